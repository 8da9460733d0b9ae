"""MetaFlow's recursive graph split (Algorithm 2), for graphs too large to search whole.

    def split(G):
        if |G| <= threshold: return [G]
        cut G in two where the fewest substitution sites cross
        return split(G1) + split(G2)

Each piece is searched alone (``search``), the substitutions found are applied to the whole
graph, and a local search then runs in a window around each cut, where the sites the cut
disabled lie.

Pieces here are contiguous ranges of the binding order, and a cut is a point between two
bindings, weighted by the sites whose nodes lie on both sides of it (MetaFlow's Cap). This
is simpler than the minimum vertex cut of a flow network and keeps what the search needs: a
range of a topological order is always convex, so a piece extracts as a function of its
inputs, and a step found in a piece applies to the whole graph at the same nodes shifted by
the piece's start. Where modules follow one another (every network of the zoo and of
MetaFlow's paper), the cheapest point lies between two modules, where no site crosses, and
both cuts are the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import tvm

from ...candidates.subgraph import SubGraph
from ...measuring.build import as_module
from ...model.graph import DataflowGraph
from .rule import Substitution
from .search import GraphCost, SearchResult, Step, replay, search

THRESHOLD = 60  # operators: larger graphs are split (MetaFlow's pieces are of this order)
WINDOW = 8  # bindings on each side of a cut searched again after the pieces


def crossings(graph: DataflowGraph, rules: Sequence[Substitution]) -> np.ndarray:
    """``crossings[p]``: how many sites have nodes both before binding ``p`` and at or after it
    (``p`` from 0 to ``len(graph)``; nothing crosses the two ends)."""
    starts = np.zeros(len(graph) + 1, dtype=int)
    for rule in rules:
        for site in rule.sites(graph):
            lo, hi = min(site.nodes), max(site.nodes)
            starts[lo + 1] += 1  # crosses every point in (lo, hi]
            starts[hi + 1] -= 1
    return np.cumsum(starts)


def cut_points(graph: DataflowGraph, rules: Sequence[Substitution], threshold: int = THRESHOLD) -> list[int]:
    """Where to cut ``graph`` so that every piece has at most ``threshold`` bindings: in each
    range too large, the point of its middle third that the fewest sites cross (the middle
    one of equals), recursively."""
    crossing = crossings(graph, rules)

    def split(lo: int, hi: int) -> list[int]:
        if hi - lo <= threshold:
            return []
        third = (hi - lo) // 3
        middle = range(lo + third, hi - third + 1)
        fewest = min(crossing[p] for p in middle)
        ties = [p for p in middle if crossing[p] == fewest]
        point = ties[len(ties) // 2]
        return split(lo, point) + [point] + split(point, hi)

    return split(0, len(graph))


def piece(graph: DataflowGraph, nodes: range) -> tvm.IRModule:
    """The bindings ``nodes`` of ``graph`` as a module whose ``main`` takes what they read."""
    return as_module(SubGraph(graph, frozenset(nodes)).extract())


def search_in_pieces(
    mod: tvm.IRModule,
    rules: Sequence[Substitution],
    cost: GraphCost,
    alpha: float = 1.05,
    budget_s: float = 120.0,
    max_graphs: int = 500,
    threshold: int = THRESHOLD,
    window: int = WINDOW,
) -> SearchResult:
    """``search`` for a graph of any size: whole when it has at most ``threshold`` bindings,
    else piece by piece, then around each cut. The whole graph is priced before and after;
    of the time budget left between, three quarters go to the pieces, shared by their size,
    the rest to the windows. The result is never costlier than ``mod`` under ``cost``."""
    graph = DataflowGraph.from_module(mod)
    points = cut_points(graph, rules, threshold)
    if not points:
        return search(mod, rules, cost, alpha, budget_s, max_graphs)
    started = time.perf_counter()
    initial = cost(mod)
    # Pricing the substituted graph at the end takes about as long as pricing it now did.
    deadline = started + budget_s - 1.5 * (time.perf_counter() - started)
    ranges = [range(a, b) for a, b in zip([0, *points], [*points, len(graph)])]
    share = 0.75 * max(deadline - time.perf_counter(), 0.0)
    results, steps, substituted, ranges = _search_ranges(mod, ranges, rules, cost, alpha, share, max_graphs)
    windows = [range(max(r.start - window, prev.start), min(r.start + window, r.stop)) for prev, r in zip(ranges, ranges[1:])]
    left = max(deadline - time.perf_counter(), 0.0)
    around, more, substituted, _ = _search_ranges(substituted, _disjoint(windows), rules, cost, alpha, left, max_graphs)
    results, steps = results + around, steps + more
    final = cost(substituted) if steps else initial
    if not final < initial:  # the pieces' estimates did not add up to a gain for the whole
        substituted, steps, final = mod, [], initial
    return SearchResult(
        substituted, final, initial, tuple(steps),
        explored=sum(r.explored for r in results), costed=sum(r.costed for r in results) + (2 if steps else 1),
        pruned=sum(r.pruned for r in results), seconds=time.perf_counter() - started,
        stopped_by=next((r.stopped_by for r in results if r.stopped_by != "exhausted"), "exhausted"),
        failed={rule: why for r in results for rule, why in r.failed.items()},
    )  # fmt: skip


def _search_ranges(mod, ranges, rules, cost, alpha, budget_s, max_graphs):
    """Search each range of ``mod`` as a piece, then apply what each found to the whole graph.
    Returns the pieces' results, the steps applied (in whole-graph indices, in order), the
    substituted module and the ranges' new extents."""
    graph = DataflowGraph.from_module(mod)
    total = sum(len(r) for r in ranges) or 1
    pieces = [piece(graph, r) for r in ranges]
    results = [search(p, rules, cost, alpha, budget_s * len(r) / total, max_graphs) for p, r in zip(pieces, ranges)]
    growth, steps = {}, []
    # From the last range to the first: a range's steps then shift no range still to apply.
    for r, given, result in reversed(list(zip(ranges, pieces, results))):
        shifted = [Step(s.rule, tuple(r.start + i for i in s.nodes), s.ordinal) for s in result.applied]
        try:
            mod = replay(mod, shifted, rules)
        except ValueError:
            continue  # a step that does not fit the whole graph: this piece stays as it was
        steps += shifted
        growth[r] = len(DataflowGraph.from_module(result.best)) - len(DataflowGraph.from_module(given))
    moved, shift = [], 0
    for r in ranges:
        moved.append(range(r.start + shift, r.stop + shift + growth.get(r, 0)))
        shift += growth.get(r, 0)
    return results, steps, mod, moved


def _disjoint(windows: list[range]) -> list[range]:
    """``windows`` (ascending) trimmed so that none overlaps the one before; empty ones dropped."""
    kept: list[range] = []
    for w in windows:
        start = max(w.start, kept[-1].stop) if kept else w.start
        if start < w.stop:
            kept.append(range(start, w.stop))
    return kept
