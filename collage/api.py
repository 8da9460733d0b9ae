"""``collage.optimize`` and ``collage.load_placement``: the only place where the stages are wired together.

    optimize:        prepare (bind, simplify, inputs, reference) -> DataflowGraph -> candidates
                     -> measured costs (cost log) -> DP placement -> finalists, each assembled and
                     checked against the unoptimized module -> timed against each other -> OptimizedModule
    load_placement:  prepare -> DataflowGraph -> the saved partitions, costs from the log
                     -> assembled and checked -> timed -> OptimizedModule
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import tvm
import tvm_ffi

from .assembling.caller import time_call_paths
from .assembling.checked import END_TO_END_RTOL, Finalist, as_tvm_runs_it, assemble_and_check
from .candidates.backend import GRAPH_LEVEL, REFERENCE_BACKEND, Backend, BackendSet
from .candidates.generate import generate, in_precisions
from .candidates.precision import FLOAT32, reduced
from .config import Config
from .deploying.optimized import OptimizedModule
from .deploying.report import dominant_tvm_ops
from .deploying.saved import (LoggedCosts, PlacementFileError, PlacementWarning, check_backends, partitions_of,
                              read_placement)
from .placing.recorded import check_model, module_hash, replay_substitutions
from .errors import OptimizeError
from .measuring.cost import Cost, Device
from .measuring.cost_log import CostLog
from .measuring.runner import MeasureRunner
from .measuring.measure import Measurer
from .measuring.meters import EnergyMeter, NoEnergyMeter, energy_meter
from .measuring.rpc_runner import GRACE_S, FleetError
from .measuring.build import is_cuda, kernel_backends, module_cuda_graph_blocker
from .measuring.threads import pin_threads
from .measuring.timing import Timing
from .model.frontend import ModelImportError, import_model
from .prepare import Model, Unplaceable, dataflow_graph, onnx_proto, prepare_model, simplification_changed
from .choosing.end_to_end import EndToEnd
from .choosing.engine_alone import EngineAloneFailed, blockers, blockers_text, checked_on_file
from .choosing import confirm, elsewhere
from .choosing import policy
from .choosing.finalists import Timed, choose, time_finalists
from .placing.objective import Objective
from .placing.placement import Partition, Placement, PlacementError
from .placing.refine import refine
from .placing.substitute import DEFAULT_RULES as SUBSTITUTIONS
from .placing.substitute import SearchResult
from .placing.substitute import search_in_pieces as search_substitutions
from .placing.substitute.placement_cost import PlacementCost
from .record import (AS_GIVEN, KERNELS_ONLY, OP_LEVEL, OP_LEVEL_REDUCED, SAVED, SUBSTITUTED, UNPLACED, FinalistKind,
                     FinalistName, FinalistResult, RunRecord)


def optimize(
    mod: tvm.IRModule,
    target: str = "llvm",
    backends: BackendSet | Iterable[Backend | str] | None = None,
    cost_log: CostLog | str | None = None,
    *,
    params: Mapping | None = None,
    onnx_model: onnx.ModelProto | str | os.PathLike | None = None,
    example_inputs=None,
    shapes: Mapping[str, Iterable[int]] | None = None,
    threads: int | None = None,
    simplify: bool = True,
    timing: Timing = Timing(),
    progress: bool = True,
    seed: int = 0,
    graph_level: bool = False,
    budget_s: float = 600.0,
    patience: int = 5,
    runner: MeasureRunner | None = None,
    substitutions: bool = False,
    alpha: float = 1.05,
    substitution_budget_s: float = 120.0,
    objective: str | Objective = "time",
    meter: EnergyMeter | None = None,
    accuracy: float | None = None,
    calibration: Iterable | None = None,
) -> OptimizedModule:
    """Place every operator of ``mod``'s ``main`` on the backend where it runs fastest here.

    ``mod`` is a Relax IRModule with static shapes (``shapes``, input name -> shape, fixes
    symbolic ones), whose ``main`` is placed (or its one function, as ``relax.frontend.nn``'s
    ``export_tvm`` names it, placed as ``main``); weights are bound as constants, or given as
    ``params`` (input name -> array) to bind. Weights a TVM importer kept as inputs
    (``keep_params_as_input``) are bound from main's ``params`` attribute, or from ``params``
    as ``relax.frontend.detach_params`` detached them. ``onnx_model`` is the ONNX model (or
    file) ``mod`` was imported from, if any: each inference engine then also runs it whole, as
    its users would, among the finalists. ``mod`` may also be a model still to import
    (``collage.model.frontend.import_model``): an ONNX file or ``onnx.ModelProto`` (``shapes``, input
    name -> shape, fixes dynamic inputs), which is then the ``onnx_model`` too; or a
    ``torch.nn.Module`` in eval mode with ``example_inputs`` (a tensor or a tuple of them),
    whose ``torch.onnx.export`` is then the ``onnx_model``, as its users would export it for an
    engine, and which an engine that compiles PyTorch (inductor) compiles whole, as
    ``torch.compile`` of it runs. ``backends`` defaults to every registered backend (a
    BackendSet, or backends and backend names); those that cannot run here are left out with
    their reason (``opt.excluded``). Costs are read from and written to ``cost_log`` (a
    CostLog or a path; default ``~/.cache/collage/costs.sqlite`` or ``$COLLAGE_COST_LOG``).
    Every backend runs on ``threads`` threads (default: the cores this process may use).
    Candidates are measured on ``runner`` (``collage.measuring.isolation``): by default in a worker
    process, so a library that crashes or hangs on one candidate costs that candidate only;
    ``runner.InProcess()`` measures here, without that safety; ``collage.RPCRunner(tracker,
    key)`` on every measuring server (``collage serve``) registered under ``key`` with a TVM
    RPC tracker, several candidates at once, with costs logged under the servers' device.
    ``simplify`` runs ``collage.simplify`` first. ``graph_level`` then refines the op-level
    placement by an evolutionary search over what to hand to an inference engine, measuring
    each placement end to end, for ``budget_s`` seconds or until the best has not improved for
    ``patience`` generations. ``substitutions`` searches semantics-preserving graph rewrites
    (``collage.placing.substitute``: parallel operators merged, linear ones folded) jointly with the
    placement, by MetaFlow's backtracking search relaxed by ``alpha``, for at most
    ``substitution_budget_s`` seconds; the best graph's placement joins the finalists beside
    the unsubstituted one. The search minimizes ``objective``: "time", "energy", "power" or
    a weighted sum ("0.5*time+0.5*energy", ``substitute.Objective``); energy is read from
    ``meter``, by default this machine's (``collage.measuring.meters``: RAPL, NVML), and an objective
    that needs energy where there is no meter is an ``OptimizeError`` saying why. The
    finalists (collage.choosing.finalists) are timed against each other (and metered, for an objective
    that weighs energy) and the best under ``objective`` kept, the simplest among those within
    noise. ``accuracy`` (None: float32 everywhere, as without it) is the largest error the
    user accepts in each output, relative to that output's largest magnitude in the
    unoptimized model (``runner.relative_error``; 1e-2 is 1%): backends that compute in a
    reduced precision natively here (OpenVINO in bfloat16 on CPUs with AVX512_BF16 or AMX)
    then offer every candidate in it too, and a placement using them is kept only if its
    measured error, on the seeded inputs and on a second draw, is within it; ``calibration``
    (input sets, each a sequence of arrays in ``main``'s parameter order or a mapping from
    input name to array) replaces the second draw with inputs the user knows to be typical.
    Raises ``OptimizeError`` for
    input it cannot handle; a failing backend candidate is excluded with its reason and never
    raises.
    """
    config = Config(
        target=target, threads=threads or 0, seed=seed, simplify=simplify, timing=timing, progress=progress,
        graph_level=graph_level, budget_s=budget_s, patience=patience, substitutions=substitutions, alpha=alpha,
        substitution_budget_s=substitution_budget_s, objective=objective, runner=runner, accuracy=accuracy,
    )  # fmt: skip
    return optimize_with(config, mod, backends, cost_log, params=params, onnx_model=onnx_model,
                         example_inputs=example_inputs, shapes=shapes, meter=meter, calibration=calibration)  # fmt: skip


def optimize_with(
    config: Config,
    mod,
    backends: BackendSet | Iterable[Backend | str] | None = None,
    cost_log: CostLog | str | None = None,
    *,
    params: Mapping | None = None,
    onnx_model: onnx.ModelProto | str | os.PathLike | None = None,
    example_inputs=None,
    shapes: Mapping[str, Iterable[int]] | None = None,
    meter: EnergyMeter | None = None,
    calibration: Iterable | None = None,
) -> OptimizedModule:
    """``optimize`` with its settings made once (``collage.config``): what the command line
    and the torch.compile backend call."""
    started = time.perf_counter()
    target, threads, seed = config.target, config.threads, config.seed
    record = RunRecord(seed=seed, objective=config.objective)
    seconds = record.seconds

    def stage(what: str) -> None:  # a line per long stage, so a long optimization never looks stuck
        if config.progress:
            print(f"collage: {what} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    if calibration is not None and config.accuracy is None:
        raise OptimizeError("calibration inputs serve an accuracy budget: pass accuracy= too, or leave them out")
    objective, meter = config.objective, _energy_meter(config, meter)
    pin_threads(threads)
    try:
        imported = import_model(mod, example_inputs, shapes)
    except ModelImportError as err:
        raise OptimizeError(str(err)) from None
    onnx_model = imported.onnx_model if onnx_model is None else onnx_model
    if imported.onnx_note is not None and onnx_model is None:
        record.left_out["torch's ONNX export"] = imported.onnx_note
    if imported.program_note is not None:
        record.left_out["torch.export's program"] = imported.program_note
    stage("preparing")
    record.optimized_for, record.not_here = _device_optimized_for(config)
    program, module = imported.program, imported.module
    if program is not None and record.optimized_for is not None:
        record.left_out["the PyTorch module compiled whole"] = "a PyTorch program is not sent to the fleet"
        program = module = None
    model = prepare_model(config, imported.mod, backends, cost_log, params, onnx_model, calibration, program, module)
    record.calibration_sets = len(model.calibration)
    original, prepared, usable, backend_set, log = model.original, model.prepared, model.usable, model.backends, model.log
    record.simplify_failed, record.rewritten = model.simplify_failed, model.rewritten
    if imported.not_imported is not None:
        record.not_imported, record.chosen = imported.not_imported, AS_GIVEN
        return _unplaced(model, config, record, started, engines=True)
    try:
        graph = dataflow_graph(prepared)
    except Unplaceable as err:
        record.unplaced, record.unplaced_hash, record.chosen = str(err), module_hash(prepared), UNPLACED
        return _unplaced(model, config, record, started)

    race = functools.partial(_race, model=model, config=config, meter=meter, record=record)
    seconds.prepare = time.perf_counter() - started
    t = time.perf_counter()
    candidates = generate(graph, usable, record.capped)
    offered = policy.reduced_precisions(usable, config, record)
    candidates = in_precisions(candidates, offered)
    record.candidates = len(candidates)
    seconds.generate = time.perf_counter() - t

    t = time.perf_counter()
    measurer = Measurer(BackendSet(usable), config, log, meter)
    measurer.measure_all(candidates, progress=config.progress)
    record.measured, record.compiled_ahead = measurer.measured, measurer.warmed
    record.measuring_by_backend, record.values_s = dict(measurer.seconds_by_backend), measurer.values_s
    record.compiling_by_backend = dict(measurer.compile_s_by_backend)
    record.skipped, record.timed_out = dict(Counter(measurer.skipped.values())), measurer.timed_out
    record.timed_once = measurer.timed_once
    if measurer.flushes_cache(graph):
        record.cache_flushed = (f"the model's weights and inputs ({graph.input_bytes / 1e6:.0f} MB) exceed the GPU's "
                                f"{measurer.cache_bytes / 1e6:.0f} MB cache, which each candidate then found flushed "
                                "before each call, as inside the model")  # fmt: skip
    record.distinct = len({measurer.key(c) for c in candidates})
    seconds.measure = time.perf_counter() - t

    substituted = None
    if config.substitutions:
        t = time.perf_counter()
        stage("searching graph substitutions")
        substituted = _search_substitutions(prepared, measurer, usable, config, record)
        seconds.substitute = time.perf_counter() - t

    t = time.perf_counter()
    stage("placing")
    try:
        missed = {}  # engines alone over the budget when measured, for within_budget to split
        placements, alone = policy.placements(graph, candidates, measurer, usable, config.graph_level, offered,
                                              record.left_out, missed)  # fmt: skip
    except PlacementError as err:  # an operator no backend (not even TVM) could run
        raise OptimizeError(_why_unplaced(err, graph, candidates, measurer)) from None
    seconds.place = time.perf_counter() - t
    record.interplays = {f"{a} and {b}": ms for (a, b), ms in measurer.interplays().items()}
    record.interplay_s = measurer.interplay_s
    record.exact = all(p.exact for p in placements.values())
    engines = [b for b in usable if b.kind == GRAPH_LEVEL and b.rules]
    record.engine_blockers = {e.name: blockers_text(e.name, found) for e in engines if (found := blockers(graph, e))}

    t = time.perf_counter()
    stage(f"assembling and checking {len(placements)} placement(s)")
    reference = model.reference
    finalists = {}
    for name, placement in placements.items():
        with _seconds_into(record.assembled_s, str(name)):
            try:
                # Reduced-precision placements are held to the budget below, as whole modules.
                finalists[name] = assemble_and_check(graph, placement, reference, backend_set, target, threads,
                                                     config.accuracy, held_to_budget=config.accuracy is not None)  # fmt: skip
            except OptimizeError as err:  # wrong even on TVM: the others may be right
                record.left_out[str(name)] = f"{name} left out: {err}"
    if OP_LEVEL in placements and OP_LEVEL not in finalists:
        # Wrong with every kernel on TVM: where the simplified model itself computes something
        # else, a simplification is at fault, and the model is placed as given instead.
        changed = simplification_changed(model, END_TO_END_RTOL)
        if changed is not None:
            again = optimize_with(dataclasses.replace(config, simplify=False), mod, backends, cost_log, params=params,
                                  onnx_model=onnx_model, example_inputs=example_inputs, shapes=shapes, meter=meter,
                                  calibration=calibration)  # fmt: skip
            again.record.simplify_failed = f"simplification changed the model's outputs ({changed}): the model is placed as given"
            return again
    for engine, name in alone.items():
        # An engine alone that had to fall back is no longer that engine alone (and all-TVM
        # placements of a large model take seconds a call to time).
        if name.kind is FinalistKind.ENGINE_ALONE and name in finalists and finalists[name].fallbacks:
            record.left_out[engine] = f"{engine} alone fell back to tvm: {finalists.pop(name).fallbacks[0][1]}"
    for name in [n for n in finalists if n.precision != FLOAT32 or n == OP_LEVEL_REDUCED]:
        # A reduced-precision placement whose every reduced partition fell back is float32:
        # another finalist already (and all-TVM placements of a large model are slow to time).
        if not reduced(finalists[name].partitions):
            fallbacks = finalists.pop(name).fallbacks
            why = f"fell back to float32: {fallbacks[0][1]}" if fallbacks else "uses no reduced-precision candidate"
            record.left_out[str(name)] = f"{name} {why}"
    if substituted is not None:
        with _seconds_into(record.assembled_s, str(SUBSTITUTED)):
            finalists[SUBSTITUTED] = _substituted_finalist(substituted, measurer, usable, reference, backend_set, config)
    if model.onnx_model is not None:
        stage("running the ONNX file on each engine")
        with _seconds_into(record.assembled_s, "the engines on the ONNX file"):
            finalists.update(policy.engines_on_file(original, graph, usable, model.onnx_model, reference, config,
                                                    offered, record.left_out))  # fmt: skip
    if model.program is not None or model.module is not None:
        with _seconds_into(record.assembled_s, "the engines on the PyTorch module"):
            finalists.update(policy.engines_on_program(original, graph, usable, model.program, model.module, reference,
                                                       config, offered, record.left_out))  # fmt: skip
    if not finalists:
        raise OptimizeError("no finalist is left: " + "; ".join(record.left_out.values()))
    errors = {}
    if config.accuracy is not None:
        repair = functools.partial(policy.repair, graph=graph, costs=measurer, backends=backend_set, config=config)
        with _seconds_into(record.assembled_s, "holding them to the budget"):
            errors = policy.within_budget(finalists, model, config, record, repair, missed)
    seconds.assemble = time.perf_counter() - t

    if config.graph_level:
        t = time.perf_counter()
        start = KERNELS_ONLY if KERNELS_ONLY in finalists else OP_LEVEL
        if engines and start in finalists:
            end_to_end = EndToEnd(graph, BackendSet(usable), target, reference, log,
                                  f"{tvm_ffi.structural_hash(prepared):x} {target}", threads)
            engine = policy.best_engine(engines, alone, finalists, race)
            refinement = refine(finalists[start].partitions, engine, end_to_end, budget_s=config.budget_s,
                                patience=config.patience, seed=seed, progress=config.progress)
            record.graph_level = refinement.summary()
            end_to_end.release()
            # The search's starting point is timed already. Timed in alternation with the
            # finalists, its many small kernels of several libraries would slow them: oneDNN and
            # OpenVINO alternating cost Inception-v3's OpenVINO placement 14% (27.7 -> 31.7 ms).
            if start == KERNELS_ONLY:
                del finalists[start]
                gc.collect()
            for k, (partitions, _) in enumerate(refinement.leaders):
                priced = _priced(partitions, measurer)
                assembly, vm = end_to_end.build(priced, fresh=True)
                finalists[FinalistName(FinalistKind.GRAPH_LEVEL, rank=k + 1)] = Finalist(list(priced), assembly, vm, sum(p.cost_ms for p in priced))
        elif engines:
            record.graph_level = {"skipped": f"no placement to start from: {record.left_out.get(str(start), start)}"}
        else:
            record.graph_level = {"skipped": "no usable inference engine (graph-level backend) to offload to"}
        seconds.graph_level = time.perf_counter() - t

    t = time.perf_counter()
    stage(f"timing {len(finalists)} finalist(s) against each other" + (" on the fleet" if record.optimized_for else ""))
    steps = {SUBSTITUTED: [list(step) for step in substituted.applied]} if SUBSTITUTED in finalists else {}
    timed = race(finalists, steps)
    measured = timed.costs
    record.others_busy_cores, record.timing_attempts = timed.others_busy_cores, timed.attempts
    chosen, note = choose(measured, {name: f.simplicity for name, f in finalists.items()}, objective, timed.race)
    if objective.is_time and timed.race is not None and record.optimized_for is None:
        chosen, note = _confirmed(chosen, note, finalists, timed.race, steps, model, config, record)
    seconds.final_timing = time.perf_counter() - t
    verdicts = timed.race.verdicts() if timed.race is not None else {}
    record.finalists = {
        name: FinalistResult(f.estimated_ms, measured[name], timed.race.paid_ms(name), verdicts[name].value, errors.get(name))
        if name in verdicts else FinalistResult(f.estimated_ms, measured[name], error=errors.get(name))
        for name, f in finalists.items()
    }  # fmt: skip
    record.chosen, record.tie = chosen, note
    if chosen == SUBSTITUTED:
        record.substituted = [list(step) for step in substituted.applied]  # how to rebuild its graph
    return _optimized_module(model, config, finalists[chosen], measured[chosen], record, started)


@contextlib.contextmanager
def _seconds_into(seconds: dict[str, float], name: str):
    """``seconds[name]``: how long the block took (``RunRecord.assembled_s``)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = time.perf_counter() - started


def _confirmed(chosen: FinalistName, note: str | None, finalists: dict, race, steps: dict, model: Model, config: Config,
               record: RunRecord) -> tuple[FinalistName, str | None]:  # fmt: skip
    """``chosen`` raced again against the close runners-up, each in a fresh process
    (``choosing.confirm``); the fastest of them when it was faster there."""
    others = confirm.runners_up(race, finalists, chosen)
    if not others:
        return chosen, note
    needless = confirm.needless(finalists, (chosen, *others), config.target, model.backends)
    if needless is not None:
        record.confirmation = f"not raced again in fresh processes: {needless}"
        return chosen, note
    file = model.onnx_model if any(n.kind is FinalistKind.ENGINE_ON_FILE for n in (chosen, *others)) else None
    request = functools.partial(confirm.request_for, finalists=finalists, module=model.prepared, steps=steps,
                                onnx_model=file, reference=model.reference, target=config.target,
                                accuracy=config.accuracy)  # fmt: skip
    confirmation = confirm.confirm(finalists, chosen, others, request, config.threads, config.seed)
    record.confirmation = confirmation.line()
    if not confirmation.switched:
        return chosen, note
    return next(name for name in others if str(name) == confirmation.kept), None


def load_placement(
    mod: tvm.IRModule,
    path: str | os.PathLike,
    target: str | None = None,
    backends: BackendSet | Iterable[Backend | str] | None = None,
    cost_log: CostLog | str | None = None,
    *,
    params: Mapping | None = None,
    onnx_model: onnx.ModelProto | str | os.PathLike | None = None,
    threads: int | None = None,
    seed: int | None = None,
) -> OptimizedModule:
    """``mod`` placed as the file at ``path`` says (``collage.deploying.saved``), without measuring any
    candidate: the stages of ``optimize`` with the placement fixed and costs from the log.

    ``mod`` and ``params`` are what was given to ``optimize``; target, threads, simplification
    and seed default to the saved ones, ``backends`` to those the placement uses. Partition
    costs come from ``cost_log`` (unknown when the log lacks them: another machine, thread
    count or library version). The module is checked against the unoptimized one, as
    ``optimize`` does, and timed end to end. A placement that runs the user's ONNX file on one
    engine (pattern ``<engine>.model``) needs that file as ``onnx_model``. Raises
    ``PlacementFileError`` when the file does not fit ``mod``.
    """
    started = time.perf_counter()
    saved = read_placement(path)
    placement = saved.placement
    config = Config(target=target or saved.target, threads=threads or saved.threads,
                    seed=seed if seed is not None else saved.seed, simplify=saved.simplify,
                    accuracy=saved.accuracy)  # fmt: skip
    pin_threads(config.threads)
    here = Device.this_machine(config.threads, config.target)
    made_for = Device(saved.device or here.name, saved.threads)
    if made_for != here:
        warnings.warn(f"{path}: placed for {made_for}, rebuilt on {here}: it runs, but its placement was measured "
                      "there; optimize again here for the fastest", PlacementWarning, stacklevel=2)  # fmt: skip
    model = prepare_model(config, mod, backends if backends is not None else saved.backends, cost_log, params)
    record = RunRecord(seed=config.seed, objective=config.objective, chosen=SAVED, accuracy=config.accuracy)
    if placement.model.unplaced is not None:
        if placement.model.hash != module_hash(model.prepared):
            raise PlacementFileError(f"{path}: placement was made for another model (hash {placement.model.hash})")
        record.unplaced, record.unplaced_hash, record.chosen = placement.model.unplaced, placement.model.hash, UNPLACED
        return _unplaced(model, config, record, started)
    graph = dataflow_graph(replay_substitutions(model.prepared, placement, path))
    check_model(graph, placement, path)
    check_backends(placement, model.backends, model.excluded, path)
    costs = LoggedCosts(Measurer(BackendSet(model.usable), config, model.log))
    partitions = partitions_of(graph, placement, costs, path)
    if placement.runs_program:
        raise PlacementFileError(f"{path}: the placement compiles the user's PyTorch module whole on "
                                 f"{partitions[0].backend}, which a placement file does not hold; optimize the module "
                                 "again, or export the optimized module (collage.export), which holds it")  # fmt: skip
    if placement.runs_file:
        if onnx_model is None:
            raise PlacementFileError(f"{path}: the placement runs the model's ONNX file on {partitions[0].backend}; give that file")
        try:
            kept = checked_on_file(model.original, graph, model.backends[partitions[0].backend], onnx_proto(onnx_model),
                                   model.reference, config.target, config.threads,
                                   partitions[0].candidate.precision, config.accuracy)  # fmt: skip
        except EngineAloneFailed as err:
            raise PlacementFileError(f"{path}: {err}") from None
    else:
        kept = assemble_and_check(graph, Placement(graph, partitions), model.reference, model.backends,
                                  config.target, config.threads, config.accuracy)  # fmt: skip
        kept.estimated_ms = sum(p.cost_ms for p in kept.partitions if not math.isnan(p.cost_ms))
    # Timed as optimize times its finalists, so the two commands print comparable numbers.
    measured = time_finalists({SAVED: kept}, model.arrays, config.target).costs[SAVED]
    return _optimized_module(model, config, kept, measured, record, started)


def _unplaced(model: Model, config: Config, record: RunRecord, started: float, engines: bool = False) -> OptimizedModule:
    """A model with nothing to place, checked and timed as a finalist, as TVM alone runs it
    (on the fleet's device, when the model is optimized for another); with ``engines`` (a model
    TVM could not import, whose module stands in for it: ``model.as_given``), timed against
    each engine running the user's file or module whole, the fastest kept."""
    kept = as_tvm_runs_it(model.original, model.prepared, model.reference, config.target)
    finalists, simplicity = {record.chosen: kept}, {record.chosen: kept.simplicity}
    if engines:
        graph = dataflow_graph(model.original)
        finalists |= policy.engines_on_file(model.original, graph, model.usable, model.onnx_model, model.reference,
                                            config, {}, record.left_out) if model.onnx_model is not None else {}
        finalists |= policy.engines_on_program(model.original, graph, model.usable, None, model.module, model.reference,
                                               config, {}, record.left_out) if model.module is not None else {}
        if model.module is None and len(finalists) > 1:
            del finalists[record.chosen]  # the file unoptimized: where no engine runs it, and only there
        # A PyTorch module as given is PyTorch's kernels, one library as an engine's are, and
        # raced as its users run it; no simpler than an engine, and it does not export.
        simplicity = {name: f.simplicity for name, f in finalists.items()} | {record.chosen: (1, 1, 0)}
    timed = _race(finalists, module=kept.assembly.module, model=model, config=config, meter=None, record=record)
    record.chosen, record.tie = choose(timed.costs, {name: simplicity[name] for name in finalists}, config.objective,
                                       timed.race)  # fmt: skip
    record.finalists = {name: FinalistResult(f.estimated_ms, timed.costs[name]) for name, f in finalists.items()}
    return _optimized_module(model, config, finalists[record.chosen], timed.costs[record.chosen], record, started)


def _race(finalists: dict[FinalistName, Finalist], steps: dict | None = None, module: tvm.IRModule | None = None, *,
          model: Model, config: Config, meter: EnergyMeter | None, record: RunRecord) -> Timed:  # fmt: skip
    """The finalists timed against each other where the model will run: here, or, when the
    fleet measuring the candidates is another device (``record.optimized_for``), on one of its
    servers (``choosing.elsewhere``), each sent as its placement over ``module`` (default the
    prepared model; ``steps``: the substitutions of a finalist's graph). There, a finalist
    the server cannot build is dropped from ``finalists`` with why (``record.left_out``),
    and one whose partitions fell back to TVM there is rebuilt here as it ran there, so
    that what is kept is what was timed."""
    if record.optimized_for is None:
        return time_finalists(finalists, model.arrays, config.target, meter=meter)
    labels = {str(name): name for name in finalists}
    on_file = any(name.kind is FinalistKind.ENGINE_ON_FILE for name in finalists)
    data = elsewhere.request({str(name): f for name, f in finalists.items()}, module or model.prepared,
                             {str(name): s for name, s in (steps or {}).items()},
                             model.onnx_model if on_file else None, model.reference, config.target,
                             config.accuracy, metered=meter is not None)  # fmt: skip
    try:
        answer = elsewhere.answer_of(config.runner.call(elsewhere.FUNCTION, data, elsewhere.RACE_TIMEOUT_S + GRACE_S))
    except FleetError as err:
        raise OptimizeError(f"the finalists could not be timed on the fleet: {err}") from None
    record.timed_on = f"{answer.server.device} at {answer.server.address}"
    for label, why in answer.left_out.items():
        record.left_out[label] = f"{label} cannot run on {answer.server.name}: {why}"
        del finalists[labels[label]]
    if not finalists:
        raise OptimizeError(f"no finalist runs on {answer.server.device}: "
                            + "; ".join(f"{label}: {why}" for label, why in answer.left_out.items()))  # fmt: skip
    for label, entries in answer.ran.items():
        name = labels[label]
        finalists[name] = elsewhere.as_ran_there(finalists[name], entries, answer.server.name, model.reference,
                                                 model.backends, config.target, config.threads, config.accuracy)  # fmt: skip
    return answer.keyed(labels)


def _optimized_module(model: Model, config: Config, kept: Finalist, measured: Cost, record: RunRecord,
                      started: float) -> OptimizedModule:
    """The one place an ``OptimizedModule`` is made: the kept finalist, its end-to-end cost
    and the record of how it was found."""
    partitions, estimated_ms = kept.partitions, kept.estimated_ms
    if len(partitions) == 1 and not partitions[0].cost.is_valid:
        # An engine running the user's file: no candidate of it was measured, so its cost is
        # what it measured here, end to end.
        partitions = [dataclasses.replace(partitions[0], cost=measured)]
        estimated_ms = measured.median_ms
    record.warnings = model.warnings + dominant_tvm_ops(partitions)
    if is_cuda(config.target):  # as build.compile_module decided when it built kept.vm
        record.cuda_graph_off = module_cuda_graph_blocker(kept.assembly.module,
                                                          kernel_backends(kept.assembly, model.backends))
    opt = OptimizedModule(
        module=kept.assembly.module,
        placement=partitions,
        target=config.target,
        threads=config.threads,
        device=config.runner.fleet.device if record.optimized_for is not None else None,
        estimated_ms=estimated_ms,
        measured=measured,
        simplified=model.simplified,
        record=record,
        excluded=model.excluded,
        fallbacks=kept.fallbacks,
        _assembly=kept.assembly,
        _vm=kept.vm,
        _params=list(model.original["main"].params),
    )
    if record.optimized_for is None:  # the user's call is timed where it will run: here
        record.call_path = time_call_paths(opt.caller, model.arrays)
    record.seconds.total = time.perf_counter() - started
    return opt


def _device_optimized_for(config: Config) -> tuple[str | None, str | None]:
    """The fleet's device and how this machine differs from it, when the runner measures on
    another device than this one (``RPCRunner.elsewhere``); else (None, None)."""
    fleet = getattr(config.runner, "fleet", None)
    why = config.runner.elsewhere(config.threads, config.target) if fleet is not None else None
    return (str(fleet.device), why) if why is not None else (None, None)


def _energy_meter(config: Config, meter: EnergyMeter | None) -> EnergyMeter | None:
    """The energy meter ``config.objective`` needs: None for time alone, else ``meter`` or
    this machine's own; ``OptimizeError`` when there is none."""
    if config.objective.is_time:
        return None
    if meter is None:
        try:
            meter = energy_meter(config.target)
        except NoEnergyMeter as err:
            raise OptimizeError(f"objective {config.objective} needs an energy meter, and this machine has none: {err}") from None
    return meter


def _search_substitutions(prepared, measurer, usable, config: Config, record: RunRecord) -> SearchResult | None:
    """The substitution search over ``prepared``, priced by the op-level placement under
    ``config.objective``; its result if it found a cheaper graph."""
    cost = PlacementCost(measurer, usable, config.objective)
    result = search_substitutions(prepared, SUBSTITUTIONS, cost, alpha=config.alpha, budget_s=config.substitution_budget_s)
    record.substitution_search = dict(result.summary(), alpha=config.alpha, objective=str(config.objective),
                                      measured_now=cost.measured)  # fmt: skip
    return result if result.applied else None


def _substituted_finalist(result: SearchResult, measurer, usable, reference, backend_set, config: Config) -> Finalist:
    """The best substituted graph placed with every candidate (engine regions included, which
    the search's estimate leaves out), assembled and checked against the unoptimized module."""
    graph = dataflow_graph(result.best)
    candidates = generate(graph, usable)
    measurer.measure_all(candidates, progress=False)
    placement = policy.placed(graph, candidates, measurer)
    return assemble_and_check(graph, placement, reference, backend_set, config.target, config.threads)


def _why_unplaced(err: PlacementError, graph, candidates, costs) -> str:
    """The placement error, then why each backend refused the first operator left without a
    candidate, and what the user can do, on one line."""
    if not err.missing:
        return str(err)
    node = err.missing[0]
    refusals = {}
    for c in sorted(candidates, key=lambda c: len(c.subgraph.nodes)):
        if node in c.subgraph.nodes and c.backend not in refusals:
            refusals[c.backend] = costs.cost(c).reason or "valid alone, but no placement could use it"
    why = "; ".join(f"{b}: {r}" for b, r in refusals.items()) or "no backend has a pattern for it"
    advice = ("TVM itself cannot run it: replace that operator in the model, or register a backend that runs it"
              if REFERENCE_BACKEND in refusals else "no backend, TVM included, has a pattern for it: register one that runs it")
    return f"{err}. {graph[node].op} (node {node}) refused by {why}. {advice}"


def _priced(partitions, measurer) -> tuple[Partition, ...]:
    """``partitions`` with the measured cost of each one not measured yet (the engine
    partitions the search formed; most single TVM ops are in the log already)."""
    return tuple(
        Partition(p.candidate, measurer.cost(p.candidate), measurer.transition_ms(p.backend)) if p.cost.is_unknown else p
        for p in partitions
    )

