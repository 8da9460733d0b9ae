"""The pattern generator: every legal (sub-graph, backend) pairing on one workload.

A Candidate is a connected, convex sub-graph, with only tensors crossing its boundary, that
one backend can run as one unit, found by
one of its explicit patterns or grown by one of its pattern rules. Candidates with the same
``key`` (backend, pattern, structural key of the sub-graph) compile to the same kernel and
are measured once.
"""

from __future__ import annotations

from collections import deque
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ..model.graph import DataflowGraph
from .backend import GRAPH_LEVEL
from .pattern import Pattern, PatternRule
from .precision import FLOAT32
from .subgraph import SubGraph

REGION_SUFFIX = ".region"  # an inference engine's largest-region candidates are named "<backend>.region"
PART_SUFFIX = ".part"  # "<backend>.part": the first or the last part of such a region, cut at one tensor
FILE_SUFFIX = ".model"  # an engine running the user's own file whole: "<backend>.model"
PROGRAM_SUFFIX = ".program"  # ... compiling the user's PyTorch program whole: "<backend>.program"
MAX_CUTS = 4  # cut places per region, spread evenly over it
# Groups grown from one seed, smallest first. Where element-wise operators are densely
# connected the connected groups of up to ``max_size`` are countless (an LSTM unrolled over
# 20 steps: 690,000 from one seed, and optimize never got past generating them); the zoo's
# busiest seed grows 232 (NASNet's concatenations).
MAX_GROUPS_PER_SEED = 256
# Past this many groups per node of the graph (the zoo grows at most 10), each further seed
# grows only its smallest few: every operator keeps its small fusions, and the count stays
# linear in the graph.
GROUPS_PER_NODE = 12
GROUPS_PER_SEED_PAST_BUDGET = 8
# A node reading more producers than this is a wide join (torch.stack over Mamba's 64 scan
# steps, a concat of many branches): a group holding one takes none of its producers or all,
# as Collage's tuple combiner merges a tuple with every field's sub-graph. Taken one at a
# time, its producers' subsets are countless (C(64, 3) = 41,664 from one stack), each a
# distinct candidate to measure, and the generator's budget runs out on them alone.
WIDE_JOIN = 8


@dataclass(frozen=True)
class Candidate:
    subgraph: SubGraph
    backend: str
    pattern: str  # the Pattern's or PatternRule's name
    precision: str = FLOAT32  # the number format the backend computes it in (``precision``)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.backend, self.pattern, self.subgraph.structural_key, self.precision)

    def __repr__(self):
        at = "" if self.precision == FLOAT32 else f", {self.precision}"
        return f"Candidate({self.backend}, {self.pattern}, {sorted(self.subgraph.nodes)}{at})"


def distinct(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The first candidate of each key, in order: what gets compiled and measured."""
    first: dict[tuple[str, str, str, str], Candidate] = {}
    for c in candidates:
        first.setdefault(c.key, c)
    return list(first.values())


def match_pattern(graph: DataflowGraph, pattern: Pattern) -> Iterator[SubGraph]:
    """Each place ``pattern`` matches, at most one match per root node."""
    for node in graph:
        match = pattern.match(graph, node)
        if match is not None:
            yield match.subgraph


def grow_rule(graph: DataflowGraph, rule: PatternRule, capped: dict[str, int] | None = None) -> Iterator[SubGraph]:
    """Every connected, convex group with a tensor boundary the rule can grow, each once.

    From each valid seed, groups grow by one valid neighbour at a time (producer or
    consumer; a wide join's producers all at once, ``WIDE_JOIN``) while the fusion rule
    allows it, the group stays convex and its size stays within ``max_size``. Non-convex
    groups are not grown further: dropping a first or last member keeps a group convex, so a
    convex group is reached through convex ones whenever such a member can go without
    disconnecting the rest, which holds for the chains, fans and diamonds of real models. It keeps the search from wandering through values shared
    far apart (BERT's attention mask feeds every layer).

    Groups grow breadth first, so the smallest come first, and each seed grows at most
    ``MAX_GROUPS_PER_SEED`` of them; once the graph has grown ``GROUPS_PER_NODE`` per node,
    ``GROUPS_PER_SEED_PAST_BUDGET`` (see there why). A seed stopped with groups left to grow
    counts one in ``capped[rule.name]``, so the report can say where larger fusions went untried.
    A rule of ``max_size`` 0 grows nothing: its backend's candidates are its regions.
    """
    if rule.max_size < 1:  # regions only: an engine whose every compile takes seconds
        return
    valid = [rule.valid_op(graph, node) for node in graph]
    seen: set[frozenset[int]] = set()
    budget, grown = GROUPS_PER_NODE * len(graph), 0
    for seed in graph:
        if not valid[seed.index]:
            continue
        cap = MAX_GROUPS_PER_SEED if grown < budget else GROUPS_PER_SEED_PAST_BUDGET
        todo, taken = deque([SubGraph(graph, frozenset({seed.index}))]), 0
        while todo and taken < cap:
            group = todo.popleft()
            taken += 1
            if group.has_tensor_boundary():
                yield group
            if len(group) == rule.max_size:
                continue
            for step in _steps(graph, group):
                nodes = group.nodes | step
                if nodes not in seen and all(valid[n] and rule.fusion_rule(group, graph[n]) for n in step):
                    seen.add(nodes)
                    bigger = SubGraph(graph, nodes)
                    if bigger.is_convex():
                        todo.append(bigger)
        grown += taken
        if todo and capped is not None:
            capped[rule.name] = capped.get(rule.name, 0) + 1


def _steps(graph: DataflowGraph, group: SubGraph) -> list[frozenset[int]]:
    """The node sets ``group`` grows by: each neighbour alone, but a wide join (``WIDE_JOIN``)
    with every producer it reads, so that a group holds none of them or all."""

    def wide(i: int) -> bool:
        return len(graph[i].inputs) > WIDE_JOIN

    steps = set()
    for i in group.nodes:
        if wide(i):
            steps.add(frozenset(graph[i].inputs))
        else:
            steps.update(frozenset({p}) for p in graph[i].inputs)
        steps.update(frozenset({c, *graph[c].inputs}) if wide(c) else frozenset({c}) for c in graph.consumers[i])
    steps = {step - group.nodes for step in steps}
    return sorted((step for step in steps if step), key=sorted)


def regions(graph: DataflowGraph, rule: PatternRule) -> Iterator[SubGraph]:
    """The maximal connected groups of ops the rule accepts, each when it is convex, has a
    tensor boundary and is larger than what ``grow_rule`` reaches, or is the whole model.
    A group that is not convex (an op the rule refuses in its middle, with a path around it:
    a residual connection past Mamba's scan kernel) is cut into the convex pieces on either
    side of such ops (``cut_at_refused_ops``).

    An inference engine optimizes across kernels (memory planning, its own fusions), so the
    largest region it can take is a candidate too: a placement is then never worse than that
    engine running all it can, under the measured costs.
    """
    valid = [rule.valid_op(graph, node) for node in graph]
    seen: set[int] = set()
    for seed in graph:
        if not valid[seed.index] or seed.index in seen:
            continue
        component = _connected(graph, {seed.index}, lambda j: valid[j])
        seen |= component
        region = SubGraph(graph, frozenset(component))
        pieces = [region] if region.is_convex() else cut_at_refused_ops(graph, component)
        for piece in pieces:
            larger = len(piece) > rule.max_size or len(piece) == len(graph)  # the whole model, however small
            if larger and piece.is_convex() and piece.has_tensor_boundary():
                yield piece


def _connected(graph: DataflowGraph, start: set[int], inside) -> set[int]:
    """The nodes reached from ``start`` through inputs and consumers for which ``inside`` holds."""
    component, todo = set(start), list(start)
    while todo:
        i = todo.pop()
        for j in (*graph[i].inputs, *graph.consumers[i]):
            if inside(j) and j not in component:
                component.add(j)
                todo.append(j)
    return component


def cut_at_refused_ops(graph: DataflowGraph, nodes: set[int]) -> list[SubGraph]:
    """``nodes`` cut where a path leaves them through other ops and comes back: grouped by
    how many such ops lie on a path to each (other ops a path from ``nodes`` passes), then
    each group by connection. Convex: the count never falls along a path and rises past an
    op outside, so a path between two nodes of one piece never leaves the piece."""
    downstream = [False] * len(graph)  # reached from ``nodes``: only such an op can lie between two of them
    outside_before = [0] * len(graph)
    for node in graph:  # node indices are in topological order
        i = node.index
        downstream[i] = any(p in nodes or downstream[p] for p in node.inputs)
        outside_before[i] = max((outside_before[p] + (downstream[p] and p not in nodes) for p in node.inputs), default=0)
    pieces = []
    for count in sorted({outside_before[i] for i in nodes}):
        group = {i for i in nodes if outside_before[i] == count}
        while group:
            piece = _connected(graph, {min(group)}, group.__contains__)
            group -= piece
            pieces.append(SubGraph(graph, frozenset(piece)))
    return pieces


def region_parts(region: SubGraph, cuts: int = MAX_CUTS) -> Iterator[SubGraph]:
    """The first and the last part of ``region`` at up to ``cuts`` places where a single tensor
    crosses from the one to the other, spread evenly over it.

    With another engine's part on the other side of a cut, a model is split between two
    engines: engines differ by layer kind (one runs the early, wide convolutions faster, another
    the late, deep ones), and a single crossing tensor keeps the hand-over cheap.
    """
    order = sorted(region.nodes)
    single = [k for k, crossing in enumerate(crossings(region)) if crossing == 1]
    if not single:
        return
    wanted = {min(single, key=lambda k: abs(k + 1 - len(order) * i / (cuts + 1))) for i in range(1, cuts + 1)}
    for k in sorted(wanted):
        for part in split_at(region, k):
            if part.is_convex() and part.has_tensor_boundary():
                yield part


def crossings(region: SubGraph) -> list[int]:
    """For each position ``k`` in ``region``'s topological order but the last, how many tensors
    cross from the ops up to ``k`` to the ops after it. One at a residual block's end or a
    transformer layer's: the cheapest places to hand a model over."""
    graph, order = region.graph, sorted(region.nodes)  # node indices are in topological order
    position = {node: k for k, node in enumerate(order)}
    last_use = [max((position[c] for c in graph.consumers[node] if c in position), default=k) for k, node in enumerate(order)]
    ends_at = [0] * len(order)
    for k, last in enumerate(last_use):
        ends_at[last] += last > k
    found, crossing = [], 0
    for k, last in enumerate(last_use[:-1]):
        crossing += (last > k) - ends_at[k]
        found.append(crossing)
    return found


def split_at(region: SubGraph, k: int) -> tuple[SubGraph, SubGraph]:
    """``region``'s ops up to position ``k`` of its topological order, and the ops after it."""
    order = sorted(region.nodes)
    return SubGraph(region.graph, frozenset(order[: k + 1])), SubGraph(region.graph, frozenset(order[k + 1 :]))


def generate(graph: DataflowGraph, backends: Iterable, capped: dict[str, int] | None = None) -> list[Candidate]:
    """All candidates of ``backends`` (Backend records) on ``graph``, in a stable order:
    pattern matches, groups grown by rules and, for inference engines (graph-level
    backends), their rules' largest regions (pattern name ``<backend>.region``) and those
    regions' parts at single-tensor cuts (``<backend>.part``). ``capped`` gains, for each
    rule, how many seeds stopped growing at ``grow_rule``'s cap with groups left to grow."""
    found: dict[tuple[str, str, frozenset[int]], Candidate] = {}
    for backend in backends:
        for pattern in backend.patterns:
            for sub in match_pattern(graph, pattern):
                found.setdefault((backend.name, pattern.name, sub.nodes), Candidate(sub, backend.name, pattern.name))
        for rule in backend.rules:
            for sub in grow_rule(graph, rule, capped):
                found.setdefault((backend.name, rule.name, sub.nodes), Candidate(sub, backend.name, rule.name))
            if backend.kind == GRAPH_LEVEL:
                name, part_name = f"{backend.name}{REGION_SUFFIX}", f"{backend.name}{PART_SUFFIX}"
                for sub in regions(graph, rule):
                    found.setdefault((backend.name, name, sub.nodes), Candidate(sub, backend.name, name))
                    for part in region_parts(sub):
                        if len(part) > rule.max_size:  # smaller ones are grown by the rule already
                            found.setdefault((backend.name, part_name, part.nodes), Candidate(part, backend.name, part_name))
    return sorted(found.values(), key=lambda c: (min(c.subgraph.nodes), c.backend, c.pattern, sorted(c.subgraph.nodes)))


def in_precisions(candidates: list[Candidate], offered: Mapping[str, tuple[str, ...]]) -> list[Candidate]:
    """``candidates``, then each again in every reduced precision its backend offers here
    (``offered``: backend name -> precisions besides float32), in the same order."""
    return candidates + [dataclasses.replace(c, precision=p) for c in candidates
                         for p in offered.get(c.backend, ())]  # fmt: skip
