"""The cost the substitution search minimizes: collage's op-level placement estimate of a graph.

This is what makes the search joint (the energy-aware paper's outer and inner search): each
graph the outer search reaches is priced by the inner one, the DP placement over the measured
costs of its candidates, transitions between libraries included. A merged convolution that
is slow on TVM but fast on oneDNN is priced as it would run. Candidates the search creates
are measured once and logged like every other; a graph's unchanged operators cost nothing
new, since the cost log knows them.

Engine regions (a whole-graph engine taking many operators) are left out of the search's
estimate: each graph would need its own engine builds. The best graph found is then placed
with everything, regions included, as a finalist beside the unsubstituted placement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm

from ...candidates.backend import Backend
from ...candidates.generate import PART_SUFFIX, REGION_SUFFIX, generate
from ...measuring.measure import Measurer
from ...model.graph import DataflowGraph
from ..objective import Objective, WeightedCosts
from ..placement import PlacementError, place


class PlacementCost:
    """``cost(mod)``: what the best op-level placement of ``mod``'s ``main`` on ``backends``
    costs under ``objective`` (``collage.placing.objective``): its estimated ms for time
    alone, else the weighted metrics relative to the first graph priced (the graph as given,
    which the search prices first). Candidate costs come from ``measurer`` (logged, or
    measured now; with energy where the objective needs it); ``math.inf`` where some operator
    has no usable candidate."""

    def __init__(self, measurer: Measurer, backends: Sequence[Backend], objective: Objective = Objective()):
        if not objective.is_time and measurer.meter is None:
            raise ValueError(f"objective {objective} needs energy: give the measurer an energy meter")
        self.measurer = measurer
        self.backends = list(backends)
        self.objective = objective
        self.reference: tuple[float, float] | None = None  # (ms, mJ) of the graph as given
        self.measured = 0  # candidates measured for the search, the log's misses

    def __call__(self, mod: tvm.IRModule) -> float:
        graph = DataflowGraph.from_module(mod)
        kernels = [c for c in generate(graph, self.backends) if not c.pattern.endswith((REGION_SUFFIX, PART_SUFFIX))]
        before = self.measurer.measured
        self.measurer.measure_all(kernels, progress=False)
        self.measured += self.measurer.measured - before
        try:
            if self.objective.is_time:
                return place(graph, kernels, self.measurer, self.measurer.transition_ms).estimated_ms
            if self.reference is None:  # the graph as given, placed for time: the unit of each metric
                self.reference = self._metrics(place(graph, kernels, self.measurer, self.measurer.transition_ms))
            weighted = WeightedCosts(self.measurer, self.objective, self.reference)
            placement = place(graph, kernels, weighted, weighted.transition_ms)
        except PlacementError:
            return math.inf
        return self.objective.value(*self._metrics(placement), self.reference)

    def _metrics(self, placement) -> tuple[float, float]:
        """(ms, mJ) of a placement: its candidates' measured time and energy, transitions in time."""
        costs = [self.measurer.cost(p.candidate) for p in placement]
        time_ms = sum(c.median_ms for c in costs) + sum(self.measurer.transition_ms(p.backend) for p in placement)
        return time_ms, sum(c.energy_mj for c in costs)
