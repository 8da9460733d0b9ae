"""Relax to ONNX: one extracted sub-graph function as an in-memory ONNX model.

The graph-level backends (ONNX Runtime, OpenVINO, TensorRT) all read ONNX, so the conversion
lives here once. ``to_onnx(func)`` takes a function as ``SubGraph.extract`` writes it: one
dataflow block of operator calls, tuples, tuple items, constants and aliases, with static
shapes. Parameters become graph inputs of the same names, in order; the returned values
become outputs ``out0``, ``out1``, ... (a returned tuple is flattened); constants become
initializers. The model uses opset 17 and IR version 10, which every engine here loads.

Each Relax operator has one small converter in ``CONVERTERS``, keyed by the operator name.
A converter reads the call's arguments, attributes and static result type, emits ONNX nodes
through a ``_Graph`` and raises ``Unsupported`` for what ONNX cannot express (a layout, an
attribute value). ``supports(graph, node)`` runs the same converter on a dry-run ``_Graph``
that never touches weights, and ``convertible`` is that as a PatternRule's ``valid_op``, so
a backend's rule and the real conversion cannot disagree.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Union

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from ..model.graph import CALLEES_ATTR, DataflowGraph, Node
from ..model.simplify.loops import is_scan_kernel
from ..model.simplify.recurrences import RECURRENCE_ATTR, KernelSpec, is_recurrence_kernel
from ..model.frontend import IR_VERSION, OPSET
from ..model.onnx_nodes import NodeWriter, attributes
from .backend import Unsupported
from .onnx_recurrences import rolled_recurrences
from .static import check_type, dtype_of, ints, number, static_ints, static_shape


# Element types ONNX Runtime's and OpenVINO's CPU kernels broadly implement. bfloat16 and
# the wider unsigned types exist in ONNX but have almost no CPU kernels there.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")

Names = Union[str, list]  # an ONNX value name, or the Names of a tuple's fields


# --------------------------------------------------------------------------- the graph being built


class _Graph(NodeWriter):
    """ONNX nodes and initializers being built, and the ONNX name of every Relax value.

    A dry run (``weights=False``) converts no constant data and gives values it has not
    seen placeholder names: enough to learn whether one binding converts. ``callees`` are
    the PrimFuncs the function's ``call_tir``s run.
    """

    def __init__(self, weights: bool = True, callees=None):
        super().__init__()
        self.weights = weights
        self.names: dict[relax.Expr, Names] = {}
        self.callees = callees if callees is not None else {}  # GlobalVar -> the PrimFunc a call_tir runs

    def tensor(self, expr: relax.Expr) -> str:
        """The name holding a tensor-valued argument."""
        if isinstance(expr, tvm.ir.GenericConst):
            return self._constant(expr)
        if isinstance(expr, relax.Var):
            return self.names[expr] if expr in self.names else self._placeholder(expr)
        raise Unsupported(f"unsupported argument {type(expr).__name__} {expr}")

    def tensors(self, expr: relax.Expr) -> list[Names]:
        """The names of a tuple-valued argument's fields: an inline tuple or a tuple var."""
        if isinstance(expr, relax.Tuple):
            return [self.tensors(f) if isinstance(f.ty, relax.TupleType) else self.tensor(f) for f in expr.fields]
        if isinstance(expr, relax.Var):
            return self.names[expr] if expr in self.names else self._placeholder(expr)
        raise Unsupported(f"unsupported tuple argument {type(expr).__name__} {expr}")

    def scalar(self, value, dtype: str) -> str:
        return self.initializer(np.array(value, dtype=dtype), "scalar")

    def _constant(self, const: tvm.ir.GenericConst) -> str:
        if const not in self.names:
            # A dry run needs the name only: no weights are copied out of TVM.
            data = const.value.numpy() if self.weights else np.zeros((), str(const.ty.dtype))
            self.names[const] = self.initializer(data, "weight")
        return self.names[const]

    def _placeholder(self, var: relax.Var) -> Names:
        if isinstance(var.ty, relax.TupleType):
            return [f"{var.name}.{i}" for i in range(len(var.ty.fields))]
        return var.name


# --------------------------------------------------------------------------- types and attributes


def _onnx_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _require(condition: bool, call: relax.Call, what: str) -> None:
    if not condition:
        raise Unsupported(f"{call.op.name}: {what} is not supported by the ONNX conversion")


def _require_float(call: relax.Call) -> None:
    dtype = dtype_of(call.args[0].ty)
    _require(dtype.startswith("float"), call, f"dtype {dtype} (ONNX implements it for floats only)")


def _inputs_as_result_dtype(g: _Graph, call: relax.Call, count: int) -> list[str]:
    """The first ``count`` arguments, cast to the result dtype where it differs (``out_dtype``)."""
    dtype = dtype_of(call.ty)
    names = []
    for arg in call.args[:count]:
        name = g.tensor(arg)
        names.append(name if dtype_of(arg.ty) == dtype else g.op("Cast", [name], to=_onnx_type(dtype)))
    return names


# --------------------------------------------------------------------------- converters

Converter = Callable[[_Graph, relax.Call], Names]
CONVERTERS: dict[str, Converter] = {}


def _converts(*op_names: str):
    def register(fn: Converter) -> Converter:
        for name in op_names:
            CONVERTERS[name] = fn
        return fn

    return register


def _elementwise(onnx_op: str) -> Converter:
    """Operators ONNX has under another name, with the same (numpy) broadcasting."""

    def convert(g: _Graph, call: relax.Call) -> str:
        return g.op(onnx_op, [g.tensor(a) for a in call.args])

    return convert


_SAME_OPS = {
    "relax.add": "Add", "relax.subtract": "Sub", "relax.multiply": "Mul", "relax.divide": "Div",
    "relax.power": "Pow", "relax.maximum": "Max", "relax.minimum": "Min",
    "relax.equal": "Equal", "relax.less": "Less", "relax.greater": "Greater",
    "relax.less_equal": "LessOrEqual", "relax.greater_equal": "GreaterOrEqual",
    "relax.logical_and": "And", "relax.logical_or": "Or", "relax.logical_not": "Not",
    "relax.nn.relu": "Relu", "relax.sigmoid": "Sigmoid", "relax.tanh": "Tanh", "relax.exp": "Exp",
    "relax.log": "Log", "relax.sqrt": "Sqrt", "relax.erf": "Erf", "relax.negative": "Neg",
    "relax.abs": "Abs", "relax.where": "Where",
    "relax.logical_xor": "Xor", "relax.sin": "Sin", "relax.cos": "Cos", "relax.tan": "Tan",
    "relax.asin": "Asin", "relax.acos": "Acos", "relax.atan": "Atan", "relax.sinh": "Sinh",
    "relax.cosh": "Cosh", "relax.asinh": "Asinh", "relax.acosh": "Acosh", "relax.atanh": "Atanh",
    "relax.sign": "Sign", "relax.isnan": "IsNaN", "relax.isinf": "IsInf",
    "relax.nn.selu": "Selu",  # ONNX's default alpha and gamma are SELU's constants, as TVM's
}  # fmt: skip
for _relax_op, _onnx_op in _SAME_OPS.items():
    CONVERTERS[_relax_op] = _elementwise(_onnx_op)


@_converts("relax.matmul")
def _matmul(g, call):
    return g.op("MatMul", _inputs_as_result_dtype(g, call, 2))


@_converts("relax.not_equal")
def _not_equal(g, call):
    return g.op("Not", [g.op("Equal", [g.tensor(a) for a in call.args])])


@_converts("relax.rsqrt")
def _rsqrt(g, call):
    """1 / sqrt(x) as a ``Div``, as torch's exporter writes it: ONNX Runtime's RMSNorm fusion
    (SimplifiedLayerNormalization) looks for that and missed a Reciprocal (Llama's norms)."""
    _require_float(call)
    return g.op("Div", [g.scalar(1, dtype_of(call.ty)), g.op("Sqrt", [g.tensor(call.args[0])])])


@_converts("relax.square")
def _square(g, call):
    x = g.tensor(call.args[0])
    return g.op("Mul", [x, x])


_ROUNDING = {"relax.floor": "Floor", "relax.ceil": "Ceil", "relax.round": "Round"}


@_converts(*_ROUNDING)
def _rounding(g, call):
    """ONNX rounds floats only; an integer is its own floor (TVM's importer writes the floor of
    an integer division of integers, LongT5's block ids)."""
    x = g.tensor(call.args[0])
    return g.op(_ROUNDING[call.op.name] if dtype_of(call.ty).startswith("float") else "Identity", [x])


@_converts("relax.trunc")
def _trunc(g, call):
    """Ceil below zero, Floor above: opset 17 has no Trunc."""
    _require_float(call)
    x = g.tensor(call.args[0])
    negative = g.op("Less", [x, g.scalar(0, dtype_of(call.ty))])
    return g.op("Where", [negative, g.op("Ceil", [x]), g.op("Floor", [x])])


@_converts("relax.isfinite")
def _isfinite(g, call):
    x = g.tensor(call.args[0])
    return g.op("Not", [g.op("Or", [g.op("IsNaN", [x]), g.op("IsInf", [x])])])


_BOOLEAN_OPS = {
    "relax.bitwise_and": "And", "relax.bitwise_or": "Or", "relax.bitwise_xor": "Xor", "relax.bitwise_not": "Not",
}  # fmt: skip


@_converts(*_BOOLEAN_OPS)
def _bitwise(g, call):
    # BitwiseAnd, BitwiseOr, ... came in opset 18: at 17 only booleans have them, as And, Or, ...
    dtype = dtype_of(call.args[0].ty)
    _require(dtype == "bool", call, f"dtype {dtype} (opset 17 has bitwise operators for booleans only)")
    return g.op(_BOOLEAN_OPS[call.op.name], [g.tensor(a) for a in call.args])


@_converts("relax.mod", "relax.floor_mod")
def _mod(g, call):
    x, y = (g.tensor(a) for a in call.args)
    if call.op.name == "relax.mod":
        return g.op("Mod", [x, y], fmod=1)  # C's fmod: the sign of the dividend
    if not dtype_of(call.ty).startswith("float"):
        return g.op("Mod", [x, y], fmod=0)  # the sign of the divisor, as Python's %
    # ONNX Mod takes floats with fmod=1 only: x - floor(x / y) y, as TVM computes it.
    return g.op("Sub", [x, g.op("Mul", [g.op("Floor", [g.op("Div", [x, y])]), y])])


@_converts("relax.floor_divide")
def _floor_divide(g, call):
    x, y = (g.tensor(a) for a in call.args)
    if dtype_of(call.ty).startswith("float"):
        return g.op("Floor", [g.op("Div", [x, y])])
    # ONNX Div truncates integers; x - (x floor-mod y) is a multiple of y, so its Div is exact.
    return g.op("Div", [g.op("Sub", [x, g.op("Mod", [x, y], fmod=0)]), y])


@_converts("relax.nn.silu")
def _silu(g, call):
    x = g.tensor(call.args[0])
    return g.op("Mul", [x, g.op("Sigmoid", [x])])


@_converts("relax.nn.gelu")
def _gelu(g, call):
    """x (1 + erf(x / sqrt 2)) 0.5: opset 17 has no Gelu. Written as torch's exporter writes it,
    a ``Div`` by sqrt 2 and the 0.5 last: ONNX Runtime's Gelu fusion looks for that form and
    missed the multiply by 1 / sqrt 2 (ConvNeXt ran 15% slower from the conversion)."""
    x, dtype = g.tensor(call.args[0]), dtype_of(call.ty)
    erf = g.op("Erf", [g.op("Div", [x, g.scalar(math.sqrt(2), dtype)])])
    one_plus = g.op("Add", [erf, g.scalar(1, dtype)])
    return g.op("Mul", [g.op("Mul", [x, one_plus]), g.scalar(0.5, dtype)])


@_converts("relax.nn.gelu_tanh")
def _gelu_tanh(g, call):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    x, dtype = g.tensor(call.args[0]), dtype_of(call.ty)
    cube = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Add", [x, g.op("Mul", [cube, g.scalar(0.044715, dtype)])])
    tanh = g.op("Tanh", [g.op("Mul", [inner, g.scalar(math.sqrt(2 / math.pi), dtype)])])
    return g.op("Mul", [g.op("Mul", [x, g.scalar(0.5, dtype)]), g.op("Add", [tanh, g.scalar(1, dtype)])])


@_converts("relax.nn.leakyrelu")
def _leakyrelu(g, call):
    return g.op("LeakyRelu", [g.tensor(call.args[0])], alpha=float(call.attrs.alpha))


@_converts("relax.nn.prelu")
def _prelu(g, call):
    rank, axis = len(static_shape(call.ty)), int(call.attrs.axis) % len(static_shape(call.ty))
    # PRelu broadcasts the slope numpy-style: it gains an axis of 1 per axis after the channel's.
    slope = g.op("Reshape", [g.tensor(call.args[1]), g.ints([-1] + [1] * (rank - 1 - axis))])
    return g.op("PRelu", [g.tensor(call.args[0]), slope])


@_converts("relax.nn.softplus")
def _softplus(g, call):
    """log(1 + exp(beta x)) / beta, or x where beta x > threshold (ONNX's Softplus has no beta)."""
    x, dtype, a = g.tensor(call.args[0]), dtype_of(call.ty), call.attrs
    scaled = g.op("Mul", [x, g.scalar(float(a.beta), dtype)])
    soft = g.op("Div", [g.op("Softplus", [scaled]), g.scalar(float(a.beta), dtype)])
    return g.op("Where", [g.op("Greater", [scaled, g.scalar(float(a.threshold), dtype)]), x, soft])


@_converts("relax.clip")
def _clip(g, call):
    dtype = dtype_of(call.ty)
    low, high = (g.scalar(number(a), dtype) for a in call.args[1:3])
    return g.op("Clip", [g.tensor(call.args[0]), low, high])


@_converts("relax.astype")
def _astype(g, call):
    return g.op("Cast", [g.tensor(call.args[0])], to=_onnx_type(dtype_of(call.ty)))


# Convolution and pooling read NC + spatial data layouts only (what ONNX defines).
_SPATIAL_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


@_converts("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
def _conv(g, call):
    _require_float(call)
    a, weight = call.attrs, call.args[1]
    data_layout, kernel_layout = _SPATIAL_LAYOUTS[len(static_shape(weight.ty)) - 2]
    _require(a.data_layout == data_layout and a.out_layout in ("", data_layout), call, f"layout {a.data_layout}")
    _require(a.kernel_layout == kernel_layout, call, f"kernel layout {a.kernel_layout}")
    return g.op(
        "Conv", _inputs_as_result_dtype(g, call, 2), kernel_shape=static_shape(weight.ty)[2:], strides=ints(a.strides),
        pads=ints(a.padding), dilations=ints(a.dilation), group=int(a.groups),
    )  # fmt: skip


@_converts("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose")
def _conv_transpose(g, call):
    _require_float(call)
    a, weight = call.attrs, call.args[1]
    data_layout, kernel_layout = _SPATIAL_LAYOUTS[len(static_shape(weight.ty)) - 2]
    # ONNX ConvTranspose weights are (in, out / groups, k...): Relax's IOHW.
    kernel_layout = kernel_layout.replace("OI", "IO")
    _require(a.data_layout == data_layout and a.out_layout in ("", data_layout), call, f"layout {a.data_layout}")
    _require(a.kernel_layout == kernel_layout, call, f"kernel layout {a.kernel_layout}")
    return g.op(
        "ConvTranspose", _inputs_as_result_dtype(g, call, 2), kernel_shape=static_shape(weight.ty)[2:],
        strides=ints(a.strides), pads=ints(a.padding), output_padding=ints(a.output_padding),
        dilations=ints(a.dilation), group=int(a.groups),
    )  # fmt: skip


def _pool_pads(call: relax.Call, kernel, strides, dilation) -> list[int]:
    """Relax's padding, with the end pads grown to give Relax's result size in floor mode.

    With ``ceil_mode`` a last, partial window is kept; ONNX and TVM disagree on when, so
    instead of ONNX's ceil_mode the pooling gets the end padding that window needs.
    """
    a, rank = call.attrs, len(kernel)
    in_size, out_size = static_shape(call.args[0].ty)[2:], static_shape(call.ty)[2:]
    begin, end = ints(a.padding)[:rank], ints(a.padding)[rank:]
    for i in range(rank):
        span = (out_size[i] - 1) * strides[i] + (kernel[i] - 1) * dilation[i] + 1
        end[i] = max(end[i], span - in_size[i] - begin[i])
    return begin + end


@_converts(*(f"relax.nn.{kind}_pool{d}d" for kind in ("max", "avg") for d in (1, 2, 3)))
def _pool(g, call):
    _require_float(call)
    a = call.attrs
    kernel, strides, dilation = ints(a.pool_size), ints(a.strides), ints(a.dilation)
    layout = _SPATIAL_LAYOUTS[len(kernel)][0]
    _require(a.layout == layout and a.out_layout in ("", layout), call, f"layout {a.layout}")
    pads = _pool_pads(call, kernel, strides, dilation)
    x = g.tensor(call.args[0])
    if call.op.name.startswith("relax.nn.max"):
        return g.op("MaxPool", [x], kernel_shape=kernel, strides=strides, pads=pads, dilations=dilation)
    _require(set(dilation) == {1}, call, "dilation (AveragePool has none before opset 19)")
    count_pad = int(bool(a.count_include_pad))
    if a.ceil_mode and a.count_include_pad:
        # TVM (as torch) counts Relax's padding but not a ceil-mode window's overhang, which
        # AveragePool would count as zeros: the padding becomes a Pad, and only it counts.
        rank, explicit = len(kernel), ints(a.padding)
        if any(explicit):
            x = g.op("Pad", [x, g.ints([0, 0] + explicit[:rank] + [0, 0] + explicit[rank:])])
        pads = [0] * rank + [p - e for p, e in zip(pads[rank:], explicit[rank:])]
        count_pad = 0
    return g.op("AveragePool", [x], kernel_shape=kernel, strides=strides, pads=pads, count_include_pad=count_pad)


@_converts("relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d")
def _adaptive_avg_pool(g, call):
    _require_float(call)
    in_size, out_size = static_shape(call.args[0].ty)[2:], static_shape(call.ty)[2:]
    layout = _SPATIAL_LAYOUTS[len(in_size)][0]
    _require(call.attrs.layout == layout and call.attrs.out_layout in ("", layout), call, f"layout {call.attrs.layout}")
    x = g.tensor(call.args[0])
    if all(o == 1 for o in out_size):
        return g.op("GlobalAveragePool", [x])
    # Equal windows only: then the adaptive pool is a plain one.
    _require(all(i % o == 0 for i, o in zip(in_size, out_size)), call, f"output size {out_size} from {in_size}")
    window = [i // o for i, o in zip(in_size, out_size)]
    return g.op("AveragePool", [x], kernel_shape=window, strides=window)


@_converts("relax.nn.batch_norm")
def _batch_norm(g, call):
    """Inference batch norm; like Relax, returns (output, moving mean, moving variance)."""
    a = call.attrs
    _require(not a.training, call, "training mode")
    _require(int(a.axis) in (1, 1 - len(static_shape(call.args[0].ty))), call, f"axis {a.axis} (ONNX normalizes axis 1)")
    _require(a.center and a.scale, call, "center=False or scale=False")
    x, gamma, beta, mean, var = (g.tensor(arg) for arg in call.args)
    return [g.op("BatchNormalization", [x, gamma, beta, mean, var], epsilon=float(a.epsilon)), mean, var]


@_converts("relax.nn.layer_norm")
def _layer_norm(g, call):
    a, rank = call.attrs, len(static_shape(call.args[0].ty))
    axes = sorted(axis % rank for axis in ints(a.axes))
    _require(axes == list(range(axes[0], rank)), call, f"axes {ints(a.axes)} (ONNX normalizes trailing axes)")
    # TVM's legalization applies gamma and beta whatever the flags say; ONNX would honour them.
    _require(a.center and a.scale, call, "center=False or scale=False")
    inputs = [g.tensor(arg) for arg in call.args]
    return g.op("LayerNormalization", inputs, axis=axes[0], epsilon=float(a.epsilon))


def _trailing_axes(call: relax.Call) -> list[int]:
    """The normalized axes, which must be the trailing ones (ONNX's layer norms' only kind)."""
    rank = len(static_shape(call.args[0].ty))
    axes = sorted(axis % rank for axis in ints(call.attrs.axes))
    _require(axes == list(range(axes[0], rank)), call, f"axes {ints(call.attrs.axes)} (not the trailing axes)")
    return axes


@_converts("relax.nn.rms_norm")
def _rms_norm(g, call):
    """x / sqrt(mean(x^2) + epsilon) * weight: opset 17 has no RMSNormalization."""
    _require_float(call)
    x, weight, dtype = g.tensor(call.args[0]), g.tensor(call.args[1]), dtype_of(call.ty)
    mean_square = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=_trailing_axes(call), keepdims=1)
    rms = g.op("Sqrt", [g.op("Add", [mean_square, g.scalar(float(call.attrs.epsilon), dtype)])])
    return g.op("Mul", [g.op("Div", [x, rms]), weight])


def _spatial_norm_axes(call: relax.Call) -> None:
    """InstanceNormalization's layout: channel axis 1, normalizing every axis after it."""
    a, shape = call.attrs, static_shape(call.args[0].ty)
    rank = len(shape)
    axes = {axis % rank for axis in ints(a.axes)}
    if shape[0] == 1:
        axes.discard(0)  # over a batch of one, as the torch frontend's instance norm writes
    _require(int(a.channel_axis) % rank == 1, call, f"channel_axis {a.channel_axis}")
    _require(axes == set(range(2, rank)), call, f"axes {ints(a.axes)} (not those after the channel axis)")
    # TVM's legalization applies gamma and beta whatever the flags say.
    _require(a.center and a.scale, call, "center=False or scale=False")


@_converts("relax.nn.instance_norm")
def _instance_norm(g, call):
    _require_float(call)
    _spatial_norm_axes(call)
    inputs = [g.tensor(arg) for arg in call.args]
    return g.op("InstanceNormalization", inputs, epsilon=float(call.attrs.epsilon))


@_converts("relax.nn.group_norm")
def _group_norm(g, call):
    """Channels in groups: an instance norm of (N, groups, rest), then the per-channel affine.

    Opset 17 has no GroupNormalization (18 has one, with per-group scale and bias).
    """
    _require_float(call)
    _spatial_norm_axes(call)
    shape, dtype, groups = static_shape(call.args[0].ty), dtype_of(call.ty), int(call.attrs.num_groups)
    grouped = g.op("Reshape", [g.tensor(call.args[0]), g.ints([shape[0], groups, -1])])
    ones, zeros = g.initializer(np.ones(groups, dtype)), g.initializer(np.zeros(groups, dtype))
    normed = g.op("InstanceNormalization", [grouped, ones, zeros], epsilon=float(call.attrs.epsilon))
    normed = g.op("Reshape", [normed, g.ints(shape)])
    per_channel = g.ints([-1] + [1] * (len(shape) - 2))
    gamma, beta = (g.op("Reshape", [g.tensor(arg), per_channel]) for arg in call.args[1:3])
    return g.op("Add", [g.op("Mul", [normed, gamma]), beta])


@_converts("relax.nn.softmax")
def _softmax(g, call):
    return g.op("Softmax", [g.tensor(call.args[0])], axis=int(call.attrs.axis))


@_converts("relax.nn.log_softmax")
def _log_softmax(g, call):
    return g.op("LogSoftmax", [g.tensor(call.args[0])], axis=int(call.attrs.axis))


def _reduction(onnx_op: str, axes_as_input: bool) -> Converter:
    """Opset 17 takes ReduceSum's axes as an input and the others' as an attribute."""

    def convert(g: _Graph, call: relax.Call) -> str:
        a, x = call.attrs, g.tensor(call.args[0])
        keepdims = int(bool(a.keepdims))
        if a.axis is None:  # over every axis
            return g.op(onnx_op, [x], keepdims=keepdims)
        if axes_as_input:
            return g.op(onnx_op, [x, g.ints(a.axis)], keepdims=keepdims)
        return g.op(onnx_op, [x], axes=ints(a.axis), keepdims=keepdims)

    return convert


CONVERTERS["relax.sum"] = _reduction("ReduceSum", axes_as_input=True)
CONVERTERS["relax.max"] = _reduction("ReduceMax", axes_as_input=False)
CONVERTERS["relax.min"] = _reduction("ReduceMin", axes_as_input=False)
CONVERTERS["relax.prod"] = _reduction("ReduceProd", axes_as_input=False)


_reduce_mean = _reduction("ReduceMean", axes_as_input=False)


@_converts("relax.mean")
def _mean(g, call):
    """A mean over every spatial axis of an N, C, ... tensor is a GlobalAveragePool: ONNX
    Runtime runs that on its blocked (NCHWc) layout, ReduceMean only after reordering back
    (the DS-CNN keyword spotter ran 0.040 ms converted with ReduceMean, 0.029 from its file).
    Only from rank 4: a mean over the last axis of a rank-3 tensor is a transformer's (batch,
    tokens, features) more often than a 1-D signal's, and the engines' LayerNorm and RMSNorm
    fusions look for ReduceMean there (DeBERTa's and Llama's norms stayed six kernels)."""
    rank = len(static_shape(call.args[0].ty))
    axes = None if call.attrs.axis is None else sorted(int(a) % rank for a in call.attrs.axis)
    if rank < 4 or axes != list(range(2, rank)) or not dtype_of(call.ty).startswith("float"):
        return _reduce_mean(g, call)
    pooled = g.op("GlobalAveragePool", [g.tensor(call.args[0])])
    return pooled if call.attrs.keepdims else g.op("Reshape", [pooled, g.ints(static_shape(call.ty))])


@_converts("relax.variance", "relax.std")
def _variance(g, call):
    """mean((x - mean x)^2), the population variance, as TVM's; std is its square root."""
    _require_float(call)
    a, x = call.attrs, g.tensor(call.args[0])
    axes = {} if a.axis is None else {"axes": ints(a.axis)}
    centred = g.op("Sub", [x, g.op("ReduceMean", [x], keepdims=1, **axes)])
    variance = g.op("ReduceMean", [g.op("Mul", [centred, centred])], keepdims=int(bool(a.keepdims)), **axes)
    return g.op("Sqrt", [variance]) if call.op.name == "relax.std" else variance


def _cast(g: _Graph, name: str, from_dtype: str, to_dtype: str) -> str:
    return name if from_dtype == to_dtype else g.op("Cast", [name], to=_onnx_type(to_dtype))


@_converts("relax.argmax", "relax.argmin")
def _arg_reduction(g, call):
    a, x = call.attrs, g.tensor(call.args[0])
    onnx_op = "ArgMax" if call.op.name == "relax.argmax" else "ArgMin"
    if a.axis is None:  # the index in the flattened tensor
        flat = g.op(onnx_op, [g.op("Reshape", [x, g.ints([-1])])], axis=0, keepdims=0)
        index = g.op("Reshape", [flat, g.ints(static_shape(call.ty))])
    else:
        index = g.op(onnx_op, [x], axis=int(a.axis), keepdims=int(bool(a.keepdims)))
    return _cast(g, index, "int64", dtype_of(call.ty))


@_converts("relax.cumsum")
def _cumsum(g, call):
    a, dtype = call.attrs, dtype_of(call.ty)
    # CumSum is defined for 32- and 64-bit numbers and float16 only.
    _require(dtype in ("int32", "int64", "float16", "float32", "float64"), call, f"dtype {dtype}")
    (x,) = _inputs_as_result_dtype(g, call, 1)
    axis = 0 if a.axis is None else int(a.axis)
    if a.axis is None:  # over the flattened tensor
        x = g.op("Reshape", [x, g.ints([-1])])
    return g.op("CumSum", [x, g.scalar(axis, "int64")], exclusive=int(bool(a.exclusive)))


@_converts("relax.topk")
def _topk(g, call):
    a = call.attrs
    values, indices = g.op(
        "TopK", [g.tensor(call.args[0]), g.ints([a.k])], outputs=2, axis=int(a.axis), largest=int(bool(a.largest)),
    )  # fmt: skip
    indices = _cast(g, indices, "int64", str(a.dtype))
    return {"both": [values, indices], "values": values, "indices": indices}[str(a.ret_type)]


@_converts("relax.sort", "relax.argsort")
def _sort(g, call):
    """A TopK of the whole axis (ties keep their order: TopK puts the lower index first)."""
    a = call.attrs
    axis = int(a.axis)
    size = static_shape(call.args[0].ty)[axis]
    values, indices = g.op(
        "TopK", [g.tensor(call.args[0]), g.ints([size])], outputs=2, axis=axis, largest=int(bool(a.descending)),
    )  # fmt: skip
    return values if call.op.name == "relax.sort" else _cast(g, indices, "int64", dtype_of(call.ty))


@_converts("relax.reshape", "relax.flatten", "relax.expand_dims", "relax.squeeze", "relax.nn.batch_flatten")
def _reshape_to_result(g, call):
    """Shapes are static, so each of these is a Reshape to the result's shape."""
    return g.op("Reshape", [g.tensor(call.args[0]), g.ints(static_shape(call.ty))])


@_converts("relax.broadcast_to")
def _broadcast_to(g, call):
    return g.op("Expand", [g.tensor(call.args[0]), g.ints(static_shape(call.ty))])


@_converts("relax.permute_dims")
def _permute_dims(g, call):
    rank, axes = len(static_shape(call.ty)), call.attrs.axes
    # Counted from the front: ONNX's Transpose takes no negative axis (Falcon-H1's
    # ``permute(0, -2, -1, 1)`` failed ONNX Runtime's type inference and OpenVINO's reader).
    perm = [axis % rank for axis in ints(axes)] if axes is not None else list(reversed(range(rank)))
    return g.op("Transpose", [g.tensor(call.args[0])], perm=perm)


@_converts("relax.concat")
def _concat(g, call):
    _require(call.attrs.axis is not None, call, "axis=None (flattening)")
    return g.op("Concat", g.tensors(call.args[0]), axis=int(call.attrs.axis))


@_converts("relax.split")
def _split(g, call):
    axis = int(call.attrs.axis)
    sizes = [static_shape(field)[axis] for field in call.ty.fields]
    return g.op("Split", [g.tensor(call.args[0]), g.ints(sizes)], outputs=len(sizes), axis=axis)


@_converts("relax.strided_slice")
def _strided_slice(g, call):
    axes, begin, end = (static_ints(arg) for arg in call.args[1:4])
    strides = static_ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
    bounds = [g.ints(values) for values in (begin, end, axes, strides)]
    return g.op("Slice", [g.tensor(call.args[0]), *bounds])


@_converts("relax.take")
def _take(g, call):
    a = call.attrs
    _require(a.axis is not None, call, "axis=None (flattening)")
    # ONNX Gather reads in-bounds (and negative) indices, as "fast" mode assumes.
    _require(a.mode == "fast", call, f"mode {a.mode!r}")
    return g.op("Gather", [g.tensor(call.args[0]), g.tensor(call.args[1])], axis=int(a.axis))


@_converts("relax.gather_elements")
def _gather_elements(g, call):
    return g.op("GatherElements", [g.tensor(call.args[0]), g.tensor(call.args[1])], axis=int(call.attrs.axis))


@_converts("relax.gather_nd")
def _gather_nd(g, call):
    """Relax's indices are int64 and index the leading axes by their last axis, as ONNX's."""
    x, indices = (g.tensor(arg) for arg in call.args)
    return g.op("GatherND", [x, indices], batch_dims=int(call.attrs.batch_dims))


@_converts("relax.index_tensor")
def _index_tensor(g, call):
    """x[i0, i1, ...]: the broadcast index tensors stacked on a last axis, one GatherND."""
    index_types = _flat_types(call.args[1].ty)
    batch = tuple(np.broadcast_shapes(*(static_shape(ty) for ty in index_types)))
    columns = []
    for name, ty in zip(g.tensors(call.args[1]), index_types):
        name = _cast(g, name, dtype_of(ty), "int64")  # GatherND reads int64 indices only
        columns.append(g.op("Reshape", [g.op("Expand", [name, g.ints(batch)]), g.ints(batch + (1,))]))
    indices = columns[0] if len(columns) == 1 else g.op("Concat", columns, axis=-1)
    return g.op("GatherND", [g.tensor(call.args[0]), indices])


_SCATTER_REDUCTIONS = {"update": "none", "add": "add", "mul": "mul"}


@_converts("relax.scatter_elements")
def _scatter_elements(g, call):
    a = call.attrs
    # Reductions max and min came in opset 18; there is no mean.
    _require(a.reduction in _SCATTER_REDUCTIONS, call, f"reduction {a.reduction!r}")
    return g.op(
        "ScatterElements", [g.tensor(arg) for arg in call.args], axis=int(a.axis),
        reduction=_SCATTER_REDUCTIONS[a.reduction],
    )  # fmt: skip


@_converts("relax.slice_scatter")
def _slice_scatter(g, call):
    """``src`` in place of data[start:end] along the axis: a Concat of it and data's ends."""
    data, src = call.args[:2]
    start, end, step = (int(number(arg)) for arg in call.args[2:5])
    _require(step == 1, call, f"step {step}")
    axis = int(call.attrs.axis) % len(static_shape(data.ty))
    size = static_shape(data.ty)[axis]
    start, end, _ = slice(start, end).indices(size)
    x, parts = g.tensor(data), [g.tensor(src)]
    if start > 0:
        parts.insert(0, g.op("Slice", [x, g.ints([0]), g.ints([start]), g.ints([axis])]))
    if end < size:
        parts.append(g.op("Slice", [x, g.ints([end]), g.ints([size]), g.ints([axis])]))
    return parts[0] if len(parts) == 1 else g.op("Concat", parts, axis=axis)


@_converts("relax.flip")
def _flip(g, call):
    axis = g.ints([int(call.attrs.axis)])
    return g.op("Slice", [g.tensor(call.args[0]), g.ints([-1]), g.ints([-(2**63)]), axis, g.ints([-1])])


@_converts("relax.tile")
def _tile(g, call):
    shape, out_shape = static_shape(call.args[0].ty), static_shape(call.ty)
    repeats = ints(call.attrs.repeats)
    repeats = [1] * (len(out_shape) - len(repeats)) + repeats
    x = g.tensor(call.args[0])
    if len(shape) < len(out_shape):  # as numpy's tile, the data gains leading axes of 1
        x = g.op("Reshape", [x, g.ints((1,) * (len(out_shape) - len(shape)) + shape)])
    return g.op("Tile", [x, g.ints(repeats)])


@_converts("relax.repeat")
def _repeat(g, call):
    """Each element ``repeats`` times along the axis: expanded over a new axis after it."""
    a, x, shape = call.attrs, g.tensor(call.args[0]), static_shape(call.args[0].ty)
    axis = 0 if a.axis is None else int(a.axis) % len(shape)
    if a.axis is None:  # over the flattened tensor
        shape = (int(np.prod(shape)),)
        x = g.op("Reshape", [x, g.ints(shape)])
    before, after = shape[: axis + 1], shape[axis + 1 :]
    x = g.op("Reshape", [x, g.ints(before + (1,) + after)])
    x = g.op("Expand", [x, g.ints(before + (int(a.repeats),) + after)])
    return g.op("Reshape", [x, g.ints(static_shape(call.ty))])


@_converts("relax.stack")
def _stack(g, call):
    axis = int(call.attrs.axis) % len(static_shape(call.ty))
    fields = [g.op("Unsqueeze", [name, g.ints([axis])]) for name in g.tensors(call.args[0])]
    return g.op("Concat", fields, axis=axis)


@_converts("relax.tril", "relax.triu")
def _trilu(g, call):
    k = g.scalar(int(number(call.args[1])), "int64")
    return g.op("Trilu", [g.tensor(call.args[0]), k], upper=int(call.op.name == "relax.triu"))


@_converts("relax.einsum")
def _einsum(g, call):
    return g.op("Einsum", g.tensors(call.args[0]), equation=str(call.attrs.subscripts))


@_converts("relax.one_hot")
def _one_hot(g, call):
    """Where(index == class, on, off): an index out of range gives all off, as in TVM (ONNX's
    OneHot would count a negative index from the end)."""
    a, dtype, indices = call.attrs, dtype_of(call.ty), call.args[0]
    rank = len(static_shape(indices.ty))
    axis = int(a.axis) % (rank + 1)
    classes = np.arange(int(a.depth), dtype=dtype_of(indices.ty)).reshape((-1,) + (1,) * (rank - axis))
    hit = g.op("Equal", [g.op("Unsqueeze", [g.tensor(indices), g.ints([axis])]), g.initializer(classes, "classes")])
    on, off = (g.scalar(number(arg), dtype) for arg in call.args[1:3])
    return g.op("Where", [hit, on, off])


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


@_converts("relax.nn.pad")
def _pad(g, call):
    a = call.attrs
    # ONNX Pad's wrap mode (Relax's circular) came in opset 19.
    _require(str(a.pad_mode) in _PAD_MODES, call, f"pad_mode {a.pad_mode!r}")
    widths = ints(a.pad_width)  # before and after, axis by axis
    x = g.tensor(call.args[0])
    if min(widths) < 0:  # a crop (RWKV's token shift pads one token before and drops the last)
        _require(a.pad_mode == "constant", call, f"negative pad_width {widths} with pad_mode {a.pad_mode!r}")
        shape = static_shape(call.args[0].ty)
        axes = [axis for axis in range(len(shape)) if min(widths[2 * axis : 2 * axis + 2]) < 0]
        starts = [max(-widths[2 * axis], 0) for axis in axes]
        ends = [shape[axis] - max(-widths[2 * axis + 1], 0) for axis in axes]
        x = g.op("Slice", [x, g.ints(starts), g.ints(ends), g.ints(axes)])
        widths = [max(w, 0) for w in widths]
    inputs = [x, g.ints(widths[::2] + widths[1::2])]
    if a.pad_mode == "constant":
        inputs.append(g.scalar(float(a.pad_value), dtype_of(call.ty)))
    return g.op("Pad", inputs, mode=_PAD_MODES[str(a.pad_mode)])


_RESIZE_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def _resize_nearest_mode(call: relax.Call, in_size, out_size) -> str:
    """ONNX's nearest_mode for TVM's rounding, checked on every source coordinate.

    A coordinate halfway between two pixels must be exact in float (in TVM and ONNX alike).
    TVM's "round" rounds it half to even, which no nearest_mode does: it is taken where all
    ties round the same way. TVM's floor and ceil are nudged by 1e-5 where ONNX's are not,
    so floor is taken only where TVM divides integers instead.
    """
    a = call.attrs
    mode, rounding = str(a.coordinate_transformation_mode), str(a.rounding_method)
    rounding = rounding or ("round" if mode == "align_corners" else "floor")  # TVM's defaults
    if rounding == "floor" and mode == "asymmetric" and all(o % i == 0 for i, o in zip(in_size, out_size)):
        return "floor"
    rounds = ("round", "round_prefer_floor", "round_prefer_ceil")
    _require(rounding in rounds, call, f"rounding_method {rounding!r} (TVM nudges it by 1e-5)")
    ties = set()
    for i, o in zip(in_size, out_size):
        scale = Fraction(i - 1, max(o - 1, 1)) if mode == "align_corners" else Fraction(i, o)
        # TVM's float coordinates are exact only for a binary fraction of a scale.
        exact = scale.denominator & (scale.denominator - 1) == 0
        for x in range(o):
            if mode == "pytorch_half_pixel" and o == 1:
                coordinate = Fraction(0)
            elif mode in ("align_corners", "asymmetric"):
                coordinate = x * scale
            else:
                coordinate = (x + Fraction(1, 2)) * scale - Fraction(1, 2)
            if coordinate.denominator == 2:
                _require(exact, call, f"a rounding tie in a {i} to {o} resize")
                ties.add(round(coordinate) > coordinate)
    if rounding != "round":
        return rounding
    _require(len(ties) < 2, call, "rounding ties both ways (TVM rounds half to even)")
    return "round_prefer_ceil" if ties == {True} else "round_prefer_floor"


@_converts("relax.image.resize2d")
def _resize2d(g, call):
    a = call.attrs
    _require(a.layout == "NCHW", call, f"layout {a.layout}")
    mode = str(a.coordinate_transformation_mode)
    _require(mode in _RESIZE_COORDINATES, call, f"coordinate_transformation_mode {mode!r}")
    _require(dtype_of(call.ty) == dtype_of(call.args[0].ty), call, f"out_dtype {dtype_of(call.ty)}")
    in_shape, out_shape = static_shape(call.args[0].ty), static_shape(call.ty)
    attrs = {"coordinate_transformation_mode": mode}
    if a.method == "nearest_neighbor":
        attrs.update(mode="nearest", nearest_mode=_resize_nearest_mode(call, in_shape[2:], out_shape[2:]))
    elif a.method == "cubic":
        attrs.update(mode="cubic", cubic_coeff_a=float(a.cubic_alpha), exclude_outside=int(a.cubic_exclude))
    else:
        attrs.update(mode="linear")
    return g.op("Resize", [g.tensor(call.args[0]), "", "", g.ints(out_shape)], **attrs)


def _filled(value) -> Converter:
    """zeros, ones, zeros_like, ones_like: a constant of the result's shape and dtype."""

    def convert(g: _Graph, call: relax.Call) -> str:
        fill = numpy_helper.from_array(np.array([value], dtype=dtype_of(call.ty)))
        return g.op("ConstantOfShape", [g.ints(static_shape(call.ty))], value=fill)

    return convert


CONVERTERS["relax.zeros"] = CONVERTERS["relax.zeros_like"] = _filled(0)
CONVERTERS["relax.ones"] = CONVERTERS["relax.ones_like"] = _filled(1)


@_converts("relax.full", "relax.full_like")
def _full(g, call):
    """The fill value (a scalar tensor argument) expanded to the result's shape."""
    fill, dtype = call.args[1], dtype_of(call.ty)
    value = g.tensor(fill)
    if dtype_of(fill.ty) != dtype:
        value = g.op("Cast", [value], to=_onnx_type(dtype))
    return g.op("Expand", [value, g.ints(static_shape(call.ty))])


@_converts("relax.arange")
def _arange(g, call):
    dtype = dtype_of(call.ty)
    start, limit, delta = (g.scalar(number(arg), dtype) for arg in call.args)
    return g.op("Range", [start, limit, delta])


# --------------------------------------------------------------------------- bindings and functions


def _convert_binding(g: _Graph, var: relax.Var, value: relax.Expr) -> None:
    """Emit what computes ``var = value`` and record the ONNX name(s) of ``var``."""
    check_type(var.ty, DTYPES)
    if isinstance(value, relax.Call):
        g.names[var] = _convert_call(g, value)
    elif isinstance(value, relax.Tuple):
        g.names[var] = g.tensors(value)
    elif isinstance(value, relax.TupleGetItem):
        g.names[var] = g.tensors(value.tuple_value)[value.index]
    elif isinstance(value, relax.Var) and isinstance(value.ty, relax.TupleType):
        g.names[var] = g.tensors(value)
    elif isinstance(value, (relax.Var, tvm.ir.GenericConst)):
        g.names[var] = g.tensor(value)
    else:
        raise Unsupported(f"unsupported binding {type(value).__name__}: {value}")


@_converts("relax.call_tir")
def _call_tir(g, call):
    """Simplification's scan kernel (``linear_recurrence_as_scan``: ``h_t = a_t * h_(t-1) + b_t``
    along axis 1 of (outer, length, inner) tensors) written out step by step again, as
    torch's exporter writes the loop it came from: the engines then take the graph around it
    whole. RecurrentGemma's RG-LRU, rolled into two scans, kept ONNX Runtime and OpenVINO from
    its whole model, and its Relax module ran 0.45x of OpenVINO on torch's file (stop 72)."""
    kernel = g.callees.get(call.args[0])
    if is_recurrence_kernel(kernel):
        return _recurrence(g, call, KernelSpec.from_json(str(kernel.attrs[RECURRENCE_ATTR])))
    what = "a PrimFunc other than simplification's recurrences"
    _require(is_scan_kernel(kernel), call, what)
    a, b, h0 = (g.tensor(arg) for arg in call.args[1].fields)
    length = static_shape(call.ty)[1]
    state, states = g.op("Unsqueeze", [h0, g.ints([1])]), []
    a_steps, b_steps = (g.op("Split", [x, g.ints([1] * length)], outputs=length, axis=1) if length > 1 else [x]
                        for x in (a, b))  # fmt: skip
    for a_t, b_t in zip(a_steps, b_steps):
        state = g.op("Add", [g.op("Mul", [a_t, state]), b_t])
        states.append(state)
    return g.op("Concat", states, axis=1) if length > 1 else states[0]


# The operators of a recurrence kernel's step (``recurrences._LANE_OPS``) as ONNX's.
_LANE_OPS = {"relax.add": "Add", "relax.subtract": "Sub", "relax.multiply": "Mul", "relax.divide": "Div",
             "relax.maximum": "Max", "relax.minimum": "Min", "relax.power": "Pow", "relax.exp": "Exp",
             "relax.log": "Log", "relax.sqrt": "Sqrt", "relax.tanh": "Tanh", "relax.sigmoid": "Sigmoid",
             "relax.negative": "Neg", "relax.abs": "Abs"}  # fmt: skip


def _recurrence(g, call, spec: KernelSpec) -> Names:
    """A recurrence kernel (``elementwise_recurrence_as_scan``) written out step by step
    again, each value (outer, 1, inner), as the exporter wrote the loop: RWKV's time mixing
    then runs on an engine with the rest of the model."""
    args = [g.tensor(arg) for arg in call.args[1].fields]
    tensors, rest = args[: len(spec.lengths)], [g.op("Unsqueeze", [x, g.ints([1])]) for x in args[len(spec.lengths) :]]
    outside, state = rest[: spec.outside], dict(zip(spec.states, rest[spec.outside :]))
    outputs: dict[int, list[str]] = {j: [] for j in spec.outputs}
    for t in range(spec.steps):
        at = spec.first_index + t
        values: list[str] = []
        for name, operands in spec.template:
            operands = [values[i] if kind == "node" else outside[i] if kind == "outside" else state[i] if kind == "state"
                        else g.op("Slice", [tensors[i], g.ints([at]), g.ints([at + 1]), g.ints([1])])
                        for kind, i in operands]  # fmt: skip
            values.append(g.op("Reciprocal", [g.op("Sqrt", operands)]) if name == "relax.rsqrt"
                          else g.op(_LANE_OPS[name], operands))  # fmt: skip
        for j in spec.outputs:
            outputs[j].append(values[j])
        state = {j: values[j] for j in spec.states}
    stacked = [g.op("Concat", outputs[j], axis=1) if spec.steps > 1 else outputs[j][0] for j in spec.outputs]
    return stacked[0] if len(stacked) == 1 else stacked


def _convert_call(g: _Graph, call: relax.Call) -> Names:
    if not isinstance(call.op, tvm.ir.Op):
        raise Unsupported(f"calls of {call.op} (not a Relax operator) have no ONNX conversion")
    converter = CONVERTERS.get(call.op.name)
    if converter is None:
        raise Unsupported(f"operator {call.op.name} has no ONNX conversion")
    for arg in call.args:
        check_type(arg.ty, DTYPES)
    return converter(g, call)


def _flatten(names: Names) -> list[str]:
    return [names] if isinstance(names, str) else [n for item in names for n in _flatten(item)]


def _flat_types(ty) -> list[relax.TensorType]:
    return [t for field in ty.fields for t in _flat_types(field)] if isinstance(ty, relax.TupleType) else [ty]


def _value_info(name: str, ty) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _onnx_type(dtype_of(ty)), static_shape(ty))


def to_onnx(func: relax.Function) -> onnx.ModelProto:
    """``func`` as an ONNX model (opset 17, IR version 10); raises Unsupported."""
    g = _Graph(callees=func.attrs.get(CALLEES_ATTR) if func.attrs else None)
    output_types = _flat_types(func.ret_ty)
    for k in range(len(output_types)):
        g.fresh(f"out{k}")  # reserved, so no parameter or node output takes these names
    inputs = []
    for param in func.params:
        if not isinstance(param.ty, relax.TensorType):
            raise Unsupported(f"parameter {param.name} of type {param.ty} is not a tensor")
        check_type(param.ty, DTYPES)
        g.names[param] = g.fresh(param.name)
        inputs.append(_value_info(g.names[param], param.ty))
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise Unsupported(f"unsupported binding kind {type(binding).__name__}")
            _convert_binding(g, binding.var, binding.value)
    result = func.body.body
    results = _flatten(g.tensors(result) if isinstance(result.ty, relax.TupleType) else g.tensor(result))
    outputs = []
    for k, (name, ty) in enumerate(zip(results, output_types)):
        # Outputs get their own names even where one value is returned twice, or is an input.
        g.nodes.append(helper.make_node("Identity", [name], [f"out{k}"]))
        outputs.append(_value_info(f"out{k}", ty))
    nodes = _engines_forms(g, [o.name for o in outputs])
    read = {name for n in nodes for name in n.input}
    initializers = [t for t in g.initializers if t.name in read]  # the fused ones' constants go
    graph = helper.make_graph(nodes, "collage_subgraph", inputs, outputs, initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="collage-tvm"
    )


class _Written:
    """The nodes written so far, read backwards for the engines' fusions below: who makes a
    value, how many nodes read it, and the scalar constants."""

    def __init__(self, nodes: list, initializers: list, shapes: dict[str, list[int]], fresh: Callable[[str], str]):
        self.nodes, self.initializers, self.shapes, self.fresh = nodes, initializers, shapes, fresh
        self.ranks = {name: len(shape) for name, shape in shapes.items()}
        self.constants = {t.name: t for t in initializers}
        self.scalars = {t.name: float(numpy_helper.to_array(t)) for t in initializers if not t.dims}
        self.float32 = {t.name for t in initializers if t.data_type == onnx.TensorProto.FLOAT}  # CPU kernels' type
        self._int64 = {t.name: t for t in initializers if t.data_type == onnx.TensorProto.INT64}
        self.producer = {out: n for n in nodes for out in n.output}
        self.readers = Counter(name for n in nodes for name in n.input)

    def ints(self, name: str) -> list[int] | None:
        """The values of int64 constant ``name`` (axes, shapes), or None when it is none."""
        t = self._int64.get(name)
        return None if t is None else numpy_helper.to_array(t).tolist()

    def made_by(self, name: str, op_type: str):
        """The node making ``name`` when it is an ``op_type`` read by one node only, else None."""
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op_type and self.readers.get(name) == 1 else None

    def bias_initializer(self, bias: onnx.TensorProto, length: int) -> str:
        """A new initializer holding ``bias``'s values as a vector of ``length``."""
        name = self.fresh("bias")
        self.initializers.append(numpy_helper.from_array(numpy_helper.to_array(bias).reshape(length), name))
        return name

    def transposed(self, weight: onnx.TensorProto) -> str:
        """A new initializer holding 2-D ``weight`` transposed, [out, in] as a Linear layer
        keeps it and exporters write it for ``Gemm(transB=1)``: OpenVINO's fully connected
        layer reads weights that way, and ran a Transpose of each [in, out] weight as a layer
        of its runtime model (the corpus MLP: three of them)."""
        name = self.fresh("weight")
        self.initializers.append(numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), name))
        if self.readers[weight.name] == 1:  # read by the product being replaced only
            self.initializers.remove(weight)
        return name

    @staticmethod
    def other(n, name: str) -> str:
        """The input of two-input ``n`` that is not ``name``."""
        return n.input[1] if n.input[0] == name else n.input[0]


def _hard_activations(w: _Written) -> tuple[dict, set]:
    """Hard-swish and hard-sigmoid as ONNX's own operators. PyTorch's importer writes them out
    as ``x * clip(x + 3, 0, 6) / 6`` and ``clip(x + 3, 0, 6) / 6``; OpenVINO fuses that back,
    ONNX Runtime runs four kernels (an MBConv net with hard-swish ran 22% slower on ONNX
    Runtime from this conversion than from torch's own ONNX export)."""

    def relu6(name):  # (z, clip) when ``name`` is clip(z, 0, 6)
        clip = w.made_by(name, "Clip")
        if clip is None or len(clip.input) != 3 or [w.scalars.get(b) for b in clip.input[1:]] != [0.0, 6.0]:
            return None
        return clip.input[0], clip

    def plus_3(name):  # (x, add) when ``name`` is x + 3
        add = w.made_by(name, "Add")
        x = next((a for a in add.input if w.scalars.get(w.other(add, a)) == 3.0), None) if add is not None else None
        return (x, add) if x is not None and x not in w.scalars else None

    replaced, dropped = {}, set()
    for n in w.nodes:
        if n.op_type != "Div" or w.scalars.get(n.input[1]) != 6.0 or n.input[1] not in w.float32:
            continue
        clipped = relu6(n.input[0])
        shifted = plus_3(clipped[0]) if clipped is not None else None
        if shifted is not None:  # relu6(x + 3) / 6
            # Only with the 3 in an add of its own: OpenVINO 2026.4's HardSigmoid with beta=0
            # (the 3 folded into a bias) computes as if beta were 0.5.
            replaced[id(n)] = helper.make_node("HardSigmoid", [shifted[0]], list(n.output), alpha=1 / 6, beta=0.5)
            dropped.update(id(p) for p in [clipped[1], shifted[1]])
            continue
        mul = w.made_by(n.input[0], "Mul")
        for operand in mul.input if mul is not None else ():
            clipped = relu6(operand)
            shifted = plus_3(clipped[0]) if clipped is not None else None
            if shifted is not None and shifted[0] == w.other(mul, operand):  # x * relu6(x + 3) / 6
                replaced[id(n)] = helper.make_node("HardSwish", [shifted[0]], list(n.output))
                dropped.update(id(p) for p in [clipped[1], shifted[1], mul])
                break
    return replaced, dropped


def _l2_norms(w: _Written) -> tuple[dict, set]:
    """``sum(|x| ** 2) ** 0.5`` over some axes as ONNX's ReduceL2, which torch's exporter writes
    for ``torch.norm`` (and the importer spells out): ONNX Runtime runs the four operators as
    four kernels and one ReduceL2 as one (ConvNeXt V2's global response norm)."""
    replaced, dropped = {}, set()
    for n in w.nodes:
        if n.op_type != "Pow" or w.scalars.get(n.input[1]) != 0.5:
            continue
        total = w.made_by(n.input[0], "ReduceSum")
        axes = w.ints(total.input[1]) if total is not None and len(total.input) == 2 else None
        if axes is None:
            continue
        square = w.made_by(total.input[0], "Pow")
        if square is None or w.scalars.get(square.input[1]) != 2.0:
            continue
        absolute = w.made_by(square.input[0], "Abs")  # |x| ** 2 is x ** 2: the Abs may go too
        x = absolute.input[0] if absolute is not None else square.input[0]
        keepdims = attributes(total).get("keepdims", 1)
        replaced[id(n)] = helper.make_node("ReduceL2", [x], list(n.output), axes=axes, keepdims=keepdims)
        dropped.update(id(p) for p in (total, square, absolute) if p is not None)
    return replaced, dropped


def _prelus(w: _Written) -> tuple[dict, set]:
    """``where(x > 0, x, slope * x)`` with a constant slope as ONNX's PRelu, which torch's
    exporter writes for ``nn.PReLU`` and PyTorch's importer spells out: ONNX Runtime runs the
    three operators as three kernels, and OpenVINO does not fuse them into the convolution before
    (the two towers' conversion ran 2.8% and 4% behind torch's file)."""
    replaced, dropped = {}, set()
    for n in w.nodes:
        if n.op_type != "Where" or len(n.input) != 3:
            continue
        greater, x = w.made_by(n.input[0], "Greater"), n.input[1]
        scaled = w.made_by(n.input[2], "Mul")
        if greater is None or scaled is None or list(greater.input) != [x, greater.input[1]] or x not in scaled.input:
            continue
        zero, slope = w.constants.get(greater.input[1]), w.constants.get(w.other(scaled, x))
        shape = w.shapes.get(x)
        if zero is None or numpy_helper.to_array(zero).any() or slope is None or slope.name not in w.float32 \
                or shape is None or np.broadcast_shapes(tuple(slope.dims), tuple(shape)) != tuple(shape):  # fmt: skip
            continue
        replaced[id(n)] = helper.make_node("PRelu", [x, slope.name], list(n.output))
        dropped.update(id(p) for p in (greater, scaled))
    return replaced, dropped


# DepthToSpace's two orders of a pixel's r x r block in the channels, each as the 6-D shape
# its input is read as (of N, C, r, H, W) and the axes it is then permuted to (ONNX's definition).
_DEPTH_TO_SPACE = {
    "CRD": (lambda n, c, r, h, w: (n, c, r, r, h, w), (0, 1, 4, 2, 5, 3)),  # torch's PixelShuffle
    "DCR": (lambda n, c, r, h, w: (n, r, r, c, h, w), (0, 3, 4, 1, 5, 2)),  # TensorFlow's depth_to_space
}


def _depths_to_space(w: _Written) -> tuple[dict, set]:
    """A reshape to 6-D, a permutation and a reshape back to 4-D that move blocks of channels
    into r x r pixels, as ONNX's DepthToSpace, which torch's exporter writes for
    ``nn.PixelShuffle`` and PyTorch's importer spells out: ONNX Runtime runs DepthToSpace as one
    kernel and the 6-D transpose as a slower one (ESPCN's conversion ran 18% behind torch's file
    on a Zen 4 without AVX-512)."""
    replaced, dropped = {}, set()
    for n in w.nodes:
        transpose = w.made_by(n.input[0], "Transpose") if n.op_type == "Reshape" else None
        split = w.made_by(transpose.input[0], "Reshape") if transpose is not None else None
        if split is None:
            continue
        x, six, out = split.input[0], w.shapes.get(split.output[0]), w.shapes.get(n.output[0])
        shape = w.shapes.get(x)
        if shape is None or six is None or out is None or len(shape) != 4 or len(six) != 6:
            continue
        batch, depth, height, width = shape
        r = out[2] // height if height else 0
        if r < 2 or depth % (r * r) or tuple(out) != (batch, depth // (r * r), height * r, width * r):
            continue
        perm = tuple(attributes(transpose).get("perm", ()))
        for mode, (read_as, axes) in _DEPTH_TO_SPACE.items():
            if tuple(six) == read_as(batch, depth // (r * r), r, height, width) and perm == axes:
                replaced[id(n)] = helper.make_node("DepthToSpace", [x], list(n.output), blocksize=r, mode=mode)
                dropped.update(id(p) for p in (split, transpose))
                break
    return replaced, dropped


def _biases(w: _Written) -> tuple[dict, set]:
    """A constant bias added after a convolution, or after a product of a matrix and a constant
    weight, as the convolution's or Gemm's own bias input, as exporters write them: PyTorch's
    importer (and a folded BatchNorm) gives ``conv(x, w) + b`` with ``b`` of shape [1, C, 1, 1],
    ``matmul(x, w) + b`` with ``b`` of shape [N]. A RegNet ran 8% slower on ONNX Runtime
    from this conversion than from torch's file, whose 30 convolutions carry their bias. Only
    float32 constants fold; a 3-D product stays MatMul + Add, as exporters write it."""
    replaced, dropped = {}, set()
    for n in w.nodes:
        if n.op_type != "Add":
            continue
        for operand in n.input:
            bias = w.constants.get(w.other(n, operand))
            if bias is None or bias.data_type != onnx.TensorProto.FLOAT:
                continue
            folded = _conv_with_bias(w, operand, bias, n) or _gemm_with_bias(w, operand, bias, n)
            if folded is not None:
                replaced[id(n)], made_by = folded
                dropped.add(id(made_by))
                break
    return replaced, dropped


def _conv_with_bias(w: _Written, name: str, bias, add):
    conv = w.made_by(name, "Conv")
    if conv is None or len(conv.input) != 2 or conv.input[1] not in w.constants:
        return None
    channels = w.constants[conv.input[1]].dims[0]
    shape = list(bias.dims)
    spatial = len(w.constants[conv.input[1]].dims) - 2
    if shape not in ([1, channels] + [1] * spatial, [channels] + [1] * spatial, [channels]):
        return None
    name = w.bias_initializer(bias, channels)
    return helper.make_node("Conv", [*conv.input, name], list(add.output), name=conv.name, **attributes(conv)), conv


def _gemm_with_bias(w: _Written, name: str, bias, add):
    matmul = w.made_by(name, "MatMul")
    if matmul is None or matmul.input[1] not in w.constants or w.ranks.get(matmul.input[0]) != 2:
        return None
    weight = w.constants[matmul.input[1]]
    if len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT or list(bias.dims) not in ([weight.dims[1]], [1, weight.dims[1]]):
        return None
    name = w.bias_initializer(bias, weight.dims[1])
    return helper.make_node("Gemm", [matmul.input[0], w.transposed(weight), name], list(add.output), transB=1), matmul


# What engines fuse when they see the exporters' form, rewritten into that form. A fusion
# returns {id(node): the node, or the nodes, replacing it} and the ids of nodes it drops.
_FUSED_FORMS = (rolled_recurrences, _hard_activations, _l2_norms, _prelus, _depths_to_space, _biases)


def _engines_forms(g: _Graph, outputs: list[str]) -> list:
    """``g``'s nodes with what engines fuse rewritten into the exporters' form (new constants
    join ``g.initializers``), in an order that computes each value before it is read, and
    without the nodes whose values no one reads any more."""
    shapes = {}
    for expr, names in g.names.items():
        for name, ty in zip(_flatten(names), _flat_types(expr.ty)):
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                shapes[name] = static_shape(ty)
    nodes = g.nodes
    for fusion in _FUSED_FORMS:
        replaced, dropped = fusion(_Written(nodes, g.initializers, shapes, g.fresh))
        if replaced or dropped:
            nodes = [m for n in nodes if id(n) not in dropped for m in _as_list(replaced.get(id(n), n))]
            nodes = _read_ones(_in_order(nodes), outputs)
    return nodes


def _as_list(replacement) -> list:
    return replacement if isinstance(replacement, list) else [replacement]


def _in_order(nodes: list) -> list:
    """``nodes`` ordered so that each comes after the nodes making its inputs, otherwise as
    they were (a fusion puts its node where the first node it replaces was)."""
    made_by = {name: k for k, n in enumerate(nodes) for name in n.output}
    waiting = [sum(1 for name in set(n.input) if name in made_by) for n in nodes]
    readers = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        for name in set(n.input):
            if name in made_by:
                readers[made_by[name]].append(k)
    ready = [k for k, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        k = heapq.heappop(ready)
        ordered.append(nodes[k])
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(ordered) != len(nodes):
        raise Unsupported("a fusion of the ONNX conversion made a cycle")
    return ordered


def _read_ones(nodes: list, outputs: list[str]) -> list:
    """``nodes`` without those whose values no kept node or output reads."""
    read, kept = set(outputs), []
    for n in reversed(nodes):
        if any(name in read for name in n.output):
            kept.append(n)
            read.update(n.input)
    return kept[::-1]


def supports(graph: DataflowGraph, node: Node) -> str | None:
    """None when ``node`` converts to ONNX, else why not (operator, dtype or attribute)."""
    try:
        _convert_binding(_Graph(weights=False, callees=graph.callees), node.var, node.value)
    except Unsupported as reason:
        return str(reason)
    return None


def convertible(graph: DataflowGraph, node: Node) -> bool:
    """``supports`` as a PatternRule's ``valid_op``."""
    return supports(graph, node) is None
