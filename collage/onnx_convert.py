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

import math
from collections.abc import Callable
from typing import Union

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from .backend import Unsupported
from .graph import DataflowGraph, Node

OPSET = 17
IR_VERSION = 10  # onnx writes IR 14 by default; onnxruntime 1.31 loads at most 13

# Element types ONNX Runtime's and OpenVINO's CPU kernels broadly implement. bfloat16 and
# the wider unsigned types exist in ONNX but have almost no CPU kernels there.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")

Names = Union[str, list]  # an ONNX value name, or the Names of a tuple's fields


# --------------------------------------------------------------------------- the graph being built


class _Graph:
    """ONNX nodes and initializers being built, and the ONNX name of every Relax value.

    A dry run (``weights=False``) converts no constant data and gives values it has not
    seen placeholder names: enough to learn whether one binding converts.
    """

    def __init__(self, weights: bool = True):
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.names: dict[relax.Expr, Names] = {}
        self._taken: set[str] = set()

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

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

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        """Emit one node; its output name, or names when ``outputs`` > 1."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def initializer(self, array: np.ndarray, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        """A 1-D int64 initializer: shapes, axes, slice bounds."""
        return self.initializer(np.array([int(v) for v in values], dtype="int64"), "ints")

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


def _dtype(ty) -> str:
    return str(ty.dtype)


def _onnx_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _shape(ty) -> tuple[int, ...]:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise Unsupported(f"a tensor of unknown shape ({ty}) has no static ONNX shape")
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:
        raise Unsupported(f"symbolic shape {ty} is not supported") from None


def _check_type(ty) -> None:
    """Unsupported unless ``ty`` is a tensor of a supported dtype and static shape, or a
    tuple of such; shapes and prim values (attributes given as arguments) pass."""
    if isinstance(ty, relax.TupleType):
        for field in ty.fields:
            _check_type(field)
    elif isinstance(ty, relax.TensorType):
        if _dtype(ty) not in DTYPES:
            raise Unsupported(f"dtype {_dtype(ty)} is not supported (supported: {', '.join(DTYPES)})")
        _shape(ty)


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _number(expr):
    """The value of a static scalar argument (an IntImm or FloatImm: clip's bounds, arange's)."""
    if isinstance(getattr(expr, "value", None), (int, float)):
        return expr.value
    raise Unsupported(f"argument {expr} is not a static number")


def _static_ints(expr) -> list[int]:
    """A static tuple of integers given as an argument (strided_slice's bounds)."""
    if not isinstance(expr, relax.Tuple):
        raise Unsupported(f"argument {expr} is not a static tuple of integers")
    return [int(_number(item)) for item in expr.fields]


def _require(condition: bool, call: relax.Call, what: str) -> None:
    if not condition:
        raise Unsupported(f"{call.op.name}: {what} is not supported by the ONNX conversion")


def _require_float(call: relax.Call) -> None:
    dtype = _dtype(call.args[0].ty)
    _require(dtype.startswith("float"), call, f"dtype {dtype} (ONNX implements it for floats only)")


def _inputs_as_result_dtype(g: _Graph, call: relax.Call, count: int) -> list[str]:
    """The first ``count`` arguments, cast to the result dtype where it differs (``out_dtype``)."""
    dtype = _dtype(call.ty)
    names = []
    for arg in call.args[:count]:
        name = g.tensor(arg)
        names.append(name if _dtype(arg.ty) == dtype else g.op("Cast", [name], to=_onnx_type(dtype)))
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
    "relax.abs": "Abs", "relax.floor": "Floor", "relax.ceil": "Ceil", "relax.where": "Where",
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
    return g.op("Reciprocal", [g.op("Sqrt", [g.tensor(call.args[0])])])


@_converts("relax.nn.silu")
def _silu(g, call):
    x = g.tensor(call.args[0])
    return g.op("Mul", [x, g.op("Sigmoid", [x])])


@_converts("relax.nn.gelu")
def _gelu(g, call):
    """0.5 x (1 + erf(x / sqrt 2)): opset 17 has no Gelu."""
    x, dtype = g.tensor(call.args[0]), _dtype(call.ty)
    erf = g.op("Erf", [g.op("Mul", [x, g.scalar(1 / math.sqrt(2), dtype)])])
    one_plus = g.op("Add", [erf, g.scalar(1, dtype)])
    return g.op("Mul", [g.op("Mul", [x, g.scalar(0.5, dtype)]), one_plus])


@_converts("relax.nn.gelu_tanh")
def _gelu_tanh(g, call):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    x, dtype = g.tensor(call.args[0]), _dtype(call.ty)
    cube = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Add", [x, g.op("Mul", [cube, g.scalar(0.044715, dtype)])])
    tanh = g.op("Tanh", [g.op("Mul", [inner, g.scalar(math.sqrt(2 / math.pi), dtype)])])
    return g.op("Mul", [g.op("Mul", [x, g.scalar(0.5, dtype)]), g.op("Add", [tanh, g.scalar(1, dtype)])])


@_converts("relax.clip")
def _clip(g, call):
    dtype = _dtype(call.ty)
    low, high = (g.scalar(_number(a), dtype) for a in call.args[1:3])
    return g.op("Clip", [g.tensor(call.args[0]), low, high])


@_converts("relax.astype")
def _astype(g, call):
    return g.op("Cast", [g.tensor(call.args[0])], to=_onnx_type(_dtype(call.ty)))


# Convolution and pooling read NC + spatial data layouts only (what ONNX defines).
_SPATIAL_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


@_converts("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
def _conv(g, call):
    _require_float(call)
    a, weight = call.attrs, call.args[1]
    data_layout, kernel_layout = _SPATIAL_LAYOUTS[len(_shape(weight.ty)) - 2]
    _require(a.data_layout == data_layout and a.out_layout in ("", data_layout), call, f"layout {a.data_layout}")
    _require(a.kernel_layout == kernel_layout, call, f"kernel layout {a.kernel_layout}")
    return g.op(
        "Conv", _inputs_as_result_dtype(g, call, 2), kernel_shape=_shape(weight.ty)[2:], strides=_ints(a.strides),
        pads=_ints(a.padding), dilations=_ints(a.dilation), group=int(a.groups),
    )  # fmt: skip


@_converts("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose")
def _conv_transpose(g, call):
    _require_float(call)
    a, weight = call.attrs, call.args[1]
    data_layout, kernel_layout = _SPATIAL_LAYOUTS[len(_shape(weight.ty)) - 2]
    # ONNX ConvTranspose weights are (in, out / groups, k...): Relax's IOHW.
    kernel_layout = kernel_layout.replace("OI", "IO")
    _require(a.data_layout == data_layout and a.out_layout in ("", data_layout), call, f"layout {a.data_layout}")
    _require(a.kernel_layout == kernel_layout, call, f"kernel layout {a.kernel_layout}")
    return g.op(
        "ConvTranspose", _inputs_as_result_dtype(g, call, 2), kernel_shape=_shape(weight.ty)[2:],
        strides=_ints(a.strides), pads=_ints(a.padding), output_padding=_ints(a.output_padding),
        dilations=_ints(a.dilation), group=int(a.groups),
    )  # fmt: skip


def _pool_pads(call: relax.Call, kernel, strides, dilation) -> list[int]:
    """Relax's padding, with the end pads grown to give Relax's result size in floor mode.

    With ``ceil_mode`` a last, partial window is kept; ONNX and TVM disagree on when, so
    instead of ONNX's ceil_mode the pooling gets the end padding that window needs.
    """
    a, rank = call.attrs, len(kernel)
    in_size, out_size = _shape(call.args[0].ty)[2:], _shape(call.ty)[2:]
    begin, end = _ints(a.padding)[:rank], _ints(a.padding)[rank:]
    for i in range(rank):
        span = (out_size[i] - 1) * strides[i] + (kernel[i] - 1) * dilation[i] + 1
        end[i] = max(end[i], span - in_size[i] - begin[i])
    return begin + end


@_converts(*(f"relax.nn.{kind}_pool{d}d" for kind in ("max", "avg") for d in (1, 2, 3)))
def _pool(g, call):
    _require_float(call)
    a = call.attrs
    kernel, strides, dilation = _ints(a.pool_size), _ints(a.strides), _ints(a.dilation)
    layout = _SPATIAL_LAYOUTS[len(kernel)][0]
    _require(a.layout == layout and a.out_layout in ("", layout), call, f"layout {a.layout}")
    pads = _pool_pads(call, kernel, strides, dilation)
    x = g.tensor(call.args[0])
    if call.op.name.startswith("relax.nn.max"):
        return g.op("MaxPool", [x], kernel_shape=kernel, strides=strides, pads=pads, dilations=dilation)
    _require(set(dilation) == {1}, call, "dilation (AveragePool has none before opset 19)")
    # Extra end padding for a ceil-mode window would be counted as zeros.
    _require(not (a.ceil_mode and a.count_include_pad), call, "ceil_mode with count_include_pad")
    return g.op(
        "AveragePool", [x], kernel_shape=kernel, strides=strides, pads=pads,
        count_include_pad=int(bool(a.count_include_pad)),
    )  # fmt: skip


@_converts("relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d")
def _adaptive_avg_pool(g, call):
    _require_float(call)
    in_size, out_size = _shape(call.args[0].ty)[2:], _shape(call.ty)[2:]
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
    _require(int(a.axis) in (1, 1 - len(_shape(call.args[0].ty))), call, f"axis {a.axis} (ONNX normalizes axis 1)")
    _require(a.center and a.scale, call, "center=False or scale=False")
    x, gamma, beta, mean, var = (g.tensor(arg) for arg in call.args)
    return [g.op("BatchNormalization", [x, gamma, beta, mean, var], epsilon=float(a.epsilon)), mean, var]


@_converts("relax.nn.layer_norm")
def _layer_norm(g, call):
    a, rank = call.attrs, len(_shape(call.args[0].ty))
    axes = sorted(axis % rank for axis in _ints(a.axes))
    _require(axes == list(range(axes[0], rank)), call, f"axes {_ints(a.axes)} (ONNX normalizes trailing axes)")
    # TVM's legalization applies gamma and beta whatever the flags say; ONNX would honour them.
    _require(a.center and a.scale, call, "center=False or scale=False")
    inputs = [g.tensor(arg) for arg in call.args]
    return g.op("LayerNormalization", inputs, axis=axes[0], epsilon=float(a.epsilon))


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
        return g.op(onnx_op, [x], axes=_ints(a.axis), keepdims=keepdims)

    return convert


CONVERTERS["relax.sum"] = _reduction("ReduceSum", axes_as_input=True)
CONVERTERS["relax.mean"] = _reduction("ReduceMean", axes_as_input=False)
CONVERTERS["relax.max"] = _reduction("ReduceMax", axes_as_input=False)
CONVERTERS["relax.min"] = _reduction("ReduceMin", axes_as_input=False)
CONVERTERS["relax.prod"] = _reduction("ReduceProd", axes_as_input=False)


@_converts("relax.reshape", "relax.flatten", "relax.expand_dims", "relax.squeeze")
def _reshape_to_result(g, call):
    """Shapes are static, so each of these is a Reshape to the result's shape."""
    return g.op("Reshape", [g.tensor(call.args[0]), g.ints(_shape(call.ty))])


@_converts("relax.broadcast_to")
def _broadcast_to(g, call):
    return g.op("Expand", [g.tensor(call.args[0]), g.ints(_shape(call.ty))])


@_converts("relax.permute_dims")
def _permute_dims(g, call):
    axes = call.attrs.axes
    perm = _ints(axes) if axes is not None else list(reversed(range(len(_shape(call.ty)))))
    return g.op("Transpose", [g.tensor(call.args[0])], perm=perm)


@_converts("relax.concat")
def _concat(g, call):
    _require(call.attrs.axis is not None, call, "axis=None (flattening)")
    return g.op("Concat", g.tensors(call.args[0]), axis=int(call.attrs.axis))


@_converts("relax.split")
def _split(g, call):
    axis = int(call.attrs.axis)
    sizes = [_shape(field)[axis] for field in call.ty.fields]
    return g.op("Split", [g.tensor(call.args[0]), g.ints(sizes)], outputs=len(sizes), axis=axis)


@_converts("relax.strided_slice")
def _strided_slice(g, call):
    axes, begin, end = (_static_ints(arg) for arg in call.args[1:4])
    strides = _static_ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
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


def _filled(value) -> Converter:
    """zeros, ones, zeros_like, ones_like: a constant of the result's shape and dtype."""

    def convert(g: _Graph, call: relax.Call) -> str:
        fill = numpy_helper.from_array(np.array([value], dtype=_dtype(call.ty)))
        return g.op("ConstantOfShape", [g.ints(_shape(call.ty))], value=fill)

    return convert


CONVERTERS["relax.zeros"] = CONVERTERS["relax.zeros_like"] = _filled(0)
CONVERTERS["relax.ones"] = CONVERTERS["relax.ones_like"] = _filled(1)


@_converts("relax.full", "relax.full_like")
def _full(g, call):
    """The fill value (a scalar tensor argument) expanded to the result's shape."""
    fill, dtype = call.args[1], _dtype(call.ty)
    value = g.tensor(fill)
    if _dtype(fill.ty) != dtype:
        value = g.op("Cast", [value], to=_onnx_type(dtype))
    return g.op("Expand", [value, g.ints(_shape(call.ty))])


@_converts("relax.arange")
def _arange(g, call):
    dtype = _dtype(call.ty)
    start, limit, delta = (g.scalar(_number(arg), dtype) for arg in call.args)
    return g.op("Range", [start, limit, delta])


# --------------------------------------------------------------------------- bindings and functions


def _convert_binding(g: _Graph, var: relax.Var, value: relax.Expr) -> None:
    """Emit what computes ``var = value`` and record the ONNX name(s) of ``var``."""
    _check_type(var.ty)
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


def _convert_call(g: _Graph, call: relax.Call) -> Names:
    if not isinstance(call.op, tvm.ir.Op):
        raise Unsupported(f"calls of {call.op} (not a Relax operator) have no ONNX conversion")
    converter = CONVERTERS.get(call.op.name)
    if converter is None:
        raise Unsupported(f"operator {call.op.name} has no ONNX conversion")
    for arg in call.args:
        _check_type(arg.ty)
    return converter(g, call)


def _flatten(names: Names) -> list[str]:
    return [names] if isinstance(names, str) else [n for item in names for n in _flatten(item)]


def _flat_types(ty) -> list[relax.TensorType]:
    return [t for field in ty.fields for t in _flat_types(field)] if isinstance(ty, relax.TupleType) else [ty]


def _value_info(name: str, ty) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _onnx_type(_dtype(ty)), _shape(ty))


def to_onnx(func: relax.Function) -> onnx.ModelProto:
    """``func`` as an ONNX model (opset 17, IR version 10); raises Unsupported."""
    g = _Graph()
    output_types = _flat_types(func.ret_ty)
    for k in range(len(output_types)):
        g.fresh(f"out{k}")  # reserved, so no parameter or node output takes these names
    inputs = []
    for param in func.params:
        if not isinstance(param.ty, relax.TensorType):
            raise Unsupported(f"parameter {param.name} of type {param.ty} is not a tensor")
        _check_type(param.ty)
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
    graph = helper.make_graph(g.nodes, "collage_subgraph", inputs, outputs, g.initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="collage-tvm"
    )


def supports(graph: DataflowGraph, node: Node) -> str | None:
    """None when ``node`` converts to ONNX, else why not (operator, dtype or attribute)."""
    try:
        _convert_binding(_Graph(weights=False), node.var, node.value)
    except Unsupported as reason:
        return str(reason)
    return None


def convertible(graph: DataflowGraph, node: Node) -> bool:
    """``supports`` as a PatternRule's ``valid_op``."""
    return supports(graph, node) is None
