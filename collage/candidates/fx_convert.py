"""Relax to torch.fx: one extracted sub-graph function as a ``torch.fx.GraphModule`` of ATen ops.

What ``onnx_convert`` is to the ONNX engines, this is to PyTorch's compiler: inductor
(``backends/inductor.py``) compiles the module ``to_fx`` writes. It takes a function as
``SubGraph.extract`` writes it (one dataflow block of operator calls, tuples, tuple items,
constants and aliases, static shapes). Parameters become placeholders in order; constants
become buffers of the module, on the device it is built for; the module returns a tuple of
every output (a returned tuple flattened).

Each Relax operator has one small converter in ``CONVERTERS`` that emits ATen calls through
an ``_FX`` builder and raises ``Unsupported`` for what it does not express the same way (a
layout, an attribute value). ``supports(graph, node)`` runs the same converter on a dry run
that touches no weights, and ``convertible`` is that as a PatternRule's ``valid_op``, so a
backend's rule and the real conversion cannot disagree. Only ATen's documented semantics are
relied on; each conversion is checked numerically against TVM in the tests.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Union

import tvm
from tvm import relax

from ..model.graph import CALLEES_ATTR, DataflowGraph, Node
from ..model.simplify.loops import is_scan_kernel
from ..model.simplify.recurrences import RECURRENCE_ATTR, KernelSpec, is_recurrence_kernel
from .backend import Unsupported
from .static import check_type, dtype_of, ints, number, static_ints, static_shape

DTYPES = ("bool", "int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64")

Value = Union[object, list]  # a torch.fx.Node, or the Values of a tuple's fields
Converter = Callable[["_FX", relax.Call], Value]
CONVERTERS: dict[str, Converter] = {}


def _aten():
    import torch

    return torch.ops.aten


def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


# --------------------------------------------------------------------------- the graph being built


class _FX:
    """An FX graph being built, the FX value of every Relax value, and the constants read.

    A dry run (``weights=False``) copies no constant out of TVM: enough to learn whether
    one binding converts. ``callees`` are the PrimFuncs the function's ``call_tir``s run."""

    def __init__(self, device: str = "cpu", weights: bool = True, callees=None):
        import torch.fx

        self.graph = torch.fx.Graph()
        self.device, self.weights = device, weights
        self.callees = callees if callees is not None else {}  # GlobalVar -> PrimFunc
        self.values: dict[relax.Expr, Value] = {}
        self.constants: dict[str, object] = {}  # buffer name -> torch tensor

    def call(self, fn, *args, **kwargs):
        return self.graph.call_function(fn, args, kwargs)

    def tensor(self, expr: relax.Expr):
        if isinstance(expr, tvm.ir.GenericConst):
            if expr not in self.values:
                name = f"const{len(self.constants)}"
                self.constants[name] = _constant(expr, self.device) if self.weights else None
                self.values[expr] = self.graph.get_attr(name)
            return self.values[expr]
        if isinstance(expr, relax.Var):
            return self.values[expr] if expr in self.values else self.graph.placeholder(expr.name)
        raise Unsupported(f"unsupported argument {type(expr).__name__} {expr}")

    def tensors(self, expr: relax.Expr) -> list:
        if isinstance(expr, relax.Tuple):
            return [self.tensors(f) if isinstance(f.ty, relax.TupleType) else self.tensor(f) for f in expr.fields]
        if isinstance(expr, relax.Var):
            if expr in self.values:
                return self.values[expr]
            return [self.call(operator.getitem, self.graph.placeholder(expr.name), i) for i in range(len(expr.ty.fields))]
        raise Unsupported(f"unsupported tuple argument {type(expr).__name__} {expr}")


def _constant(const, device: str):
    import torch

    return torch.from_dlpack(const.value).clone().to(device)


# --------------------------------------------------------------------------- types and attributes


def _require(condition: bool, call: relax.Call, what: str) -> None:
    if not condition:
        raise Unsupported(f"{call.op.name}: {what} is not supported by the torch.fx conversion")


def _same_dtype(call: relax.Call) -> None:
    """Relax's binary operators and matmul may name an ``out_dtype`` or mix dtypes; ATen
    would promote them its own way, so only one dtype throughout converts."""
    dtypes = {dtype_of(a.ty) for a in call.args if isinstance(a.ty, relax.TensorType)} | {dtype_of(call.ty)}
    _require(len(dtypes) == 1, call, f"mixed dtypes {sorted(dtypes)}")


def _float(call: relax.Call) -> None:
    dtype = dtype_of(call.args[0].ty)
    _require(dtype.startswith(("float", "bfloat")), call, f"dtype {dtype}")


def _converts(*op_names: str):
    def register(fn: Converter) -> Converter:
        for name in op_names:
            CONVERTERS[name] = fn
        return fn

    return register


# --------------------------------------------------------------------------- converters

# Relax operator -> ATen overload name, same arguments, numpy broadcasting on both sides.
_ELEMENTWISE = {
    "relax.add": "add.Tensor", "relax.subtract": "sub.Tensor", "relax.multiply": "mul.Tensor",
    "relax.maximum": "maximum.default", "relax.minimum": "minimum.default", "relax.power": "pow.Tensor_Tensor",
    "relax.equal": "eq.Tensor", "relax.not_equal": "ne.Tensor", "relax.less": "lt.Tensor",
    "relax.greater": "gt.Tensor", "relax.less_equal": "le.Tensor", "relax.greater_equal": "ge.Tensor",
    "relax.logical_and": "logical_and.default", "relax.logical_or": "logical_or.default",
    "relax.logical_xor": "logical_xor.default", "relax.logical_not": "logical_not.default",
    "relax.nn.relu": "relu.default", "relax.sigmoid": "sigmoid.default", "relax.tanh": "tanh.default",
    "relax.exp": "exp.default", "relax.log": "log.default", "relax.sqrt": "sqrt.default",
    "relax.rsqrt": "rsqrt.default", "relax.erf": "erf.default", "relax.negative": "neg.default",
    "relax.abs": "abs.default", "relax.floor": "floor.default", "relax.ceil": "ceil.default",
    "relax.sin": "sin.default", "relax.cos": "cos.default", "relax.sign": "sign.default",
    "relax.square": "square.default", "relax.bitwise_and": "bitwise_and.Tensor",
    "relax.bitwise_or": "bitwise_or.Tensor", "relax.bitwise_xor": "bitwise_xor.Tensor",
    "relax.bitwise_not": "bitwise_not.default", "relax.nn.silu": "silu.default", "relax.where": "where.self",
}  # fmt: skip


def _elementwise(overload: str) -> Converter:
    packet, name = overload.split(".")

    def convert(g: _FX, call: relax.Call):
        values = call.args[1:] if call.op.name == "relax.where" else call.args  # where's condition is bool
        dtypes = {dtype_of(a.ty) for a in values}
        if dtype_of(call.ty) != "bool" or call.op.name.startswith("relax.logical"):
            dtypes.add(dtype_of(call.ty))  # a comparison's result is bool whatever it compares
        _require(len(dtypes) == 1, call, f"mixed dtypes {sorted(dtypes)}")
        return g.call(getattr(getattr(_aten(), packet), name), *(g.tensor(a) for a in call.args))

    return convert


for _op, _overload in _ELEMENTWISE.items():
    CONVERTERS[_op] = _elementwise(_overload)


@_converts("relax.divide")
def _divide(g, call):
    _float(call)  # integer division truncates in TVM, rounds to float in ATen
    _same_dtype(call)
    return g.call(_aten().div.Tensor, *(g.tensor(a) for a in call.args))


@_converts("relax.nn.gelu", "relax.nn.gelu_tanh")
def _gelu(g, call):
    approximate = "tanh" if call.op.name.endswith("tanh") else "none"
    return g.call(_aten().gelu.default, g.tensor(call.args[0]), approximate=approximate)


@_converts("relax.nn.leakyrelu")
def _leakyrelu(g, call):
    return g.call(_aten().leaky_relu.default, g.tensor(call.args[0]), float(call.attrs.alpha))


@_converts("relax.clip")
def _clip(g, call):
    return g.call(_aten().clamp.default, g.tensor(call.args[0]), number(call.args[1]), number(call.args[2]))


@_converts("relax.astype")
def _astype(g, call):
    return g.call(_aten()._to_copy.default, g.tensor(call.args[0]), dtype=_torch_dtype(dtype_of(call.ty)))


@_converts("relax.matmul")
def _matmul(g, call):
    _same_dtype(call)
    return g.call(_aten().matmul.default, *(g.tensor(a) for a in call.args[:2]))


_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def _symmetric(call: relax.Call, padding: list[int], rank: int) -> list[int]:
    """Relax pads (before..., after...); ATen's convolution and pooling pad both sides alike."""
    before, after = padding[:rank], padding[rank:]
    _require(before == after, call, f"asymmetric padding {padding}")
    return before


@_converts("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
def _conv(g, call):
    _float(call)
    _same_dtype(call)
    a, rank = call.attrs, len(static_shape(call.args[1].ty)) - 2
    data_layout, kernel_layout = _LAYOUTS[rank]
    _require(a.data_layout == data_layout and a.out_layout in ("", data_layout), call, f"layout {a.data_layout}")
    _require(a.kernel_layout == kernel_layout, call, f"kernel layout {a.kernel_layout}")
    x, w = (g.tensor(arg) for arg in call.args[:2])
    padding = _symmetric(call, ints(a.padding), rank)
    return g.call(_aten().convolution.default, x, w, None, ints(a.strides), padding, ints(a.dilation),
                  False, [0] * rank, int(a.groups))  # fmt: skip


@_converts("relax.nn.max_pool2d", "relax.nn.avg_pool2d")
def _pool2d(g, call):
    _float(call)
    a = call.attrs
    _require(a.layout == "NCHW" and a.out_layout in ("", "NCHW"), call, f"layout {a.layout}")
    kernel, strides, dilation = ints(a.pool_size), ints(a.strides), ints(a.dilation)
    padding = _symmetric(call, ints(a.padding), 2)
    x = g.tensor(call.args[0])
    if call.op.name == "relax.nn.max_pool2d":
        return g.call(_aten().max_pool2d.default, x, kernel, strides, padding, dilation, bool(a.ceil_mode))
    _require(set(dilation) == {1}, call, "dilation")
    return g.call(_aten().avg_pool2d.default, x, kernel, strides, padding, bool(a.ceil_mode), bool(a.count_include_pad))


@_converts("relax.nn.adaptive_avg_pool2d")
def _adaptive_avg_pool2d(g, call):
    _float(call)
    _require(call.attrs.layout == "NCHW" and call.attrs.out_layout in ("", "NCHW"), call, f"layout {call.attrs.layout}")
    return g.call(_aten()._adaptive_avg_pool2d.default, g.tensor(call.args[0]), static_shape(call.ty)[2:])


def _channel_shape(rank: int, axis: int) -> list[int]:
    return [-1 if k == axis else 1 for k in range(rank)]


@_converts("relax.nn.batch_norm")
def _batch_norm(g, call):
    """Inference batch norm, (x - mean) / sqrt(var + eps) gamma + beta; like Relax, returns
    (output, moving mean, moving variance)."""
    a = call.attrs
    _require(not a.training, call, "training mode")
    _require(a.center and a.scale, call, "center=False or scale=False")
    rank = len(static_shape(call.args[0].ty))
    x, gamma, beta, mean, var = (g.tensor(arg) for arg in call.args)
    aten, shape = _aten(), _channel_shape(rank, int(a.axis) % rank)
    gamma_c, beta_c, mean_c, var_c = (g.call(aten.reshape.default, v, shape) for v in (gamma, beta, mean, var))
    scale = g.call(aten.mul.Tensor, gamma_c, g.call(aten.rsqrt.default, g.call(aten.add.Tensor, var_c, float(a.epsilon))))
    centred = g.call(aten.sub.Tensor, x, mean_c)
    return [g.call(aten.add.Tensor, g.call(aten.mul.Tensor, centred, scale), beta_c), mean, var]


def _trailing(call: relax.Call) -> list[int]:
    rank = len(static_shape(call.args[0].ty))
    axes = sorted(axis % rank for axis in ints(call.attrs.axes))
    _require(axes == list(range(axes[0], rank)), call, f"axes {ints(call.attrs.axes)} (not the trailing axes)")
    return axes


@_converts("relax.nn.layer_norm")
def _layer_norm(g, call):
    _float(call)
    _require(call.attrs.center and call.attrs.scale, call, "center=False or scale=False")
    normalized = static_shape(call.args[0].ty)[_trailing(call)[0] :]
    x, gamma, beta = (g.tensor(arg) for arg in call.args)
    return g.call(_aten().layer_norm.default, x, normalized, gamma, beta, float(call.attrs.epsilon))


@_converts("relax.nn.rms_norm")
def _rms_norm(g, call):
    _float(call)
    aten, x = _aten(), g.tensor(call.args[0])
    mean_square = g.call(aten.mean.dim, g.call(aten.mul.Tensor, x, x), _trailing(call), True)
    inverse = g.call(aten.rsqrt.default, g.call(aten.add.Tensor, mean_square, float(call.attrs.epsilon)))
    return g.call(aten.mul.Tensor, g.call(aten.mul.Tensor, x, inverse), g.tensor(call.args[1]))


@_converts("relax.nn.group_norm")
def _group_norm(g, call):
    _float(call)
    a, shape = call.attrs, static_shape(call.args[0].ty)
    rank = len(shape)
    _require(int(a.channel_axis) % rank == 1, call, f"channel_axis {a.channel_axis}")
    _require({axis % rank for axis in ints(a.axes)} == set(range(2, rank)), call, f"axes {ints(a.axes)}")
    _require(a.center and a.scale, call, "center=False or scale=False")
    x, gamma, beta = (g.tensor(arg) for arg in call.args)
    return g.call(_aten().group_norm.default, x, int(a.num_groups), gamma, beta, float(a.epsilon))


@_converts("relax.nn.softmax", "relax.nn.log_softmax")
def _softmax(g, call):
    _float(call)
    fn = _aten()._softmax.default if call.op.name == "relax.nn.softmax" else _aten()._log_softmax.default
    return g.call(fn, g.tensor(call.args[0]), int(call.attrs.axis), False)


def _axes(call: relax.Call) -> list[int]:
    axis = call.attrs.axis
    return list(range(len(static_shape(call.args[0].ty)))) if axis is None else ints(axis)


_REDUCTIONS = {"relax.sum": "sum.dim_IntList", "relax.mean": "mean.dim", "relax.max": "amax.default",
               "relax.min": "amin.default"}  # fmt: skip


@_converts(*_REDUCTIONS)
def _reduction(g, call):
    if call.op.name == "relax.mean":
        _float(call)
    _require(dtype_of(call.ty) == dtype_of(call.args[0].ty), call, "a result dtype of its own")
    packet, name = _REDUCTIONS[call.op.name].split(".")
    return g.call(getattr(getattr(_aten(), packet), name), g.tensor(call.args[0]), _axes(call), bool(call.attrs.keepdims))


@_converts("relax.variance", "relax.std")
def _variance(g, call):
    _float(call)
    fn = _aten().var.correction if call.op.name == "relax.variance" else _aten().std.correction
    return g.call(fn, g.tensor(call.args[0]), _axes(call), correction=0, keepdim=bool(call.attrs.keepdims))


@_converts("relax.reshape", "relax.flatten", "relax.expand_dims", "relax.squeeze", "relax.nn.batch_flatten")
def _reshape(g, call):
    return g.call(_aten().reshape.default, g.tensor(call.args[0]), static_shape(call.ty))


@_converts("relax.broadcast_to")
def _broadcast_to(g, call):
    return g.call(_aten().expand.default, g.tensor(call.args[0]), static_shape(call.ty))


@_converts("relax.tile")
def _tile(g, call):
    repeats = ints(call.attrs.repeats)
    rank = len(static_shape(call.args[0].ty))
    # Tensor.repeat takes a repeat for every axis, as tile does once its repeats are aligned right.
    return g.call(_aten().repeat.default, g.tensor(call.args[0]), [1] * (rank - len(repeats)) + repeats)


@_converts("relax.permute_dims")
def _permute_dims(g, call):
    axes = call.attrs.axes
    perm = ints(axes) if axes is not None else list(reversed(range(len(static_shape(call.ty)))))
    return g.call(_aten().permute.default, g.tensor(call.args[0]), perm)


@_converts("relax.concat")
def _concat(g, call):
    _require(call.attrs.axis is not None, call, "axis=None (flattening)")
    return g.call(_aten().cat.default, g.tensors(call.args[0]), int(call.attrs.axis))


@_converts("relax.stack")
def _stack(g, call):
    return g.call(_aten().stack.default, g.tensors(call.args[0]), int(call.attrs.axis))


@_converts("relax.split")
def _split(g, call):
    axis = int(call.attrs.axis)
    sizes = [static_shape(field)[axis] for field in call.ty.fields]
    parts = g.call(_aten().split_with_sizes.default, g.tensor(call.args[0]), sizes, axis)
    return [g.call(operator.getitem, parts, k) for k in range(len(sizes))]


@_converts("relax.strided_slice")
def _strided_slice(g, call):
    axes, begin, end = (static_ints(arg) for arg in call.args[1:4])
    strides = static_ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
    _require(min(strides, default=1) > 0, call, f"negative strides {strides}")
    x = g.tensor(call.args[0])
    for axis, b, e, s in zip(axes, begin, end, strides):
        x = g.call(_aten().slice.Tensor, x, axis, b, e, s)
    return x


@_converts("relax.take")
def _take(g, call):
    """x's slices along the axis at the indices: index_select of them flattened, reshaped to
    x's shape with the axis replaced by the indices' shape (numpy's ``take``)."""
    a = call.attrs
    _require(a.axis is not None, call, "axis=None (flattening)")
    _require(a.mode == "fast", call, f"mode {a.mode!r}")
    aten, x, indices = _aten(), g.tensor(call.args[0]), g.tensor(call.args[1])
    flat = g.call(aten.reshape.default, indices, [-1])
    axis = int(a.axis) % len(static_shape(call.args[0].ty))
    return g.call(aten.reshape.default, g.call(aten.index_select.default, x, axis, flat), static_shape(call.ty))


@_converts("relax.gather_elements")
def _gather_elements(g, call):
    aten = _aten()
    indices = g.call(aten._to_copy.default, g.tensor(call.args[1]), dtype=_torch_dtype("int64"))
    return g.call(aten.gather.default, g.tensor(call.args[0]), int(call.attrs.axis), indices)


@_converts("relax.index_tensor")
def _index_tensor(g, call):
    """x[i0, i1, ...], numpy's advanced indexing, as ATen's ``index``."""
    aten, int64 = _aten(), _torch_dtype("int64")
    indices = [g.call(aten._to_copy.default, i, dtype=int64) for i in g.tensors(call.args[1])]
    return g.call(aten.index.Tensor, g.tensor(call.args[0]), indices)


@_converts("relax.tril", "relax.triu")
def _trilu(g, call):
    fn = _aten().tril.default if call.op.name == "relax.tril" else _aten().triu.default
    return g.call(fn, g.tensor(call.args[0]), int(number(call.args[1])))


@_converts("relax.cumsum")
def _cumsum(g, call):
    a = call.attrs
    _require(not a.exclusive, call, "exclusive")
    _require(a.axis is not None, call, "axis=None (flattening)")
    return g.call(_aten().cumsum.default, g.tensor(call.args[0]), int(a.axis), dtype=_torch_dtype(dtype_of(call.ty)))


@_converts("relax.einsum")
def _einsum(g, call):
    return g.call(_aten().einsum.default, str(call.attrs.subscripts), g.tensors(call.args[0]))


@_converts("relax.nn.pad")
def _pad(g, call):
    a = call.attrs
    _require(str(a.pad_mode) == "constant", call, f"pad_mode {a.pad_mode!r}")
    widths = ints(a.pad_width)  # before and after, axis by axis from the first
    pads = [w for axis in reversed(range(len(widths) // 2)) for w in widths[2 * axis : 2 * axis + 2]]
    return g.call(_aten().constant_pad_nd.default, g.tensor(call.args[0]), pads, float(a.pad_value))


@_converts("relax.zeros", "relax.ones", "relax.zeros_like", "relax.ones_like")
def _filled(g, call):
    value = 0 if "zeros" in call.op.name else 1
    return g.call(_aten().full.default, static_shape(call.ty), value, dtype=_torch_dtype(dtype_of(call.ty)), device=g.device)


@_converts("relax.full", "relax.full_like")
def _full(g, call):
    fill = g.tensor(call.args[1])
    if dtype_of(call.args[1].ty) != dtype_of(call.ty):
        fill = g.call(_aten()._to_copy.default, fill, dtype=_torch_dtype(dtype_of(call.ty)))
    return g.call(_aten().expand.default, fill, static_shape(call.ty))


@_converts("relax.arange")
def _arange(g, call):
    start, end, step = (number(arg) for arg in call.args)
    return g.call(_aten().arange.start_step, start, end, step, dtype=_torch_dtype(dtype_of(call.ty)), device=g.device)


@_converts("relax.call_tir")
def _call_tir(g, call):
    """Simplification's scan kernel (``linear_recurrence_as_scan``: ``h_t = a_t * h_(t-1) + b_t``
    along axis 1 of (outer, length, inner) tensors) written out step by step, as the loop it
    came from: inductor then takes a region around it (RecurrentGemma's RG-LRU, Mamba's
    selective scan), and fuses each step's multiply-add."""
    kernel = g.callees.get(call.args[0])
    if is_recurrence_kernel(kernel):
        return _recurrence(g, call, KernelSpec.from_json(str(kernel.attrs[RECURRENCE_ATTR])))
    what = "a PrimFunc other than simplification's recurrences"
    _require(is_scan_kernel(kernel), call, what)
    aten = _aten()
    a, b, h0 = (g.tensor(arg) for arg in call.args[1].fields)
    state, states = g.call(aten.unsqueeze.default, h0, 1), []
    for t in range(static_shape(call.ty)[1]):
        a_t, b_t = (g.call(aten.slice.Tensor, x, 1, t, t + 1) for x in (a, b))
        state = g.call(aten.add.Tensor, g.call(aten.mul.Tensor, a_t, state), b_t)
        states.append(state)
    return g.call(aten.cat.default, states, 1)


# The operators of a recurrence kernel's step (``recurrences._LANE_OPS``) as aten's.
_LANE_OPS = {"relax.add": "add.Tensor", "relax.subtract": "sub.Tensor", "relax.multiply": "mul.Tensor",
             "relax.divide": "div.Tensor", "relax.maximum": "maximum.default", "relax.minimum": "minimum.default",
             "relax.power": "pow.Tensor_Tensor", "relax.exp": "exp.default", "relax.log": "log.default",
             "relax.sqrt": "sqrt.default", "relax.rsqrt": "rsqrt.default", "relax.tanh": "tanh.default",
             "relax.sigmoid": "sigmoid.default", "relax.negative": "neg.default", "relax.abs": "abs.default"}  # fmt: skip


def _recurrence(g, call, spec: KernelSpec):
    """A recurrence kernel (``elementwise_recurrence_as_scan``) written out step by step,
    each value (outer, 1, inner), as the loop it came from: inductor fuses each step."""
    aten = _aten()
    args = [g.tensor(arg) for arg in call.args[1].fields]
    tensors = args[: len(spec.lengths)]
    rest = [g.call(aten.unsqueeze.default, x, 1) for x in args[len(spec.lengths) :]]
    outside, state = rest[: spec.outside], dict(zip(spec.states, rest[spec.outside :]))
    outputs: dict[int, list] = {j: [] for j in spec.outputs}
    for t in range(spec.steps):
        at = spec.first_index + t
        values: list = []
        for name, operands in spec.template:
            operands = [values[i] if kind == "node" else outside[i] if kind == "outside" else state[i] if kind == "state"
                        else g.call(aten.slice.Tensor, tensors[i], 1, at, at + 1) for kind, i in operands]  # fmt: skip
            packet, overload = _LANE_OPS[name].split(".")
            values.append(g.call(getattr(getattr(aten, packet), overload), *operands))
        for j in spec.outputs:
            outputs[j].append(values[j])
        state = {j: values[j] for j in spec.states}
    stacked = [g.call(aten.cat.default, outputs[j], 1) for j in spec.outputs]
    return stacked[0] if len(stacked) == 1 else stacked


# --------------------------------------------------------------------------- bindings and functions


def _convert_binding(g: _FX, var: relax.Var, value: relax.Expr) -> None:
    check_type(var.ty, DTYPES)
    if isinstance(value, relax.Call):
        if not isinstance(value.op, tvm.ir.Op):
            raise Unsupported(f"calls of {value.op} (not a Relax operator) have no torch.fx conversion")
        converter = CONVERTERS.get(value.op.name)
        if converter is None:
            raise Unsupported(f"operator {value.op.name} has no torch.fx conversion")
        for arg in value.args:
            check_type(arg.ty, DTYPES)
        g.values[var] = converter(g, value)
    elif isinstance(value, relax.Tuple):
        g.values[var] = g.tensors(value)
    elif isinstance(value, relax.TupleGetItem):
        g.values[var] = g.tensors(value.tuple_value)[value.index]
    elif isinstance(value, relax.Var) and isinstance(value.ty, relax.TupleType):
        g.values[var] = g.tensors(value)
    elif isinstance(value, (relax.Var, tvm.ir.GenericConst)):
        g.values[var] = g.tensor(value)
    else:
        raise Unsupported(f"unsupported binding {type(value).__name__}: {value}")


def _flatten(value: Value) -> list:
    return [n for item in value for n in _flatten(item)] if isinstance(value, list) else [value]


def to_fx(func: relax.Function, device: str = "cpu"):
    """``func`` as a ``torch.fx.GraphModule`` whose constants live on ``device`` ("cpu" or
    "cuda"); called with one tensor per parameter, it returns a tuple of every output.
    Raises Unsupported."""
    import torch
    import torch.fx

    g = _FX(device, callees=func.attrs.get(CALLEES_ATTR) if func.attrs else None)
    for param in func.params:
        if not isinstance(param.ty, relax.TensorType):
            raise Unsupported(f"parameter {param.name} of type {param.ty} is not a tensor")
        check_type(param.ty, DTYPES)
        g.values[param] = g.graph.placeholder(f"p_{param.name}")
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise Unsupported(f"unsupported binding kind {type(binding).__name__}")
            _convert_binding(g, binding.var, binding.value)
    result = func.body.body
    outputs = _flatten(g.tensors(result) if isinstance(result.ty, relax.TupleType) else g.tensor(result))
    g.graph.output(tuple(outputs))
    root = torch.nn.Module()
    for name, tensor in g.constants.items():
        root.register_buffer(name, tensor)
    return torch.fx.GraphModule(root, g.graph)


def supports(graph: DataflowGraph, node: Node) -> str | None:
    """None when ``node`` converts to torch.fx, else why not (operator, dtype or attribute)."""
    try:
        _convert_binding(_FX(weights=False, callees=graph.callees), node.var, node.value)
    except Unsupported as reason:
        return str(reason)
    return None


def convertible(graph: DataflowGraph, node: Node) -> bool:
    """``supports`` as a PatternRule's ``valid_op``."""
    return supports(graph, node) is None
