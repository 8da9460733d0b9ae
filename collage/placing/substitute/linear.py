"""A linear operator folded into the linear operator that reads it, when nothing nonlinear lies
between (MetaFlow's fusion of consecutive linear layers).

- ``fold_conv_into_conv1x1``: ``conv1x1(conv(x, w1) [+ b1], w2)`` is one convolution
  ``conv(x, w2 . w1) [+ w2 . b1]``, with the first convolution's geometry;
- ``fold_matmul_into_matmul``: ``(x @ w1 [+ b1]) @ w2`` is ``x @ (w1 @ w2) [+ b1 @ w2]``.

The weights are multiplied here, once. The folded operator does less work when the middle
width is the largest of the three (a bottleneck widened and narrowed again) and more when
it is the smallest (a low-rank factorization): the search's cost decides which to keep. The
first operator's result must have no other reader, or it would be computed twice.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ...model.graph import DataflowGraph
from .rule import Matches, Rewrite, index_of
from .site import Emitter, Site, read_outside


def _linear_chain(op: str):
    """Patterns of ``op(op(x, w1) [+ b1], w2)``: (root, input, w1, first, bias, biased, w2)."""
    x, w1, b1, w2 = wildcard(), is_const(), is_const(), is_const()
    first = is_op(op)(x, w1)
    biased = is_op("relax.add")(first, b1)
    second = is_op(op)(first | biased, w2)
    return second, x, w1, first, b1, biased, w2


_CONV = _linear_chain("relax.nn.conv2d")
_MATMUL = _linear_chain("relax.matmul")


def _chain_site(rule: str, graph: DataflowGraph, matches: Matches, parts, fold) -> Site | None:
    """The site of a matched chain, if its intermediate results have no other reader; ``fold``
    gives the folded value from (input, w1, bias or None, w2) and the second call."""
    second, x, w1, first, b1, biased, w2 = parts
    calls = [matches[second], matches[first]] + ([matches[biased]] if biased in matches else [])
    nodes = tuple(sorted(index_of(graph, c) for c in calls))
    if None in nodes or read_outside(graph, nodes) != {index_of(graph, matches[second])}:
        return None  # an intermediate result is read elsewhere: folding would compute it twice
    bias = matches[b1].value.numpy() if biased in matches else None
    folded = fold(matches[w1].value.numpy(), bias, matches[w2].value.numpy(), matches[first], matches[second])
    if folded is None:
        return None
    weight, new_bias = folded
    root = index_of(graph, matches[second])

    def build(emit: Emitter) -> dict[int, relax.Expr]:
        call = matches[first]
        product = relax.Call(call.op, [call.args[0], relax.const(weight, str(weight.dtype))], call.attrs)
        if new_bias is None:
            return {root: product}
        return {root: relax.op.add(emit(product), relax.const(new_bias, str(new_bias.dtype)))}

    return Site(rule, nodes, build)


def _channel_vector(bias: np.ndarray, channels: int, axis_from_end: int) -> np.ndarray | None:
    """``bias`` as a vector of ``channels`` values if it broadcasts along that one axis only."""
    if bias.ndim < axis_from_end or bias.shape[-axis_from_end] != channels or bias.size != channels:
        return None
    return bias.reshape(channels)


def _fold_convs(w1, bias, w2, first: relax.Call, second: relax.Call):
    a1, a2 = first.attrs, second.attrs
    for attrs in (a1, a2):
        if attrs.groups != 1 or (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
            return None
    if w2.shape[2:] != (1, 1) or any(int(s) != 1 for s in a2.strides) or any(int(p) for p in a2.padding):
        return None  # the second must be a pointwise convolution: a matrix over channels
    if str(a1.out_dtype) != str(a2.out_dtype):
        return None
    mix = w2[:, :, 0, 0]
    weight = np.einsum("om,mikl->oikl", mix, w1).astype(w1.dtype)
    if bias is None:
        return weight, None
    vector = _channel_vector(bias, w1.shape[0], 3)
    if vector is None:
        return None
    return weight, (mix @ vector).astype(bias.dtype).reshape(1, -1, 1, 1)


def _fold_matmuls(w1, bias, w2, first: relax.Call, second: relax.Call):
    if w1.ndim != 2 or w2.ndim != 2 or str(first.attrs.out_dtype) != str(second.attrs.out_dtype):
        return None
    weight = (w1 @ w2).astype(w1.dtype)
    if bias is None:
        return weight, None
    vector = _channel_vector(bias, w1.shape[1], 1)
    if vector is None:
        return None
    return weight, (vector @ w2).astype(bias.dtype)


FOLD_CONV_INTO_CONV1X1 = Rewrite(
    "fold_conv_into_conv1x1", _CONV[0],
    lambda graph, matches: _chain_site("fold_conv_into_conv1x1", graph, matches, _CONV, _fold_convs),
)  # fmt: skip
FOLD_MATMUL_INTO_MATMUL = Rewrite(
    "fold_matmul_into_matmul", _MATMUL[0],
    lambda graph, matches: _chain_site("fold_matmul_into_matmul", graph, matches, _MATMUL, _fold_matmuls),
)  # fmt: skip
