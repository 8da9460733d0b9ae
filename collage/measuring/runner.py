"""The runner interface, as TVM meta-schedule's runners have one: what one candidate's
measurement is (``MeasureTask``, ``MeasureResult``) and what measures it (``MeasureRunner``).

A ``MeasureRunner`` is one small interface, ``run(task) -> MeasureResult``,
``run_batch(tasks)`` for candidates of a backend that compiles several at once
(``Backend.compile_many``), and ``run_all(works, on_result)`` for many of either, which a
runner with several machines measures at once. ``InProcess`` (here) measures in the calling
process; ``isolation.WorkerProcess`` in a worker process that may die;
``rpc_runner.RPCRunner`` on a fleet of measuring servers. Each ends in ``measure``: compile,
check against TVM, time. A ``MeasureTask`` travels to a worker as data: the sub-graph
function as TVM's JSON text with its weights lifted out as arrays (``weights_out``), the
backend record (its functions pickled by reference to their modules), the reference outputs
as arrays; never a compiled kernel. To another machine it travels without the backend
record (``wire``).
"""

from __future__ import annotations

import logging
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
from ..errors import first_line
from .arrays import empty_outputs, mismatch, random_inputs, relative_error, to_tensors
from .build import compile_kernel, device_for, is_cuda, run_reference, synchronized
from .cost import Cost
from .meters import EnergyMeter
from .timing import Timing, time_call, time_captured
from .transition import TransitionTask


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
    checked within ``rtol`` instead of float32's tolerance (``GROSS_FAULT`` from a
    ``Measurer``, which holds the error kept with the cost to the budget itself). The
    ``ops`` on the sub-graph's longest path widen float32's (``arrays.tolerance``)."""

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
    ops: int = 1

    def __reduce__(self):
        # The function as TVM's JSON, its weights as arrays beside it.
        return _task, (self.backend, *weights_out(self.func), self.pattern, self.target, self.threads, self.seed, self.timing,
                       self.reference, self.meter, self.inputs, self.precision, self.rtol, self.ops)  # fmt: skip


def _task(backend, lifted, weights, pattern, target, threads, seed, timing, reference, meter, inputs, precision,
          rtol, ops) -> MeasureTask:
    return MeasureTask(backend, weights_in(lifted, weights), pattern, target, threads, seed, timing, reference, meter,
                       inputs, precision, rtol, ops)


@dataclass(frozen=True)
class MeasureResult:
    """The candidate's cost, and TVM's outputs for its sub-graph when the task had none and
    drew its inputs from its seed (the candidate's own when it is TVM's, else a reference
    run's) so later tasks are checked against them. ``timed_out``: the candidate overran the
    runner's deadline, which a busy machine can cause as well as a hanging library, so its
    failure is not for keeping. ``compile_s``: the seconds its compile took where it was
    measured (a batch's, on its first result), so that a report can say how much of a
    backend's measuring was compiling."""

    cost: Cost
    reference: list[np.ndarray] | None = None
    timed_out: bool = False
    compile_s: float = 0.0


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
    compile_s = 0.0
    if kernel is None:
        started = time.perf_counter()
        kernel, reason = compile_kernel(backend, func, task.pattern, task.target, task.threads, precision=task.precision)
        compile_s = time.perf_counter() - started
        if reason is not None:
            return MeasureResult(Cost.invalid(reason), compile_s=compile_s)
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
        problem = mismatch(actual, reference, task.rtol, task.ops)
        # A reduced precision's own error is kept with its cost (float32's is noise), for the
        # Measurer to hold to each run's budget, and with its failure where it errs beyond
        # ``rtol`` (grossly). Outputs of other shapes or dtypes have no such error.
        alike = len(actual) == len(reference) and all(a.shape == e.shape and a.dtype == e.dtype
                                                      for a, e in zip(actual, reference))  # fmt: skip
        error = None if task.precision == FLOAT32 or not alike else relative_error(actual, reference)
        if problem is not None:
            return MeasureResult(Cost.invalid(f"wrong result: {problem}", error), found, compile_s=compile_s)
        cost = _time(kernel, inputs, outputs, task)
        cost = cost if error is None or not cost.is_valid else replace(cost, error=error)
        return MeasureResult(cost, found, compile_s=compile_s)
    except Exception as err:
        return MeasureResult(Cost.invalid(f"run failed: {type(err).__name__}: {first_line(err)}"), compile_s=compile_s)


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
    started = time.perf_counter()
    try:
        kernels = backend.compile_many([t.func for t in tasks], [t.pattern for t in tasks], target, threads)
    except Exception:  # noqa: BLE001 -- compiled one by one, each failure gets its own reason
        failed_s = time.perf_counter() - started
        results = [measure(t) for t in tasks]
        return [replace(results[0], compile_s=results[0].compile_s + failed_s), *results[1:]]
    compile_s = time.perf_counter() - started
    results = [measure(t, kernel) for t, kernel in zip(tasks, kernels)]
    return [replace(results[0], compile_s=compile_s), *results[1:]]


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

