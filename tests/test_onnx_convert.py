"""Relax -> ONNX, operator by operator: each converter's model, run in ONNX Runtime, matches
TVM's default pipeline on the same tiny function (``mismatch`` tolerances). Every
operator of every zoo model converts, and what does not convert says why."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from tvm import relax

import collage

from collage.measuring.arrays import mismatch, random_inputs, to_tensors
from collage.measuring.build import run_reference
from collage.candidates.backend import Unsupported
from collage.candidates.subgraph import SubGraph
from collage.model.graph import DataflowGraph
from collage.model.onnx_nodes import attributes
from collage.candidates.onnx_convert import CONVERTERS, IR_VERSION, OPSET, supports, to_onnx
from experiments import models
from experiments.conversion_parity import onnxruntime_ops
from tests.helpers import zoo

op = relax.op
nn = relax.op.nn


def t(*shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def function(make, *param_types) -> relax.Function:
    """``main(p0, p1, ...) = make(p0, p1, ...)``; nested calls become their own bindings."""
    params = [relax.Var(f"p{i}", ty) for i, ty in enumerate(param_types)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    return bb.get()["main"]


def run_onnx(func, arrays):
    model = to_onnx(func)
    onnx.checker.check_model(model, full_check=True)  # also ONNX's strict shape inference
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(model.graph.input, arrays)})


def positive(x):
    return op.exp(x)


X = t(2, 3, 4)
IMG = t(1, 4, 8, 8)
IDS = t(2, 3, dtype="int64")
MASK = t(2, 3, 4, dtype="bool")

# (case id, function). Random inputs are standard normal floats, ints in [0, 8), booleans.
# fmt: off
CASES = [
    ("add", function(op.add, X, t(3, 1))),
    ("subtract", function(op.subtract, X, t(4))),
    ("multiply", function(op.multiply, X, X)),
    ("divide", function(op.divide, X, t(1, 3, 1))),
    ("power", function(lambda x, y: op.power(positive(x), y), X, t(4))),
    ("maximum", function(op.maximum, X, t(3, 4))),
    ("minimum", function(op.minimum, X, t(3, 4))),
    ("equal", function(op.equal, IDS, t(3, dtype="int64"))),
    ("not_equal", function(op.not_equal, IDS, t(3, dtype="int64"))),
    ("less", function(op.less, IDS, t(3, dtype="int64"))),
    ("greater", function(op.greater, IDS, t(3, dtype="int64"))),
    ("less_equal", function(op.less_equal, IDS, t(3, dtype="int64"))),
    ("greater_equal", function(lambda a: op.greater_equal(a, relax.const(3, "int64")), IDS)),
    ("logical", function(lambda a, b: op.logical_not(op.logical_or(op.logical_and(a, b), b)), MASK, MASK)),
    ("relu", function(nn.relu, X)),
    ("sigmoid", function(op.sigmoid, X)),
    ("tanh", function(op.tanh, X)),
    ("exp", function(op.exp, X)),
    ("log", function(lambda x: op.log(positive(x)), X)),
    ("sqrt", function(lambda x: op.sqrt(positive(x)), X)),
    ("rsqrt", function(lambda x: op.rsqrt(positive(x)), X)),
    ("erf", function(op.erf, X)),
    ("negative_abs", function(lambda x: op.negative(op.abs(x)), X)),
    ("floor_ceil", function(lambda x: op.add(op.floor(x), op.ceil(x)), X)),
    ("gelu", function(nn.gelu, X)),
    ("gelu_tanh", function(nn.gelu_tanh, X)),
    ("silu", function(nn.silu, X)),
    ("clip", function(lambda x: op.clip(x, -0.5, 0.5), X)),
    ("where", function(op.where, t(2, 1, 4, dtype="bool"), X, t(4))),
    ("where_scalars", function(lambda c: op.where(c, relax.const(0.0), relax.const(-3e38)), MASK)),
    ("astype_float_to_int", function(lambda x: op.astype(op.multiply(x, relax.const(3.0)), "int32"), X)),
    ("astype_int_to_float", function(lambda a: op.astype(a, "float32"), IDS)),
    ("matmul", function(op.matmul, t(2, 3, 4, 5), t(5, 6))),
    ("matmul_vector", function(op.matmul, t(5), t(2, 5, 3))),
    ("conv1d", function(lambda x, w: nn.conv1d(x, w, strides=2, padding=(1, 2)), t(1, 4, 9), t(6, 4, 3))),
    ("conv2d", function(
        lambda x, w: nn.conv2d(x, w, strides=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2)), IMG, t(6, 4, 3, 3))),
    ("conv2d_grouped", function(lambda x, w: nn.conv2d(x, w, padding=1, groups=4), IMG, t(8, 1, 3, 3))),
    ("conv3d", function(
        lambda x, w: nn.conv3d(x, w, strides=(1, 2, 2), padding=(1, 3, 3)), t(1, 3, 4, 8, 8), t(4, 3, 3, 7, 7))),
    ("conv1d_transpose", function(
        lambda x, w: nn.conv1d_transpose(x, w, strides=2, padding=1, output_padding=1), t(1, 4, 5), t(4, 3, 3))),
    ("conv2d_transpose", function(lambda x, w: nn.conv2d_transpose(x, w, strides=2, padding=1), IMG, t(4, 3, 4, 4))),
    ("max_pool2d", function(lambda x: nn.max_pool2d(x, 3, 2, padding=1), IMG)),
    ("max_pool2d_ceil", function(lambda x: nn.max_pool2d(x, 3, 2, ceil_mode=True), t(1, 2, 8, 8))),
    ("max_pool2d_ceil_padded", function(lambda x: nn.max_pool2d(x, 3, 2, padding=1, ceil_mode=True), t(1, 2, 8, 8))),
    ("avg_pool2d", function(lambda x: nn.avg_pool2d(x, 3, 1, padding=1, count_include_pad=True), IMG)),
    ("avg_pool2d_exclude_pad", function(lambda x: nn.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False), IMG)),
    ("avg_pool2d_ceil", function(lambda x: nn.avg_pool2d(x, 3, 2, ceil_mode=True, count_include_pad=False), IMG)),
    ("max_pool1d", function(lambda x: nn.max_pool1d(x, 3, 2, padding=1), t(1, 2, 9))),
    ("avg_pool1d", function(lambda x: nn.avg_pool1d(x, 2, 2), t(1, 2, 8))),
    ("max_pool3d", function(lambda x: nn.max_pool3d(x, 2, 2), t(1, 2, 4, 4, 4))),
    ("avg_pool3d", function(lambda x: nn.avg_pool3d(x, 2, 2), t(1, 2, 4, 4, 4))),
    ("adaptive_avg_pool2d_global", function(lambda x: nn.adaptive_avg_pool2d(x, 1), IMG)),
    ("adaptive_avg_pool2d", function(lambda x: nn.adaptive_avg_pool2d(x, (2, 4)), IMG)),
    ("adaptive_avg_pool1d", function(lambda x: nn.adaptive_avg_pool1d(x, 1), t(1, 2, 8))),
    ("adaptive_avg_pool3d", function(lambda x: nn.adaptive_avg_pool3d(x, 1), t(1, 2, 2, 4, 4))),
    ("batch_norm", function(
        lambda x, g, b, m, v: nn.batch_norm(x, g, b, m, positive(v), axis=1, training=False), IMG, *[t(4)] * 4)),
    ("batch_norm_item", function(
        lambda x, g, b, m, v: relax.TupleGetItem(nn.batch_norm(x, g, b, m, positive(v), axis=1, training=False), 0),
        IMG, *[t(4)] * 4)),
    ("layer_norm", function(lambda x, g, b: nn.layer_norm(x, g, b, axes=-1, epsilon=1e-12), X, t(4), t(4))),
    ("layer_norm_two_axes", function(lambda x, g, b: nn.layer_norm(x, g, b, axes=[1, 2]), X, t(3, 4), t(3, 4))),
    ("softmax", function(lambda x: nn.softmax(x, axis=1), X)),
    ("log_softmax", function(nn.log_softmax, X)),
    ("sum", function(lambda x: op.sum(x, axis=[0, 2]), X)),
    ("sum_all", function(op.sum, X)),
    ("mean", function(lambda x: op.mean(x, axis=[-1, -2], keepdims=True), IMG)),  # GlobalAveragePool
    ("mean_spatial_dropped", function(lambda x: op.mean(x, axis=[2, 3]), IMG)),  # and a Reshape
    ("mean_channels", function(lambda x: op.mean(x, axis=[1]), IMG)),  # ReduceMean
    ("max", function(lambda x: op.max(x, axis=1), X)),
    ("min", function(lambda x: op.min(x, axis=0, keepdims=True), X)),
    ("prod", function(lambda x: op.prod(x, axis=2), X)),
    ("reshape", function(lambda x: op.reshape(x, (4, -1)), X)),
    ("flatten", function(op.flatten, X)),
    ("expand_dims", function(lambda x: op.expand_dims(x, [0, -1]), X)),
    ("squeeze", function(lambda x: op.squeeze(x, [0]), t(1, 3, 1))),
    ("squeeze_all", function(op.squeeze, t(1, 3, 1))),
    ("broadcast_to", function(lambda x: op.broadcast_to(x, (2, 3, 4)), t(3, 1))),
    ("broadcast_to_bool", function(lambda m: op.broadcast_to(m, (2, 2, 3, 4)), MASK)),
    ("permute_dims", function(lambda x: op.permute_dims(x, [2, 0, 1]), X)),
    ("permute_dims_reverse", function(op.permute_dims, X)),
    ("permute_dims_negative_axes", function(lambda x: op.permute_dims(x, [0, -1, -2]), X)),  # Falcon-H1's
    ("concat", function(lambda a, b, c: op.concat([a, b, c], axis=1), X, t(2, 1, 4), X)),
    ("split_sections", function(lambda x: op.split(x, 2, axis=2), X)),
    ("split_indices", function(lambda x: op.split(x, [1, 3], axis=-1), X)),
    ("split_item", function(lambda x: relax.TupleGetItem(op.split(x, 3, axis=1), 2), X)),
    ("tuple_of_values", function(lambda x, y: relax.Tuple([op.add(x, y), x, op.add(x, y)]), X, X)),
    ("strided_slice", function(lambda x: op.strided_slice(x, [1, 2], [0, 3], [2, 0], [2, -1]), X)),
    ("strided_slice_to_end", function(lambda x: op.strided_slice(x, [2], [1], [2**63 - 1]), X)),
    ("take", function(lambda x, i: op.take(x, i, axis=0), t(10, 4), t(5, dtype="int32"))),
    ("take_axis1", function(lambda x, i: op.take(x, i, axis=1), t(2, 10), t(2, 3, dtype="int64"))),
    ("gather_elements", function(lambda x, i: op.gather_elements(x, i, axis=1), t(2, 9), IDS)),
    ("zeros", function(lambda: op.zeros((2, 3), "float32"))),
    ("ones", function(lambda: op.ones((2, 3), "int64"))),
    ("zeros_like", function(op.zeros_like, X)),
    ("ones_like", function(lambda x: op.ones_like(x, "int32"), X)),
    ("full", function(lambda: op.full((2, 3), relax.const(1.5), "float32"))),
    ("full_cast", function(lambda: op.full((), relax.const(7, "int64"), "float32"))),
    ("full_like", function(lambda x, v: op.full_like(x, v), X, t())),
    ("arange", function(lambda: op.arange(0, 16, 3, "int64"))),
    ("arange_float", function(lambda: op.arange(0.5, 4.0, 0.25, "float32"))),
    ("constant_binding", function(lambda x: op.add(x, relax.const(np.arange(4, dtype="float32"))), X)),
    # elementwise
    ("logical_xor", function(op.logical_xor, MASK, MASK)),
    ("trigonometric", function(lambda x: op.add(op.add(op.sin(x), op.cos(x)), op.atan(op.tan(x))), X)),
    ("inverse_trigonometric", function(lambda x: op.add(op.asin(op.tanh(x)), op.acos(op.tanh(x))), X)),
    ("hyperbolic", function(lambda x: op.add(op.sinh(x), op.cosh(x)), X)),
    ("inverse_hyperbolic", function(
        lambda x: op.add(op.add(op.asinh(x), op.acosh(op.add(positive(x), relax.const(1.0)))), op.atanh(op.tanh(x))),
        X)),
    ("sign", function(op.sign, X)),
    ("round", function(lambda x: op.round(op.multiply(x, relax.const(2.0))), X)),
    ("round_ties", function(lambda: op.round(relax.const(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], "float32"))))),
    ("trunc", function(lambda x: op.trunc(op.multiply(x, relax.const(3.0))), X)),
    ("square", function(op.square, X)),
    ("isnan", function(lambda x: op.isnan(op.log(x)), X)),
    ("isinf", function(lambda x: op.isinf(op.exp(op.multiply(x, relax.const(100.0)))), X)),
    ("isfinite", function(lambda x: op.isfinite(op.log(x)), X)),
    ("bitwise_bool", function(
        lambda a, b: op.bitwise_not(op.bitwise_xor(op.bitwise_or(op.bitwise_and(a, b), b), a)), MASK, MASK)),
    ("mod_int", function(lambda a: op.mod(op.subtract(a, relax.const(4, "int64")), relax.const(3, "int64")), IDS)),
    ("mod_float", function(lambda x: op.mod(op.multiply(x, relax.const(3.0)), relax.const(0.7)), X)),
    ("floor_mod_int", function(
        lambda a: op.floor_mod(op.subtract(a, relax.const(4, "int64")), relax.const(-3, "int64")), IDS)),
    ("floor_mod_float", function(lambda x: op.floor_mod(op.multiply(x, relax.const(3.0)), relax.const(0.7)), X)),
    ("floor_divide_int", function(
        lambda a: op.floor_divide(op.subtract(a, relax.const(4, "int64")), relax.const(3, "int64")), IDS)),
    ("floor_divide_float", function(lambda x, y: op.floor_divide(x, positive(y)), X, X)),
    ("floor_int", function(op.floor, IDS)),  # the floor of an integer division, as TVM's PyTorch importer writes it
    ("ceil_int", function(op.ceil, IDS)),
    ("round_int", function(op.round, IDS)),
    ("leakyrelu", function(lambda x: nn.leakyrelu(x, 0.1), X)),
    ("prelu", function(lambda x, a: nn.prelu(x, a), IMG, t(4))),
    ("prelu_last_axis", function(lambda x, a: nn.prelu(x, a, axis=2), X, t(4))),
    ("selu", function(nn.selu, X)),
    ("softplus", function(nn.softplus, X)),
    ("softplus_beta_threshold", function(lambda x: nn.softplus(x, beta=2.0, threshold=1.0), X)),
    # normalization and statistics
    ("rms_norm", function(lambda x, w: nn.rms_norm(x, w, axes=-1, epsilon=1e-6), X, t(4))),
    ("instance_norm", function(lambda x, g, b: nn.instance_norm(x, g, b, channel_axis=1, axes=[2, 3]), t(2, 4, 8, 8),
                               t(4), t(4))),
    ("instance_norm_torch", function(  # torch's frontend includes the batch axis, of 1
        lambda x, g, b: nn.instance_norm(x, g, b, channel_axis=1, axes=[0, 2, 3], epsilon=1e-3), IMG, t(4), t(4))),
    ("group_norm", function(
        lambda x, g, b: nn.group_norm(x, g, b, num_groups=2, channel_axis=1, axes=[2, 3]), t(2, 8, 5, 5), t(8), t(8))),
    ("group_norm_1d", function(
        lambda x, g, b: nn.group_norm(x, g, b, num_groups=4, channel_axis=1, axes=[2], epsilon=1e-3), t(2, 8, 6),
        t(8), t(8))),
    ("variance", function(lambda x: op.variance(x, axis=[-1], keepdims=True), X)),
    ("variance_all", function(op.variance, X)),
    ("std", function(lambda x: op.std(x, axis=[0, 2]), X)),
    ("argmax", function(lambda x: op.argmax(x, axis=-1), X)),
    ("argmax_all", function(op.argmax, X)),
    ("argmin", function(lambda x: op.argmin(x, axis=1, keepdims=True), X)),
    ("argmin_all_keepdims", function(lambda x: op.argmin(x, keepdims=True), X)),
    ("cumsum", function(lambda x: op.cumsum(x, axis=1), X)),
    ("cumsum_exclusive_int", function(lambda a: op.cumsum(a, axis=-1, exclusive=True), IDS)),
    ("cumsum_flat_cast", function(lambda a: op.cumsum(a, dtype="float32"), IDS)),
    ("topk", function(lambda x: op.topk(x, 2, axis=1, dtype="int64"), X)),
    ("topk_values_smallest", function(lambda x: op.topk(x, 3, ret_type="values", largest=False), X)),
    ("topk_indices", function(lambda x: op.topk(x, 2, axis=0, ret_type="indices"), X)),
    ("sort", function(lambda x: op.sort(x, axis=1), X)),
    ("sort_descending", function(lambda x: op.sort(x, descending=True), X)),
    ("argsort", function(lambda x: op.argsort(x, axis=0, descending=True), X)),
    ("argsort_int64", function(lambda x: op.argsort(x, dtype="int64"), X)),
    # pooling with ceil_mode, counting the padding
    ("avg_pool2d_ceil_count_pad", function(  # torch's AvgPool2d(3, 2, ceil_mode=True) on 7x7
        lambda x: nn.avg_pool2d(x, 3, 2, ceil_mode=True, count_include_pad=True), t(1, 2, 7, 7))),
    ("avg_pool2d_ceil_count_pad_overhang", function(
        lambda x: nn.avg_pool2d(x, 3, 2, ceil_mode=True, count_include_pad=True), t(1, 2, 8, 8))),
    ("avg_pool2d_ceil_count_pad_padded", function(
        lambda x: nn.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=True), t(1, 2, 8, 8))),
    ("avg_pool2d_ceil_huge_window", function(  # EfficientNet's AvgPool2d(640, ceil_mode=True) on 3x3
        lambda x: nn.avg_pool2d(x, 640, 640, ceil_mode=True, count_include_pad=True), t(1, 4, 3, 3))),
    ("avg_pool1d_ceil_count_pad", function(
        lambda x: nn.avg_pool1d(x, 4, 3, padding=1, ceil_mode=True, count_include_pad=True), t(1, 2, 9))),
    ("conv3d_transpose", function(lambda x, w: nn.conv3d_transpose(x, w, strides=2, padding=1), t(1, 2, 3, 4, 4),
                                  t(2, 3, 3, 3, 3))),
    # indexing and layout
    ("gather_nd", function(lambda x, i: op.gather_nd(x, i), t(8, 8, 4), t(5, 2, dtype="int64"))),
    ("gather_nd_batch", function(lambda x, i: op.gather_nd(x, i, batch_dims=1), t(2, 8, 4), t(2, 3, 1, dtype="int64"))),
    ("index_tensor", function(lambda x, i: op.index_tensor(x, [i]), t(8, 4), IDS)),
    ("index_tensor_broadcast", function(
        lambda x, i, j: op.index_tensor(x, [i, j]), t(8, 8, 3), t(2, 1, dtype="int32"), t(3, dtype="int64"))),
    ("scatter_elements", function(
        lambda x, u: op.scatter_elements(x, relax.const(np.array([[2, 0, 1], [1, 2, 0]], "int64")), u, axis=1),
        t(2, 3), t(2, 3))),
    ("scatter_elements_add", function(lambda x, i, u: op.scatter_elements(x, i, u, axis=0, reduction="add"),
                                      t(8, 3), IDS, t(2, 3))),
    ("slice_scatter", function(lambda x, s: op.slice_scatter(x, s, 1, 3, 1, axis=2), X, t(2, 3, 2))),
    ("slice_scatter_start", function(lambda x, s: op.slice_scatter(x, s, 0, 1, 1, axis=0), X, t(1, 3, 4))),
    ("flip", function(lambda x: op.flip(x, 1), X)),
    ("tile", function(lambda x: op.tile(x, [2, 1, 3]), X)),
    ("tile_more_axes", function(lambda x: op.tile(x, [2, 1, 1, 2]), X)),
    ("tile_fewer_repeats", function(lambda x: op.tile(x, [2]), X)),
    ("repeat", function(lambda x: op.repeat(x, 2, axis=1), X)),
    ("repeat_flat", function(lambda x: op.repeat(x, 3), X)),
    ("stack", function(lambda x, y: op.stack([x, y], axis=1), X, X)),
    ("stack_last", function(lambda x, y: op.stack([x, y], axis=-1), X, X)),
    ("batch_flatten", function(nn.batch_flatten, IMG)),
    ("tril", function(lambda x: op.tril(x, 1), X)),
    ("triu", function(lambda x: op.triu(x, -1), t(5, 5))),
    ("einsum", function(lambda x, y: op.einsum([x, y], "bij,bkj->bik"), X, X)),
    ("one_hot", function(lambda a: op.one_hot(a, 1.0, 0.0, 6), IDS)),
    ("one_hot_axis0_int", function(lambda a: op.one_hot(op.subtract(a, relax.const(1, "int64")), 5, -1, 8, axis=0),
                                   IDS)),
    ("pad_constant", function(lambda x: nn.pad(x, [0, 0, 0, 0, 0, 1, 1, 2], pad_value=0.5), IMG)),
    ("pad_int", function(lambda a: nn.pad(a, [1, 0, 2, 2], pad_value=7), IDS)),
    # RWKV's token shift: a token in front, the last dropped (a crop, then a pad)
    ("pad_negative", function(lambda x: nn.pad(x, [0, 0, 0, 0, 1, -1, -2, 1]), IMG)),
    ("pad_reflect", function(lambda x: nn.pad(x, [0, 0, 0, 0, 2, 1, 1, 3], pad_mode="reflect"), IMG)),
    ("pad_replicate", function(lambda x: nn.pad(x, [0, 0, 1, 0, 0, 2], pad_mode="replicate"), X)),
    ("resize_nearest", function(  # torch's interpolate(scale_factor=2, mode="nearest")
        lambda x: relax.op.image.resize2d(x, (16, 16), method="nearest_neighbor", rounding_method="round"), IMG)),
    ("resize_nearest_half", function(  # ties x.5 round down to even
        lambda x: relax.op.image.resize2d(x, (4, 4), method="nearest_neighbor", rounding_method="round"), IMG)),
    ("resize_nearest_quarter", function(  # ties x.5 round up to even
        lambda x: relax.op.image.resize2d(x, (2, 2), method="nearest_neighbor", rounding_method="round"), IMG)),
    ("resize_nearest_prefer_ceil", function(
        lambda x: relax.op.image.resize2d(x, (4, 2), method="nearest_neighbor", rounding_method="round_prefer_ceil"),
        IMG)),
    ("resize_nearest_asymmetric_floor", function(
        lambda x: relax.op.image.resize2d(x, (16, 24), method="nearest_neighbor",
                                          coordinate_transformation_mode="asymmetric", rounding_method="floor"), IMG)),
    ("resize_nearest_align_corners", function(
        lambda x: relax.op.image.resize2d(x, (22, 5), method="nearest_neighbor",
                                          coordinate_transformation_mode="align_corners"), IMG)),
    ("resize_linear", function(lambda x: relax.op.image.resize2d(x, (16, 12)), IMG)),
    ("resize_linear_down", function(
        lambda x: relax.op.image.resize2d(x, (3, 5), coordinate_transformation_mode="pytorch_half_pixel"), IMG)),
    ("resize_linear_align_corners", function(
        lambda x: relax.op.image.resize2d(x, (10, 12), coordinate_transformation_mode="align_corners"), IMG)),
    ("resize_cubic", function(lambda x: relax.op.image.resize2d(x, (16, 12), method="cubic"), IMG)),
    ("resize_cubic_align_corners_exclude", function(
        lambda x: relax.op.image.resize2d(x, (5, 3), method="cubic", coordinate_transformation_mode="align_corners",
                                          cubic_alpha=-0.5, cubic_exclude=1), IMG)),
    ("resize_linear_asymmetric", function(
        lambda x: relax.op.image.resize2d(x, (12, 20), coordinate_transformation_mode="asymmetric"), IMG)),
]
# fmt: on


@pytest.mark.parametrize("func", [f for _, f in CASES], ids=[name for name, _ in CASES])
def test_operator_matches_tvm(func):
    arrays = random_inputs(func)
    assert mismatch(run_onnx(func, arrays), run_reference(func, arrays)) is None


def test_every_converter_is_tested():
    tested = {node.op for _, func in CASES for node in DataflowGraph(func)}
    # call_tir converts simplification's scan kernel only, tested on a loop it rolled up below.
    assert set(CONVERTERS) - tested == {"relax.call_tir"}


class Recurrence(torch.nn.Module):
    """RecurrentGemma's RG-LRU as exported: ``h = a_t * h + b_t``, a step per token, stacked."""

    def forward(self, a, b):
        h, states = torch.zeros_like(a[:, 0]), []
        for t in range(a.shape[1]):
            h = a[:, t] * h + b[:, t]
            states.append(h)
        return torch.stack(states, 1).tanh()


def rolled_up_recurrences():
    """The loops simplification rolls into a kernel: the linear one (RG-LRU) and RWKV's."""
    from tests.test_recurrences import TimeMixing

    return [Recurrence(), TimeMixing()]


@pytest.mark.parametrize("net", rolled_up_recurrences(), ids=["linear", "element-wise"])
def test_a_rolled_up_recurrence_is_written_out_again_for_the_engines(net):
    from collage.model.frontend import import_model

    a, b = torch.rand(2, 12, 16), torch.randn(2, 12, 16)
    simplified = collage.simplify(import_model(net.eval(), example_inputs=(a, b)).mod)
    graph = DataflowGraph.from_module(simplified)
    assert "relax.call_tir" in {node.op for node in graph}  # the loop, one kernel
    func = SubGraph(graph, frozenset(range(len(graph)))).extract()
    arrays = [a.numpy(), b.numpy()]
    session = ort.InferenceSession(to_onnx(func).SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip([i.name for i in session.get_inputs()], arrays)))
    assert mismatch(got, run_reference(func, arrays)) is None
    with torch.no_grad():
        assert mismatch(got, [net(a, b).numpy()]) is None


def test_model_format():
    model = to_onnx(function(lambda x, y: relax.Tuple([x, op.add(x, y)]), X, t(4)))
    assert model.ir_version == IR_VERSION == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["p0", "p1"]
    assert [o.name for o in model.graph.output] == ["out0", "out1"]


def test_constants_become_initializers():
    weight = np.arange(12, dtype="float32").reshape(3, 4)
    model = to_onnx(function(lambda x: op.matmul(x, relax.const(weight)), t(2, 3)))
    assert [i.name for i in model.graph.input] == ["p0"]
    (initializer,) = model.graph.initializer
    np.testing.assert_array_equal(numpy_helper.to_array(initializer), weight)


def _hard_swish(x):
    return op.divide(op.multiply(x, op.clip(op.add(x, relax.const(3.0)), 0, 6)), relax.const(6.0))


def _hard_sigmoid(z):
    return op.divide(op.clip(z, 0, 6), relax.const(6.0))


@pytest.mark.parametrize(
    "make, fused",
    [
        (_hard_swish, {"HardSwish"}),
        (lambda x: _hard_sigmoid(op.add(x, relax.const(3.0))), {"HardSigmoid"}),
        # near misses: the 3 inside a bias (OpenVINO gets HardSigmoid's beta=0 wrong), another
        # bound, another divisor, the clip read twice
        (_hard_sigmoid, set()),
        (lambda x: op.divide(op.multiply(x, op.clip(op.add(x, relax.const(3.0)), 0, 5)), relax.const(6.0)), set()),
        (lambda x: op.divide(op.clip(op.add(x, relax.const(3.0)), 0, 6), relax.const(5.0)), set()),
        (lambda x: (lambda c: op.add(op.divide(c, relax.const(6.0)), c))(op.clip(x, 0, 6)), set()),
    ],
)
def test_hard_activations_become_onnx_operators_where_they_match(make, fused):
    func = function(make, X)
    model = to_onnx(func)
    found = {n.op_type for n in model.graph.node} & {"HardSwish", "HardSigmoid"}
    assert found == fused
    if fused:
        assert {n.op_type for n in model.graph.node} == fused | {"Identity"}
        assert [i.name for i in model.graph.initializer] == []  # the fused constants are gone
    arrays = [random_inputs(func)[0] * 4]
    expected = run_reference(func, arrays)
    assert mismatch(run_onnx(func, arrays), expected) is None
    from collage.backends.openvino import compile_onnx  # the other engine reading these operators

    outputs = to_tensors([np.empty_like(expected[0])])
    compile_onnx(model, "llvm", 0)(*to_tensors(arrays), *outputs)
    assert mismatch([outputs[0].numpy()], expected) is None


def _l2_norm(x):  # torch.norm over the spatial axes, as PyTorch's importer spells it out
    return op.power(op.sum(op.power(op.abs(x), relax.const(2.0)), axis=[2, 3], keepdims=True), relax.const(0.5))


@pytest.mark.parametrize(
    "make, fused, gone",
    [
        (nn.gelu, "Gelu", {"Erf"}),  # ONNX Runtime's fusion looks for the exporter's Div by sqrt 2
        (_l2_norm, "ReduceL2", {"Pow", "ReduceSum", "Abs"}),
    ],
)
def test_the_engines_fuse_what_the_conversion_writes_as_the_exporter_does(make, fused, gone):
    func = function(make, IMG)
    model = to_onnx(func)
    optimized = set(onnxruntime_ops(model, threads=2))
    assert fused in optimized and not optimized & gone
    arrays = random_inputs(func)
    expected = run_reference(func, arrays)
    assert mismatch(run_onnx(func, arrays), expected) is None
    from collage.backends.openvino import compile_onnx

    outputs = to_tensors([np.empty_like(expected[0])])
    compile_onnx(model, "llvm", 0)(*to_tensors(arrays), *outputs)
    assert mismatch([outputs[0].numpy()], expected) is None


def _prelu(slope: np.ndarray, zero: float = 0.0):  # nn.PReLU as PyTorch's importer spells it out
    return lambda x: op.where(op.greater(x, relax.const(zero)), x, op.multiply(relax.const(slope), x))


@pytest.mark.parametrize(
    "make, fused",
    [
        (_prelu(np.array([0.25], "float32")), True),
        (_prelu(np.linspace(-1, 1, 4, dtype="float32").reshape(1, 4, 1, 1)), True),  # per channel of IMG
        (_prelu(np.array([0.25], "float32"), zero=0.5), False),  # another threshold
        (_prelu(np.ones((2, 4, 8, 8), "float32")), False),  # a slope that broadcasts x
    ],
)
def test_a_spelled_out_prelu_is_onnxs_prelu_where_it_is_one(make, fused):
    func = function(make, IMG)
    model = to_onnx(func)
    assert ({n.op_type for n in model.graph.node} == {"PRelu", "Identity"}) == fused
    arrays = random_inputs(func)
    expected = run_reference(func, arrays)
    assert mismatch(run_onnx(func, arrays), expected) is None


def _pixel_shuffle(six, perm, n=1, c=2, r=2, h=4, w=4):  # nn.PixelShuffle (CRD) as PyTorch's importer spells it out
    return lambda x: op.reshape(op.permute_dims(op.reshape(x, six(n, c, r, h, w)), perm), (n, c, h * r, w * r))


@pytest.mark.parametrize(
    "six, perm, mode",
    [
        (lambda n, c, r, h, w: (n, c, r, r, h, w), [0, 1, 4, 2, 5, 3], "CRD"),  # torch's PixelShuffle
        (lambda n, c, r, h, w: (n, r, r, c, h, w), [0, 3, 4, 1, 5, 2], "DCR"),  # TensorFlow's depth_to_space
        (lambda n, c, r, h, w: (n, c, r, r, h, w), [0, 1, 4, 3, 5, 2], None),  # each block transposed: neither
    ],
)
def test_a_spelled_out_pixel_shuffle_is_onnxs_depth_to_space(six, perm, mode):
    func = function(_pixel_shuffle(six, perm), t(1, 8, 4, 4))
    model = to_onnx(func)
    ops = {n.op_type for n in model.graph.node}
    if mode is None:
        assert "DepthToSpace" not in ops
    else:
        (node,) = [n for n in model.graph.node if n.op_type == "DepthToSpace"]
        assert ops <= {"DepthToSpace", "Identity"} and attributes(node) == {"blocksize": 2, "mode": mode.encode()}
    arrays = random_inputs(func)
    assert mismatch(run_onnx(func, arrays), run_reference(func, arrays)) is None


def test_a_sum_of_squares_read_elsewhere_is_no_l2_norm():
    def norm_and_sum(x):
        squares = op.power(x, relax.const(2.0))
        return op.add(op.power(op.sum(squares, axis=[2, 3], keepdims=True), relax.const(0.5)), op.mean(squares))

    func = function(norm_and_sum, IMG)
    assert "ReduceL2" not in {n.op_type for n in to_onnx(func).graph.node}
    arrays = random_inputs(func)
    assert mismatch(run_onnx(func, arrays), run_reference(func, arrays)) is None


# ------------------------------------------------------------------ what does not convert


def only_node(func):
    graph = DataflowGraph(func)
    return graph, graph[0]


def test_unknown_operator_is_named():
    func = function(lambda x: op.cumprod(x, axis=1), X)
    assert supports(*only_node(func)) == "operator relax.cumprod has no ONNX conversion"
    with pytest.raises(Unsupported, match="relax.cumprod"):
        to_onnx(func)


def test_unsupported_dtype_is_named():
    func = function(nn.relu, t(2, 3, dtype="bfloat16"))
    assert supports(*only_node(func)).startswith("dtype bfloat16 is not supported")
    with pytest.raises(Unsupported, match="bfloat16"):
        to_onnx(func)


@pytest.mark.parametrize(
    "make, types, reason",
    [
        (lambda x, w: nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO"), (t(1, 8, 8, 4), t(3, 3, 4, 6)),
         "relax.nn.conv2d: layout NHWC is not supported"),
        (lambda x, i: op.take(x, i, axis=0, mode="clip"), (t(10, 4), t(5, dtype="int32")),
         "relax.take: mode 'clip' is not supported"),
        (lambda x: nn.adaptive_avg_pool2d(x, 3), (IMG,),
         "relax.nn.adaptive_avg_pool2d: output size (3, 3) from (8, 8)"),
        (lambda x, g, b, m, v: nn.batch_norm(x, g, b, m, v, axis=1), (IMG, *[t(4)] * 4),
         "relax.nn.batch_norm: training mode is not supported"),
        (lambda x, g, b: nn.layer_norm(x, g, b, axes=-1, center=False), (X, t(4), t(4)),
         "relax.nn.layer_norm: center=False or scale=False is not supported"),
        (lambda x: nn.pad(x, [0, 0, 1, 1, 2, 2], pad_mode="circular"), (X,),
         "relax.nn.pad: pad_mode 'circular' is not supported"),
        (lambda a, b: op.bitwise_and(a, b), (IDS, IDS),
         "relax.bitwise_and: dtype int64 (opset 17 has bitwise operators for booleans only)"),
        (lambda x: relax.op.image.resize2d(x, (16, 16), coordinate_transformation_mode="tf_crop_and_resize"), (IMG,),
         "relax.image.resize2d: coordinate_transformation_mode 'tf_crop_and_resize'"),
        (lambda x: relax.op.image.resize2d(x, (12, 12), method="nearest_neighbor", rounding_method="floor"), (IMG,),
         "relax.image.resize2d: rounding_method 'floor' (TVM nudges it by 1e-5)"),
        (lambda x: relax.op.image.resize2d(x, (4, 2), method="nearest_neighbor"), (IMG,),
         "relax.image.resize2d: rounding ties both ways"),
        (lambda x, i, u: op.scatter_elements(x, i, u, reduction="max"), (t(8, 3), IDS, t(2, 3)),
         "relax.scatter_elements: reduction 'max'"),
        (lambda x, s: op.slice_scatter(x, s, 0, 4, 2, axis=2), (X, t(2, 3, 2)),
         "relax.slice_scatter: step 2"),
        (lambda x, g, b: nn.group_norm(x, g, b, 2, channel_axis=-1, axes=[1, 2]), (t(1, 5, 5, 8), t(8), t(8)),
         "relax.nn.group_norm: channel_axis -1"),
    ],
    ids=["conv2d_nhwc", "take_clip", "adaptive_pool_uneven", "batch_norm_training", "layer_norm_without_beta",
         "pad_circular", "bitwise_and_int", "resize_crop", "resize_floor", "resize_ties_both_ways", "scatter_max",
         "slice_scatter_step", "group_norm_nhwc"],
)  # fmt: skip
def test_unsupported_attribute_is_named(make, types, reason):
    assert supports(*only_node(function(make, *types))).startswith(reason)


# ------------------------------------------------------------------ the zoo


@pytest.mark.parametrize("name", list(models.MODELS))
def test_every_zoo_operator_converts(name):
    mod = zoo(name).relax
    # FoldConstant stands in for the simplification before placement: it leaves constant
    # bindings, pre-transposed weights and the like that the raw import has not.
    for variant in (mod, relax.transform.FoldConstant()(mod)):
        graph = DataflowGraph.from_module(variant)
        reasons = {node.op: supports(graph, node) for node in graph}
        assert {op_name: why for op_name, why in reasons.items() if why is not None} == {}


@pytest.mark.parametrize("name", ["mlp", "squeezenet", "dcgan"])
def test_whole_zoo_model_matches_tvm(name):
    func = zoo(name).relax["main"]
    arrays = random_inputs(func)
    assert mismatch(run_onnx(func, arrays), run_reference(func, arrays)) is None
