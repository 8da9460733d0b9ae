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

# Each process of the pool compiles one candidate at a time; inductor compiles that
# candidate's kernels in a pool of its own, of this many processes (not part of its cache key),
# read once, when a process first imports inductor.
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"
# The compile threads of all processes, per core. A compile's serial stretches (tracing,
# lowering, scheduling, the wrapper's C++) leave its threads idle, so the cores are shared out
# this many times over, as ``make -j`` oversubscribes.
OVERSUBSCRIPTION = 2


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
    slowest_threads: int = 0  # the compile threads it had


def warm(tasks: list[MeasureTask], sizes: list[int], processes: int) -> Warmed:
    """Each task's kernel compiled in one of ``processes`` fresh processes, then dropped, the
    largest sub-graphs first (the longest compiles, which would end last if started last),
    each process with its first task's compile threads (``compile_threads``); ``sizes`` are
    the tasks' sub-graphs' operators. Never raises: a candidate that fails here fails again
    where it is measured, which says why; a pool that cannot start leaves every compile to
    the worker."""
    processes = min(processes, len(tasks))
    if processes < 2:
        return Warmed()
    import cloudpickle  # as the worker is sent its tasks: a backend's functions may be lambdas

    started = time.perf_counter()
    order = sorted(range(len(tasks)), key=lambda k: -sizes[k])
    tasks, sizes = [tasks[k] for k in order], [sizes[k] for k in order]
    threads = compile_threads(sizes, processes, processes_here() + 1)
    try:
        with ProcessPoolExecutor(processes, multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(_compiles, map(cloudpickle.dumps, tasks), threads))
    except Exception:  # noqa: BLE001 -- a pool that broke: the worker compiles each as before
        return Warmed()
    slowest = max(range(len(tasks)), key=lambda k: done[k][1])
    return Warmed(sum(ok for ok, _, _ in done), processes, time.perf_counter() - started, done[slowest][1],
                  sizes[slowest], done[slowest][2])  # fmt: skip


def compile_threads(sizes: list[int], processes: int, cores: int) -> list[int]:
    """Compile threads for each task, ``sizes`` largest first. The first ``processes`` tasks
    start a process each and fix its threads: they share ``OVERSUBSCRIPTION * cores`` by their
    operators, so the largest compile, which ends last, has the most. A later task runs with
    the threads of the process it lands in; it is given one."""
    first = sizes[:processes]
    budget = OVERSUBSCRIPTION * cores
    return [max(1, budget * size // sum(first)) for size in first] + [1] * (len(sizes) - len(first))


def _compiles(pickled: bytes, threads: int) -> tuple[bool, float, int]:
    """Whether the task's kernel compiled, in how many seconds, with how many compile threads
    (``threads`` where this is the process's first compile, else its first one's)."""
    os.environ.setdefault(COMPILE_THREADS, str(threads))  # read when inductor is first imported
    import cloudpickle

    started = time.perf_counter()
    task: MeasureTask = cloudpickle.loads(pickled)
    pin_threads(task.threads)  # on the worker's threads, as its compile will be
    kernel, reason = compile_kernel(task.backend, task.func, task.pattern, task.target, task.threads,
                                    precision=task.precision)  # fmt: skip
    return reason is None, time.perf_counter() - started, int(os.environ[COMPILE_THREADS])
