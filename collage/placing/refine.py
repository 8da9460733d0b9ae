"""Graph-level refinement of an op-level placement: which engine, which units, which leaders.

Wires the pieces of Collage's second level together: the ``OffloadSpace`` of the op-level
placement for one inference engine, the ``evolutionary_search`` over it, and end-to-end
measurements as the fitness, which the caller hands in (``PlacementLatency``: the finalists'
stage measures placements assembled, a later stage than this one). The caller times the
leaders against its other finalists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..measuring.cost import Cost
from ..model.graph import DataflowGraph
from .evolve import EvolutionResult, evolutionary_search
from .offload import OffloadSpace
from .placement import Partition


class PlacementLatency(Protocol):
    """What the search measures with (``choosing.end_to_end.EndToEnd``): placements of
    ``graph``, each assembled and timed end to end, and how many were measured now."""

    graph: DataflowGraph
    measured: int

    def latency(self, partitions: Sequence[Partition]) -> Cost: ...


@dataclass
class Refinement:
    engine: str
    space: OffloadSpace
    result: EvolutionResult
    leaders: list[tuple[tuple[Partition, ...], float]]  # placements the search found best, with their ms
    measured: int  # placements measured now (the rest came from the cost log)

    def summary(self) -> dict:
        r = self.result
        return {
            "engine": self.engine,
            "units": len(self.space),
            "generations": r.generations,
            "placements": r.evaluated,
            "measured_now": self.measured,
            "search_s": round(r.seconds, 1),
            "stopped": r.stopped,
            "start_ms": r.seed_ms[0],  # all zeros: the op-level placement the search started from
            "all_on_engine_ms": r.seed_ms[1] if len(r.seed_ms) > 1 else r.seed_ms[0],
            "best_ms": r.best_ms,
            "history_ms": [round(g["best_ms"], 4) for g in r.logbook],
        }


def refine(
    op_level: tuple[Partition, ...],
    engine,
    end_to_end: PlacementLatency,
    *,
    budget_s: float,
    patience: int,
    seed: int,
    progress: bool,
) -> Refinement:
    """Search which units of ``op_level`` to hand to ``engine`` (a graph-level Backend),
    measuring each placement with ``end_to_end``; seeded with the op-level placement (all
    zeros) and with the engine taking every op it can (all ones)."""
    space = OffloadSpace.of(end_to_end.graph, op_level, engine)

    def latency_ms(bits: tuple[int, ...]) -> float:
        partitions = space.decode(bits)
        if partitions is None:  # its partitions would wait for each other
            return math.inf
        cost = end_to_end.latency(partitions)
        return cost.median_ms if cost.is_valid else math.inf

    seeds = [[0] * len(space), space.all_ones()]
    result = evolutionary_search(len(space), latency_ms, seeds, budget_s=budget_s, patience=patience, seed=seed, progress=progress)
    leaders = [(space.decode(bits), ms) for bits, ms in result.leaders if math.isfinite(ms)]
    return Refinement(engine.name, space, result, leaders, end_to_end.measured)
