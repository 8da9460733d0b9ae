"""Importer idioms lifted back to the operators they hide, so libraries can take them.

- ``te_calls_as_ops``: TVM's ONNX importer builds some operators with ``emit_te``: Clip
  becomes ``call_tir`` of private ``maximum`` and ``minimum`` PrimFuncs, between
  ``isnan``/``where`` of its bounds (which FoldConstant then folds). No library can run a
  ``call_tir``, so every engine lost those ops and the graph around them. The lift is exact:
  the operator the PrimFunc is named after (``maximum``, ``minimum1``) is legalized on the
  same argument types, and the call is replaced only when that legalization is structurally
  the PrimFunc the call runs. A constant Pad (``topi.nn.pad``), Tile and Einsum alike, their
  attributes read off the PrimFunc: EfficientNet's ONNX file has 51 Pads, and with them no
  engine could take the model whole or a region across one. (A reflecting Pad stays: Relax
  legalizes its own differently, so the lift could not be checked.)
- ``clip_from_max_min``: ``minimum(maximum(x, lo), hi)`` with scalar constant bounds is
  ``clip(x, lo, hi)``, which engines fuse into the convolution before it (ReLU6).
- ``linear_on_all_axes`` and ``matmul_on_all_axes``: PyTorch's importer flattens a linear
  layer's input to 2-D and an attention's batched matmul to 3-D, and reshapes back after;
  torch's ONNX exporter writes one matmul on all axes, the form the engines' fusions match.
- ``matrix_weight``: a constant matmul operand with unit leading axes as the matrix it is,
  the form exporters write and engines pre-pack.
- ``matmul_broadcasts_itself``: a matmul operand ``broadcast_to`` the batch axes the matmul
  broadcasts to anyway, as the operand itself.
- ``elementwise_broadcasts_itself``: likewise an element-wise operand (``add``, ``where``...)
  ``broadcast_to`` the shape the operator broadcasts it to anyway.
- ``wrap_negative_take_indices``: constant negative indices counted from the end, as torch
  and ONNX count them and TVM's fast ``take`` does not.
- ``booleans_as_integers``: comparisons and arithmetic of booleans, which TVM cannot compile,
  computed on their 0/1 integers.
- ``finite_integer_clips``: a clip of integers to an infinite bound, which TVM cannot compile,
  bounded by the integer type's own extreme instead.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .ops import literal, static_shape
from .pattern_rewrite import Matches, PatternRewrite

# Operators whose legalization an importer may have emitted itself (topi's element-wise ops).
LIFTABLE = (
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "where",
    "exp", "log", "sqrt", "tanh", "sigmoid", "negative", "abs", "floor", "ceil", "round", "sign",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "logical_and", "logical_or", "logical_not", "isnan", "isinf",
)  # fmt: skip

_call_tir = is_op("relax.call_tir")(wildcard(), wildcard())


class TeCallsAsOps:
    """The simplification step (``collage.simplify``) lifting such calls back to operators."""

    name = "te_calls_as_ops"

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        applied = 0

        def lift(call: relax.Call, matches) -> relax.Expr:
            nonlocal applied
            op = _operator_for(mod, call)
            if op is None:
                return call
            applied += 1
            return op(*call.args[1].fields)

        rewritten = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewritten[gvar] = rewrite_call(_call_tir, lift, func)
        return (rewritten, applied) if applied else (mod, 0)


def _operator_for(mod: tvm.IRModule, call: relax.Call):
    """The Relax operator ``call`` (a call_tir) computes, or None when it is not one of ours."""
    callee, args = call.args[0], call.args[1]
    if len(call.args) != 2 or not isinstance(callee, relax.GlobalVar) or not isinstance(args, relax.Tuple):
        return None
    base = re.sub(r"_?\d+$", "", callee.name_hint)
    if base == "pad":
        op = _padding(mod[callee], call)
    elif base == "tile":
        op = _tiling(call)
    elif base == "einsum":
        op = _summation(mod[callee], call)
    else:
        op = getattr(relax.op, base, None) if base in LIFTABLE else None
    if op is None:
        return None
    try:
        legalized = _legalized(op, list(args.fields))
    except Exception:  # noqa: BLE001 -- the operator does not take these arguments: not ours
        return None
    return op if tvm_ffi.structural_equal(_bare(legalized), _bare(mod[callee]), map_free_vars=True) else None


def _padding(prim, call: relax.Call):
    """``relax.op.nn.pad`` with the widths and value a constant Pad's PrimFunc (``topi.nn.pad``)
    was built with: each axis's width before is the offset it reads the input at, its width
    after what the output's shape leaves, the value what it writes outside the input. Read off
    TVM's own structure, so only a guess: the caller keeps it only where the operator's
    legalization is that PrimFunc. None for anything else (another mode, another shape)."""
    try:
        block = _only_block(prim)
        (read,) = block.reads
        value, fill = block.body.value, 0.0  # a pad of nothing copies x[i], writes no fill
        if isinstance(value, tvm.ir.Call):  # if_then_else(inside, x[i - before], fill)
            if value.op.name != "prim.if_then_else":
                return None
            fill = value.args[2].value
        before = [_offset(axis.min) for axis in read.region]
    except (AttributeError, ValueError, TypeError, IndexError):
        return None
    data, out = static_shape(call.args[1].fields[0]), static_shape(call)
    if None in before or data is None or out is None or len(before) != len(data):
        return None
    widths = [(b, o - i - b) for b, i, o in zip(before, data, out)]
    return functools.partial(relax.op.nn.pad, pad_width=[w for pair in widths for w in pair],
                             pad_mode="constant", pad_value=float(fill))  # fmt: skip


def _offset(index) -> int | None:
    """``before`` of an index ``i - before`` (or ``i``), None for any other form."""
    if isinstance(index, tvm.tirx.Var):
        return 0
    if isinstance(index, tvm.tirx.Sub) and isinstance(index.a, tvm.tirx.Var) and isinstance(index.b, tvm.tirx.IntImm):
        return int(index.b.value)
    return None


def _summation(prim, call: relax.Call):
    """``relax.op.einsum`` with the subscripts ``topi.einsum``'s PrimFunc computes: a letter
    for each loop of its block, each operand's read and the output's write spelled in them
    (``bhwc,hkc->bhwk``). A guess the caller checks, as ``_padding``'s."""
    try:
        block = _only_block(prim)
        letters = {iv.var: chr(ord("a") + k) for k, iv in enumerate(block.iter_vars)}
        operands = [_spelled(read, letters) for read in block.reads]
        (write,) = block.writes
        subscripts = ",".join(operands) + "->" + _spelled(write, letters)
    except (AttributeError, KeyError, ValueError, TypeError, IndexError):
        return None
    if len(letters) > 26 or len(operands) != len(call.args[1].fields):
        return None
    return lambda *operands: relax.op.einsum(operands, subscripts)


def _spelled(region, letters: dict) -> str:
    """A tensor's access, each index one loop's letter (KeyError for any other index)."""
    return "".join(letters[axis.min] for axis in region.region)


def _only_block(prim):
    """The one block of a PrimFunc as ``emit_te`` writes one: under its root block's loops."""
    stmt = prim.body.block.body
    while not hasattr(stmt, "block"):
        stmt = stmt.body
    return stmt.block


def _tiling(call: relax.Call):
    """``relax.op.tile`` with the repeats its output's shape says: each axis's extent over the
    input's, the two aligned on their last axes as tile aligns them. None where they do not divide."""
    data, out = static_shape(call.args[1].fields[0]), static_shape(call)
    if data is None or out is None or len(out) < len(data) or 0 in data:
        return None
    data = [1] * (len(out) - len(data)) + data
    if any(o % i for i, o in zip(data, out)):
        return None
    return functools.partial(relax.op.tile, repeats=[o // i for i, o in zip(data, out)])


def _legalized(op, args: list[relax.Expr]):
    """The PrimFunc TVM's LegalizeOps writes for ``op`` on arguments of ``args``' types."""
    params = [relax.Var(f"a{k}", a.ty) for k, a in enumerate(args)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(op(*params))
        bb.emit_func_output(out)
    legal = relax.transform.LegalizeOps()(bb.get())
    (prim,) = [f for _, f in legal.functions_items() if not isinstance(f, relax.Function)]
    return prim


def _bare(prim):
    """A PrimFunc without its attributes (names, the importer's flags), for comparison."""
    for key in list(prim.attrs.keys()) if prim.attrs else ():
        prim = prim.without_attr(key)
    return prim


TE_CALLS_AS_OPS = TeCallsAsOps()


_x, _lo, _hi = wildcard(), is_const(), is_const()
_max = is_op("relax.maximum")(_x, _lo)
_max_min = is_op("relax.minimum")(_max, _hi)


def _clip(matches: Matches, single_use: set) -> relax.Expr | None:
    lo, hi = (matches[c].value.numpy() for c in (_lo, _hi))
    x = matches[_x]
    if lo.ndim or hi.ndim or not lo <= hi or matches[_max] not in single_use:
        return None  # per-element bounds, or the maximum is read elsewhere too
    if not tvm_ffi.structural_equal(matches[_max_min].ty, x.ty):
        return None  # the bounds broadcast x: not an element-wise clip
    return relax.op.clip(x, float(lo), float(hi))


CLIP_FROM_MAX_MIN = PatternRewrite("clip_from_max_min", _max_min, _clip)


# A reduction over a stack along the stacked axis, as the element-wise operator of its values in
# turn: TVM's ONNX importer writes ONNX's Max, Min and Sum of several tensors so (RWKV's
# torch.maximum of two: 512 stacks of two rows, each reduced), which no engine or recurrence
# reads as the one operator it is.
_PAIRWISE = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum, "relax.sum": relax.op.add}
_stack = is_op("relax.stack")(wildcard())
_reduced_stacks = {name: is_op(name)(_stack) for name in _PAIRWISE}


def _pairwise(name: str, matches: Matches, single_use: set) -> relax.Expr | None:
    reduced, stack = matches[_reduced_stacks[name]], matches[_stack]
    fields, rank = stack.args[0], len(static_shape(stack) or ())
    if not isinstance(fields, relax.Tuple) or stack not in single_use or not rank or reduced.attrs.keepdims:
        return None
    axes = reduced.attrs.axis
    if axes is None or [int(a) % rank for a in axes] != [int(stack.attrs.axis or 0) % rank]:
        return None
    return functools.reduce(_PAIRWISE[name], fields.fields)


STACKED_REDUCTIONS_PAIRWISE = tuple(
    PatternRewrite(f"{name.removeprefix('relax.')}_of_stack_pairwise", pattern, functools.partial(_pairwise, name))
    for name, pattern in _reduced_stacks.items()
)  # fmt: skip


_clipped, _inner_lo, _inner_hi, _outer_lo, _outer_hi = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
_inner_clip = is_op("relax.clip")(_clipped, _inner_lo, _inner_hi)
_clip_of_clip = is_op("relax.clip")(_inner_clip, _outer_lo, _outer_hi)


def _merged_clips(matches: Matches, single_use: set) -> relax.Expr | None:
    if matches[_inner_clip] not in single_use:
        return None  # the inner clip's output is read elsewhere
    bounds = [literal(matches[b]) for b in (_inner_lo, _inner_hi, _outer_lo, _outer_hi)]
    if None in bounds:
        return None
    inner_lo, inner_hi, outer_lo, outer_hi = bounds
    lo, hi = float(max(inner_lo, outer_lo)), float(min(inner_hi, outer_hi))
    if lo > hi:
        return None  # disjoint ranges: every value becomes a bound; leave it as written
    return relax.op.clip(matches[_clipped], lo, hi)


# PyTorch's importer writes ReLU6 and hard-swish's relu6 as clip(0, inf) then clip(-inf, 6).
MERGE_CLIPS = PatternRewrite("merge_clips", _clip_of_clip, _merged_clips)


_features, _weight, _bias = wildcard(), wildcard(), wildcard()
_flat = is_op("relax.reshape")(_features, wildcard())
_product = is_op("relax.matmul")(_flat, _weight)
_biased = is_op("relax.add")(_product, _bias)
_unflat = is_op("relax.reshape")(_biased | _product, wildcard())


def _linear_on_all_axes(matches: Matches, single_use: set) -> relax.Expr | None:
    x, weight, biased, after = matches[_features], matches[_weight], matches.get(_biased), matches[_unflat]
    x_shape, w_shape, flat_shape, out_shape = (static_shape(e) for e in (x, weight, matches[_flat], after))
    if None in (x_shape, w_shape, flat_shape, out_shape) or len(w_shape) != 2 or len(flat_shape) != 2:
        return None
    (rows, features), outputs = flat_shape, w_shape[1]
    # The leading axes the product keeps: those the reshape after restores, else the input's.
    if len(out_shape) >= 3 and out_shape[-1] == outputs and math.prod(out_shape[:-1]) == rows:
        leading = out_shape[:-1]
    elif len(x_shape) >= 3 and x_shape[-1] == features and math.prod(x_shape[:-1]) == rows:
        leading = x_shape[:-1]
    else:
        return None
    if biased is not None:
        if matches[_product] not in single_use:
            return None  # the flat product is read elsewhere: rewriting would compute it twice
        bias_shape = static_shape(matches[_bias])
        if bias_shape is None or len(bias_shape) > 2 or any(d != 1 for d in bias_shape[:-1]):
            return None  # a bias per row of the flat product: it needs the flat layout
    x = x if x_shape == leading + [features] else relax.op.reshape(x, leading + [features])
    out = relax.op.matmul(x, weight)
    if biased is not None:
        out = relax.op.add(out, matches[_bias]) if biased.args[0].same_as(matches[_product]) else relax.op.add(matches[_bias], out)
    # The reshape after stays where it splits the features (heads of attention).
    return out if out_shape == leading + [outputs] else relax.op.reshape(out, after.args[1])


# PyTorch's importer writes a linear layer on a (batch, tokens, features) or NHWC tensor as
# reshape to 2-D, matmul, bias, reshape back; torch's ONNX exporter writes one MatMul on the
# whole tensor, and OpenVINO's MatMul fusions and ONNX Runtime's MatMul+Add (Gemm-like)
# fusions match that form (ConvNeXt V2 kept 20 reshapes in OpenVINO's runtime graph).
LINEAR_ON_ALL_AXES = PatternRewrite("linear_on_all_axes", _unflat, _linear_on_all_axes)


_left, _right = wildcard(), wildcard()
_left_flat, _right_flat = is_op("relax.reshape")(_left, wildcard()), is_op("relax.reshape")(_right, wildcard())
_left_constant, _right_constant = is_const(), is_const()
_batched = is_op("relax.matmul")(_left_flat | _left_constant, _right_flat | _right_constant)
_batched_back = is_op("relax.reshape")(_batched, wildcard())


def _matmul_on_all_axes(matches: Matches, single_use: set) -> relax.Expr | None:
    flats = [matches.get(_left_flat, matches.get(_left_constant)), matches.get(_right_flat, matches.get(_right_constant))]
    out, left_flat, right_flat = static_shape(matches[_batched_back]), static_shape(flats[0]), static_shape(flats[1])
    if None in (out, left_flat, right_flat) or len(out) < 4 or len(left_flat) != 3 or len(right_flat) != 3:
        return None
    # The batch axes are those the reshape after restores.
    batch, (rows, columns), inner = out[:-2], out[-2:], left_flat[-1]
    if left_flat != [math.prod(batch), rows, inner] or right_flat != [math.prod(batch), inner, columns]:
        return None  # not the merging of the batch axes
    if matches[_batched] not in single_use:
        return None  # the merged product is read elsewhere: rewriting would compute it twice
    # A flattening read by other matmuls too (DeBERTa's query, in its content-to-content and
    # content-to-position products) stays for them; a reshape computes nothing.
    operands = []
    for constant, unflat, wanted in ((_left_constant, _left, batch + [rows, inner]), (_right_constant, _right, batch + [inner, columns])):
        if constant in matches:  # folded already: its batch axes are written back here
            operands.append((relax.const(matches[constant].value.numpy().reshape(wanted)), False))
            continue
        operand = matches[unflat]
        shape = static_shape(operand)
        if shape is None or shape[-2:] != wanted[-2:]:
            return None
        # Grouped-query attention: RemoveRedundantReshape merged the key/value repeat's
        # reshape to (batch, heads, tokens, size) into the flattening, so that operand arrives
        # as (batch, groups, repeats, tokens, size); one reshape regroups it, as torch's
        # exporter writes.
        operands.append((operand if shape == wanted else relax.op.reshape(operand, wanted), shape == wanted))
    if not any(has_batch_axes for _, has_batch_axes in operands):
        return None  # neither operand has the output's batch axes: the merged layout is needed
    return relax.op.matmul(operands[0][0], operands[1][0])


# The importer merges the batch axes of an attention's (batch, heads, tokens, size) matmuls
# into one and splits them again after: three reshapes per matmul that torch's ONNX exporter
# does not write, and that keep ONNX Runtime from fusing the scale after the matmul and
# OpenVINO from fusing the attention (it matches 4-D matmuls only; Llama kept 4 MatMul and 2
# Softmax layers). An operand that was a constant (DeBERTa's projected relative positions,
# folded) arrives merged and is written back with its batch axes.
MATMUL_ON_ALL_AXES = PatternRewrite("matmul_on_all_axes", _batched_back, _matmul_on_all_axes)


_activations, _stacked_weight = wildcard(), is_const()
_product_of_constant = is_op("relax.matmul")(_activations, _stacked_weight)


def _matrix_weight(matches: Matches, single_use: set) -> relax.Expr | None:
    x_shape, w_shape = static_shape(matches[_activations]), static_shape(matches[_stacked_weight])
    if None in (x_shape, w_shape) or len(w_shape) <= 2 or any(d != 1 for d in w_shape[:-2]):
        return None
    if len(x_shape) < len(w_shape):
        return None  # the weight's unit axes add axes to the product: they are needed
    matrix = matches[_stacked_weight].value.numpy().reshape(w_shape[-2:])
    return relax.op.matmul(matches[_activations], relax.const(matrix))


# A constant right operand with unit leading axes (LeViT's stage linears import as (1, 128,
# 640)) computes what its matrix computes when the left operand has as many axes; torch's
# ONNX exporter writes the matrix, and ONNX Runtime pre-packs only a 2-D constant (the 3-D
# one ran 83 us against 57 in LeViT's stem, one of three such).
MATRIX_WEIGHT = PatternRewrite("matrix_weight", _product_of_constant, _matrix_weight)


_expanded_left, _expanded_right = wildcard(), wildcard()
_left_operand, _right_operand = wildcard(), wildcard()
_product_of_broadcast = is_op("relax.matmul")(
    is_op("relax.broadcast_to")(_expanded_left, wildcard()) | _left_operand,
    is_op("relax.broadcast_to")(_expanded_right, wildcard()) | _right_operand,
)


def _unbroadcast_operands(matches: Matches, single_use: set) -> relax.Expr | None:
    left, right = matches.get(_expanded_left, matches.get(_left_operand)), matches.get(_expanded_right, matches.get(_right_operand))
    if _expanded_left not in matches and _expanded_right not in matches:
        return None
    shapes = static_shape(left), static_shape(right)
    if None in shapes or min(map(len, shapes)) < 2:
        return None
    batch = _broadcast(shapes[0][:-2], shapes[1][:-2])
    if batch is None or batch + [shapes[0][-2], shapes[1][-1]] != static_shape(matches[_product_of_broadcast]):
        return None  # the broadcast adds axes or extents the matmul would not
    return relax.op.matmul(left, right, out_dtype=matches[_product_of_broadcast].attrs.out_dtype)


# PyTorch's decomposition of ``x @ w.T`` on a (tokens, batch, features) input (the in- and
# out-projections of nn.MultiheadAttention with batch_first) expands the weight to (tokens,
# features, out) for a batched product; FoldConstant then writes that copy out, one matrix
# per token, and ONNX Runtime multiplies by a 6 MB stacked weight it cannot pre-pack
# (nn.TransformerEncoder, 2 layers: 0.89 ms against 0.38 on torch's ONNX export). Before
# folding, the product of the operand itself is the same, and the weight stays a matrix.
MATMUL_BROADCASTS_ITSELF = PatternRewrite("matmul_broadcasts_itself", _product_of_broadcast, _unbroadcast_operands)


# The element-wise operators that broadcast their operands to one shape, by how many they take.
BROADCASTING_OPS = {
    2: ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
        "relax.power"),
    3: ("relax.where",),
}
_expanded = [wildcard() for _ in range(3)]
_operands = [wildcard() for _ in range(3)]
_maybe_broadcast = [is_op("relax.broadcast_to")(e, wildcard()) | o for e, o in zip(_expanded, _operands)]
_broadcasting = functools.reduce(
    lambda either, pattern: either | pattern,
    [is_op(op)(*_maybe_broadcast[:arity]) for arity, ops in BROADCASTING_OPS.items() for op in ops],
)


def _elementwise_unbroadcast(matches: Matches, single_use: set) -> relax.Expr | None:
    call = matches[_broadcasting]
    arity = len(call.args)
    if not any(e in matches for e in _expanded[:arity]):
        return None
    args = [matches[e] if e in matches else matches[o] for e, o in zip(_expanded[:arity], _operands[:arity])]
    shapes = [static_shape(a) for a in args]
    if None in shapes:
        return None
    result = _broadcast(*shapes)
    if result is None or result != static_shape(call):
        return None  # the broadcast adds axes or extents the operator would not
    return relax.Call(call.op, args, call.attrs)


def _broadcast(*shapes: list[int]) -> list[int] | None:
    """The shape ``shapes`` broadcast to (NumPy's rules, which Relax's operators follow), or
    None where they do not broadcast."""
    try:
        return list(np.broadcast_shapes(*map(tuple, shapes)))
    except ValueError:
        return None


# An element-wise operand ``broadcast_to`` the shape the operator broadcasts it to anyway, as
# the operand itself: the exporters' files broadcast implicitly, and the engines fuse such
# operators. RecurrentGemma's import writes 128 ``where``s of a mask, an expanded state and a
# constant; each became an Expand before a Where, which OpenVINO ran as a Broadcast between
# layout reorders (135 reorders against 7 on torch's file, 54 fewer fused subgraphs: 5.2 ms
# against 4.0-4.1 without the Expands, on a 2-core Zen 4).
ELEMENTWISE_BROADCASTS_ITSELF = PatternRewrite("elementwise_broadcasts_itself", _broadcasting, _elementwise_unbroadcast)


_taken, _indices = wildcard(), is_const()
_take = is_op("relax.take")(_taken, _indices)


def _wrapped_indices(matches: Matches, single_use: set) -> relax.Expr | None:
    take = matches[_take]
    indices = matches[_indices].value.numpy()
    shape = static_shape(matches[_taken])
    if shape is None or indices.dtype.kind not in "iu" or not (indices < 0).any() or take.attrs.axis is None:
        return None
    if take.attrs.mode not in ("fast", "wrap"):
        return None  # "clip" and "nan" give a negative index a meaning of their own
    extent = shape[int(take.attrs.axis) % len(shape)]
    if (indices < -extent).any():
        return None  # out of range either way: left for the backends to report
    wrapped = relax.const(np.where(indices < 0, indices + extent, indices).astype(indices.dtype))
    return relax.op.take(matches[_taken], wrapped, axis=take.attrs.axis, mode=take.attrs.mode)


# PyTorch's importer writes ``x[..., [-2], :]`` (Falcon's key and value split off its fused
# projection) as take(x, [-2], mode="fast"), and TVM's fast take reads index -2 out of bounds
# instead of from the end: Falcon's outputs came out wrong by 100%. ONNX's Gather and torch
# count negative indices from the end; written that way, every backend agrees.
WRAP_NEGATIVE_TAKE_INDICES = PatternRewrite("wrap_negative_take_indices", _take, _wrapped_indices)


# The operators TVM 0.27 compiles for numbers only. Booleans have a DLPack type code of their
# own since tvm-ffi 0.1, which its LLVM code generator takes for neither an integer nor a
# float: comparisons and arithmetic stop it ("t.MatchesCode(kDLFloat)", or "fcmp oeq i1",
# invalid LLVM), and legalizing max, min or argmax finds no bounds for the type. PyTorch's
# importer writes them on booleans as torch has them (LongT5's ``mask > 0``), so TVM could
# not run the unoptimized model at all. The logical and bitwise operators, ``where``,
# casts, sums and data movement compile on booleans and are left alone.
ON_NUMBERS_ONLY = (
    "less", "greater", "less_equal", "greater_equal", "equal", "not_equal",
    "add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "mod", "power", "maximum", "minimum",
    "clip", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "sort", "argsort", "topk",
)  # fmt: skip
_COMPARISONS = {f"relax.{name}" for name in ON_NUMBERS_ONLY[:6]}
_OPERATORS = {f"relax.{name}" for name in ON_NUMBERS_ONLY}
# Any value, the operator checked by name: an alternative of 26 call patterns (``|``) does not
# match binary calls in TVM 0.27's matcher.
_on_numbers = wildcard()


def _is_boolean(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == "bool"


def _booleans_as_integers(matches: Matches, single_use: set) -> relax.Expr | None:
    call = matches[_on_numbers]
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in _OPERATORS):
        return None
    if not any(map(_is_boolean, call.args)):
        return None
    # int32: a count (cumsum) of booleans needs more than a byte.
    args = [relax.op.astype(arg, "int32") if _is_boolean(arg) else arg for arg in call.args]
    computed = relax.Call(call.op, args, call.attrs, call.ty_args)
    if _is_boolean(call) and call.op.name not in _COMPARISONS:
        return relax.op.astype(computed, "bool")  # nonzero is true: add is or, multiply is and, as in torch
    return computed


# An operator on booleans computed on their 0/1 integers, its result cast back to booleans
# where it was declared boolean.
BOOLEANS_AS_INTEGERS = PatternRewrite("booleans_as_integers", _on_numbers, _booleans_as_integers)


_clipped_integers, _low, _high = wildcard(), wildcard(), wildcard()
_integer_clip = is_op("relax.clip")(_clipped_integers, _low, _high)


def _finite_integer_clip(matches: Matches, single_use: set) -> relax.Expr | None:
    dtype = getattr(matches[_clipped_integers].ty, "dtype", None)
    if dtype is None or np.dtype(str(dtype)).kind not in "iu":
        return None
    bounds = [literal(matches[b]) for b in (_low, _high)]
    if None in bounds or all(math.isfinite(b) for b in bounds):
        return None
    extremes = np.iinfo(str(dtype))
    low, high = (int(min(max(b, extremes.min), extremes.max)) for b in bounds)  # -inf and inf clamp to the type's ends
    return relax.op.clip(matches[_clipped_integers], low, high)


# PyTorch's importer writes a one-sided clamp as a clip with the other bound infinite, whatever
# the dtype; TVM casts that bound to the tensor's dtype when it compiles the clip, and an
# integer cannot hold infinity ("Cannot convert infinity to BigInt"). torch.export writes such
# clamps on index arithmetic: SAM's relative positions, resized by a linear interpolation,
# clamp their int64 source indices to the last one, and TVM could not compile the model at all.
FINITE_INTEGER_CLIPS = PatternRewrite("finite_integer_clips", _integer_clip, _finite_integer_clip)
