"""Substitution rules as data: a source pattern in ``tvm.relax.dpl`` and a function that checks
a match and builds its replacement.

Two kinds, by the shape of their source graph:

- ``Rewrite``: a pattern rooted at one binding (a convolution of a convolution, a split of a
  concatenation). ``site(graph, matches)`` returns the Site, or None where the match is not
  valid (shapes, attributes, weights not constant).
- ``ParallelMerge``: two bindings that match the same ``branch`` pattern and read the same
  input (MetaFlow's parallel convolutions, the query/key/value matmuls). Matches with equal
  ``key`` can merge; ``site(graph, (a, b))`` builds the merged one.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from tvm import relax
from tvm.relax.dpl import DFPattern

from ...model.graph import DataflowGraph, Node
from .site import Site

Matches = Mapping[DFPattern, relax.Expr]


class Substitution(Protocol):
    name: str

    def sites(self, graph: DataflowGraph) -> Iterator[Site]:
        """Every site of ``graph`` where the substitution applies and is valid, in order."""


def matches_at(graph: DataflowGraph, pattern: DFPattern) -> Iterator[tuple[Node, Matches]]:
    """Each binding whose value ``pattern`` matches (seeing through variables), with the match."""
    for node in graph:
        if node.call is not None and pattern.match(node.value, graph.var2val):
            yield node, pattern.extract_matched_expr(node.value, graph.var2val)


def index_of(graph: DataflowGraph, expr: relax.Expr) -> int | None:
    """The graph index of the binding whose value is ``expr`` (a matched call), if any."""
    return graph.index_of_value.get(expr)


@dataclass(frozen=True)
class Rewrite:
    name: str
    pattern: DFPattern
    site: Callable[[DataflowGraph, Matches], Site | None]

    def sites(self, graph: DataflowGraph) -> Iterator[Site]:
        for _, matches in matches_at(graph, self.pattern):
            if (found := self.site(graph, matches)) is not None:
                yield found


@dataclass(frozen=True)
class ParallelMerge:
    name: str
    branch: DFPattern
    key: Callable[[DataflowGraph, Matches], Hashable | None]  # None: this match cannot merge
    site: Callable[[DataflowGraph, tuple[Matches, Matches]], Site | None]

    def sites(self, graph: DataflowGraph) -> Iterator[Site]:
        groups: dict[Hashable, list[Matches]] = defaultdict(list)
        for _, matches in matches_at(graph, self.branch):
            if (key := self.key(graph, matches)) is not None:
                groups[key].append(matches)
        for group in groups.values():
            for pair in itertools.combinations(group, 2):
                if (found := self.site(graph, pair)) is not None:
                    yield found
