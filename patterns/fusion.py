"""Fusion rules several backends share."""

from __future__ import annotations

from collage.model.graph import TUPLE_GET_ITEM, Node
from collage.candidates.subgraph import SubGraph

from collage.patterns.op_kinds import OpKind, op_kind


def is_anchor(kind: OpKind) -> bool:
    """Heavier than injective: a reduction, a conv/matmul-like op, or opaque."""
    return kind > OpKind.INJECTIVE and kind != OpKind.TUPLE


def anchor_then_elementwise(group: SubGraph, node: Node) -> bool:
    """TVM's FuseOps rule for one kernel: an anchor (conv, matmul, reduction...) absorbs the
    element-wise and broadcast ops that consume it; without an anchor, injective ops chain.
    An anchor never joins a group: groups grow from it as their seed. This is also what a
    library kernel with fused post-ops (bias, activation, residual add) can run.
    """
    g = group.graph
    kind = op_kind(g, node)
    if kind == OpKind.TUPLE or node.op == TUPLE_GET_ITEM:
        return True  # packing and unpacking move no data
    if is_anchor(kind):
        return False
    if any(is_anchor(op_kind(g, g[i])) for i in group.nodes):
        consumes_group = not any(c in group.nodes for c in g.consumers[node.index])
        return kind <= OpKind.BROADCAST and consumes_group
    return True


def never_fuse(group: SubGraph, node: Node) -> bool:
    """No group grows: for a rule whose backend offers its regions only (``max_size`` 0)."""
    return False
