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

The processes a block starts (the measuring worker, each compile ahead) are sampled as well
under ``in_every_process(directory)``, each into a file of its own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def _sampler(stacks: Stacks, target: int, stop: threading.Event, interval: float, every=None) -> threading.Thread:
    """A started daemon thread adding thread ``target``'s stack to ``stacks`` every
    ``interval`` seconds until ``stop`` is set, and calling ``every()`` after each sample."""

    def sample():
        last = stacks.started
        while not stop.wait(interval):
            frame, now = sys._current_frames().get(target), time.perf_counter()
            if frame is not None:
                stacks.add(frame, now - last)
            last = now
            if every is not None:
                every()

    sampler = threading.Thread(target=sample, name="stack sampler", daemon=True)
    sampler.start()
    return sampler


@contextlib.contextmanager
def sampled(interval: float = INTERVAL_S):
    """The calling thread's stack sampled every ``interval`` seconds while the block runs."""
    stacks, stop = Stacks(), threading.Event()
    sampler = _sampler(stacks, threading.get_ident(), stop, interval)
    try:
        yield stacks
    finally:
        stop.set()
        sampler.join()
        stacks.ended = time.perf_counter()


# Where a process started under ``in_every_process`` writes its stacks; read by ``sitecustomize``.
DIRECTORY_ENV = "COLLAGE_STACKS_DIR"
# A process's table is written again this often while it runs: a worker ended by a kill (as
# the measuring worker is, and every process when a call's time limit ends it) keeps its last.
WRITE_S = 5.0
# A process sampled fewer times is not written: the short Python processes libraries start
# (PyTorch's probes of the CPU) would bury the ones that matter.
MIN_SAMPLES = 10


@contextlib.contextmanager
def in_every_process(directory: Path):
    """Every Python process started in the block samples its main thread's stack and writes
    the table to ``directory/<pid>.txt``, headed by its command line, while it runs and when it
    exits. Through ``sitecustomize``, which Python imports in every process it starts from a
    directory on ``PYTHONPATH`` (collage's workers pass this process's ``sys.path`` on)."""
    root = str(Path(__file__).resolve().parents[1])
    saved = {name: os.environ.get(name) for name in (DIRECTORY_ENV, "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="collage-stacks-") as hook:
        (Path(hook) / "sitecustomize.py").write_text(
            f"import sys\nsys.path.append({root!r})\nfrom experiments.stacks import sample_this_process\nsample_this_process()\n")
        os.environ[DIRECTORY_ENV] = str(directory)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (hook, saved["PYTHONPATH"])))
        sys.path.insert(0, hook)
        try:
            yield
        finally:
            sys.path.remove(hook)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def sample_this_process(interval: float = INTERVAL_S) -> None:
    """This process's main thread sampled until it exits, its table written as
    ``in_every_process`` says; nothing where no directory is set."""
    import atexit

    directory = os.environ.get(DIRECTORY_ENV)
    if not directory:
        return
    stacks, path = Stacks(), Path(directory) / f"{os.getpid()}.txt"
    command = " ".join(sys.orig_argv).replace("\n", "; ")
    header = f"pid {os.getpid()}: {command[:200]}\n"
    written = [time.perf_counter()]

    def write(force: bool = False) -> None:
        now = time.perf_counter()
        if stacks.samples >= MIN_SAMPLES and (force or now - written[0] >= WRITE_S):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{header}{stacks.table()}\n")
            written[0] = now

    stop = threading.Event()
    sampler = _sampler(stacks, threading.main_thread().ident, stop, interval, every=write)

    def last_write():
        stop.set()
        sampler.join(timeout=1.0)
        write(force=True)

    atexit.register(last_write)
