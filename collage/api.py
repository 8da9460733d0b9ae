"""``collage.optimize``: the only place where the stages are wired together.

    simplify -> DataflowGraph -> candidates -> measured costs (cost log) -> DP placement
             -> assembled module -> checked against the unoptimized module -> OptimizedModule
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .assemble import Assembly, PartitionFailed, assemble
from .backend import GRAPH_LEVEL, REFERENCE_BACKEND, Backend, BackendSet, default_backends
from .candidates import REGION_SUFFIX, generate
from .cost import Cost
from .cost_log import CostLog
from .end_to_end import EndToEnd, wrong_result
from .graph import DataflowGraph
from .measure import Measurer, default_threads, pin_threads
from .placement import Partition, Placement, PlacementError, place, tvm_op
from .refine import refine
from .report import backend_totals, format_report
from .runner import build_vm, device_for, mismatch, numpy_outputs, random_inputs, run_kernel, static_shape, to_tensors
from .simplify import SimplifyReport
from .simplify import simplify as simplify_module
from .timing import Timing, time_interleaved

TARGETS = ("llvm", "cuda")
MAX_CHECK_ROUNDS = 3
# Finalists are timed in samples of at least 50 ms, each after a quiet pause (time_interleaved),
# so what switching modules costs (caches, threads waking) is spread thin: Inception-v3's
# op-level placement measured 32.5 ms in 5 ms samples, 29.7 ms in 50 ms ones and 29.8 ms alone.
FINALIST_TIMING = {"rounds": 9, "min_sample_ms": 50.0}
# Names of finalists (placements timed end to end against each other).
OP_LEVEL_PLACEMENT = "op-level"
KERNELS_ONLY_PLACEMENT = "op-level, kernels only"  # the DP without engine regions: the graph-level search's start


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
        totals = backend_totals(self.placement)
        all_ms = sum(t.ms for t in totals.values()) or 1.0
        return {backend: t.ms / all_ms for backend, t in totals.items()}

    def report(self) -> str:
        return format_report(self)

    def save_placement(self, path):
        """Write the placement as JSON (``collage.saved``), for ``collage.load_placement`` and
        ``collage run`` to rebuild this module without measuring; returns the path."""
        from .saved import save_placement

        return save_placement(self, path)

    def draw(self, path):
        """Draw the graph with each partition in its backend's colour (``collage.draw``): DOT
        for ``.dot``, rendered by Graphviz for ``.svg``/``.png``/``.pdf``; returns the path."""
        from .draw import draw

        return draw(self, path)


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
    graph_level: bool = False,
    budget_s: float = 600.0,
    patience: int = 5,
) -> OptimizedModule:
    """Place every operator of ``mod``'s ``main`` on the backend where it runs fastest here.

    ``mod`` is a Relax IRModule with static shapes; weights are bound as constants, or given
    as ``params`` (name -> array) to bind. ``backends`` defaults to every registered backend
    (a BackendSet, or backends and backend names); those that cannot run here are left out
    with their reason (``opt.excluded``). Costs are read from and written to ``cost_log`` (a
    CostLog or a path; default ``~/.cache/collage/costs.sqlite`` or ``$COLLAGE_COST_LOG``).
    Every backend runs on ``threads`` threads (default: the cores this process may use).
    ``simplify`` runs ``collage.simplify`` first. ``graph_level`` then refines the op-level
    placement by an evolutionary search over what to hand to an inference engine, measuring
    each placement end to end, for ``budget_s`` seconds or until the best has not improved for
    ``patience`` generations. Raises ``OptimizeError`` for input it cannot handle; a failing
    backend candidate is excluded with its reason and never raises.
    """
    started = time.perf_counter()
    stats: dict = {"seed": seed}
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
        placements, alone = _placements(graph, candidates, measurer, usable, graph_level)
    except PlacementError as err:  # an operator no backend (not even TVM) could run
        raise OptimizeError(str(err)) from None
    stats["place_s"] = time.perf_counter() - t
    stats["exact"] = all(p.exact for p in placements.values())

    t = time.perf_counter()
    arrays = random_inputs(original["main"], seed)
    expected = _reference(original, arrays, log, seed, target)
    built = {
        name: _assemble_and_check(graph, placement, expected, arrays, backend_set, target)
        for name, placement in placements.items()
    }
    stats["assemble_s"] = time.perf_counter() - t

    if graph_level:
        t = time.perf_counter()
        engines = [b for b in usable if b.kind == GRAPH_LEVEL and b.rules]
        if engines:
            end_to_end = EndToEnd(graph, BackendSet(usable), target, arrays, expected, log,
                                  f"{tvm_ffi.structural_hash(prepared):x} {target}", threads)
            engine = _best_engine(engines, alone, built, arrays, target)
            start = KERNELS_ONLY_PLACEMENT if KERNELS_ONLY_PLACEMENT in built else OP_LEVEL_PLACEMENT
            refinement = refine(built[start][2], engine, end_to_end, budget_s=budget_s, patience=patience,
                                seed=seed, progress=progress)
            stats["graph_level"] = refinement.summary()
            end_to_end.release()
            # The search's starting point is timed already. Timed in alternation with the
            # finalists, its many small kernels of several libraries would slow them: oneDNN and
            # OpenVINO alternating cost Inception-v3's OpenVINO placement 14% (27.7 -> 31.7 ms).
            if start == KERNELS_ONLY_PLACEMENT:
                del placements[start], built[start]
                gc.collect()
            for k, (partitions, _) in enumerate(refinement.leaders):
                name = f"graph-level #{k + 1}"
                placements[name] = Placement(graph, _priced(partitions, measurer))
                built[name] = (*end_to_end.build(partitions, fresh=True), list(placements[name].partitions), [])
        else:
            stats["graph_level"] = {"skipped": "no usable inference engine (graph-level backend) to offload to"}
        stats["graph_level_s"] = time.perf_counter() - t

    # The additive model misses what kernels do to each other (threads handed over, caches
    # emptied), so the op-level answer, each engine's own regions and the graph-level leaders
    # are timed end to end, in alternation, and the fastest is kept.
    measured = _time_finalists(built, {name: name for name in built}, arrays, target)
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


def _reference(original, arrays, log: CostLog, seed: int, target: str) -> list[np.ndarray]:
    """The unoptimized module's outputs on ``arrays`` (drawn with ``seed``): from the log, else
    run on TVM and saved."""
    key = f"{tvm_ffi.structural_hash(original):x} seed {seed} {target}"
    saved = log.get_reference(key)
    if saved is None:
        saved = numpy_outputs(build_vm(original, target)["main"](*to_tensors(arrays, device_for(target))))
        log.put_reference(key, saved)
    return saved


def _placements(graph, candidates, costs, usable, graph_level: bool) -> tuple[dict[str, Placement], dict[str, str]]:
    """The finalists: the op-level DP's placement, and for each inference engine the placement
    of its largest regions with TVM for the rest (what that engine alone would run). With
    ``graph_level``, also the DP's placement over kernel-sized candidates only (no regions),
    where the graph-level search starts. Equal placements are kept once; the second result
    names, for each engine, the finalist that is its own-regions placement."""
    placements: dict[str, Placement] = {}

    def add(name: str, placement: Placement) -> str:
        same = next((other for other, p in placements.items() if _parts(p) == _parts(placement)), None)
        if same is None:
            placements[name] = placement
        return same or name

    add(OP_LEVEL_PLACEMENT, place(graph, candidates, costs, costs.transition_ms))
    if graph_level:
        kernels = [c for c in candidates if not c.pattern.endswith(REGION_SUFFIX)]
        add(KERNELS_ONLY_PLACEMENT, place(graph, kernels, costs, costs.transition_ms))
    tvm_only = [c for c in candidates if c.backend == REFERENCE_BACKEND]
    alone = {}
    for backend in usable:
        regions = [c for c in candidates if c.backend == backend.name and c.pattern == f"{backend.name}{REGION_SUFFIX}"]
        if backend.kind == GRAPH_LEVEL and regions:
            alone[backend.name] = add(f"{backend.name} regions", place(graph, regions + tvm_only, costs, costs.transition_ms))
    return placements, alone


def _best_engine(engines, alone: dict[str, str], built, arrays, target):
    """The inference engine to refine with: the one whose own-regions placement runs the model
    fastest (timed here in alternation), else the first."""
    timed = {e.name: alone[e.name] for e in engines if e.name in alone}
    if len(set(timed.values())) < 2:
        return next((e for e in engines if e.name in timed), engines[0])
    times = _time_finalists(built, timed, arrays, target)
    fastest = min(times, key=lambda e: times[e].median_ms)
    return next(e for e in engines if e.name == fastest)


def _time_finalists(built, names: dict[str, str], arrays, target) -> dict[str, Cost]:
    """End-to-end cost of each built finalist (``names``: label -> finalist), timed in
    alternation on ``arrays``."""
    inputs = to_tensors(arrays, device_for(target))
    calls = {label: functools.partial(built[name][1]["main"], *inputs) for label, name in names.items()}
    return time_interleaved(calls, **FINALIST_TIMING)


def _priced(partitions, measurer) -> tuple[Partition, ...]:
    """``partitions`` with the measured cost of each one not measured yet (the engine
    partitions the search formed; most single TVM ops are in the log already)."""
    return tuple(
        Partition(p.candidate, measurer.cost(p.candidate), measurer.transition_ms(p.backend)) if p.cost.is_unknown else p
        for p in partitions
    )


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
    checks = 0
    while True:
        try:
            assembly = assemble(graph, partitions, backends, target)
        except PartitionFailed as failed:
            # Not a check round: each failure sends one more partition to TVM, so this ends.
            fallbacks.append((failed.partition, failed.reason))
            partitions = _fall_back(graph, partitions, [failed.partition])
            continue
        vm = build_vm(assembly.module, target)
        problem = wrong_result(vm, to_tensors(arrays, device), expected)
        if problem is None:
            return assembly, vm, partitions, fallbacks
        checks += 1
        if checks == MAX_CHECK_ROUNDS:
            raise OptimizeError(f"the assembled module still disagrees with the unoptimized one: {problem}")
        culprits = _culprits(graph, assembly, arrays, target) or [p for p, _, _ in assembly.kernels]
        fallbacks += [(p, f"wrong inside the assembled model ({problem})") for p in culprits]
        partitions = _fall_back(graph, partitions, culprits)


def _fall_back(graph, partitions, failing) -> list[Partition]:
    """``failing`` partitions replaced by their ops, one by one on TVM (inline, so TVM's own
    fusion regroups them)."""
    out = []
    for p in partitions:
        if any(p is f for f in failing):
            out += [tvm_op(graph, i, "tvm.fallback") for i in sorted(p.nodes)]
        else:
            out.append(p)
    return out


def _culprits(graph, assembly, arrays, target) -> list[Partition]:
    """The partitions outside TVM whose kernels, fed TVM's values for their inputs, disagree
    with TVM's values for their outputs."""
    needed = sorted({i for p, _, _ in assembly.kernels for i in (*p.candidate.subgraph.input_nodes, *p.candidate.subgraph.outputs)})
    on_tvm = [tvm_op(graph, i, "tvm.reference") for i in range(len(graph))]
    probe = assemble(graph, on_tvm, BackendSet(), target, returns=needed).module
    values = dict(zip(needed, numpy_outputs(build_vm(probe, target)["main"](*to_tensors(arrays, device_for(target))))))
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


def _to_numpy(result):
    if isinstance(result, tvm.runtime.Tensor):
        return result.numpy()
    return tuple(_to_numpy(r) for r in result)
