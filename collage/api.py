"""``collage.optimize``: the only place where the stages are wired together.

    simplify -> DataflowGraph -> candidates -> measured costs (cost log) -> DP placement
             -> assembled module -> checked against the unoptimized module -> OptimizedModule
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .assemble import Assembly, PartitionFailed, assemble
from .backend import GRAPH_LEVEL, REFERENCE_BACKEND, Backend, BackendSet, default_backends
from .candidates import Candidate, generate
from .cost import Cost
from .cost_log import CostLog
from .graph import DataflowGraph
from .measure import Measurer, default_threads, pin_threads
from .placement import Partition, Placement, PlacementError, place
from .report import format_report
from .runner import device_for, mismatch, numpy_outputs, random_inputs, run_kernel, static_shape, to_tensors
from .simplify import SimplifyReport
from .simplify import simplify as simplify_module
from .subgraph import SubGraph
from .timing import Timing, time_interleaved

TARGETS = ("llvm", "cuda")
# End to end, rounding differences of the kernels add up along the model: the check allows
# ten times the per-candidate tolerance (the zoo's measured error is under a quarter of it).
END_TO_END_RTOL = 1e-3
MAX_CHECK_ROUNDS = 3


class OptimizeError(Exception):
    """The model cannot be optimized as given; the message says what to change."""


@dataclass
class OptimizedModule:
    """The placed and assembled model. Call it with numpy arrays like the original ``main``."""

    module: tvm.IRModule  # the assembled Relax module (kernels outside TVM by call_dps_packed)
    placement: list[Partition]
    target: str
    threads: int
    estimated_ms: float  # the DP's sum of measured candidate and transition costs
    measured: Cost  # the assembled module end to end
    simplified: SimplifyReport | None
    stats: dict = field(default_factory=dict)  # candidates, measurements, timings of each stage
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why it was not used
    fallbacks: list[tuple[Partition, str]] = field(default_factory=list)
    _assembly: Assembly | None = field(default=None, repr=False)
    _vm: relax.VirtualMachine | None = field(default=None, repr=False)
    _params: list[relax.Var] = field(default_factory=list, repr=False)

    def __call__(self, *arrays):
        if len(arrays) != len(self._params):
            names = ", ".join(p.name for p in self._params)
            raise TypeError(f"the model takes {len(self._params)} input(s) ({names}), got {len(arrays)}")
        tensors = []
        for param, array in zip(self._params, arrays):
            array = np.asarray(array)
            shape, dtype = static_shape(param.ty), str(param.ty.dtype)
            if array.shape != shape or str(array.dtype) != dtype:
                raise ValueError(
                    f"input {param.name!r} must be {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}"
                )
            tensors.append(tvm.runtime.tensor(np.ascontiguousarray(array), device_for(self.target)))
        return _to_numpy(self._vm["main"](*tensors))

    @property
    def main(self):
        """The assembled ``main`` on the Relax VM, taking ``tvm.runtime.Tensor`` inputs: for
        callers that convert their inputs once, such as benchmarks."""
        return self._vm["main"]

    def backend_shares(self) -> dict[str, float]:
        """Each backend's share of the estimated time (fallbacks, never measured, count zero)."""
        ms: dict[str, float] = {}
        for p in self.placement:
            ms[p.backend] = ms.get(p.backend, 0.0) + (0.0 if math.isnan(p.cost_ms) else p.cost_ms)
        total = sum(ms.values()) or 1.0
        return {b: v / total for b, v in sorted(ms.items(), key=lambda kv: -kv[1])}

    def report(self) -> str:
        return format_report(self)


def optimize(
    mod: tvm.IRModule,
    target: str = "llvm",
    backends: BackendSet | Iterable[Backend | str] | None = None,
    cost_log: CostLog | str | None = None,
    *,
    params: Mapping[str, np.ndarray] | None = None,
    threads: int | None = None,
    simplify: bool = True,
    timing: Timing = Timing(),
    progress: bool = True,
    seed: int = 0,
) -> OptimizedModule:
    """Place every operator of ``mod``'s ``main`` on the backend where it runs fastest here.

    ``mod`` is a Relax IRModule with static shapes; weights are bound as constants, or given
    as ``params`` (name -> array) to bind. ``backends`` defaults to every registered backend
    (a BackendSet, or backends and backend names); those that cannot run here are left out
    with their reason (``opt.excluded``). Costs are read from and written to ``cost_log`` (a
    CostLog or a path; default ``~/.cache/collage/costs.sqlite`` or ``$COLLAGE_COST_LOG``).
    Every backend runs on ``threads`` threads (default: the cores this process may use).
    ``simplify`` runs ``collage.simplify`` first. Raises ``OptimizeError`` for input it cannot
    handle; a failing backend candidate is excluded with its reason and never raises.
    """
    started = time.perf_counter()
    stats: dict = {}
    if target not in TARGETS:
        raise OptimizeError(f"unknown target {target!r}; collage supports {', '.join(TARGETS)}")
    threads = threads or default_threads()
    pin_threads(threads)
    original = _bound_main(mod, params)
    backend_set = _backend_set(backends)
    usable, excluded = backend_set.usable(target)
    if not any(b.name == REFERENCE_BACKEND for b in usable):
        raise OptimizeError("the 'tvm' backend must be among the backends: it is the fallback for every operator")
    log = cost_log if isinstance(cost_log, CostLog) else CostLog(cost_log)

    report = None
    prepared = original
    if simplify:
        prepared, report = simplify_module(original, report=True)
    graph = _graph(prepared)

    t = time.perf_counter()
    candidates = generate(graph, usable)
    stats["candidates"] = len(candidates)
    stats["generate_s"] = time.perf_counter() - t

    t = time.perf_counter()
    measurer = Measurer(BackendSet(usable), target, threads, log, timing, seed=seed)
    measurer.measure_all(candidates, progress=progress)
    stats["measured"] = measurer.measured
    stats["distinct"] = len({measurer.key(c) for c in candidates})
    stats["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    try:
        placements = _placements(graph, candidates, measurer, usable)
    except PlacementError as err:  # an operator no backend (not even TVM) could run
        raise OptimizeError(str(err)) from None
    stats["place_s"] = time.perf_counter() - t
    stats["exact"] = all(p.exact for p in placements.values())

    t = time.perf_counter()
    arrays = random_inputs(original["main"], seed)
    expected = _reference(original, arrays, log, f"{tvm_ffi.structural_hash(original):x} seed {seed} {target}", target)
    built = {
        name: _assemble_and_check(graph, placement, expected, arrays, backend_set, target)
        for name, placement in placements.items()
    }
    stats["assemble_s"] = time.perf_counter() - t

    # The additive model misses what kernels do to each other (threads handed over, caches
    # emptied), so the op-level answer and each engine's own regions are timed end to end,
    # in alternation, and the fastest is kept.
    inputs = to_tensors(arrays, device_for(target))
    measured = time_interleaved({name: functools.partial(b[1]["main"], *inputs) for name, b in built.items()})
    chosen = min(measured, key=lambda name: measured[name].median_ms)
    stats["alternatives"] = {
        name: {"estimated_ms": placements[name].estimated_ms, "measured_ms": measured[name].median_ms}
        for name in placements
    }
    stats["chosen"] = chosen
    assembly, vm, partitions, fallbacks = built[chosen]
    placement = placements[chosen]
    stats["total_s"] = time.perf_counter() - started
    return OptimizedModule(
        module=assembly.module,
        placement=partitions,
        target=target,
        threads=threads,
        estimated_ms=placement.estimated_ms,
        measured=measured[chosen],
        simplified=report,
        stats=stats,
        excluded=excluded,
        fallbacks=fallbacks,
        _assembly=assembly,
        _vm=vm,
        _params=list(original["main"].params),
    )


# -- input checks --


def _bound_main(mod, params) -> tvm.IRModule:
    if not isinstance(mod, tvm.IRModule):
        raise OptimizeError(
            f"collage.optimize takes a Relax tvm.IRModule, not {type(mod).__name__}; import ONNX models "
            "with tvm.relax.frontend.onnx.from_onnx and PyTorch ones with tvm.relax.frontend.torch"
        )
    main = mod["main"] if any(gv.name_hint == "main" for gv in mod.get_global_vars()) else None
    if not isinstance(main, relax.Function):
        raise OptimizeError("the module has no Relax function named 'main' to optimize")
    if params:
        known = {p.name for p in main.params}
        unknown = sorted(set(params) - known)
        if unknown:
            raise OptimizeError(f"params name no input of main: {', '.join(unknown)} (inputs: {', '.join(sorted(known))})")
        mod = relax.transform.BindParams("main", {k: tvm.runtime.tensor(np.asarray(v)) for k, v in params.items()})(mod)
    for p in mod["main"].params:
        if not isinstance(p.ty, relax.TensorType):
            raise OptimizeError(f"input {p.name!r} is a {p.ty}, not a tensor; collage takes tensor inputs")
        try:
            static_shape(p.ty)
        except ValueError as err:
            raise OptimizeError(f"input {p.name!r}: {err}") from None
    return mod


def _backend_set(backends) -> BackendSet:
    if backends is None:
        return default_backends()
    if isinstance(backends, BackendSet):
        return backends
    defaults = default_backends()
    chosen = []
    for b in backends:
        if isinstance(b, Backend):
            chosen.append(b)
        else:
            try:
                chosen.append(defaults[b])
            except KeyError as err:
                raise OptimizeError(err.args[0]) from None
    return BackendSet(chosen)


def _graph(mod: tvm.IRModule) -> DataflowGraph:
    try:
        return DataflowGraph(mod["main"])
    except ValueError:
        pass
    try:
        return DataflowGraph(relax.transform.ConvertToDataflow(min_size=1)(mod)["main"])
    except ValueError as err:
        raise OptimizeError(f"main cannot be placed: {err}") from None


# -- assembly with its check --


def _reference(original, arrays, log: CostLog, key: str, target: str) -> list[np.ndarray]:
    """The unoptimized module's outputs on ``arrays``: from the log, else run on TVM and saved."""
    saved = log.get_reference(key)
    if saved is None:
        saved = numpy_outputs(_vm(original, target)["main"](*to_tensors(arrays, device_for(target))))
        log.put_reference(key, saved)
    return saved


def _placements(graph, candidates, costs, usable) -> dict[str, Placement]:
    """The op-level DP's placement, and for each inference engine the placement of its
    largest regions with TVM for the rest (what that engine alone would run), when different."""
    placements = {"op-level": place(graph, candidates, costs, costs.transition_ms)}
    tvm_only = [c for c in candidates if c.backend == REFERENCE_BACKEND]
    for backend in usable:
        regions = [c for c in candidates if c.backend == backend.name and c.pattern == f"{backend.name}.region"]
        if backend.kind != GRAPH_LEVEL or not regions:
            continue
        alone = place(graph, regions + tvm_only, costs, costs.transition_ms)
        if all(_parts(alone) != _parts(p) for p in placements.values()):
            placements[f"{backend.name} regions"] = alone
    return placements


def _parts(placement: Placement) -> set:
    return {(p.backend, p.nodes) for p in placement}


def _assemble_and_check(graph, placement: Placement, expected, arrays, backends, target):
    """Assemble, compile and compare with the unoptimized module's ``expected`` outputs on
    ``arrays``. Partitions that fail to compile, or whose kernels disagree with TVM inside
    the model, fall back to TVM, and the check repeats. Returns the assembly, its VM, the
    partitions it runs and the fallbacks with their reasons."""
    device = device_for(target)
    partitions = list(placement.partitions)
    fallbacks: list[tuple[Partition, str]] = []
    for _ in range(MAX_CHECK_ROUNDS):
        try:
            assembly = assemble(graph, partitions, backends, target)
        except PartitionFailed as failed:
            fallbacks.append((failed.partition, failed.reason))
            partitions = _fall_back(graph, partitions, [failed.partition])
            continue
        vm = _vm(assembly.module, target)
        problem = mismatch(numpy_outputs(vm["main"](*to_tensors(arrays, device))), expected, rtol=END_TO_END_RTOL)
        if problem is None:
            return assembly, vm, partitions, fallbacks
        culprits = _culprits(graph, assembly, arrays, target) or [p for p, _, _ in assembly.kernels]
        fallbacks += [(p, f"wrong inside the assembled model ({problem})") for p in culprits]
        partitions = _fall_back(graph, partitions, culprits)
    raise OptimizeError(f"the assembled module still disagrees with the unoptimized one: {problem}")


def _fall_back(graph, partitions, failing) -> list[Partition]:
    """``failing`` partitions replaced by their ops, one by one on TVM (inline, so TVM's own
    fusion regroups them)."""
    out = []
    for p in partitions:
        if any(p is f for f in failing):
            out += [_on_tvm(graph, i, "tvm.fallback") for i in sorted(p.nodes)]
        else:
            out.append(p)
    return out


def _on_tvm(graph, node: int, pattern: str) -> Partition:
    """One op inline on TVM, never measured on its own."""
    return Partition(Candidate(SubGraph(graph, frozenset({node})), REFERENCE_BACKEND, pattern), Cost.unknown())


def _culprits(graph, assembly, arrays, target) -> list[Partition]:
    """The partitions outside TVM whose kernels, fed TVM's values for their inputs, disagree
    with TVM's values for their outputs."""
    needed = sorted({i for p, _, _ in assembly.kernels for i in (*p.candidate.subgraph.input_nodes, *p.candidate.subgraph.outputs)})
    on_tvm = [_on_tvm(graph, i, "tvm.reference") for i in range(len(graph))]
    probe = assemble(graph, on_tvm, BackendSet(), target, returns=needed).module
    values = dict(zip(needed, numpy_outputs(_vm(probe, target)["main"](*to_tensors(arrays, device_for(target))))))
    params = {p: a for p, a in zip(graph.func.params, arrays)}
    culprits = []
    for part, _, kernel in assembly.kernels:
        sub = part.candidate.subgraph
        feed = [params[v] if v in params else values[graph.index_of_var[v]] for v in sub.arguments()]
        try:
            got = run_kernel(kernel, sub.extract(), feed, device_for(target))
        except Exception:  # a kernel that raises inside the model is as wrong as a wrong one
            culprits.append(part)
            continue
        if mismatch(got, [values[i] for i in sub.outputs]) is not None:
            culprits.append(part)
    return culprits


# -- running --


def _vm(mod: tvm.IRModule, target: str) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, target=target), device_for(target))


def _to_numpy(result):
    if isinstance(result, tvm.runtime.Tensor):
        return result.numpy()
    return tuple(_to_numpy(r) for r in result)
