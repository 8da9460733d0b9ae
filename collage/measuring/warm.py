"""Compiling candidates ahead, in parallel, for backends whose compiles leave what they built on disk.

PyTorch's inductor takes seconds per candidate: GPT-2's 18 regions took 91 s of a 219 s
optimization on an H100's 16-core host, compiled one after another by the measuring worker,
which measures one candidate at a time. Its compiles write AOTInductor packages that any
process loads in milliseconds (``backends/inductor.py``). So such candidates
(``Backend.compile_cache``) are first compiled ahead, as many at once as there are cores
but the worker's, and the worker's compile of each then only loads what was built. On the CPU
nothing is measured while they compile, as a kernel timed beside them would share its cores
with them. On the GPU, where the device's clock times the kernels, TVM's candidates are
measured meanwhile (``Measurer._measure_all``), and the compiles then keep off one core, left
to the measuring worker (``spare_one_core``).

Each compile runs in a worker process of its own (``isolation.WorkerProcess``, as candidates
are measured), not in a ``multiprocessing`` pool: its processes start by running the user's
script again where it has no ``if __name__ == "__main__":`` guard (on an H100, nine of them each
ran the whole optimization of that script again), a compile that hangs would hang the pool,
and a process of its own takes the compile threads meant for its candidate.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple

from .build import compile_kernel
from .isolation import TIMEOUT_S, WorkerProcess
from .runner import MeasureTask
from .threads import default_threads

# Inductor compiles a candidate's kernels in a pool of its own, of this many processes (not part
# of its cache key), read once, when a process first imports inductor.
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"
# The compile threads of the compiles running at once, per core. A compile's serial stretches
# (tracing, lowering, scheduling, the wrapper's C++) leave its threads idle, so the cores are
# shared out this many times over, as ``make -j`` oversubscribes.
OVERSUBSCRIPTION = 2
# A compile ahead has fewer threads than the measuring worker's own compile would: twice the
# worker's time before it is given up (the worker then compiles it, within its own limit).
COMPILE_TIMEOUT_S = 2 * TIMEOUT_S


def processes_here() -> int:
    """The cores this process may run on, less one for the rest of the machine's work."""
    return default_threads() - 1


def spare_one_core() -> frozenset[int] | None:
    """The cores this process may run on but one (the highest), for compiles that run beside
    a measuring worker, which the scheduler then finds that core free for; None where the
    platform does not say which cores these are."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return frozenset(cores[:-1]) if len(cores) > 1 else None


@dataclass(frozen=True)
class Warmed:
    """What compiling ahead did: candidates compiled, how many at once, in how many seconds,
    the slowest compile (seconds, its sub-graph's operators, its compile threads), what the
    backends warned of meanwhile, once each (in their processes, which nobody reads), and
    whether candidates were measured meanwhile (so its seconds are not measuring's on top)."""

    compiled: int = 0
    processes: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    slowest_ops: int = 0
    slowest_threads: int = 0
    warnings: tuple[str, ...] = ()
    measured_meanwhile: bool = False

    def and_then(self, later: Warmed) -> Warmed:
        """This and a ``later`` round of compiling ahead as one: what both compiled, in both
        rounds' seconds, with the slower round's slowest compile."""
        slowest = max(self, later, key=lambda w: w.slowest_s)
        return replace(slowest, compiled=self.compiled + later.compiled,
                       processes=max(self.processes, later.processes), seconds=self.seconds + later.seconds,
                       warnings=tuple(dict.fromkeys(self.warnings + later.warnings)),
                       measured_meanwhile=self.measured_meanwhile or later.measured_meanwhile)


def warm(tasks: list[MeasureTask], sizes: list[int], processes: int, cores: frozenset[int] | None = None) -> Warmed:
    """Each task's kernel compiled in a worker process of its own, then dropped, ``processes``
    at once, the largest sub-graphs first (the longest compiles, which would end last if
    started last), each with its share of compile threads (``compile_threads``) and only on
    ``cores`` where given (else on any); ``sizes`` are the tasks' sub-graphs' operators. Never
    raises: a candidate that fails or overruns here is compiled again where it is measured,
    which says why."""
    usable = len(cores) if cores is not None else default_threads()
    processes = min(processes, len(tasks), usable)
    if processes < 2:
        return Warmed()
    started = time.perf_counter()
    order = sorted(range(len(tasks)), key=lambda k: -sizes[k])
    tasks, sizes = [tasks[k] for k in order], [sizes[k] for k in order]
    threads = compile_threads(sizes, processes, usable)
    compile_apart = functools.partial(_compiled_apart, cores=cores)
    with ThreadPoolExecutor(processes) as pool:  # each thread waits on its worker process
        done = list(pool.map(compile_apart, tasks, threads))
    slowest = max(range(len(tasks)), key=lambda k: done[k].seconds)
    said = tuple(dict.fromkeys(w for d in done for w in d.warnings))
    return Warmed(sum(d.compiled for d in done), processes, time.perf_counter() - started, done[slowest].seconds,
                  sizes[slowest], done[slowest].threads, said)  # fmt: skip


def compile_threads(sizes: list[int], processes: int, cores: int) -> list[int]:
    """Compile threads for each task, ``sizes`` largest first: the first ``processes``
    tasks, which start at once, share ``OVERSUBSCRIPTION * cores`` by their operators, so the
    largest compile, which ends last, has the most; a later task, started as one ends, has its
    operators' share by the same measure."""
    budget, first = OVERSUBSCRIPTION * cores, sum(sizes[:processes])
    return [max(1, budget * size // first) for size in sizes]


class _Compile(NamedTuple):
    compiled: bool
    seconds: float  # the worker's start-up included
    threads: int  # compile threads
    warnings: tuple[str, ...] = ()  # the backend's, in the worker


def _compiled_apart(task: MeasureTask, threads: int, cores: frozenset[int] | None = None) -> _Compile:
    """The task's kernel compiled in a worker process of its own, on ``cores`` (one that dies
    or overruns: not compiled)."""
    started = time.perf_counter()
    worker = WorkerProcess(task.threads, timeout_s=COMPILE_TIMEOUT_S, cores=cores)
    compiled, used, said = False, threads, ()
    try:
        compiled, used, said = worker.call(functools.partial(_compiles, task, threads), COMPILE_TIMEOUT_S)
    except (RuntimeError, OSError):  # the worker died, overran or could not start
        pass
    finally:
        worker.close()
    return _Compile(compiled, time.perf_counter() - started, used, said)


def _compiles(task: MeasureTask, threads: int) -> tuple[bool, int, tuple[str, ...]]:
    """In the worker: whether the task's kernel compiled, on how many compile threads
    (``threads``, unless the user's environment names a number), and what the backend warned
    of meanwhile (its warnings start with its name): a compile that fell back to a slower path
    (inductor without an AOTInductor package) is otherwise only in the worker's output."""
    os.environ.setdefault(COMPILE_THREADS, str(threads))  # before inductor is first imported here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, reason = compile_kernel(task.backend, task.func, task.pattern, task.target, task.threads,
                                   precision=task.precision)  # fmt: skip
    said = tuple(dict.fromkeys(m for w in caught if (m := str(w.message)).startswith(f"{task.backend.name}:")))
    return reason is None, int(os.environ[COMPILE_THREADS]), said
