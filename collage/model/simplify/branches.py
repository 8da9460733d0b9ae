"""Parallel branches of one input, summed, as one convolution (structural re-parameterization).

RepVGG-style blocks train several branches on one input and add them: a 3x3 convolution, a
1x3 and a 3x1 one, a 1x1, the input itself through a BatchNorm. Every branch is linear in
the input, so at inference the sum is one convolution whose kernel is the branches' kernels
centred and added (RepVGG, Ding et al. 2021). Their authors fold it by hand before deploying;
exported as trained (transformers' TextNet, RT-DETR's RepVGG blocks, MobileOne, ACNet), the
model keeps every branch, and no engine folds it: ONNX Runtime and OpenVINO run each
convolution and the adds.

``merge_summed_convolutions`` folds ``a + b`` where each side is a term on the same input
``x``: ``conv(x, w)``, ``x * s`` with ``s`` per channel (a BatchNorm once
``batch_norm_to_affine`` has run), or ``x`` itself, each with an optional constant added (a
bias, a BatchNorm's shift). The result is again such a term, so a sum of four branches folds
in three iterations of the pipeline. A fold must not add work: the merged kernel has at
most as many taps as the convolutions it replaces together (a 3x3 and a 1x3 fold; a 1x3 and a
3x1 would become a 3x3, more multiply-adds than both, and stay).

``merge_summed_matmuls`` does the same for linear layers: ``a + b`` where each side is
``x @ W`` or a low-rank ``(x @ A) @ B`` of the same ``x``, each with an optional bias, is one
``x @ (W + A B)``. That is a LoRA adapter left unmerged (PEFT's ``base(x) + B(A(x)) * s``,
its scale already folded into ``B``), which every engine runs as three matmuls. The same
rule holds: the merged matrix must cost no more multiply-adds than the terms (a LoRA beside
its base layer always folds; two low-rank terms alone stay low-rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .batch_norm import CONVOLUTIONS, per_channel
from .ops import static_shape
from .pattern_rewrite import Matches, PatternRewrite


@dataclass(frozen=True)
class _TermPattern:
    """One operand of the sum: a convolution, a per-channel scale or the input, plus a constant."""

    conv: DFPattern
    conv_data: DFPattern
    weight: DFPattern
    scaled: DFPattern
    scaled_data: DFPattern
    scale: DFPattern
    bare: DFPattern
    bias: DFPattern
    biased: DFPattern
    term: DFPattern


def _term_pattern() -> _TermPattern:
    conv_data, weight = wildcard(), is_const()
    conv = is_op(CONVOLUTIONS[0])(conv_data, weight)
    for name in CONVOLUTIONS[1:]:
        conv = conv | is_op(name)(conv_data, weight)
    scaled_data, scale, bare, bias = wildcard(), is_const(), wildcard(), is_const()
    scaled = is_op("relax.multiply")(scaled_data, scale)
    linear = conv | scaled
    biased = is_op("relax.add")(linear, bias)
    # The bare input last: a wildcard matches any operand, the other alternatives are tried first.
    term = biased | linear | bare
    return _TermPattern(conv, conv_data, weight, scaled, scaled_data, scale, bare, bias, biased, term)


_LEFT, _RIGHT = _term_pattern(), _term_pattern()
_SUM = is_op("relax.add")(_LEFT.term, _RIGHT.term)


@dataclass(frozen=True)
class _Term:
    """A term as a convolution's kernel (``kernel_layout``) placed by its padding, and its constant."""

    data: relax.Expr
    weight: np.ndarray
    before: tuple[int, ...]  # padding before each spatial axis
    after: tuple[int, ...]
    bias: np.ndarray | None
    reads: tuple[relax.Expr, ...]  # the values folded away: each must have no other reader


def _spatial_axes(layout: str) -> list[int]:
    return [i for i, letter in enumerate(layout) if letter not in "OI"]


def _term(p: _TermPattern, matches: Matches, conv: relax.Call, kernel: np.ndarray) -> _Term | None:
    """The operand ``p`` matched as a term of the same geometry as ``conv`` (whose weights are
    ``kernel``), or None."""
    attrs = conv.attrs
    spatial = len(attrs.strides)
    bias = matches[p.bias].value.numpy() if p.biased in matches else None
    reads = [matches[p.biased]] if p.biased in matches else []
    if p.conv in matches:
        own = matches[p.conv]
        if own.op.name != conv.op.name or not _same_geometry(own.attrs, attrs):
            return None
        padding = [int(v) for v in own.attrs.padding]
        reads.append(own)
        return _Term(matches[p.conv_data], matches[p.weight].value.numpy(), tuple(padding[:spatial]),
                     tuple(padding[spatial:]), bias, tuple(reads))  # fmt: skip
    # The input itself, scaled per channel or not: a kernel of one tap, the scale on its diagonal.
    if any(int(s) != 1 for s in attrs.strides):
        return None
    data = matches[p.scaled_data] if p.scaled in matches else matches[p.bare]
    channel_axis = attrs.data_layout.index("C")
    data_shape = static_shape(data)
    if data_shape is None or len(data_shape) != len(attrs.data_layout):
        return None
    channels = data_shape[channel_axis]
    if p.scaled in matches:
        scale = matches[p.scale].value.numpy()
        vector = per_channel(scale, len(data_shape), channel_axis, channels) if scale.dtype == str(data.ty.dtype) else None
        if vector is None:
            return None
        reads.append(matches[p.scaled])
    else:
        vector = np.ones(channels, str(data.ty.dtype))
    layout = attrs.kernel_layout
    out_axis, in_axis = layout.index("O"), layout.index("I")
    if kernel.shape[out_axis] != channels:
        return None  # the identity needs as many outputs as inputs
    per_group = kernel.shape[in_axis]
    one_tap = [1] * kernel.ndim
    one_tap[out_axis], one_tap[in_axis] = channels, per_group
    weight = np.zeros(one_tap, kernel.dtype)
    for channel in range(channels):
        index = [0] * kernel.ndim
        index[out_axis], index[in_axis] = channel, channel % per_group
        weight[tuple(index)] = vector[channel]
    return _Term(data, weight, (0,) * spatial, (0,) * spatial, bias, tuple(reads))


def _same_geometry(a, b) -> bool:
    """Two convolutions whose kernels can be added: all but the padding alike."""
    return all(tvm_ffi.structural_equal(getattr(a, k), getattr(b, k)) for k in
               ("strides", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype"))  # fmt: skip


def _merged(terms: list[_Term], conv: relax.Call) -> relax.Expr | None:
    """One convolution computing the sum of ``terms``, its constant added; None if it needs more taps."""
    attrs = conv.attrs
    layout, dilation = attrs.kernel_layout, [int(d) for d in attrs.dilation]
    axes = _spatial_axes(layout)
    before = [max(t.before[i] for t in terms) for i in range(len(axes))]
    shifts, after = [], None
    for t in terms:
        taps = [t.weight.shape[a] for a in axes]
        offsets = [before[i] - t.before[i] for i in range(len(axes))]
        if any(o % d for o, d in zip(offsets, dilation)):
            return None  # the kernels' taps fall between each other's
        shifts.append([o // d for o, d in zip(offsets, dilation)])
        # The padding after each axis that keeps this term's output where it was.
        own_after = [t.before[i] + t.after[i] - dilation[i] * (taps[i] - 1) for i in range(len(axes))]
        after = own_after if after is None else after
        if own_after != after:
            return None  # the terms' outputs cover different windows
    size = [max(s[i] + t.weight.shape[a] for s, t in zip(shifts, terms)) for i, a in enumerate(axes)]
    if int(np.prod(size)) > sum(int(np.prod([t.weight.shape[a] for a in axes])) for t in terms):
        return None  # more multiply-adds than the branches: not a simplification
    shape = list(terms[0].weight.shape)
    for i, a in enumerate(axes):
        shape[a] = size[i]
    dtype = terms[0].weight.dtype
    weight = np.zeros(shape, np.float64)  # summed in double, rounded once
    for t, shift in zip(terms, shifts):
        window = [slice(None)] * len(shape)
        for i, a in enumerate(axes):
            window[a] = slice(shift[i], shift[i] + t.weight.shape[a])
        weight[tuple(window)] += t.weight
    weight = weight.astype(dtype)
    padding = [*before, *[after[i] + dilation[i] * (size[i] - 1) - before[i] for i in range(len(axes))]]
    if min(padding) < 0:
        return None
    make = getattr(relax.op.nn, conv.op.name.rsplit(".", 1)[1])
    merged = make(terms[0].data, relax.const(weight, str(weight.dtype)), strides=attrs.strides, padding=padding,
                  dilation=attrs.dilation, groups=attrs.groups, data_layout=attrs.data_layout,
                  kernel_layout=layout, out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)  # fmt: skip
    return _plus_biases(merged, [t.bias for t in terms if t.bias is not None], dtype)


def _plus_biases(merged: relax.Expr, biases: list[np.ndarray], dtype) -> relax.Expr:
    """``merged`` plus the terms' constants, summed in double and rounded once."""
    if not biases:
        return merged
    bias = np.sum(np.broadcast_arrays(*(b.astype(np.float64) for b in biases)), axis=0)
    return relax.op.add(merged, relax.const(bias.astype(dtype)))


def _merge_summed_convolutions(matches: Matches, single_use: set) -> relax.Expr | None:
    total = matches[_SUM]
    convs = [p for p in (_LEFT, _RIGHT) if p.conv in matches]
    if not convs:
        return None
    anchor, kernel = matches[convs[0].conv], matches[convs[0].weight].value.numpy()
    if not {"O", "I"} <= set(anchor.attrs.kernel_layout) or not anchor.attrs.kernel_layout.isupper():
        return None  # a packed layout (OIHW16o) splits a channel axis in two
    terms = [_term(p, matches, anchor, kernel) for p in (_LEFT, _RIGHT)]
    if None in terms or not terms[0].data.same_as(terms[1].data):
        return None
    if not all(read in single_use for t in terms for read in t.reads):
        return None  # a branch read elsewhere stays, and folding it in would compute it twice
    outputs = [matches[p.conv] if p.conv in matches else matches[p.scaled] if p.scaled in matches else matches[p.bare]
               for p in (_LEFT, _RIGHT)]  # fmt: skip
    if not all(tvm_ffi.structural_equal(o.ty, total.ty) for o in outputs):
        return None  # a branch broadcast by the add: not a sum of like outputs
    shape = static_shape(total)
    biases = [t.bias for t in terms if t.bias is not None]
    if shape is None or any(b.dtype != kernel.dtype or list(np.broadcast_shapes(b.shape, shape)) != shape for b in biases):
        return None  # a bias that broadcasts the sum further, or of another type
    return _merged(terms, anchor)


MERGE_SUMMED_CONVOLUTIONS = PatternRewrite("merge_summed_convolutions", _SUM, _merge_summed_convolutions)


@dataclass(frozen=True)
class _MatmulTermPattern:
    """One operand of a sum of linear layers: ``x @ W``, or ``(x @ A) @ B`` (as PyTorch's
    importer writes a linear layer on a batch of rows, maybe between a flattening reshape of
    ``x`` and one back), plus a constant on either side."""

    full: DFPattern
    full_data: DFPattern
    weight: DFPattern
    low_rank: DFPattern
    down: DFPattern
    down_data: DFPattern
    flat: DFPattern
    down_weight: DFPattern
    up_weight: DFPattern
    unflat: DFPattern
    bias: DFPattern
    bias_after: DFPattern
    bias_before: DFPattern
    term: DFPattern


def _matmul_term_pattern() -> _MatmulTermPattern:
    full_data, weight = wildcard(), is_const()
    full = is_op("relax.matmul")(full_data, weight)
    down_data, down_weight, up_weight = wildcard(), is_const(), is_const()
    flat = is_op("relax.reshape")(down_data, wildcard())
    down = is_op("relax.matmul")(flat | down_data, down_weight)
    low_rank = is_op("relax.matmul")(down, up_weight)
    unflat = is_op("relax.reshape")(low_rank, wildcard())
    linear = unflat | low_rank | full  # the low-rank forms first: their outer matmul is also ``full``
    bias = is_const()
    bias_after, bias_before = is_op("relax.add")(linear, bias), is_op("relax.add")(bias, linear)
    term = bias_after | bias_before | linear
    return _MatmulTermPattern(full, full_data, weight, low_rank, down, down_data, flat, down_weight, up_weight, unflat,
                              bias, bias_after, bias_before, term)  # fmt: skip


_MM_LEFT, _MM_RIGHT = _matmul_term_pattern(), _matmul_term_pattern()
_MM_SUM = is_op("relax.add")(_MM_LEFT.term, _MM_RIGHT.term)


@dataclass(frozen=True)
class _MatmulTerm:
    """A term as its (inputs, outputs) matrix, what computing it costs per row, and its constant."""

    data: relax.Expr
    matrix: np.ndarray  # float64
    multiply_adds: int  # per row of ``data``
    output: relax.Expr  # the product, before the bias
    bias: np.ndarray | None
    reads: tuple[relax.Expr, ...]  # the values folded away: each must have no other reader


def _same_rows(flat: relax.Call) -> bool:
    """A reshape that only regroups the leading axes, each row (the last axis) kept whole."""
    before, after = static_shape(flat.args[0]), static_shape(flat)
    return before is not None and after is not None and before[-1:] == after[-1:]


def _matmul_term(p: _MatmulTermPattern, matches: Matches) -> _MatmulTerm | None:
    biased = next((b for b in (p.bias_after, p.bias_before) if b in matches), None)
    bias = matches[p.bias].value.numpy() if biased is not None else None
    reads = [matches[biased]] if biased is not None else []
    if p.low_rank in matches:
        down, up = (matches[w].value.numpy() for w in (p.down_weight, p.up_weight))
        if down.ndim != 2 or up.ndim != 2 or down.shape[1] != up.shape[0] or down.dtype != up.dtype:
            return None
        if p.flat in matches and not _same_rows(matches[p.flat]):
            return None  # a reshape that moves numbers between rows: not the rows of ``x``
        output = matches[p.unflat] if p.unflat in matches else matches[p.low_rank]
        reads += [matches[p.down], matches[p.low_rank], *([matches[p.unflat]] if p.unflat in matches else [])]
        data, matrix = matches[p.down_data], down.astype(np.float64) @ up.astype(np.float64)
        multiply_adds = down.shape[1] * (down.shape[0] + up.shape[1])
        products = [matches[p.down], matches[p.low_rank]]
    else:
        weight = matches[p.weight].value.numpy()
        if weight.ndim != 2:
            return None  # a batch of matrices
        output = matches[p.full]
        reads.append(output)
        data, matrix, multiply_adds, products = matches[p.full_data], weight.astype(np.float64), weight.size, [output]
    dtype = str(output.ty.dtype)
    if any(m.attrs.out_dtype is not None and str(m.attrs.out_dtype) not in ("", "void", dtype) for m in products):
        return None  # a product accumulated in another type than its operands
    return _MatmulTerm(data, matrix, multiply_adds, output, bias, tuple(reads))


def _merge_summed_matmuls(matches: Matches, single_use: set) -> relax.Expr | None:
    total = matches[_MM_SUM]
    terms = [_matmul_term(p, matches) for p in (_MM_LEFT, _MM_RIGHT)]
    if None in terms or not terms[0].data.same_as(terms[1].data):
        return None
    if terms[0].matrix.shape != terms[1].matrix.shape:
        return None
    if terms[0].matrix.size > sum(t.multiply_adds for t in terms):
        return None  # two low-rank terms: merged, they would cost more than they do
    if not all(read in single_use for t in terms for read in t.reads):
        return None  # a branch read elsewhere stays, and folding it in would compute it twice
    if not all(tvm_ffi.structural_equal(t.output.ty, total.ty) for t in terms):
        return None  # a branch broadcast by the add: not a sum of like outputs
    dtype = str(total.ty.dtype)
    shape = static_shape(total)
    biases = [t.bias for t in terms if t.bias is not None]
    if shape is None or any(str(b.dtype) != dtype or list(np.broadcast_shapes(b.shape, shape)) != shape for b in biases):
        return None  # a bias that broadcasts the sum further, or of another type
    rows = static_shape(terms[0].data)
    if rows is None or [*rows[:-1], terms[0].matrix.shape[1]] != shape:
        return None  # the reshapes around a product regrouped its rows otherwise than ``x``'s
    merged = relax.op.matmul(terms[0].data, relax.const((terms[0].matrix + terms[1].matrix).astype(dtype)))
    return _plus_biases(merged, biases, dtype)


MERGE_SUMMED_MATMULS = PatternRewrite("merge_summed_matmuls", _MM_SUM, _merge_summed_matmuls)
