"""BatchNorm removal in rewrites that compose.

An inference BatchNorm with constant statistics is a per-channel affine map, so
``batch_norm_to_affine`` replaces it with ``x * scale + shift``. When ``x`` comes from a
convolution with constant weights, ``fold_scale_into_conv`` moves ``scale`` into the
weights, which leaves ``conv(x, w * scale) + shift``: the BatchNorm is a bias add. A BatchNorm
after anything else (a concat, an add) stays as one multiply and one add.

A convolution with a bias before its BatchNorm (``nn.Conv2d(bias=True)``, the default, as
PyTorch's importer emits it) reads ``(conv + bias) * scale + shift``: ``scale_before_bias``
makes it ``conv * scale + bias * scale + shift``, and ``merge_constant_adds`` then leaves
one bias add. Left as they were, every such BatchNorm cost a multiply and an add over the
whole activation in every backend (a small U-Net through ``torch.export``: 5 multiplies).

TVM's ``FoldBatchnormToConv2D`` is not used: it matches only ``conv2d``, and when the
convolution has a second reader it emits a new convolution beside the old one.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, wildcard

from .pattern_rewrite import Matches, PatternRewrite

# --------------------------------------------------------------------------- batch_norm_to_affine

_bn_data = wildcard()
_bn_gamma, _bn_beta, _bn_mean, _bn_var = is_const(), is_const(), is_const(), is_const()
_bn = is_op("relax.nn.batch_norm")(_bn_data, _bn_gamma, _bn_beta, _bn_mean, _bn_var)
_bn_output = TupleGetItemPattern(_bn, 0)


def _channel_shape(ndim: int, axis: int, channels: int) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector along ``axis`` of an ``ndim``-d tensor."""
    shape = [1] * ndim
    shape[axis] = channels
    return tuple(shape)


def _batch_norm_to_affine(matches: Matches, single_use: set) -> relax.Expr | None:
    attrs = matches[_bn].attrs
    data = matches[_bn_data]
    if attrs.training or data.ty.ndim < 0:
        return None  # training mode normalizes with batch statistics, not the constants
    if matches[_bn] not in single_use:
        return None  # the mean and variance outputs are read too: the BatchNorm must stay
    gamma, beta, mean, var = (
        matches[p].value.numpy().astype(np.float64)
        for p in (_bn_gamma, _bn_beta, _bn_mean, _bn_var)
    )
    scale = 1.0 / np.sqrt(var + float(attrs.epsilon))
    if attrs.scale:
        scale = scale * gamma
    shift = -mean * scale
    if attrs.center:
        shift = shift + beta
    shape = _channel_shape(data.ty.ndim, int(attrs.axis) % data.ty.ndim, len(scale))
    dtype = str(data.ty.dtype)
    scaled = relax.op.multiply(data, relax.const(scale.reshape(shape), dtype))
    return relax.op.add(scaled, relax.const(shift.reshape(shape), dtype))


BATCH_NORM_TO_AFFINE = PatternRewrite("batch_norm_to_affine", _bn_output, _batch_norm_to_affine)

# --------------------------------------------------------------------------- fold_scale_into_conv

CONVOLUTIONS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_TRANSPOSED_CONVOLUTIONS = ("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose")

_conv_data, _conv_weight, _scale = wildcard(), is_const(), is_const()
_any_conv_op = is_op(CONVOLUTIONS[0])
for _name in CONVOLUTIONS[1:] + _TRANSPOSED_CONVOLUTIONS:
    _any_conv_op = _any_conv_op | is_op(_name)
_conv = _any_conv_op(_conv_data, _conv_weight)
_scaled_conv = is_op("relax.multiply")(_conv, _scale)  # the matcher also tries (_scale, _conv)


def per_channel(scale: np.ndarray, ndim: int, axis: int, channels: int) -> np.ndarray | None:
    """``scale`` as a vector of ``channels`` values if it broadcasts along ``axis`` only."""
    if scale.ndim > ndim:
        return None
    padded = scale.reshape((1,) * (ndim - scale.ndim) + scale.shape)
    if any(size != 1 for i, size in enumerate(padded.shape) if i != axis):
        return None
    if padded.shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(padded.reshape(-1), (channels,))


def _fold_scale_into_conv(matches: Matches, single_use: set) -> relax.Expr | None:
    conv = matches[_conv]
    attrs = conv.attrs
    if conv not in single_use:
        return None  # another reader still needs the unscaled output
    if not (attrs.kernel_layout.isupper() and attrs.out_layout.isupper()):
        return None  # packed layouts (NCHW16c) split the channel axis in two
    if conv.op.name in _TRANSPOSED_CONVOLUTIONS and attrs.groups != 1:
        return None  # grouped transposed weights hold out_channels / groups per group
    out = conv.ty
    channel_axis = attrs.out_layout.index("C")
    channels = out.shape.values[channel_axis] if out.shape is not None else None
    if not isinstance(channels, tvm.tirx.IntImm):
        return None  # the channel count is only known at run time
    scale = matches[_scale].value.numpy()
    if scale.dtype != str(out.dtype):
        return None
    vector = per_channel(scale, out.ndim, channel_axis, int(channels))
    if vector is None:
        return None
    weight = matches[_conv_weight].value.numpy()
    out_axis = attrs.kernel_layout.index("O")
    scaled_weight = weight * vector.reshape(_channel_shape(weight.ndim, out_axis, len(vector)))
    new_weight = relax.const(scaled_weight, str(weight.dtype))
    return relax.Call(conv.op, [matches[_conv_data], new_weight], attrs)


FOLD_SCALE_INTO_CONV = PatternRewrite("fold_scale_into_conv", _scaled_conv, _fold_scale_into_conv)

# --------------------------------------------------------------------------- scale_before_bias

_bias, _bias_scale = is_const(), is_const()
_biased_conv = is_op("relax.add")(_conv, _bias)
_scaled_biased_conv = is_op("relax.multiply")(_biased_conv, _bias_scale)


def _scale_before_bias(matches: Matches, single_use: set) -> relax.Expr | None:
    conv, biased = matches[_conv], matches[_biased_conv]
    if biased not in single_use or conv not in single_use:
        return None  # a reader of the biased or the plain output: the scale cannot reach the weights
    bias, scale = matches[_bias].value.numpy(), matches[_bias_scale].value.numpy()
    dtype = str(conv.ty.dtype)
    if bias.dtype != dtype or scale.dtype != dtype:
        return None
    scaled = relax.op.multiply(conv, matches[_bias_scale])
    return relax.op.add(scaled, relax.const((bias * scale).astype(dtype), dtype))


SCALE_BEFORE_BIAS = PatternRewrite("scale_before_bias", _scaled_biased_conv, _scale_before_bias)

# --------------------------------------------------------------------------- merge_constant_adds

_augend, _first_addend, _second_addend = wildcard(), is_const(), is_const()
_first_add = is_op("relax.add")(_augend, _first_addend)
_second_add = is_op("relax.add")(_first_add, _second_addend)


def _merge_constant_adds(matches: Matches, single_use: set) -> relax.Expr | None:
    if matches[_first_add] not in single_use:
        return None  # the first sum is read elsewhere: it stays, and merging would add work
    first, second = matches[_first_addend].value.numpy(), matches[_second_addend].value.numpy()
    dtype = str(matches[_second_add].ty.dtype)
    if first.dtype != dtype or second.dtype != dtype:
        return None
    return relax.op.add(matches[_augend], relax.const((first + second).astype(dtype), dtype))


MERGE_CONSTANT_ADDS = PatternRewrite("merge_constant_adds", _second_add, _merge_constant_adds)

# --------------------------------------------------------------------------- fold_scale_into_matmul

_mm_data, _mm_weight, _mm_scale = wildcard(), is_const(), is_const()
_mm = is_op("relax.matmul")(_mm_data, _mm_weight)
_mm_flat = is_op("relax.reshape")(_mm, wildcard())
_scaled_mm = is_op("relax.multiply")(_mm_flat | _mm, _mm_scale)


def _fold_scale_into_matmul(matches: Matches, single_use: set) -> relax.Expr | None:
    mm, scaled = matches[_mm], matches[_scaled_mm]
    flat = matches.get(_mm_flat)
    weight = matches[_mm_weight].value.numpy()
    if mm not in single_use or (flat is not None and flat not in single_use) or weight.ndim != 2:
        return None  # another reader needs the unscaled product; or a batch of weights
    outputs, out = weight.shape[1], scaled.ty
    if out.ndim < 1 or out.shape is None or int(out.shape.values[-1]) != outputs:
        return None  # the reshape between moved the output features off the last axis
    scale = matches[_mm_scale].value.numpy()
    if scale.dtype != weight.dtype or str(out.dtype) != str(weight.dtype):
        return None
    vector = per_channel(scale, out.ndim, out.ndim - 1, outputs)
    if vector is None:
        return None
    product = relax.op.matmul(matches[_mm_data], relax.const(weight * vector[None, :], str(weight.dtype)))
    return product if flat is None else relax.op.reshape(product, flat.args[1])


# A linear layer without bias before a BatchNorm1d (LeViT, SwiftFormer; the importer reshapes the
# tokens to (batch * tokens, features) for it): the BatchNorm's scale goes into the weights, as
# for a convolution, and leaves one bias add where ONNX Runtime ran a multiply and an add.
FOLD_SCALE_INTO_MATMUL = PatternRewrite("fold_scale_into_matmul", _scaled_mm, _fold_scale_into_matmul)
