"""The local runner: candidates measured in a worker process that may die.

A library that segfaults, aborts, hangs or runs out of memory on one sub-graph must cost that
candidate, not the optimization. So, as TVM meta-schedule's runners do, candidates are
compiled, checked and timed in a worker process (``worker_loop``, which calls the runner
interface's ``measure``); the optimizing process waits with a deadline. A worker that dies
or overruns is killed, its candidate becomes ``Cost.invalid(reason)`` (the signal, or the
timeout, and the last line the worker wrote), and the next candidate gets a fresh worker.
Tasks and results cross the pipes as length-framed pickles.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import first_line
from .cost import Cost
from .runner import MeasureResult, MeasureTask, Work, in_turn, measure, measure_batch
from .threads import pin_threads
from .transition import TransitionTask

# Long enough for the largest candidates of the zoo (an engine compiling a 150-op region takes
# seconds, TVM compiling one large convolution without tuning about as long); a hang costs this.
TIMEOUT_S = 300.0

# The worker's command line: not ``-m collage.measuring.isolation``, which runs this module a second time
# after the package imported it.
WORKER_MAIN = "import sys; from collage.measuring.isolation import worker_loop; worker_loop(*map(int, sys.argv[1:]))"

STARTUP_S = 120.0  # a worker imports TVM and torch: about 4 s on the 2-core development machines


class WorkerProcess:
    """Measures in one worker process (``worker_loop``), started on first use
    and again after it dies, on ``threads`` threads (and only on ``cores``, where given).
    Each task gets ``timeout_s`` seconds.

    The worker's own output (TVM's C++ warnings, a library's crash report) goes to a file, not
    to the user's terminal; its last line becomes the reason when the worker dies.
    """

    def __init__(self, threads: int, timeout_s: float = TIMEOUT_S, cores: frozenset[int] | None = None):
        self.threads, self.timeout_s = threads, timeout_s
        self.cores = cores  # the CPUs the worker may run on; None: any
        self.started = 0  # how many worker processes were started (1 unless some died)
        self._proc: subprocess.Popen | None = None
        self._job_s, self._deadline = 0.0, 0.0  # the submitted job's time and when it runs out

    def run(self, task: MeasureTask | TransitionTask) -> MeasureResult:
        try:
            return self._exchange(task)
        except _WorkerLost as lost:
            return MeasureResult(Cost.invalid(self._lost(lost)), timed_out=lost.timed_out)

    def run_batch(self, tasks: list[MeasureTask]) -> list[MeasureResult]:
        """The tasks measured together in the worker; if it dies or overruns on them, each
        again on its own, so that only the candidate at fault is lost."""
        try:
            return self._exchange(list(tasks))
        except _WorkerLost as lost:
            self._lost(lost)
            return [self.run(task) for task in tasks]

    def run_all(self, works: list[Work], on_result) -> None:
        in_turn(self, works, on_result)

    def call(self, job: Callable[[], object], timeout_s: float) -> object:
        """``job()`` run in the worker, on its threads, within ``timeout_s`` seconds: what a
        measuring server does besides measuring (``collage.time_finalists``). ``job`` travels
        pickled, so it is a module-level function (with its arguments bound). Raises
        ``RuntimeError`` with why when the worker dies, overruns, or ``job`` raises."""
        self.submit(job, timeout_s)
        return self.result()

    def submit(self, job: Callable[[], object], timeout_s: float) -> None:
        """``job`` started in the worker while this process goes on (another worker's job
        too); ``result`` waits for it, within ``timeout_s`` seconds of its start."""
        try:
            self._start()
            self._job_s, self._deadline = timeout_s, time.monotonic() + timeout_s
            self._clear_output()
            _write(self._to_worker, job)
        except _WorkerLost as lost:
            raise RuntimeError(self._lost(lost, timeout_s)) from None

    def result(self) -> object:
        """What the job ``submit`` started returned; ``RuntimeError`` as ``call`` says."""
        try:
            result = _read(self._from_worker, self._deadline)
        except _WorkerLost as lost:
            raise RuntimeError(self._lost(lost, self._job_s)) from None
        if isinstance(result, _JobFailed):
            raise RuntimeError(result.why)
        return result

    def _exchange(self, work):
        """``work`` (a task or a list of them) sent to the worker, and its answer; raises
        _WorkerLost when the worker dies or overruns ``timeout_s``."""
        self._start()
        self._clear_output()
        _write(self._to_worker, work)
        return _read(self._from_worker, time.monotonic() + self.timeout_s)

    def _clear_output(self) -> None:
        self._output.seek(0)  # keep only what the worker writes while on this work
        self._output.truncate()

    def close(self) -> None:
        if self._proc is None:
            return
        for stream in (self._to_worker, self._from_worker, self._output):
            stream.close()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc = None

    def start(self) -> None:
        """Start the worker now, without waiting for it (it imports every library: seconds),
        so that its start-up overlaps other work; the first task waits for it to be ready."""
        if self._proc is None:
            self._spawn()

    def _start(self) -> None:
        self.start()
        if not self._ready:
            # The worker says when it is ready, so its start-up (importing the libraries,
            # seconds) does not count against the first task's time.
            _read(self._from_worker, time.monotonic() + max(self.timeout_s, STARTUP_S))
            self._ready = True

    def _spawn(self) -> None:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        self._output = tempfile.TemporaryFile()
        # The worker sees the modules this process sees (a backend of the user's own, pickled
        # by reference to its module, must import there), as multiprocessing's spawn does.
        path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        env = dict(os.environ, PYTHONPATH=path)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, str(task_read), str(result_write), str(self.threads)],
            pass_fds=(task_read, result_write), stdin=subprocess.DEVNULL, stdout=self._output,
            stderr=subprocess.STDOUT, env=env,
        )
        if self.cores is not None:
            # Set before the worker imports anything: the threads its libraries start inherit it.
            os.sched_setaffinity(self._proc.pid, self.cores)
        os.close(task_read)
        os.close(result_write)
        self._to_worker = os.fdopen(task_write, "wb")
        self._from_worker = os.fdopen(result_read, "rb")
        self.started += 1
        self._ready = False

    def _lost(self, lost: _WorkerLost, timeout_s: float | None = None) -> str:
        """Why the worker is gone (it is killed if it still runs), with its last words;
        ``timeout_s``: the job's time, where it was not a measuring task's."""
        proc = self._proc
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        self._output.seek(0)
        lines = [line.strip() for line in self._output.read().decode(errors="replace").splitlines() if line.strip()]
        self.close()
        if lost.timed_out:
            why = f"timed out after {timeout_s or self.timeout_s:g} s"
        elif code < 0:
            why = f"the worker died of {signal.Signals(-code).name}"
        else:
            why = f"the worker exited with status {code}"
        return f"measuring failed: {why}" + (f" ({lines[-1][:200]})" if lines and not lost.timed_out else "")


_shared: dict[int, WorkerProcess] = {}


def shared_worker(threads: int) -> WorkerProcess:
    """One worker per thread count for this whole process: a worker takes seconds to start
    (it imports every library), so successive optimizations reuse it. Closed at exit."""
    if threads not in _shared:
        if not _shared:
            atexit.register(lambda: [w.close() for w in _shared.values()])
        _shared[threads] = WorkerProcess(threads)
    return _shared[threads]


@dataclass(frozen=True)
class _JobFailed:
    """A job (``WorkerProcess.call``) raised in the worker: why."""

    why: str


class _WorkerLost(Exception):
    def __init__(self, timed_out: bool = False):
        self.timed_out = timed_out


def _write(stream, obj) -> None:
    import cloudpickle

    data = cloudpickle.dumps(obj)
    try:
        stream.write(struct.pack("<Q", len(data)))
        stream.write(data)
        stream.flush()
    except (BrokenPipeError, OSError):
        raise _WorkerLost() from None


def _read(stream, deadline: float | None = None):
    import cloudpickle

    fd = stream.fileno()
    (size,) = struct.unpack("<Q", _read_exactly(fd, 8, deadline))
    return cloudpickle.loads(_read_exactly(fd, size, deadline))


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    """``size`` bytes from ``fd``; _WorkerLost when the other end closes or the deadline passes."""
    chunks = []
    while size:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise _WorkerLost(timed_out=True)
        chunk = os.read(fd, size)
        if not chunk:
            raise _WorkerLost()
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def worker_loop(task_fd: int, result_fd: int, threads: int) -> None:
    """The worker's loop: read a task, measure it, write the result, until the parent leaves."""
    pin_threads(threads)
    tasks, results = os.fdopen(task_fd, "rb"), os.fdopen(result_fd, "wb")
    _write(results, "ready")
    while True:
        try:
            work = _read(tasks)  # a task, or a list of them (``run_batch``)
        except _WorkerLost:  # the parent closed the pipe or exited
            return
        try:
            if callable(work):  # a job (``WorkerProcess.call``)
                result = work()
            else:
                result = measure_batch(work) if isinstance(work, list) else measure(work)
        except BaseException as err:  # noqa: BLE001 -- anything measure did not expect
            why = f"measuring failed: {type(err).__name__}: {first_line(err)}"
            if callable(work):
                result = _JobFailed(why)
            else:
                failed = MeasureResult(Cost.invalid(why))
                result = [failed] * len(work) if isinstance(work, list) else failed
        _write(results, result)

