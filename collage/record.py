"""What one optimization did, as typed data: the run record.

``optimize`` fills a ``RunRecord`` stage by stage; the report, the saved placement, the
export and the benchmarks read its fields. Finalists are named by a ``FinalistName`` (a kind
and, where it applies, the engine or the rank), never by their display text, which
``str(name)`` gives.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .assembling.caller import CallPathTiming
from .candidates.precision import FLOAT32, short
from .measuring.cost import Cost
from .measuring.warm import Warmed
from .placing.objective import Objective


class FinalistKind(enum.Enum):
    """How a finalist placement was made; the value is its display text."""

    OP_LEVEL = "op-level"  # the DP over every float32 candidate
    OP_LEVEL_REDUCED = "op-level, reduced precision allowed"  # the DP over every candidate, every precision
    KERNELS_ONLY = "op-level, kernels only"  # the DP without engine regions: the graph-level search's start
    SUBSTITUTED = "op-level, substituted graph"  # the DP over the graph the substitution search found
    ENGINE_ALONE = "alone"  # one engine on collage's conversion of the whole model
    ENGINE_REGIONS = "regions"  # one engine's largest regions, TVM for the rest
    ENGINE_SPLIT = "float32 first"  # one engine on the whole model, float32 up to a cut, reduced after it
    ENGINE_ON_FILE = "on the ONNX file"  # one engine on the user's own ONNX file
    ENGINE_ON_PROGRAM = "on the PyTorch module"  # one engine compiling the user's own PyTorch module
    GRAPH_LEVEL = "graph-level"  # a leader of the graph-level search
    UNPLACED = "the whole model on tvm, unplaced"  # nothing to place: TVM runs it as it is
    AS_GIVEN = "the model as given"  # TVM cannot import it: PyTorch or ONNX Runtime runs it unoptimized
    SAVED = "placement"  # a saved placement, rebuilt


@dataclass(frozen=True)
class FinalistName:
    """A finalist: its kind, the engine of an engine's finalist, the rank of a graph-level
    leader, the precision an engine's finalist computes in."""

    kind: FinalistKind
    engine: str | None = None
    rank: int | None = None
    precision: str = FLOAT32

    def __str__(self) -> str:
        at = "" if self.precision == FLOAT32 else f", {short(self.precision)}"
        if self.engine is not None:
            return f"{self.engine} {self.kind.value}{at}"
        if self.rank is not None:
            return f"{self.kind.value} #{self.rank}{at}"
        return self.kind.value + at


OP_LEVEL = FinalistName(FinalistKind.OP_LEVEL)
OP_LEVEL_REDUCED = FinalistName(FinalistKind.OP_LEVEL_REDUCED)
KERNELS_ONLY = FinalistName(FinalistKind.KERNELS_ONLY)
SUBSTITUTED = FinalistName(FinalistKind.SUBSTITUTED)
UNPLACED = FinalistName(FinalistKind.UNPLACED)
AS_GIVEN = FinalistName(FinalistKind.AS_GIVEN)
SAVED = FinalistName(FinalistKind.SAVED)


@dataclass(frozen=True)
class FinalistResult:
    """One finalist as it was timed against the others: the DP's estimate (NaN for the user's
    file, whose kernels were never measured alone), its end-to-end cost, and, when the choice
    raced them round by round, the upper quartile of its blocks and its verdict."""

    estimated_ms: float
    measured: Cost
    paid_ms: float | None = None
    verdict: str | None = None  # finalists.Verdict's value: "leader", "equivalent", ...
    error: float | None = None  # with an accuracy budget: its largest relative error over the budget's input sets


@dataclass
class StageSeconds:
    prepare: float = 0.0  # importing, simplifying, the unoptimized module's reference outputs
    generate: float = 0.0
    measure: float = 0.0
    substitute: float = 0.0
    place: float = 0.0
    assemble: float = 0.0
    graph_level: float = 0.0
    final_timing: float = 0.0
    total: float = 0.0


@dataclass
class RunRecord:
    """What one ``optimize`` call did, stage by stage (empty for a rebuilt saved placement,
    which generates and measures nothing)."""

    seed: int = 0
    objective: Objective = Objective()
    accuracy: float | None = None  # the user's budget: largest error relative to each output's largest magnitude
    calibration_sets: int = 0  # the user's input sets the budget was held on, instead of a second draw
    precision_note: str | None = None  # why the budget changed nothing, where it could not
    simplify_failed: str | None = None  # why the model was placed as given, unsimplified
    rewritten: list[str] = field(default_factory=list)  # what of the model was written otherwise before placing, and why
    unplaced: str | None = None  # why nothing could be placed (TVM then runs the model)
    unplaced_hash: str | None = None  # the structural hash of that model, for its saved record
    not_imported: str | None = None  # why TVM cannot import the model, which then runs whole (``model.as_given``)
    cuda_graph_off: str | None = None  # on CUDA: why the kept module runs without CUDA graphs
    candidates: int = 0
    distinct: int = 0  # candidates with distinct log keys
    capped: dict[str, int] = field(default_factory=dict)  # pattern rule -> seeds whose growth stopped at the cap
    measured: int = 0  # candidates measured by this call (the rest came from the cost log)
    compiled_ahead: Warmed = Warmed()  # what the compile pool did before measuring
    measuring_by_backend: dict[str, float] = field(default_factory=dict)  # backend -> seconds its candidates took
    compiling_by_backend: dict[str, float] = field(default_factory=dict)  # backend -> of those, seconds compiling
    values_s: float = 0.0  # seconds computing the model's values (the candidates' inputs and references)
    interplays: dict[str, float] = field(default_factory=dict)  # "a and b" -> ms a pair of calls, as the DP priced them
    interplay_s: float = 0.0  # seconds measuring those not logged, while placing
    cache_flushed: str | None = None  # on a GPU: why each candidate was timed after its cache was flushed
    assembled_s: dict[str, float] = field(default_factory=dict)  # finalist, or a step of assembling -> its seconds
    skipped: dict[str, int] = field(default_factory=dict)  # search-bound rule -> candidates not measured
    timed_out: int = 0  # candidates that overran the runner's deadline: not logged, measured again next time
    timed_once: int = 0  # candidates timed by one call: over twice the cheapest whole-model candidate (Timing.ceiling_ms)
    exact: bool = True  # whether every DP search was exact (no state cap)
    engine_blockers: dict[str, str] = field(default_factory=dict)  # engine -> the ops it cannot take
    left_out: dict[str, str] = field(default_factory=dict)  # a finalist that could not be: why
    substitution_search: dict | None = None  # substitute.SearchResult.summary() and its settings
    substituted: list = field(default_factory=list)  # the kept graph's substitution steps, in order
    graph_level: dict | None = None  # refine.Refinement.summary(), or {"skipped": why}
    finalists: dict[FinalistName, FinalistResult] = field(default_factory=dict)
    chosen: FinalistName | None = None
    tie: str | None = None  # why the kept finalist is not the one with the best number
    confirmation: str | None = None  # what racing the kept finalist and the runner-up in fresh processes showed
    optimized_for: str | None = None  # the fleet's device, when it is not this machine
    not_here: str | None = None  # then, how this machine differs from it
    timed_on: str | None = None  # the server the finalists were timed on, when not here
    others_busy_cores: float | None = None  # what other processes took while finalists were timed
    timing_attempts: int = 0
    call_path: CallPathTiming | None = None  # where opt(x) can take two paths: both timed, the faster kept
    warnings: list[str] = field(default_factory=list)
    seconds: StageSeconds = field(default_factory=StageSeconds)
