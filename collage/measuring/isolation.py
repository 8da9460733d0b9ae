"""Where one candidate is measured: in this process, or in a worker process that may die.

A library that segfaults, aborts, hangs or runs out of memory on one sub-graph must cost that
candidate, not the optimization. So, as TVM meta-schedule's runners do, candidates are
compiled, checked and timed in a worker process; the optimizing process waits with a deadline.
A worker that dies or overruns is killed, its candidate becomes ``Cost.invalid(reason)`` (the
signal, or the timeout, and the last line the worker wrote), and the next candidate gets a
fresh worker.

A ``MeasureRunner`` is one small interface, ``run(task) -> MeasureResult``,
``run_batch(tasks)`` for candidates of a backend that compiles several at once
(``Backend.compile_many``), and ``run_all(works, on_result)`` for many of either, which a
runner with several machines measures at once; ``InProcess`` and ``WorkerProcess``
implement it one work after another, and ``rpc_runner.RPCRunner`` on a fleet of measuring
servers. A ``MeasureTask`` travels to the worker as data: the sub-graph function as TVM's
JSON text (weights as arrays beside it), the backend record (its functions pickled by
reference to their modules), the reference outputs as arrays; never a compiled kernel. To
another machine it travels without the backend record (``wire``).
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import tvm
from tvm import relax

from ..candidates.backend import REFERENCE_BACKEND, Backend
from ..candidates.precision import FLOAT32
from ..candidates.subgraph import is_tensor_constant
from .cost import Cost
from .meters import EnergyMeter
from .runner import (compile_kernel, device_for, empty_outputs, first_line, is_cuda, mismatch, random_inputs,
                     relative_error, run_reference, synchronized, to_tensors)
from .threads import pin_threads
from .timing import Timing, time_call, time_captured
from .transition import TransitionTask

# Long enough for the largest candidates of the zoo (an engine compiling a 150-op region takes
# seconds, TVM compiling one large convolution without tuning about as long); a hang costs this.
TIMEOUT_S = 300.0
# The worker's command line: not ``-m collage.measuring.isolation``, which runs this module a second time
# after the package imported it.
WORKER_MAIN = "import sys; from collage.measuring.isolation import serve; serve(*map(int, sys.argv[1:]))"
STARTUP_S = 120.0  # a worker imports TVM and torch: about 4 s on the 2-core development machines


@relax.expr_functor.mutator
class _WeightsOut(relax.PyExprMutator):
    """Replaces each tensor constant with a new variable, keeping the arrays in order."""

    def __init__(self):
        super().__init__()
        self.vars: list[relax.Var] = []
        self.arrays: list[np.ndarray] = []

    def visit_generic_const_(self, op):
        if not is_tensor_constant(op):
            return op  # a scalar: it stays in the text
        self.vars.append(relax.Var(f"collage_weight_{len(self.vars)}", op.ty))
        self.arrays.append(op.value.numpy())
        return self.vars[-1]


def weights_out(func: relax.Function) -> tuple[relax.Function, list[np.ndarray]]:
    """``func`` with its tensor constants as trailing parameters, and their values: TVM's JSON
    writes weights as base64 text, ten times slower to write and read than the arrays
    themselves (ResNet-50's candidates: 23 s against 2.3 s)."""
    mutator = _WeightsOut()
    body = mutator.visit_expr(func.body)
    lifted = relax.Function(list(func.params) + mutator.vars, body, func.ret_ty, func.is_pure, func.attrs)
    return lifted, mutator.arrays


def weights_in(lifted: relax.Function, arrays: list[np.ndarray]) -> relax.Function:
    """The inverse of ``weights_out``: the trailing parameters bound to the arrays, each as a
    tensor of its own dtype (bound as a numpy array, an int64 constant came back int32: a
    fleet server then refused Swin's placements as made for another model)."""
    first = len(lifted.params) - len(arrays)
    return lifted.bind_params({lifted.params[first + k]: tvm.runtime.tensor(a) for k, a in enumerate(arrays)})


@dataclass(frozen=True)
class MeasureTask:
    """One candidate to measure: ``func`` (the extracted sub-graph, sent as TVM's JSON with its
    weights as arrays beside it) on ``backend`` by ``pattern``, compiled for ``target`` on
    ``threads`` threads, on ``inputs`` (None: drawn
    with ``seed``), checked against ``reference`` (TVM's outputs for the same sub-graph and
    inputs; None when not known yet: the task computes it), in ``precision``: a reduced one is
    checked within ``rtol`` (the accuracy budget) instead of float32's tolerance."""

    backend: Backend
    func: relax.Function
    pattern: str
    target: str
    threads: int
    seed: int
    timing: Timing
    reference: list[np.ndarray] | None = None
    meter: EnergyMeter | None = None  # also measure each call's energy (collage.measuring.meters)
    inputs: list[np.ndarray] | None = None
    precision: str = FLOAT32
    rtol: float | None = None

    def __reduce__(self):
        # The function as TVM's JSON, its weights as arrays beside it.
        return _task, (self.backend, *weights_out(self.func), self.pattern, self.target, self.threads, self.seed, self.timing,
                       self.reference, self.meter, self.inputs, self.precision, self.rtol)  # fmt: skip


def _task(backend, lifted, weights, pattern, target, threads, seed, timing, reference, meter, inputs, precision,
          rtol) -> MeasureTask:
    return MeasureTask(backend, weights_in(lifted, weights), pattern, target, threads, seed, timing, reference, meter,
                       inputs, precision, rtol)


@dataclass(frozen=True)
class MeasureResult:
    """The candidate's cost, and TVM's outputs for its sub-graph when the task had none and
    drew its inputs from its seed (the candidate's own when it is TVM's, else a reference
    run's) so later tasks are checked against them. ``timed_out``: the candidate overran the
    runner's deadline, which a busy machine can cause as well as a hanging library, so its
    failure is not for keeping."""

    cost: Cost
    reference: list[np.ndarray] | None = None
    timed_out: bool = False


# What a runner measures: one candidate, a backend's transition, or a batch of candidates.
Work = MeasureTask | TransitionTask | list[MeasureTask]


class MeasureRunner(Protocol):
    def run(self, task: MeasureTask | TransitionTask) -> MeasureResult: ...

    def run_batch(self, tasks: list[MeasureTask]) -> list[MeasureResult]: ...

    def run_all(self, works: list[Work], on_result: Callable[[int, MeasureResult | list[MeasureResult]], None]) -> None:
        """Measure every work, calling ``on_result(index, result)`` in the calling thread as
        each is done (in any order)."""


def in_turn(runner: MeasureRunner, works: list[Work], on_result) -> None:
    """``run_all`` for a runner that measures one work at a time."""
    for index, work in enumerate(works):
        on_result(index, runner.run_batch(work) if isinstance(work, list) else runner.run(work))


def measure(task: MeasureTask, kernel=None) -> MeasureResult:
    """Compile (unless ``kernel`` is given), check and time one candidate (or measure a
    transition), in whichever process calls it; never raises."""
    if isinstance(task, TransitionTask):
        try:
            return MeasureResult(task.measure())
        except Exception as err:  # noqa: BLE001 -- a probe that fails costs the transition only
            return MeasureResult(Cost.invalid(f"transition probe failed: {type(err).__name__}: {first_line(err)}"))
    backend, func = task.backend, task.func
    try:
        arrays = random_inputs(func, task.seed) if task.inputs is None else task.inputs
    except ValueError as err:  # a dynamic or symbolic shape: nothing can be measured
        return MeasureResult(Cost.invalid(str(err)))
    if kernel is None:
        kernel, reason = compile_kernel(backend, func, task.pattern, task.target, task.threads, precision=task.precision)
        if reason is not None:
            return MeasureResult(Cost.invalid(reason))
    reference = task.reference
    device = device_for(task.target)
    inputs, outputs = to_tensors(arrays, device), empty_outputs(func, device)
    try:
        kernel(*inputs, *outputs)
        actual = [o.numpy() for o in outputs]
        if reference is None:
            reference = actual if backend.name == REFERENCE_BACKEND else run_reference(func, arrays)
        # A reference found for inputs drawn here serves later tasks of the same sub-graph; one
        # for the caller's inputs (a model's own values) the caller holds already.
        found = reference if task.reference is None and task.inputs is None else None
        problem = mismatch(actual, reference, task.rtol)
        if problem is not None:
            return MeasureResult(Cost.invalid(f"wrong result: {problem}"), found)
        # A reduced precision's own error is kept with its cost (float32's is noise).
        error = None if task.precision == FLOAT32 else relative_error(actual, reference)
        cost = _time(kernel, inputs, outputs, task)
        return MeasureResult(cost if error is None or not cost.is_valid else replace(cost, error=error), found)
    except Exception as err:
        return MeasureResult(Cost.invalid(f"run failed: {type(err).__name__}: {first_line(err)}"))


def _time(kernel, inputs, outputs, task: MeasureTask) -> Cost:
    """The kernel timed as it will run: by itself where it can time itself without Python
    (TVM's VM), inside a CUDA graph where it is a graph-safe library kernel on the GPU (as
    an assembled module replays it), else as Python calls (on the GPU, each then waited for)."""
    call = lambda: kernel(*inputs, *outputs)  # noqa: E731
    timer = getattr(kernel, "time_ms", None)
    if timer is not None:
        return timer(inputs, task.timing, task.meter)
    if is_cuda(task.target) and task.backend.graph_safe:
        try:
            return time_captured(call, task.timing, task.meter)
        except Exception as err:  # noqa: BLE001 -- not capturable here: timed as Python calls instead
            logging.getLogger(__name__).warning("%s: timed without a CUDA graph, capture failed: %s: %s",
                                                task.pattern, type(err).__name__, first_line(err))  # fmt: skip
    return time_call(synchronized(call, task.target), task.timing, task.meter)


def measure_batch(tasks: list[MeasureTask]) -> list[MeasureResult]:
    """Tasks of one backend compiled together (``Backend.compile_many``), then each checked
    and timed as ``measure`` would; where the batch does not compile (one sub-graph the
    library rejects fails them all), each is measured alone. Never raises."""
    backend, target, threads = tasks[0].backend, tasks[0].target, tasks[0].threads
    try:
        kernels = backend.compile_many([t.func for t in tasks], [t.pattern for t in tasks], target, threads)
    except Exception:  # noqa: BLE001 -- compiled one by one, each failure gets its own reason
        return [measure(t) for t in tasks]
    return [measure(t, kernel) for t, kernel in zip(tasks, kernels)]


class InProcess:
    """Measures in the calling process: no start-up and no copies, but a library that crashes
    ends the optimization. For trusted backends, and for backends whose state must be seen by
    the caller."""

    def run(self, task: MeasureTask | TransitionTask) -> MeasureResult:
        return measure(task)

    def run_batch(self, tasks: list[MeasureTask]) -> list[MeasureResult]:
        return measure_batch(tasks)

    def run_all(self, works: list[Work], on_result) -> None:
        in_turn(self, works, on_result)


class WorkerProcess:
    """Measures in one worker process (``serve``), started on first use
    and again after it dies, on ``threads`` threads. Each task gets ``timeout_s`` seconds.

    The worker's own output (TVM's C++ warnings, a library's crash report) goes to a file, not
    to the user's terminal; its last line becomes the reason when the worker dies.
    """

    def __init__(self, threads: int, timeout_s: float = TIMEOUT_S):
        self.threads, self.timeout_s = threads, timeout_s
        self.started = 0  # how many worker processes were started (1 unless some died)
        self._proc: subprocess.Popen | None = None

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
        saved, self.timeout_s = self.timeout_s, timeout_s
        try:
            result = self._exchange(job)
        except _WorkerLost as lost:
            raise RuntimeError(self._lost(lost)) from None
        finally:
            self.timeout_s = saved
        if isinstance(result, _JobFailed):
            raise RuntimeError(result.why)
        return result

    def _exchange(self, work):
        """``work`` (a task or a list of them) sent to the worker, and its answer; raises
        _WorkerLost when the worker dies or overruns ``timeout_s``."""
        self._start()
        self._output.seek(0)  # keep only what the worker writes while on this work
        self._output.truncate()
        _write(self._to_worker, work)
        return _read(self._from_worker, time.monotonic() + self.timeout_s)

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
        os.close(task_read)
        os.close(result_write)
        self._to_worker = os.fdopen(task_write, "wb")
        self._from_worker = os.fdopen(result_read, "rb")
        self.started += 1
        self._ready = False

    def _lost(self, lost: _WorkerLost) -> str:
        """Why the worker is gone (it is killed if it still runs), with its last words."""
        proc = self._proc
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        self._output.seek(0)
        lines = [line.strip() for line in self._output.read().decode(errors="replace").splitlines() if line.strip()]
        self.close()
        if lost.timed_out:
            why = f"timed out after {self.timeout_s:g} s"
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


# -- the wire: a length, then a pickle (cloudpickle, so test-only backends defined in a function
# travel too); functions of importable modules travel by name.


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


def serve(task_fd: int, result_fd: int, threads: int) -> None:
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

