"""MetaFlow's backtracking search (Algorithm 1 of Jia et al., 2019) over substitution sites.

    Q = {G0}                       # a priority queue of graphs, cheapest first
    while Q is not empty:
        G = Q.dequeue()
        for each rule S, for each site of S in G:
            G' = S(G) at that site
            if G' was seen before: skip it
            if cost(G') < cost(G_opt): G_opt = G'
            if cost(G') < alpha * cost(G_opt): Q.enqueue(G')
    return G_opt

``alpha = 1`` is greedy (only strictly better graphs are expanded); a larger ``alpha`` accepts
steps that are slower on their own and explores more. The cost of a graph is a number to
minimize (collage's placement estimate, in ms, or energy); graphs are compared by TVM's
structural hash, so one reached by two paths is costed once. A time budget and a graph
budget stop the search; whatever stops it, the best graph found so far is returned.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import tvm
import tvm_ffi

from ...model.graph import DataflowGraph
from .rule import Substitution
from .site import apply

GraphCost = Callable[[tvm.IRModule], float]  # math.inf where the graph cannot run


class Step(NamedTuple):
    """One substitution applied: the rule, the graph indices of the site it rewrote, and which
    of the rule's sites over those nodes it was (a kernel can be enlarged to match either of
    two siblings), in the order the rule finds them."""

    rule: str
    nodes: tuple[int, ...]
    ordinal: int = 0


def steps_of(graph: DataflowGraph, rules: Sequence[Substitution]):
    """Each (rule, site, step) of ``graph``, rule by rule, in the order the rules find them."""
    for rule in rules:
        seen: Counter = Counter()
        for site in rule.sites(graph):
            yield rule, site, Step(rule.name, site.nodes, seen[site.nodes])
            seen[site.nodes] += 1


@dataclass(frozen=True)
class SearchResult:
    best: tvm.IRModule
    best_cost: float
    initial_cost: float
    applied: tuple[Step, ...]  # the sites on the path from the input to ``best``, in order
    explored: int  # graphs dequeued and expanded
    costed: int  # distinct graphs whose cost was asked, the input included
    pruned: int  # costed graphs not enqueued: cost at least alpha times the best
    seconds: float
    stopped_by: str  # "exhausted", "time budget" or "graph budget"
    failed: dict[str, str] = field(default_factory=dict)  # rule -> why applying it failed (its first failure)

    def rules_applied(self) -> Counter:
        return Counter(step.rule for step in self.applied)

    def summary(self) -> dict:
        return {
            "rules_applied": dict(self.rules_applied()), "initial_cost": self.initial_cost,
            "best_cost": self.best_cost, "explored": self.explored, "costed": self.costed,
            "pruned": self.pruned, "seconds": self.seconds, "stopped_by": self.stopped_by,
            "failed": dict(self.failed),
        }  # fmt: skip


def graph_key(mod: tvm.IRModule) -> int:
    return tvm_ffi.structural_hash(mod["main"])


def search(
    mod: tvm.IRModule,
    rules: Sequence[Substitution],
    cost: GraphCost,
    alpha: float = 1.05,
    budget_s: float = 120.0,
    max_graphs: int = 500,
) -> SearchResult:
    """The cheapest graph reachable from ``mod``'s ``main`` by ``rules`` under ``cost``, as far
    as ``alpha``, ``budget_s`` seconds and ``max_graphs`` costed graphs let the search see."""
    if alpha < 1:
        raise ValueError(f"alpha must be at least 1 (1 is greedy), got {alpha}")
    started = time.perf_counter()
    tie = itertools.count()  # equal costs dequeue in the order they were found
    initial = cost(mod)
    best = (initial, mod, ())
    queue = [(initial, next(tie), mod, ())]
    seen = {graph_key(mod)}
    explored = pruned = 0
    failed: dict[str, str] = {}
    stopped_by = "exhausted"
    while queue and stopped_by == "exhausted":
        _, _, current, path = heapq.heappop(queue)
        explored += 1
        graph = DataflowGraph.from_module(current)
        for rule, site, step in steps_of(graph, rules):
            if time.perf_counter() - started > budget_s:
                stopped_by = "time budget"
                break
            if len(seen) >= max_graphs:
                stopped_by = "graph budget"
                break
            try:
                candidate = apply(graph, site)
            except Exception as err:  # noqa: BLE001 -- a rule that fails on this graph loses that site only
                failed.setdefault(rule.name, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
                continue
            key = graph_key(candidate)
            if key in seen:
                continue
            seen.add(key)
            value = cost(candidate)
            if value < best[0]:
                best = (value, candidate, path + (step,))
            if value < alpha * best[0] and math.isfinite(value):
                heapq.heappush(queue, (value, next(tie), candidate, path + (step,)))
            else:
                pruned += 1
    best_cost, best_mod, applied = best
    return SearchResult(best_mod, best_cost, initial, applied, explored, len(seen), pruned,
                        time.perf_counter() - started, stopped_by, failed)  # fmt: skip


def replay(mod: tvm.IRModule, steps: Sequence[Step], rules: Sequence[Substitution]) -> tvm.IRModule:
    """``mod`` with ``steps`` applied in order, as a search found them (a saved placement of a
    substituted graph is rebuilt this way). Raises ValueError where a step does not fit."""
    by_name = {rule.name: rule for rule in rules}
    for wanted in steps:
        wanted = Step(wanted.rule, tuple(wanted.nodes), wanted.ordinal)
        if wanted.rule not in by_name:
            raise ValueError(f"unknown substitution rule {wanted.rule!r}")
        graph = DataflowGraph.from_module(mod)
        site = next((site for _, site, step in steps_of(graph, [by_name[wanted.rule]]) if step == wanted), None)
        if site is None:
            raise ValueError(f"{wanted.rule} does not apply at nodes {list(wanted.nodes)} of this graph")
        mod = apply(graph, site)
    return mod
