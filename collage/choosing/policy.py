"""The finalist policy: which complete placements are assembled and timed against each other,
and which of them an accuracy budget leaves in.

``placements`` picks them from the measured candidates: the op-level DP's, each inference
engine alone on the whole model (or its regions with TVM for the rest), in float32 and in
each reduced precision a backend offers; ``engines_on_file`` adds each engine running the
user's own ONNX file, ``engines_on_program`` each compiling the user's own PyTorch module;
``within_budget`` holds every finalist that computes in a reduced
precision to the accuracy budget, ``repaired`` bringing the op-level one back within it
partition by partition; ``best_engine`` names the engine the graph-level search refines
with. ``collage.api`` wires these; the race itself is ``choosing.finalists``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from ..assembling.checked import Finalist, assemble_and_check
from ..candidates.backend import GRAPH_LEVEL, REFERENCE_BACKEND
from ..candidates.generate import PART_SUFFIX, REGION_SUFFIX
from ..candidates.precision import BFLOAT16, FLOAT32, bf16_unavailable, reduced, short
from ..config import Config
from ..errors import OptimizeError
from ..measuring.cost import cpu_info
from ..measuring.build import device_for
from ..measuring.arrays import Reference, numpy_outputs, relative_error, to_tensors
from ..prepare import Model
from .engine_alone import EngineAloneFailed, checked_on_file, checked_on_program
from .precision_split import NoSplit, split_in_precision
from ..placing.placement import Partition, Placement, place
from ..record import KERNELS_ONLY, OP_LEVEL, OP_LEVEL_REDUCED, FinalistKind, FinalistName, RunRecord


def placements(graph, candidates, costs, usable, graph_level: bool, offered: dict[str, tuple[str, ...]],
               notes: dict, missed: dict | None = None) -> tuple[dict[FinalistName, Placement], dict[str, FinalistName]]:
    """The placements to assemble: the op-level DP's over float32 candidates, and for each
    inference engine the whole model ("<engine> alone") when every op converts, else its
    largest regions with TVM for the rest ("<engine> regions"). Where backends ``offered``
    reduced precisions, also the DP's over every candidate, and each engine alone or its
    regions in each precision it offers. With ``graph_level``, also the DP's placement over
    kernel-sized float32 candidates only (no regions), where the graph-level search starts.
    Equal placements are kept once; the second result names, for each engine, the float32
    placement that is its own regions. Why an engine cannot run the whole model goes to
    ``notes``; an engine alone whose whole-model candidate missed the accuracy budget when
    measured goes to ``missed`` (its name -> that candidate's partition), for ``within_budget``
    to split."""
    placements: dict[FinalistName, Placement] = {}
    every_precision, candidates = candidates, [c for c in candidates if c.precision == FLOAT32]
    missed = {} if missed is None else missed

    def add(name: FinalistName, placement: Placement) -> FinalistName:
        same = next((other for other, p in placements.items() if _parts(p) == _parts(placement)), None)
        if same is None:
            placements[name] = placement
        return same or name

    add(OP_LEVEL, placed(graph, candidates, costs))
    if offered:
        add(OP_LEVEL_REDUCED, placed(graph, every_precision, costs))
    if graph_level:
        kernels = [c for c in candidates if not c.pattern.endswith((REGION_SUFFIX, PART_SUFFIX))]
        add(KERNELS_ONLY, placed(graph, kernels, costs))
    tvm_only = [c for c in candidates if c.backend == REFERENCE_BACKEND]
    alone = {}
    for backend in usable:
        if backend.kind != GRAPH_LEVEL:
            continue
        for precision in (FLOAT32, *offered.get(backend.name, ())):
            name = _engine_placement(graph, backend, precision, every_precision, tvm_only, costs, notes, add, missed)
            if name is not None and precision == FLOAT32:
                alone[backend.name] = name
    return placements, alone

def placed(graph, candidates, costs) -> Placement:
    """The DP's placement under ``costs``: its transitions, and the interplay of libraries
    sharing the cores where ``costs`` measures it (a price list of a test may not)."""
    return place(graph, candidates, costs, costs.transition_ms, interplay_ms=getattr(costs, "interplay_ms", None))


def _engine_placement(graph, backend, precision, candidates, tvm_only, costs, notes, add, missed) -> FinalistName | None:
    """``backend`` alone on the whole model in ``precision``, else its largest regions in it
    with TVM for the rest, handed to ``add``; the name it is timed under (another finalist's,
    where that is the same placement), or None when it has no region."""
    at = "" if precision == FLOAT32 else f" in {short(precision)}"
    # Regions measured (not skipped: each then would cost more than a whole-model candidate).
    regions = [c for c in candidates if c.backend == backend.name and c.pattern == f"{backend.name}{REGION_SUFFIX}"
               and c.precision == precision and (len(c.subgraph) == len(graph) or costs.cost(c).is_valid)]  # fmt: skip
    if not regions:
        return None
    whole = next((c for c in regions if len(c.subgraph) == len(graph)), None)
    if whole is not None and (cost := costs.cost(whole)).is_invalid:
        if cost.error is not None:  # it ran, over the budget: within_budget says so
            missed[FinalistName(FinalistKind.ENGINE_ALONE, backend.name, precision=precision)] = Partition(whole, cost)
        else:
            notes[backend.name + at] = f"{backend.name}{at} alone is not a finalist: {cost.reason}"
        regions.remove(whole)
        whole = None
    if not regions:  # nothing but TVM would be left: the float32 finalists have that placement
        return None
    if whole is not None:
        name = FinalistName(FinalistKind.ENGINE_ALONE, backend.name, precision=precision)
        same = add(name, Placement(graph, (Partition(whole, costs.cost(whole), costs.transition_ms(backend.name)),)))
        if same != name:
            # Assembled and raced twice, one module would be timed against itself, and raced
            # again in fresh processes: on an H200, ViT-B on inductor alone took 126 s so.
            notes[str(name)] = f"{name} is the '{same}' placement (one partition, the whole model), timed once as it"
        return same
    name = FinalistName(FinalistKind.ENGINE_REGIONS, backend.name, precision=precision)
    return add(name, placed(graph, regions + tvm_only, costs))

def reduced_precisions(usable, config: Config, record: RunRecord) -> dict[str, tuple[str, ...]]:
    """Backend name -> the reduced precisions it offers on the device optimized for (here, or
    the fleet's), with an accuracy budget; none without one. Where the budget can change
    nothing, ``record.precision_note`` says why."""
    record.accuracy = config.accuracy
    if config.accuracy is None:
        return {}
    if record.optimized_for is None:
        offered = {b.name: b.reduced_precisions(config.target) for b in usable}
        isa = cpu_info()["isa"]
    else:  # what the fleet's CPU computes natively, which this machine's may not
        fleet = config.runner.fleet
        offered = {b.name: tuple(fleet.precisions.get(b.name, ())) for b in usable}
        isa = fleet.isa
    offered = {name: precisions for name, precisions in offered.items() if precisions}
    why = bf16_unavailable(isa) if config.target == "llvm" else None
    if not offered:
        record.precision_note = ("no backend here computes in a reduced precision"
                                 + (f": {why}" if why else "") + "; every placement is float32")  # fmt: skip
    elif why and not any(BFLOAT16 in precisions for precisions in offered.values()):
        offers = ", ".join(f"{name} in {'/'.join(short(p) for p in precisions)}" for name, precisions in offered.items())
        record.precision_note = f"no bfloat16: {why}; offered: {offers}"
    return offered

class Repaired(NamedTuple):
    """A finalist over the budget brought within it: under ``name``, with its error and
    ``how`` (for the report, which follows it with the error)."""

    name: FinalistName
    finalist: Finalist
    error: float
    how: str


def within_budget(finalists: dict, model: Model, config: Config, record: RunRecord, repair,
                  missed: dict | None = None) -> dict:  # fmt: skip
    """Each finalist's error (``runner.relative_error``, the largest over ``model.budget_draws``:
    the seeded inputs and a second, independent draw, or the user's calibration sets); finalists
    with reduced-precision partitions whose error exceeds ``config.accuracy`` are left out, with
    it, each after ``repair(name, partitions, draws)`` had its chance to bring it within (a
    Repaired, or None, or NoSplit with why not), as have the engines alone that ``missed`` the
    budget when measured (name -> the whole model's partition). Errors compound along a model, so
    the whole module is what is held to the budget, not each kernel."""
    draws = model.budget_draws
    errors, over = {}, {}
    for name, f in list(finalists.items()):
        errors[name] = module_error(f, draws, config.target)
        if reduced(f.partitions) and not errors[name] <= config.accuracy:
            record.left_out[str(name)] = (f"{name}: error {errors[name]:.3g} of the largest output exceeds the "
                                          f"accuracy budget {config.accuracy:g} ({len(draws)} input sets)")  # fmt: skip
            over[name] = finalists.pop(name).partitions
    for name, whole in (missed or {}).items():
        record.left_out[str(name)] = (f"{name}: error {whole.cost.error:.3g} of the largest output exceeds the "
                                      f"accuracy budget {config.accuracy:g}, measured alone")  # fmt: skip
        over[name] = (whole,)
    for name, partitions in over.items():
        try:
            fixed = repair(name, partitions, draws)
        except NoSplit as why:
            record.left_out[str(name)] += f"; not split: {why}"
            continue
        if fixed is not None:
            finalists[fixed.name], errors[fixed.name] = fixed.finalist, fixed.error
            record.left_out[str(name)] += f"; {fixed.how} {fixed.error:.3g}"
    if not any(reduced(f.partitions) for f in finalists.values()):
        kept = "no placement in a reduced precision stayed within the budget: float32 kept"
        record.precision_note = kept if record.precision_note is None else f"{record.precision_note}; {kept}"
    return errors


def repair(name: FinalistName, partitions, draws, graph, costs, backends, config: Config) -> Repaired | None:
    """A placement's ``partitions``, over the budget, brought within it where its kind can be:
    the op-level placement with its earliest reduced partitions back in float32 (``repaired``),
    an engine alone split into float32 first and the reduced precision after
    (``split_in_precision``, as a finalist of its own); None for the others. Raises NoSplit."""
    if name == OP_LEVEL_REDUCED:
        fixed = repaired(partitions, draws, graph, costs, backends, config)
        return None if fixed is None else Repaired(name, fixed[0], fixed[1], f"{fixed[2]} of its partitions back in float32 bring it to")
    if name.kind is FinalistKind.ENGINE_ALONE:
        (whole,) = partitions
        error_of = functools.partial(module_error, draws=draws, target=config.target)
        split = split_in_precision(whole.candidate, draws, graph, costs, backends, config, error_of)
        named = FinalistName(FinalistKind.ENGINE_SPLIT, name.engine, precision=name.precision)
        return Repaired(named, split.finalist, split.error, f"split into {split.how(graph)} ('{named}') brings it to")
    return None

def module_error(finalist: Finalist, draws, target: str) -> float:
    device = device_for(target)
    return max(relative_error(numpy_outputs(finalist.vm["main"](*to_tensors(draw.inputs, device))), draw.outputs)
               for draw in draws)  # fmt: skip

def repaired(partitions, draws, graph, costs, backends, config: Config):
    """A mixed-precision placement over the budget brought within it: its earliest reduced
    partitions computed in float32 again (an early error compounds through every op after
    it), as few as bisection finds, at least one left reduced; ``(finalist, error, how many
    went back)`` or None. Each try is a build and a check: ResNet-50's fifty reduced
    convolutions, brought back one at a time, would be fifty."""
    order = [p for p in range(len(partitions)) if partitions[p].candidate.precision != FLOAT32]
    tried: dict[int, tuple | None] = {}

    def back_in_float32(count: int):
        """The placement with the first ``count`` reduced partitions in float32, checked: (finalist, error) within the budget, else None."""
        if count not in tried:
            mixed = list(partitions)
            for p in order[:count]:
                f32 = dataclasses.replace(mixed[p].candidate, precision=FLOAT32)
                mixed[p] = Partition(f32, costs.cost(f32), costs.transition_ms(f32.backend))
            tried[count] = None
            try:
                candidate = assemble_and_check(graph, Placement(graph, tuple(mixed)), draws[0], backends,
                                               config.target, config.threads, config.accuracy, held_to_budget=True)  # fmt: skip
            except OptimizeError:  # still wrong after the check's fallbacks
                return None
            error = module_error(candidate, draws, config.target)
            if reduced(candidate.partitions) and error <= config.accuracy:
                tried[count] = (candidate, error)
        return tried[count]

    low, high = 1, len(order) - 1  # the fewest that may do, the most that leaves one reduced
    if high < low or back_in_float32(high) is None:
        return None
    while low < high:
        middle = (low + high) // 2
        if back_in_float32(middle) is not None:
            high = middle
        else:
            low = middle + 1
    candidate, error = back_in_float32(high)
    return candidate, error, high

def engines_on_file(original, graph, usable, model, reference: Reference, config: Config, offered: dict,
                     notes: dict) -> dict[FinalistName, Finalist]:
    """Each inference engine that reads ONNX running the user's file whole, checked against
    the unoptimized module, in float32 and in each reduced precision it ``offered`` (OpenVINO
    in bfloat16: its own default on CPUs that compute it natively, as its users run it); one
    that cannot, or computes otherwise, is left out with why (in ``notes``)."""
    engines = [b for b in usable if b.kind == GRAPH_LEVEL and b.compile_onnx is not None]
    check = functools.partial(checked_on_file, original, graph, model=model, check=reference)
    return _engines_on(engines, check, FinalistKind.ENGINE_ON_FILE, "file", config, offered, notes)


def engines_on_program(original, graph, usable, program, module, reference: Reference, config: Config, offered: dict,
                       notes: dict) -> dict[FinalistName, Finalist]:
    """Each engine that compiles PyTorch programs (inductor) compiling the user's own
    ``module`` whole (its ``program`` where there is no module, or Dynamo cannot capture it
    whole), as ``torch.compile`` of the module would, checked and left out as
    ``engines_on_file`` does: on a model handed over as a PyTorch module, collage is never
    slower than that call either."""
    engines = [b for b in usable if b.compile_program is not None]
    check = functools.partial(checked_on_program, original, graph, program=program, module=module, check=reference)
    return _engines_on(engines, check, FinalistKind.ENGINE_ON_PROGRAM, "module", config, offered, notes)


def _engines_on(engines, check, kind: FinalistKind, what: str, config: Config, offered: dict,
                notes: dict) -> dict[FinalistName, Finalist]:  # fmt: skip
    finalists = {}
    for backend in engines:
        for precision in (FLOAT32, *offered.get(backend.name, ())):
            at = "" if precision == FLOAT32 else f" in {short(precision)}"
            try:
                finalist = check(backend=backend, target=config.target, threads=config.threads, precision=precision,
                                 budget=config.accuracy)  # fmt: skip
            except EngineAloneFailed as err:
                notes[f"{backend.name} {what}{at}"] = str(err)
                continue
            finalists[FinalistName(kind, backend.name, precision=precision)] = finalist
    return finalists

def best_engine(engines, alone: dict[str, FinalistName], finalists: dict[FinalistName, Finalist], race):
    """The inference engine to refine with: the one whose own-regions placement runs the model
    fastest (timed against each other by ``race``), else the first."""
    timed = {e.name: alone[e.name] for e in engines if alone.get(e.name) in finalists}
    if len(set(timed.values())) < 2:
        return next((e for e in engines if e.name in timed), engines[0])
    contenders = {name: finalists[name] for name in timed.values()}
    times = race(contenders)
    fastest = min(times.costs, key=lambda name: times.costs[name].median_ms)
    return next(e for e in engines if timed.get(e.name) == fastest)

def _parts(placement: Placement) -> set:
    return {(p.backend, p.nodes, p.candidate.precision) for p in placement}
