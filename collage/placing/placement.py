"""Op-level placement: the cheapest way to cover the graph with candidates (Collage's DP).

A placement is a set of disjoint candidates covering every node, in an order in which each
partition runs after the partitions it reads from. Its estimated cost is the sum of its
candidates' costs plus a transition cost for each partition (what entering that backend
costs), as in the Collage paper's additive model (Eq. 2), plus, where two libraries slow each
other by sharing the cores, a share of that for each of their partitions (``_sharing_cores``).

The search is the paper's frontier DP (Algorithm 1), exact under that model. A state is the
set of nodes placed so far, always closed under producers (every producer of a placed node is
placed), and its frontier is the unplaced nodes whose producers are all placed. A step adds
one candidate whose external inputs are all placed and which starts at a frontier node.
States are visited in order of their cost plus an estimate of what is left that never
overestimates it (A*: each unplaced node at the least per node any candidate covering it
costs), so the first time the full graph is reached, no placement is cheaper, and partial
placements already dearer than a whole one are never expanded. Every placement whose
partitions can run in some order is reached by adding its partitions in that order, so none
is missed; and one that could not run (two partitions each waiting for the other) is never
built.

The number of states grows with the graph's width: a NASNet cell has five branches that
can each be partly placed; in a GRU unrolled over 32 steps, candidates starting early take
along any of 32 splits of the input projections, each placed or not ahead of its turn, and no
cap on the states could hold the 2**32 sets (24 GB, then killed). Past ``max_states`` the
search starts over under TVM Collage's rule, expanding each state only at its lowest
unplaced node, which misses only placements needing a candidate that starts there but reads
from a later node. Every step then raises that node, so the states are searched in groups by
it, each group once, and of each only the ``beam`` most promising (cost plus estimate) are
expanded: time and memory grow with the graph's size, not its width. ``Placement.exact``
says which search gave the answer.
"""

from __future__ import annotations

import heapq
import itertools
import math
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
    # What entering its backend costs, paid once, with its share of its library's interplay
    # with the placement's other libraries (``_sharing_cores``).
    transition_ms: float = 0.0

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
    exact: bool = True  # False when the state cap made the search expand only the lowest unplaced node

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
    beam: int = 1_000,
    interplay_ms: Callable[[str, str], float] | None = None,
) -> Placement:
    """The cheapest placement of ``graph`` over ``candidates`` under ``costs``.

    ``costs`` must know every candidate's cost (invalid ones are left out); ``transition_ms``
    gives each backend's entry cost. Past ``max_states`` states, each state is expanded at its
    lowest unplaced node only, ``beam`` states per node (see the module's docstring). With
    ``interplay_ms`` (two backends' names -> ms per pair of their calls), libraries that slow
    each other in one module pay for it (``_sharing_cores``). Raises ``PlacementError`` when
    some node has no usable candidate.
    """
    candidates = list(candidates)
    if interplay_ms is not None:
        return _sharing_cores(graph, candidates, costs, transition_ms, interplay_ms, max_states, beam)
    usable = _usable(candidates, costs, transition_ms)
    _check_coverage(graph, usable)
    steps = _Steps.of(graph, usable)
    try:
        return _search(graph, steps, max_states)
    except _TooManyStates:
        return _lowest_node_search(graph, steps, beam)


def _sharing_cores(graph, candidates, costs, transition_ms, interplay_ms, max_states, beam) -> Placement:
    """The cheapest placement where libraries sharing the cores slow each other.

    Two libraries' interplay is paid wherever their calls fall (``measuring.transition``), so
    it depends on which libraries the whole placement uses, not on a partition's neighbours,
    and the DP cannot price it step by step. It searches once per set of the interplaying
    libraries that a placement may use instead, each partition of a library in the set paying
    half of its interplay with each other library in it (a pair of calls is one of each).
    Interplays are measured as needed: a pair not measured yet counts as none, so each
    search's best is a lower bound; while that best uses a pair not measured, the pair is
    measured and the search repeated, and a best whose pairs are all measured is the cheapest.
    """
    libraries = sorted({c.backend for c in candidates} - {REFERENCE_BACKEND})
    known: dict[frozenset[str], float] = {}
    while True:
        best = None
        for k, (allowed, share) in enumerate(_library_sets(libraries, known)):
            kept = [c for c in candidates if c.backend == REFERENCE_BACKEND or c.backend in allowed]
            try:
                found = place(graph, kept, costs, lambda b, share=share: transition_ms(b) + share.get(b, 0.0),
                              max_states, beam)  # fmt: skip
            except PlacementError:
                if k == 0:  # every library allowed: nothing covers the graph
                    raise
                continue  # some operator only a library left out runs
            if best is None or found.estimated_ms < best.estimated_ms:
                best = found
        used = sorted({p.backend for p in best} - {REFERENCE_BACKEND})
        missing = [frozenset(pair) for pair in itertools.combinations(used, 2) if frozenset(pair) not in known]
        if not missing:
            return best
        for pair in missing:
            known[pair] = interplay_ms(*sorted(pair))
        if all(known[pair] <= 0 for pair in missing):  # the same sets and prices: the same best
            return best


def _library_sets(libraries: list[str], known: dict[frozenset[str], float]):
    """(the libraries a placement may use, what each of their partitions pays beyond its
    transition) for each subset of the libraries with a known interplay, all of them first;
    the other libraries are always allowed and pay nothing more."""
    interplaying = sorted({name for pair, ms in known.items() if ms > 0 for name in pair})
    others = {name for name in libraries if name not in interplaying}
    for size in range(len(interplaying), -1, -1):
        for chosen in itertools.combinations(interplaying, size):
            share = {b: sum(known.get(frozenset((a, b)), 0.0) for a in chosen if a != b) / 2 for b in chosen}
            yield others | set(chosen), share


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
        usable.append((c, cost, t, c.subgraph.mask, _mask(c.subgraph.input_nodes)))
    return usable


@dataclass(frozen=True)
class _Steps:
    """The usable candidates as the searches' steps: by their first node, what each costs, and
    the estimate of what is left that each takes away (``covers``; ``left`` is the whole
    graph's)."""

    usable: list[tuple[Candidate, Cost, float, int, int]]
    starting_at: list[list[int]]
    step_ms: list[float]
    covers: list[float]
    left: float

    @classmethod
    def of(cls, graph, usable) -> _Steps:
        n = len(graph)
        starting_at: list[list[int]] = [[] for _ in range(n)]
        for k, (c, *_rest) in enumerate(usable):
            starting_at[min(c.subgraph.nodes)].append(k)
        step_ms = [cost.median_ms + transition for _, cost, transition, _, _ in usable]
        # A candidate's cost is the sum of its nodes' shares, so no step costs less than the
        # estimate it takes away. Whole-graph candidates are left out: they are steps from the
        # empty state only, which is expanded first whatever its estimate, and their one
        # share, spread over every node, would make the estimate nearly nothing.
        per_node = [math.inf] * n
        for (c, *_rest), ms in zip(usable, step_ms):
            if len(c.subgraph.nodes) < n:
                for v in c.subgraph.nodes:
                    per_node[v] = min(per_node[v], ms / len(c.subgraph.nodes))
        per_node = [0.0 if math.isinf(share) else share for share in per_node]
        covers = [sum(per_node[v] for v in c.subgraph.nodes) for c, *_rest in usable]
        return cls(usable, starting_at, step_ms, covers, sum(per_node))

    def placement(self, graph, reached: dict[int, tuple[float, int, int]], exact: bool) -> Placement:
        """The placement that reached the full state, traced back through ``reached``
        (state -> (cost, previous state, step))."""
        chosen, state = [], (1 << len(graph)) - 1
        while state:
            _, state, k = reached[state]
            chosen.append(k)
        return Placement(graph, tuple(Partition(*self.usable[k][:3]) for k in reversed(chosen)), exact=exact)


def _search(graph, steps: _Steps, max_states: int) -> Placement:
    """The exact search: A* over placed-node sets, every frontier node expanded."""
    usable, n = steps.usable, len(graph)
    full = (1 << n) - 1
    producers = [_mask(node.inputs) for node in graph]
    best: dict[int, tuple[float, int, int]] = {0: (0.0, -1, -1)}  # state -> (cost, previous, step)
    left: dict[int, float] = {0: steps.left}  # state -> estimate of what is left
    frontier: dict[int, frozenset[int]] = {0: frozenset(i for i in range(n) if producers[i] == 0)}
    done: set[int] = set()
    tie = itertools.count()  # equal costs pop in insertion order: deterministic results
    heap = [(steps.left, next(tie), 0)]
    while heap:
        _, _, state = heapq.heappop(heap)
        if state in done:
            continue
        done.add(state)
        if state == full:
            return steps.placement(graph, best, exact=True)
        if len(best) > max_states:
            raise _TooManyStates
        spent = best[state][0]
        for v in frontier[state]:
            for k in steps.starting_at[v]:
                members, inputs = usable[k][3], usable[k][4]
                if members & state or inputs & ~state:
                    continue
                after = state | members
                total = spent + steps.step_ms[k]
                if after not in best or total < best[after][0]:
                    best[after] = (total, state, k)
                    if after not in left:
                        frontier[after] = _advance(graph, producers, frontier[state], members, after)
                        left[after] = max(left[state] - steps.covers[k], 0.0)
                    heapq.heappush(heap, (total + left[after], next(tie), after))
        del frontier[state]  # a visited state is never expanded again
    raise PlacementError("no placement covers the whole graph with usable candidates")


def _lowest_node_search(graph, steps: _Steps, beam: int) -> Placement:
    """Each state expanded at its lowest unplaced node only, in groups by that node, the
    ``beam`` most promising of each group (cost plus estimate left)."""
    usable, n = steps.usable, len(graph)
    # groups[m]: state -> (cost, previous, step, estimate left) of the states whose lowest
    # unplaced node is m; group n holds the full state.
    groups: list[dict[int, tuple[float, int, int, float]]] = [{} for _ in range(n + 1)]
    groups[0][0] = (0.0, -1, -1, steps.left)
    reached: dict[int, tuple[float, int, int]] = {}
    for m in range(n + 1):
        group, groups[m] = _most_promising(groups[m], beam), {}
        for state, (spent, previous, k_in, left) in group.items():
            reached[state] = (spent, previous, k_in)
            for k in steps.starting_at[m] if m < n else ():
                members, inputs = usable[k][3], usable[k][4]
                if members & state or inputs & ~state:
                    continue
                after, total = state | members, spent + steps.step_ms[k]
                lowest = _lowest_unset(after)
                later = groups[lowest]
                if after not in later or total < later[after][0]:
                    later[after] = (total, state, k, left - steps.covers[k])
                    if len(later) > 4 * beam:  # bounded memory while a group fills
                        groups[lowest] = _most_promising(later, beam)
    if (1 << n) - 1 not in reached:
        raise PlacementError("no placement covers the whole graph with usable candidates")
    return steps.placement(graph, reached, exact=False)


def _most_promising(group: dict, beam: int) -> dict:
    if len(group) <= beam:
        return group
    return dict(heapq.nsmallest(beam, group.items(), key=lambda item: item[1][0] + item[1][3]))


def _lowest_unset(mask: int) -> int:
    return (~mask & (mask + 1)).bit_length() - 1


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
