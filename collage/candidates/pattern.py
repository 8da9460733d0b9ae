"""What a backend can run: explicit patterns, and pattern rules the generator grows.

Both are plain records; a backend lists them, nothing registers them globally.

- ``Pattern``: a tvm.relax.dpl pattern with named captures and an optional check, as in
  TVM's ``FusionPattern``. The check reads the captures and rejects what the backend's
  library cannot do (a layout, a dtype, a kernel size).
- ``PatternRule``: Collage's pattern rule. ``valid_op`` says which single operators the
  backend supports; ``fusion_rule`` says whether a group may grow by one more node. The
  generator (candidates.py) enumerates every connected, convex group the rule allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tvm import relax
from tvm.relax.dpl import CallPattern, DFPattern, TupleGetItemPattern, TuplePattern

from ..model.graph import DataflowGraph, Node
from .subgraph import SubGraph

_COVERING = (CallPattern, TuplePattern, TupleGetItemPattern)


@dataclass(frozen=True)
class Match:
    """One place a Pattern matched: the covered nodes and the named captures."""

    subgraph: SubGraph
    root: Node
    captures: Mapping[str, relax.Expr]

    def __getitem__(self, name: str) -> relax.Expr:
        return self.captures[name]


@dataclass(frozen=True)
class Pattern:
    """A named dpl pattern. Names start with the backend (``dnnl.conv2d_bias_relu``).

    ``annotations`` name sub-patterns whose matched expressions the check (and the backend's
    compile) can read; ``check(match) -> bool`` rejects matches the library cannot run.
    A fused kernel produces only its root's value, so a match whose intermediate values are
    used outside it is rejected unless ``allow_intermediate_outputs``.
    """

    name: str
    pattern: DFPattern
    annotations: Mapping[str, DFPattern] = field(default_factory=dict)
    check: Callable[[Match], bool] | None = None
    allow_intermediate_outputs: bool = False

    def match(self, graph: DataflowGraph, root: Node) -> Match | None:
        """The match rooted at ``root``, or None (no match, rejected, or not one kernel)."""
        if root.call is None:
            return None
        matched = self.pattern.extract_matched_expr(root.value, graph.var2val)
        if matched is None:
            return None
        # Operators the pattern names are covered; what wildcards match are the inputs.
        covered = {
            graph.index_of_value[e]
            for p, e in matched.items()
            if isinstance(p, _COVERING) and e in graph.index_of_value
        }
        sub = SubGraph(graph, frozenset(covered))
        if not self.allow_intermediate_outputs and sub.outputs != (root.index,):
            return None
        if not sub.is_convex() or not sub.has_tensor_boundary():
            return None
        match = Match(sub, root, {name: matched[p] for name, p in self.annotations.items() if p in matched})
        if self.check is not None and not self.check(match):
            return None
        return match


@dataclass(frozen=True)
class PatternRule:
    """Collage's pattern rule: supported operators plus a rule for growing groups.

    ``valid_op(graph, node)``: can the backend run this operator at all?
    ``fusion_rule(group, node)``: may ``group`` (a SubGraph of valid ops) absorb ``node``,
    a valid neighbour (producer or consumer) of it?
    Groups hold at most ``max_size`` nodes, which bounds the enumeration; with 0, none are
    grown and a graph-level backend offers its largest regions only (``generate.regions``).
    """

    name: str
    valid_op: Callable[[DataflowGraph, Node], bool]
    fusion_rule: Callable[[SubGraph, Node], bool]
    max_size: int = 8
