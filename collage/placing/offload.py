"""The graph-level search space: which parts of the op-level placement to hand to an engine.

The op-level DP prices each candidate alone, so it cannot see what an inference engine gains
across kernels (its scheduling, memory planning and own fusions). Collage's graph-level step
(paper §4.3) revisits the op-level placement with one digit per *unit*:

- a unit is an op-level partition whose ops the engine can all run, or, where it cannot run
  them all, each op of that partition that it can (ops it cannot run are never offered);
- bit 0 keeps the op-level decision, bit 1 hands the unit to the engine;
- offloaded units that touch form one engine partition, split only where one partition
  could not run as one kernel (a path leaving it and coming back).

A partition that the op-level DP already gave to this engine is a unit too: 1 merges it with
the offloaded units around it, 0 keeps it on its own. So all zeros is the op-level placement
and all ones is the engine taking every op it can, the two seeds of the search.
"""

from __future__ import annotations

import graphlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..candidates.backend import Backend
from ..candidates.generate import Candidate
from ..candidates.subgraph import SubGraph
from ..measuring.cost import Cost
from ..model.graph import DataflowGraph
from .placement import Partition, tvm_op


@dataclass(frozen=True)
class OffloadSpace:
    """The units of one op-level placement that ``engine`` could take, in graph order."""

    graph: DataflowGraph
    partitions: tuple[Partition, ...]  # the op-level placement, in an order that runs
    engine: str
    units: tuple[frozenset[int], ...]

    @classmethod
    def of(cls, graph: DataflowGraph, partitions: Sequence[Partition], engine: Backend) -> OffloadSpace:
        def runs(i: int) -> bool:
            return any(rule.valid_op(graph, graph[i]) for rule in engine.rules)

        units = []
        for p in partitions:
            if all(runs(i) for i in p.nodes):
                units.append(p.nodes)
            else:
                units += [frozenset({i}) for i in sorted(p.nodes) if runs(i)]
        return cls(graph, tuple(partitions), engine.name, tuple(sorted(units, key=min)))

    def __len__(self):
        return len(self.units)

    @property
    def pattern(self) -> str:
        return f"{self.engine}.offload"

    def all_ones(self) -> list[int]:
        return [1] * len(self.units)

    def decode(self, bits: Sequence[int]) -> tuple[Partition, ...] | None:
        """The placement ``bits`` stand for, in an order that runs; None when its partitions
        would wait for each other, or an engine partition would pass a tuple across its edge."""
        if len(bits) != len(self.units):
            raise ValueError(f"expected {len(self.units)} bits, got {len(bits)}")
        offloaded = frozenset().union(*(u for u, bit in zip(self.units, bits) if bit))
        kept: list[Partition] = []
        for p in self.partitions:
            rest = p.nodes - offloaded
            if rest == p.nodes:
                kept.append(p)
            else:  # what the engine leaves of a partition runs op by op on TVM, which regroups it
                kept += [tvm_op(self.graph, i, "tvm.remainder") for i in sorted(rest)]
        own = {p.nodes: p for p in self.partitions if p.backend == self.engine}
        for piece in convex_pieces(self.graph, offloaded):
            sub = SubGraph(self.graph, piece)
            if not sub.has_tensor_boundary():
                return None
            kept.append(own.get(piece) or Partition(Candidate(sub, self.engine, self.pattern), Cost.unknown()))
        return in_running_order(kept)


def convex_pieces(graph: DataflowGraph, nodes: frozenset[int]) -> list[frozenset[int]]:
    """``nodes`` as few connected, convex groups as a greedy pass finds: each node joins the
    first group it touches that stays convex with it; then groups that touch merge while the
    union stays convex."""
    pieces: list[set[int]] = []
    for i in sorted(nodes):
        near = {*graph[i].inputs, *graph.consumers[i]}
        for piece in pieces:
            if near & piece and SubGraph(graph, frozenset(piece | {i})).is_convex():
                piece.add(i)
                break
        else:
            pieces.append({i})
    merged = True
    while merged:
        merged = False
        for a in range(len(pieces)):
            for b in range(a + 1, len(pieces)):
                touching = any(j in pieces[b] for i in pieces[a] for j in (*graph[i].inputs, *graph.consumers[i]))
                if touching and SubGraph(graph, frozenset(pieces[a] | pieces[b])).is_convex():
                    pieces[a] |= pieces.pop(b)
                    merged = True
                    break
            if merged:
                break
    return sorted((frozenset(p) for p in pieces), key=min)


def in_running_order(partitions: list[Partition]) -> tuple[Partition, ...] | None:
    """``partitions`` ordered so each runs after those it reads from (lowest first node first
    among the ready ones), or None when two wait for each other."""
    owner = {i: k for k, p in enumerate(partitions) for i in p.nodes}
    sorter = graphlib.TopologicalSorter(
        {k: {owner[i] for i in p.candidate.subgraph.input_nodes} for k, p in enumerate(partitions)}
    )
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return None
    order = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=lambda k: min(partitions[k].nodes))
        order += ready
        sorter.done(*ready)
    return tuple(partitions[k] for k in order)
