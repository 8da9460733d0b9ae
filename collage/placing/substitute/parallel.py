"""Parallel operators that read the same input, merged into one wider operator and a split
(MetaFlow's first family), and the kernel enlargement that lets convolutions of different
sizes merge.

- ``merge_parallel_conv2d``: ``conv2d(x, w1)`` and ``conv2d(x, w2)`` with the same strides,
  padding and dilation become ``split(conv2d(x, concat(w1, w2)))`` (Inception's and NASNet's
  branches, SqueezeNet's expand layers). One larger convolution fills the machine better
  than two thin ones, and the channels that follow can fuse as one.
- ``merge_parallel_matmul``: ``x @ w1`` and ``x @ w2`` become ``split(x @ concat(w1, w2))``
  (a transformer's query, key and value projections).
- ``enlarge_conv_kernel``: a convolution whose kernel is smaller than a sibling's (one that
  reads the same input with the same strides) gets the sibling's kernel size, zero weights
  around its own and padding widened to match. Alone it only adds work, which is why the
  search is relaxed: it is the step before ``merge_parallel_conv2d``.

Weights must be constants (they are concatenated or padded here, once) and shapes static.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from ...measuring.arrays import static_shape
from ...model.graph import DataflowGraph
from .rule import Matches, ParallelMerge, index_of
from .site import Emitter, Site, read_outside

_conv_input, _conv_weight = wildcard(), is_const()
_conv = is_op("relax.nn.conv2d")(_conv_input, _conv_weight)

_matmul_input, _matmul_weight = wildcard(), is_const()
_matmul = is_op("relax.matmul")(_matmul_input, _matmul_weight)


def _plain_conv(graph: DataflowGraph, matches: Matches) -> relax.Call | None:
    """The matched conv2d if it is one this family handles: static shapes, ungrouped, NCHW."""
    conv = matches[_conv]
    attrs = conv.attrs
    if attrs.groups != 1:
        return None  # a grouped convolution's weights are not one block of output channels
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return None  # the merge concatenates along O of OIHW and splits along C of NCHW
    if index_of(graph, conv) is None or conv.ty.shape is None:
        return None
    return conv


def _conv_key(graph: DataflowGraph, matches: Matches):
    """Convolutions merge when they read the same input with the same geometry and kernel."""
    conv = _plain_conv(graph, matches)
    if conv is None:
        return None
    a = conv.attrs
    kernel = static_shape(matches[_conv_weight].ty)[2:]
    return (conv.args[0], tuple(a.strides), tuple(a.padding), tuple(a.dilation), str(a.out_dtype), kernel)


def _merge(rule: str, call: DFPattern, weight: DFPattern, weight_axis: int):
    """The site function of a parallel merge: the two matched calls become one call of their
    weights concatenated along ``weight_axis``, whose output (last axis for a matmul, channels
    for a convolution) is split back into each call's part."""

    def site(graph: DataflowGraph, pair: tuple[Matches, Matches]) -> Site | None:
        calls = [m[call] for m in pair]
        nodes = tuple(sorted(index_of(graph, c) for c in calls))
        if len(set(nodes)) != len(nodes):
            return None
        weights = [m[weight].value.numpy() for m in pair]
        widths = [int(w.shape[weight_axis]) for w in weights]
        merged = np.concatenate(weights, axis=weight_axis)
        first = calls[0]
        out_axis = 1 if first.op.name == "relax.nn.conv2d" else first.ty.ndim - 1
        part_of = {index_of(graph, c): k for k, c in enumerate(calls)}

        def build(emit: Emitter) -> dict[int, relax.Expr]:
            wide = emit(relax.Call(first.op, [first.args[0], relax.const(merged, str(merged.dtype))], first.attrs))
            parts = emit(relax.op.split(wide, np.cumsum(widths)[:-1].tolist(), axis=out_axis))
            return {i: relax.TupleGetItem(parts, k) for i, k in part_of.items() if i in read_outside(graph, nodes)}

        return Site(rule, nodes, build)

    return site


MERGE_PARALLEL_CONV2D = ParallelMerge(
    "merge_parallel_conv2d", _conv, _conv_key, _merge("merge_parallel_conv2d", _conv, _conv_weight, weight_axis=0)
)


def _matmul_key(graph: DataflowGraph, matches: Matches):
    call = matches[_matmul]
    weight = matches[_matmul_weight]
    if index_of(graph, call) is None or weight.ty.ndim != 2 or call.ty.shape is None:
        return None  # a batched weight has no single column axis to concatenate along
    return (call.args[0], int(weight.ty.shape[0]), str(weight.ty.dtype), str(call.attrs.out_dtype))


MERGE_PARALLEL_MATMUL = ParallelMerge(
    "merge_parallel_matmul", _matmul, _matmul_key,
    _merge("merge_parallel_matmul", _matmul, _matmul_weight, weight_axis=1),
)  # fmt: skip


def _geometry_key(graph: DataflowGraph, matches: Matches):
    """Convolutions that could merge once their kernels had the same size."""
    conv = _plain_conv(graph, matches)
    if conv is None or any(d != 1 for d in conv.attrs.dilation):
        return None
    return (conv.args[0], tuple(conv.attrs.strides), str(conv.attrs.out_dtype))


def _enlarge(graph: DataflowGraph, pair: tuple[Matches, Matches]) -> Site | None:
    small, large = sorted(pair, key=lambda m: np.prod(static_shape(m[_conv_weight].ty)[2:]))
    weight = small[_conv_weight].value.numpy()
    (kh, kw), (KH, KW) = weight.shape[2:], static_shape(large[_conv_weight].ty)[2:]
    grow_h, grow_w = KH - kh, KW - kw
    if grow_h < 0 or grow_w < 0 or grow_h % 2 or grow_w % 2 or (grow_h, grow_w) == (0, 0):
        return None  # the small kernel must fit centred in the large one
    conv = small[_conv]
    top, left, bottom, right = (int(p) for p in conv.attrs.padding)
    padding = (top + grow_h // 2, left + grow_w // 2, bottom + grow_h // 2, right + grow_w // 2)
    if padding != tuple(int(p) for p in large[_conv].attrs.padding):
        return None  # enlarged, it still could not merge with this sibling
    enlarged = np.pad(weight, [(0, 0), (0, 0), (grow_h // 2,) * 2, (grow_w // 2,) * 2])
    node = index_of(graph, conv)
    a = conv.attrs

    def build(emit: Emitter) -> dict[int, relax.Expr]:
        return {node: relax.op.nn.conv2d(
            conv.args[0], relax.const(enlarged, str(enlarged.dtype)), a.strides, padding, a.dilation,
            a.groups, a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype,
        )}  # fmt: skip

    return Site("enlarge_conv_kernel", (node,), build)


ENLARGE_CONV_KERNEL = ParallelMerge("enlarge_conv_kernel", _conv, _geometry_key, _enlarge)
