"""Where a long call's seconds go, by sampling: the calling thread's Python stack read every
``interval`` seconds by a daemon thread (``sys._current_frames``).

A lent GPU's minutes are too few to profile a run a second time, and ``cProfile`` would slow
the Python-heavy stages it measures. A sample costs tens of microseconds of the GIL, and a
call blocked in C++ (a compile, a package load, a kernel) still shows the Python line that
made it. A sample stands for the seconds since the one before (a call that holds the GIL
delays the next sample, which then stands for the wait); each function is counted once per
sample it is on the stack in, so a row's seconds are the time spent inside it, callees
included.

    with sampled() as stacks:
        collage.optimize(...)
    print(stacks.table())
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time

INTERVAL_S = 0.1


class Stacks:
    """Samples of one thread's stack: for each function, the seconds it was running
    (``inclusive``) or at the top (``own``)."""

    def __init__(self):
        self.samples = 0
        self.started = time.perf_counter()
        self.ended: float | None = None  # still sampling while None
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()

    def add(self, frame, seconds: float) -> None:
        """The stack from ``frame`` up, standing for ``seconds``."""
        on_stack = []
        while frame is not None:
            on_stack.append(_name(frame))
            frame = frame.f_back
        if on_stack:
            self.samples += 1
            self.own[on_stack[0]] += seconds
            for name in set(on_stack):
                self.inclusive[name] += seconds

    @property
    def seconds(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    def table(self, top: int = 60) -> str:
        """The ``top`` functions by seconds inside them, with their own seconds."""
        lines = [f"{self.samples} samples over {self.seconds:.1f} s; seconds inside (own)  function"]
        for name, seconds in self.inclusive.most_common(top):
            lines.append(f"{seconds:8.1f} ({self.own[name]:6.1f})  {name}")
        return "\n".join(lines)


def _name(frame) -> str:
    """``path:line function``, the path from site-packages or from the working directory."""
    code = frame.f_code
    path = code.co_filename.split("site-packages/")[-1]
    if path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return f"{path}:{code.co_firstlineno} {code.co_name}"


@contextlib.contextmanager
def sampled(interval: float = INTERVAL_S):
    """The calling thread's stack sampled every ``interval`` seconds while the block runs."""
    stacks, target, stop = Stacks(), threading.get_ident(), threading.Event()

    def sample():
        last = stacks.started
        while not stop.wait(interval):
            frame, now = sys._current_frames().get(target), time.perf_counter()
            if frame is not None:
                stacks.add(frame, now - last)
            last = now

    sampler = threading.Thread(target=sample, name="stack sampler", daemon=True)
    sampler.start()
    try:
        yield stacks
    finally:
        stop.set()
        sampler.join()
        stacks.ended = time.perf_counter()
