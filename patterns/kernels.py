"""Patterns and checks for library kernels that several backends share.

- Convolution, 1-D to 3-D, with the post-ops oneDNN and cuDNN apply: bias, residual add,
  ReLU, in that order (a ResNet block once BatchNorm is folded). ``dnnl`` (1-D to 3-D) and
  ``cudnn`` (2-D and 3-D).
- Matmul: dense ``x[..., K] @ W[K, N]`` (+ bias) (+ ReLU) and batch matmul. Either may
  take its right operand through ``permute_dims``: BLAS reads it transposed, for free.
  ``mkl`` and ``cublas``.
- 2-D pooling.

Factories return ``(pattern, annotations)`` like TVM's own (tvm/relax/backend/patterns.py);
``conv_patterns`` and ``matmul_patterns`` name them for one backend. A check is a ``Check``:
rules that each say why the library cannot run a match, or None. The generator only asks
whether a match passes; ``compile_match`` re-finds the match in the function a backend is
asked to compile and raises ``Unsupported`` with the first rule's reason. ``reader`` is how
a kernel gets each operand: constants once, at compile time; inputs on each call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from collage.candidates.backend import Unsupported
from collage.model.graph import ALIAS, DataflowGraph
from collage.candidates.pattern import Match, Pattern

Rule = Callable[[Match], "str | None"]
WithAnnotations = tuple[DFPattern, dict[str, DFPattern]]


@dataclass(frozen=True)
class Check:
    """A pattern check made of rules; each returns why the library cannot run a match, or None.
    Rules run in order, so later ones may assume what earlier ones established."""

    rules: tuple[Rule, ...]

    def __call__(self, match: Match) -> bool:
        return self.reason(match) is None

    def reason(self, match: Match) -> str | None:
        return next((why for rule in self.rules if (why := rule(match)) is not None), None)


# --------------------------------------------------------------------------- factories


def conv(dims: int = 2, bias: bool = False, residual: bool = False, relu: bool = False) -> WithAnnotations:
    """``relu?(conv(data, weight) + bias? + residual?)``."""
    data, weight = wildcard(), wildcard()
    out = is_op(f"relax.nn.conv{dims}d")(data, weight)
    annotations = {"data": data, "weight": weight, "conv": out}
    if bias:
        out = _add_bias(out, annotations)
    if residual:
        annotations["residual"] = wildcard()
        out = annotations["residual_add"] = is_op("relax.add")(out, annotations["residual"])
    if relu:
        out = annotations["relu"] = is_op("relax.nn.relu")(out)
    return out, annotations


def matmul(bias: bool = False, relu: bool = False, transpose: str = "maybe") -> WithAnnotations:
    """``relu?(lhs @ rhs + bias?)`` where ``rhs`` is ``permute_dims(rhs)`` when ``transpose``
    is "always", may be when "maybe"; "never" leaves a permute_dims before it to another kernel."""
    lhs, rhs = wildcard(), wildcard()
    annotations = {"lhs": lhs, "rhs": rhs}
    permuted = annotations["transpose"] = is_op("relax.permute_dims")(rhs)
    operand = {"maybe": permuted | rhs, "always": permuted, "never": rhs}[transpose]
    if transpose == "never":
        del annotations["transpose"]
    out = annotations["matmul"] = is_op("relax.matmul")(lhs, operand)
    if bias:
        out = _add_bias(out, annotations)
    if relu:
        out = annotations["relu"] = is_op("relax.nn.relu")(out)
    return out, annotations


def pool2d(op: str) -> WithAnnotations:
    """``op(data)`` for ``relax.nn.max_pool2d`` or ``relax.nn.avg_pool2d``."""
    data = wildcard()
    out = is_op(op)(data)
    return out, {"data": data, "pool": out}


def _add_bias(out: DFPattern, annotations: dict) -> DFPattern:
    bias = wildcard()
    # Frontends reshape a [C] bias to broadcast over the channel: [1, C, 1, 1]. relax.add is
    # matched in either operand order.
    operand = is_op("relax.reshape")(bias, wildcard()) | bias
    annotations.update(bias=bias, bias_operand=operand)
    annotations["bias_add"] = added = is_op("relax.add")(out, operand)
    return added


def conv_name(backend: str, dims: int, bias: bool, residual: bool, relu: bool) -> str:
    """``dnnl.conv2d_bias_add_relu``: post-ops in the order they apply."""
    suffix = "".join(part for part, on in (("_bias", bias), ("_add", residual), ("_relu", relu)) if on)
    return f"{backend}.conv{dims}d{suffix}"


def conv_patterns(backend: str, dims: tuple[int, ...] = (2, 3)) -> tuple[Pattern, ...]:
    """Every combination of the post-ops, for each convolution rank in ``dims``."""
    return tuple(
        Pattern(conv_name(backend, d, b, r, u), *conv(d, b, r, u), check=CONV_CHECK)
        for d in dims
        for b in (False, True)
        for r in (False, True)
        for u in (False, True)
    )


def matmul_patterns(backend: str) -> tuple[Pattern, ...]:
    """``dense``, ``dense_bias``, ``dense_bias_relu`` (2-D weight) and ``batch_matmul`` (with a
    transposed right operand: ``batch_matmul_transposed``)."""
    return (
        Pattern(f"{backend}.dense", *matmul(), check=DENSE_CHECK),
        Pattern(f"{backend}.dense_bias", *matmul(bias=True), check=DENSE_CHECK),
        Pattern(f"{backend}.dense_bias_relu", *matmul(bias=True, relu=True), check=DENSE_CHECK),
        # Attention's operands arrive permuted from (batch, tokens, heads, size): a permute that
        # is not a transpose of the last two axes stays out, and the batch matmul takes its result.
        Pattern(f"{backend}.batch_matmul", *matmul(transpose="never"), check=BATCH_MATMUL_CHECK),
        Pattern(f"{backend}.batch_matmul_transposed", *matmul(transpose="always"), check=BATCH_MATMUL_CHECK),
    )


# --------------------------------------------------------------------------- rules


def shape_of(expr: relax.Expr) -> tuple[int, ...] | None:
    """The shape as ints, or None when unknown or symbolic."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:  # a symbolic dimension
        return None


def float32_static(match: Match) -> str | None:
    """Every tensor the kernel reads or writes is float32 with a static shape."""
    for name, expr in {**match.captures, "output": match.root.var}.items():
        ty = expr.ty
        if not isinstance(ty, relax.TensorType):
            return f"{name} is not a tensor ({ty})"
        if str(ty.dtype) != "float32":  # the kernels are float32 only
            return f"float32 only: {name} is {ty.dtype}"
        if shape_of(expr) is None:  # kernels are built for one shape
            return f"static shapes only: {name} has shape {ty.shape}"
    return None


# PyTorch's channels-first layouts, by the convolution's spatial rank.
CHANNELS_FIRST = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def conv_layout(match: Match) -> str | None:
    attrs = match["conv"].attrs
    data, kernel = CHANNELS_FIRST[len(attrs.strides)]
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != (data, kernel, data):  # PyTorch's convolutions take channels-first tensors
        return f"layouts {data}/{kernel} only, not {layouts[0]}/{layouts[1]} -> {layouts[2]}"
    return None


def symmetric_padding(capture: str) -> Rule:
    def rule(match: Match) -> str | None:
        padding = [int(p) for p in match[capture].attrs.padding]
        half = len(padding) // 2
        if padding[:half] != padding[half:]:  # PyTorch pads both sides of an axis alike
            return f"asymmetric padding {padding}"
        return None

    return rule


def per_channel_bias(anchor: str, channel_axis: int) -> Rule:
    """The bias holds one value per output channel (``channel_axis`` of ``anchor``'s output)
    and broadcasts to that output without growing it."""

    def rule(match: Match) -> str | None:
        if "bias" not in match.captures:
            return None
        out, operand = shape_of(match[anchor]), shape_of(match["bias_operand"])
        aligned = (1,) * (len(out) - len(operand)) + operand  # numpy broadcasting aligns the right
        want = tuple(size if axis == channel_axis % len(out) else 1 for axis, size in enumerate(out))
        if aligned != want:  # libraries add one value per output channel
            return f"bias of shape {operand} is not one value per output channel {want}"
        return None

    return rule


def residual_same_shape(match: Match) -> str | None:
    if "residual" not in match.captures:
        return None
    residual, out = shape_of(match["residual"]), shape_of(match["conv"])
    if residual != out:  # the fused add takes a tensor of the output's shape, no broadcasting
        return f"residual of shape {residual} is not the output's shape {out}"
    return None


def _matmul_shapes(match: Match) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The operands' shapes as the matmul sees them (after any transpose)."""
    lhs, rhs = match["matmul"].args
    return shape_of(lhs), shape_of(rhs)


def dense_shapes(match: Match) -> str | None:
    lhs, rhs = _matmul_shapes(match)
    if len(rhs) != 2 or len(lhs) < 2:  # GEMM: rows of x (leading dims folded) times a matrix
        return f"dense needs x[..., K] @ W[K, N], not {lhs} @ {rhs}"
    return None


def batch_shapes(match: Match) -> str | None:
    lhs, rhs = _matmul_shapes(match)
    if len(lhs) < 3 or len(lhs) != len(rhs) or lhs[:-2] != rhs[:-2]:  # batched GEMM, no broadcast
        return f"batch matmul needs equal batch dimensions, not {lhs} @ {rhs}"
    return None


def transpose_swaps_last_two(match: Match) -> str | None:
    if "transpose" not in match.captures:
        return None
    call = match["transpose"]
    ndim = len(shape_of(call))
    axes = list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
    if axes != [*range(ndim - 2), ndim - 1, ndim - 2]:  # BLAS transposes a matrix, nothing else
        return f"permute_dims{tuple(axes)} is not a transpose of the last two axes"
    return None


def pool_layout(match: Match) -> str | None:
    attrs = match["pool"].attrs
    if (str(attrs.layout), str(attrs.out_layout)) != ("NCHW", "NCHW"):  # channels-first only
        return f"layout NCHW only, not {attrs.layout} -> {attrs.out_layout}"
    return None


CONV_CHECK = Check(
    (float32_static, conv_layout, symmetric_padding("conv"), per_channel_bias("conv", 1), residual_same_shape)
)
DENSE_CHECK = Check((float32_static, dense_shapes, transpose_swaps_last_two, per_channel_bias("matmul", -1)))
BATCH_MATMUL_CHECK = Check((float32_static, batch_shapes, transpose_swaps_last_two))
POOL_CHECK = Check((float32_static, pool_layout, symmetric_padding("pool")))


# --------------------------------------------------------------------------- compiling


def compile_match(func: relax.Function, patterns: Mapping[str, Pattern], name: str) -> Match:
    """The match of pattern ``name`` covering all of ``func``, a sub-graph extracted for
    compiling; else ``Unsupported`` saying why: no such pattern, operators it does not
    cover, or the reason its check gives (a dtype, a layout)."""
    pattern = patterns.get(name)
    if pattern is None:
        raise Unsupported(f"no pattern named {name!r}; known: {', '.join(patterns)}")
    graph = DataflowGraph(func)
    computed = [node for node in graph if node.op != ALIAS]
    match = dataclasses.replace(pattern, check=None).match(graph, computed[-1])
    if match is None or len(match.subgraph) != len(computed):
        ops = " -> ".join(node.op for node in computed)
        raise Unsupported(f"{name} does not cover this sub-graph ({ops})")
    if pattern.check is not None and not pattern.check(match):
        reason = pattern.check.reason(match) if isinstance(pattern.check, Check) else "its check rejects it"
        raise Unsupported(f"{name}: {reason}")
    return match


def use_torch_threads(threads: int) -> None:
    """Run the kernels compiled now on ``threads`` of torch's intra-op threads (0: leave them).
    torch has one such count per process, so a backend driving torch sets it when it compiles."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def reader(func: relax.Function, match: Match, name: str, convert: Callable, prepare: Callable = lambda t: t):
    """How a kernel for ``func`` gets the operand captured as ``name``: ``read(inputs) ->
    tensor``, or None when the match has no such capture (an optional bias or residual).

    A constant (a weight bound into the model) is converted and prepared (moved to the
    device, prepacked) once, now. A parameter is picked from the kernel's inputs on each
    call and converted: ``torch.from_dlpack`` views it without copying.
    """
    if name not in match.captures:
        return None
    expr = match[name]
    if isinstance(expr, tvm.ir.GenericConst):
        value = prepare(convert(expr.value))
        return lambda inputs: value
    position = list(func.params).index(expr)
    return lambda inputs: convert(inputs[position])


def conv_params(match: Match) -> tuple[list[int], list[int], list[int], int]:
    """``(padding, stride, dilation, groups)`` as PyTorch takes them: one padding per axis
    (the check ensured both sides agree)."""
    attrs = match["conv"].attrs
    dims = len(attrs.strides)
    padding = [int(p) for p in attrs.padding][:dims]
    return padding, [int(s) for s in attrs.strides], [int(d) for d in attrs.dilation], int(attrs.groups)
