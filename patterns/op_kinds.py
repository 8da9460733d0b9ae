"""Operator kinds as TVM's fusion sees them.

Relax operators carry no fusion kind of their own: TVM decides after lowering, by analysing
each operator's TIR (``AnnotateTIROpPattern``). We ask the same analysis, one operator at a
time, so our fusion rules agree with TVM's FuseOps.
"""

from __future__ import annotations

import enum

import tvm
from tvm import relax

from collage.model.graph import DataflowGraph, Node
from collage.candidates.subgraph import SubGraph


class OpKind(enum.IntEnum):
    """TVM's OpPatternKind (include/tvm/relax/op_attr_types.h), in its order."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4  # conv2d, matmul, softmax, layer_norm: an anchor
    TUPLE = 7
    OPAQUE = 8


# Structural nodes have no TIR; they move data around without computing.
_STRUCTURAL = {"tuple": OpKind.TUPLE, "tuple_get_item": OpKind.INJECTIVE, "alias": OpKind.ELEMWISE,
               "constant": OpKind.ELEMWISE}  # fmt: skip


def op_kind(graph: DataflowGraph, node: Node) -> OpKind:
    """The kind TVM assigns to ``node``'s operator at its shapes (cached per graph)."""
    cache = graph.__dict__.setdefault("_op_kinds", {})
    if node.index not in cache:
        cache[node.index] = _STRUCTURAL.get(node.op) or _analyse(SubGraph(graph, frozenset({node.index})))
    return cache[node.index]


def _analyse(single: SubGraph) -> OpKind:
    mod = tvm.IRModule({"main": single.extract()})
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    kinds = [
        int(f.attrs["op_pattern"])
        for f in mod.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "op_pattern" in f.attrs
    ]
    # No TIR at all (the op folded to a constant at legalization) computes nothing: injective.
    # Several kernels for one op: the op is as hard to fuse as its hardest kernel.
    return OpKind(max(kinds)) if kinds else OpKind.INJECTIVE
