"""Compiling candidates ahead, in parallel, for backends whose compiles leave what they built on disk.

PyTorch's inductor takes seconds per candidate: GPT-2's 18 regions took 91 s of a 219 s
optimization on an H100's 16-core host, compiled one after another by the measuring worker,
which measures one candidate at a time. Its compiles write AOTInductor packages that any
process loads in milliseconds (``backends/inductor.py``). So such candidates
(``Backend.compile_cache``) are first compiled by a pool of processes, one per core but the
worker's, and the worker's compile of each then only loads what the pool built. Nothing is
measured while they compile, so no measurement runs beside them.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from .build import compile_kernel
from .runner import MeasureTask
from .threads import pin_threads

# Each process of the pool compiles one candidate at a time; inductor's own pool of compile
# processes per process is sized to the cores each gets (its size is not part of the cache key).
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


def processes_here() -> int:
    """The cores this process may run on, less one for the rest of the machine's work."""
    return len(os.sched_getaffinity(0)) - 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) - 1


@dataclass(frozen=True)
class Warmed:
    """What the pool did: candidates compiled, in how many processes, in how many seconds,
    and the slowest compile (seconds, and its sub-graph's operators)."""

    compiled: int = 0
    processes: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    slowest_ops: int = 0


def warm(tasks: list[MeasureTask], sizes: list[int], processes: int) -> Warmed:
    """Each task's kernel compiled in one of ``processes`` fresh processes, then dropped, the
    largest sub-graphs first (the longest compiles, which would end last if started last);
    ``sizes`` are the tasks' sub-graphs' operators. Never raises: a candidate that fails here
    fails again where it is measured, which says why; a pool that cannot start leaves every
    compile to the worker."""
    processes = min(processes, len(tasks))
    if processes < 2:
        return Warmed()
    import cloudpickle  # as the worker is sent its tasks: a backend's functions may be lambdas

    started = time.perf_counter()
    order = sorted(range(len(tasks)), key=lambda k: -sizes[k])
    tasks, sizes = [tasks[k] for k in order], [sizes[k] for k in order]
    threads = str(max(1, (processes_here() + 1) // processes))
    try:
        with ProcessPoolExecutor(processes, multiprocessing.get_context("spawn"), _set_env, (COMPILE_THREADS, threads)) as pool:
            done = list(pool.map(_compiles, map(cloudpickle.dumps, tasks)))
    except Exception:  # noqa: BLE001 -- a pool that broke: the worker compiles each as before
        return Warmed()
    slowest = max(range(len(tasks)), key=lambda k: done[k][1])
    return Warmed(sum(ok for ok, _ in done), processes, time.perf_counter() - started, done[slowest][1],
                  sizes[slowest])  # fmt: skip


def _set_env(name: str, value: str) -> None:
    os.environ[name] = value


def _compiles(pickled: bytes) -> tuple[bool, float]:
    """Whether the task's kernel compiled, and in how many seconds."""
    import cloudpickle

    started = time.perf_counter()
    task: MeasureTask = cloudpickle.loads(pickled)
    pin_threads(task.threads)  # on the worker's threads, as its compile will be
    kernel, reason = compile_kernel(task.backend, task.func, task.pattern, task.target, task.threads,
                                    precision=task.precision)  # fmt: skip
    return reason is None, time.perf_counter() - started
