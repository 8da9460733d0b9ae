"""Op-level placement: the cheapest way to cover the graph with candidates (Collage's DP).

A placement is a set of disjoint candidates covering every node, in an order in which each
partition runs after the partitions it reads from. Its estimated cost is the sum of its
candidates' costs plus a transition cost for each partition (what entering that backend
costs), as in the Collage paper's additive model (Eq. 2).

The search is the paper's frontier DP (Algorithm 1), exact under that model. A state is the
set of nodes placed so far, always closed under producers (every producer of a placed node is
placed), and its frontier is the unplaced nodes whose producers are all placed. A step adds
one candidate whose external inputs are all placed and which starts at a frontier node.
States are visited cheapest first (Dijkstra: every step costs at least zero), so the first
time the full graph is reached, no placement is cheaper. Every placement whose partitions can
run in some order is reached by adding its partitions in that order, so none is missed; and
one that could not run (two partitions each waiting for the other) is never built.

The number of states grows with the graph's width: a NASNet cell has five branches that
can each be partly placed. Past ``max_states`` the search starts over, expanding each state
only at its lowest frontier node (TVM Collage's rule: far fewer states, since branches are
then placed one after the other). That misses only placements needing a candidate that
starts at the lowest frontier node but reads from a later one; ``Placement.exact`` says
which search gave the answer.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..candidates.backend import REFERENCE_BACKEND
from ..candidates.generate import Candidate
from ..candidates.subgraph import SubGraph
from ..measuring.cost import Cost, CostSource
from ..model.graph import DataflowGraph


class PlacementError(Exception):
    """No placement exists: some node is covered by no usable candidate (``missing``: their
    indices, when known)."""

    def __init__(self, message: str, missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Partition:
    """One chosen candidate: which backend runs which ops, and what that costs."""

    candidate: Candidate
    cost: Cost  # the candidate's measured cost
    transition_ms: float = 0.0  # what entering its backend costs, paid once

    @property
    def backend(self) -> str:
        return self.candidate.backend

    @property
    def pattern(self) -> str:
        return self.candidate.pattern

    @property
    def nodes(self) -> frozenset[int]:
        return self.candidate.subgraph.nodes

    @property
    def ops(self) -> list[str]:
        return self.candidate.subgraph.ops

    @property
    def cost_ms(self) -> float:
        """Measured kernel plus transition cost; NaN for a partition never measured (a fallback)."""
        return self.cost.median_ms + self.transition_ms

    def __repr__(self):
        return f"Partition({self.backend}, {self.pattern}, {sorted(self.nodes)}, {self.cost_ms:.4g} ms)"


def tvm_op(graph: DataflowGraph, node: int, pattern: str) -> Partition:
    """One op left inline on TVM (a fallback, or what a larger partition leaves), never
    measured on its own: TVM's own fusion regroups such ops when the module is built."""
    return Partition(Candidate(SubGraph(graph, frozenset({node})), REFERENCE_BACKEND, pattern), Cost.unknown())


@dataclass(frozen=True)
class Placement:
    """Partitions covering the graph once each, in an order that runs."""

    graph: DataflowGraph
    partitions: tuple[Partition, ...]
    exact: bool = True  # False when the state cap made the search expand only the lowest frontier node

    @property
    def estimated_ms(self) -> float:
        return sum(p.cost_ms for p in self.partitions)

    def __iter__(self):
        return iter(self.partitions)

    def __len__(self):
        return len(self.partitions)


def place(
    graph: DataflowGraph,
    candidates: Iterable[Candidate],
    costs: CostSource,
    transition_ms: Callable[[str], float] = lambda backend: 0.0,
    max_states: int = 100_000,
) -> Placement:
    """The cheapest placement of ``graph`` over ``candidates`` under ``costs``.

    ``costs`` must know every candidate's cost (invalid ones are left out); ``transition_ms``
    gives each backend's entry cost. Raises ``PlacementError`` when some node has no usable
    candidate.
    """
    usable = _usable(candidates, costs, transition_ms)
    _check_coverage(graph, usable)
    try:
        return _search(graph, usable, max_states, lowest_only=False)
    except _TooManyStates:
        return _search(graph, usable, None, lowest_only=True)


class _TooManyStates(Exception):
    pass


def _usable(candidates, costs, transition_ms) -> list[tuple[Candidate, Cost, float, int, int]]:
    """(candidate, cost, transition, node mask, input mask) of each usable one."""
    usable = []
    for c in candidates:
        cost = costs.cost(c)
        if cost.is_invalid:
            continue
        t = transition_ms(c.backend)
        usable.append((c, cost, t, _mask(c.subgraph.nodes), _mask(c.subgraph.input_nodes)))
    return usable


def _search(graph, usable, max_states: int | None, lowest_only: bool) -> Placement:
    n = len(graph)
    full = (1 << n) - 1
    producers = [_mask(node.inputs) for node in graph]
    starting_at: list[list[int]] = [[] for _ in range(n)]  # candidates by their first node
    for k, (c, *_rest) in enumerate(usable):
        starting_at[min(c.subgraph.nodes)].append(k)

    # Dijkstra over placed-node sets. best[state] = (cost, previous state, candidate index).
    start_frontier = frozenset(i for i in range(n) if producers[i] == 0)
    best: dict[int, tuple[float, int, int]] = {0: (0.0, -1, -1)}
    frontier: dict[int, frozenset[int]] = {0: start_frontier}
    done: set[int] = set()
    tie = itertools.count()  # equal costs pop in insertion order: deterministic results
    heap = [(0.0, next(tie), 0)]
    while heap:
        spent, _, state = heapq.heappop(heap)
        if state in done:
            continue
        done.add(state)
        if state == full:
            break
        if max_states is not None and len(best) > max_states:
            raise _TooManyStates
        for v in (min(frontier[state]),) if lowest_only else frontier[state]:
            for k in starting_at[v]:
                _, cost, transition, members, inputs = usable[k]
                if members & state or inputs & ~state:
                    continue
                after = state | members
                total = spent + cost.median_ms + transition
                if after not in best or total < best[after][0]:
                    best[after] = (total, state, k)
                    if after not in frontier:
                        frontier[after] = _advance(graph, producers, frontier[state], members, after)
                    heapq.heappush(heap, (total, next(tie), after))
        del frontier[state]  # a visited state is never expanded again
    if full not in done:
        raise PlacementError("no placement covers the whole graph with usable candidates")

    chosen = []
    state = full
    while state:
        _, previous, k = best[state]
        chosen.append(k)
        state = previous
    return Placement(
        graph,
        tuple(Partition(*usable[k][:3]) for k in reversed(chosen)),
        exact=not lowest_only,
    )


def _mask(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def _advance(graph, producers, frontier, members, after) -> frozenset[int]:
    """The frontier once ``members`` are placed: the rest of the old frontier, plus consumers
    of the new members whose producers are now all placed."""
    new = {v for v in frontier if not (members >> v) & 1}
    for i in _bits(members):
        for u in graph.consumers[i]:
            if not (after >> u) & 1 and producers[u] & ~after == 0:
                new.add(u)
    return frozenset(new)


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _check_coverage(graph, usable) -> None:
    covered = 0
    for _, _, _, members, _ in usable:
        covered |= members
    missing = [graph[i] for i in range(len(graph)) if not (covered >> i) & 1]
    if missing:
        shown = ", ".join(f"{node.op} (node {node.index})" for node in missing[:5])
        raise PlacementError(
            f"{len(missing)} operator(s) have no usable candidate on any backend: {shown}"
            + (", ..." if len(missing) > 5 else ""),
            tuple(node.index for node in missing),
        )
