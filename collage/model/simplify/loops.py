"""Unrolled loops over a sequence rolled back into whole-tensor work.

``torch.export`` and torch's ONNX exporter unroll a Python loop over time steps: each step is a
handful of operators on one slice. transformers' Mamba writes its selective scan that way when
exporting (under ``torch.compile`` it takes an associative scan instead): per token and layer,
``h = A[t] * h + B[t]`` and ``y[t] = h @ C[t]``, nine operators on a (256, 16) state, 1152 of the
1254 operators of the corpus's Mamba. Each is an engine call of a few microseconds on 4096
numbers; OpenVINO ran the model in 4.6 ms where ``torch.compile`` of the module took 2.2.

- ``linear_recurrence_as_scan``: a chain ``h_t = a_t * h_(t-1) + b_t``, where ``a_t`` and
  ``b_t`` are the t-th slices (``take`` at t along one axis) of two tensors of one shape, for
  every t of that axis in order, becomes one ``call_tir`` of a scan kernel that walks the axis
  (parallel over the axes before it, vectorized over those after it); each ``h_t`` is a slice
  of its output. Exact: the kernel does the same multiply-adds in the same order. Only TVM runs
  the kernel; the engines take the graph around it.
- ``stacked_steps_batched``: a ``concat`` of one per-step expression (of its ``expand_dims``,
  or on an axis it has and reshaped after: how torch stacks a loop's outputs), step t reading
  the t-th slice of some tensors and the same values otherwise, becomes that expression once,
  on the whole tensors, the step axis carried in front as a batch axis and moved to where the
  concat put it. The same operators on the same numbers, batched. Only operators whose
  batched form is known are carried (``_Batched``: element-wise ones, matmul, take,
  expand_dims, squeeze, permute_dims, reshape, reductions); any other leaves the loop as it is.
- ``written_slices_stacked``: ``out[:, t] = x`` in a loop, which torch.export writes as a
  ``where`` on a constant mask true at index t, in a chain through every index, becomes a
  ``concat`` of what was written (RWKV: 64 ``where``s a layer, each over the whole output).
- ``consecutive_slices_joined``: fields of a ``concat`` that are slices of one tensor at
  consecutive indices of its axis (each given that axis back) become one slice of it: a loop
  rolled into a kernel (``recurrences``) then hands its output over whole.

The element-wise recurrences the linear one is not are ``recurrences``'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script import tirx as T

from .ops import static_shape
from .pattern_rewrite import Rebound


# ------------------------------------------------------------------ shared


def _index(expr: relax.Expr) -> int | None:
    """The integer a scalar constant index holds, or None."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    return int(value) if value.ndim == 0 and value.dtype.kind in "iu" else None


@dataclass(frozen=True)
class _Slice:
    """``take(tensor, index, axis)`` at a scalar constant index: one step's slice."""

    tensor: relax.Expr
    axis: int
    index: int


def slice_at_constant(expr: relax.Expr, values: dict) -> _Slice | None:
    call = values.get(expr, expr)
    if not (isinstance(call, relax.Call) and call.op == tvm.ir.Op.get("relax.take")):
        return None
    tensor, index = call.args
    shape = static_shape(tensor)
    position = _index(index)
    if shape is None or position is None or call.attrs.axis is None:
        return None
    axis = int(call.attrs.axis) % len(shape)
    return _Slice(tensor, axis, position % shape[axis])


def _call(expr: relax.Expr, values: dict, name: str) -> relax.Call | None:
    call = values.get(expr, expr)
    return call if isinstance(call, relax.Call) and call.op == tvm.ir.Op.get(f"relax.{name}") else None


def relax_functions(mod: tvm.IRModule):
    return [(gvar, func) for gvar, func in mod.functions_items() if isinstance(func, relax.Function)]


# ------------------------------------------------------------------ linear recurrences


@dataclass(frozen=True)
class _Step:
    """``state = a[t] * previous + b[t]``, ``a[t]`` and ``b[t]`` slices along one axis."""

    state: relax.Var
    previous: relax.Expr
    a: relax.Expr
    b: relax.Expr
    axis: int
    t: int


def _step(binding: relax.VarBinding, values: dict) -> _Step | None:
    add = _call(binding.value, values, "add")
    if add is None or not isinstance(binding.var, relax.DataflowVar):
        return None
    for product, addend in (add.args, reversed(add.args)):
        multiply, b = _call(product, values, "multiply"), slice_at_constant(addend, values)
        if multiply is None or b is None:
            continue
        for factor, previous in (multiply.args, reversed(multiply.args)):
            a = slice_at_constant(factor, values)
            if a is None or (a.axis, a.index) != (b.axis, b.index) or static_shape(a.tensor) != static_shape(b.tensor):
                continue
            # The state keeps its shape and type step to step: no broadcast or cast hides in the chain.
            if static_shape(previous) == static_shape(binding.var) == static_shape(factor) == static_shape(addend) \
                    and len({str(x.ty.dtype) for x in (previous, factor, addend, binding.var)}) == 1:  # fmt: skip
                return _Step(binding.var, previous, a.tensor, b.tensor, a.axis, a.index)
    return None


def _chains(func: relax.Function) -> list[list[_Step]]:
    """Each complete chain of steps: t = 0, 1, ... through the whole axis, each step reading
    the state the one before wrote and the same two tensors."""
    values = relax.analysis.get_var2val(func)
    steps = [s for block in func.body.blocks for b in block.bindings
             if isinstance(b, relax.VarBinding) and (s := _step(b, values)) is not None]  # fmt: skip
    after = {step.previous: step for step in steps if isinstance(step.previous, relax.Var)}
    chains = []
    for first in (step for step in steps if step.t == 0):
        chain = [first]
        while (nxt := after.get(chain[-1].state)) is not None and nxt.t == len(chain) \
                and nxt.a.same_as(first.a) and nxt.b.same_as(first.b) and nxt.axis == first.axis:  # fmt: skip
            chain.append(nxt)
        if len(chain) == static_shape(first.a)[first.axis] > 1:
            chains.append(chain)
    return chains


# The PrimFunc attribute marking a scan kernel, so that a build for the GPU can swap in the
# GPU's form (``recurrences.scan_kernels_for_the_gpu``): simplification does not know the target.
SCAN_ATTR = "collage.linear_recurrence"
# CUDA threads a block, one (p, q) lane each.
_GPU_LANES = 256


def scan_kernel(outer: int, length: int, inner: int, dtype: str, gpu: bool = False) -> tvm.tirx.PrimFunc:
    """``h[p, t, q] = a[p, t, q] * h[p, t - 1, q] + b[p, t, q]`` from ``h0[p, q]``: the steps
    in order along t; on the CPU parallel over p and vectorized over q, on the GPU a thread
    for each (p, q)."""
    shape, attrs = (outer, length, inner), {"tir.noalias": True, "tirx.is_scheduled": True, SCAN_ATTR: True}
    lanes = outer * inner

    @T.prim_func(private=True)
    def on_the_cpu(a: T.Buffer(shape, dtype), b: T.Buffer(shape, dtype), h0: T.Buffer((outer, inner), dtype),
                   h: T.Buffer(shape, dtype)):  # fmt: skip
        T.func_attr(attrs)
        for p in T.parallel(outer):
            for q in T.vectorized(inner):
                h[p, 0, q] = a[p, 0, q] * h0[p, q] + b[p, 0, q]
            for t in range(1, length):
                for q in T.vectorized(inner):
                    h[p, t, q] = a[p, t, q] * h[p, t - 1, q] + b[p, t, q]

    @T.prim_func(private=True)
    def on_the_gpu(a: T.Buffer(shape, dtype), b: T.Buffer(shape, dtype), h0: T.Buffer((outer, inner), dtype),
                   h: T.Buffer(shape, dtype)):  # fmt: skip
        T.func_attr(attrs)
        for block in T.thread_binding((lanes + _GPU_LANES - 1) // _GPU_LANES, thread="blockIdx.x"):
            for thread in T.thread_binding(_GPU_LANES, thread="threadIdx.x"):
                lane = block * _GPU_LANES + thread
                if lane < lanes:
                    p = lane // inner
                    q = lane % inner
                    h[p, 0, q] = a[p, 0, q] * h0[p, q] + b[p, 0, q]
                    for t in range(1, length):
                        h[p, t, q] = a[p, t, q] * h[p, t - 1, q] + b[p, t, q]

    return on_the_gpu if gpu else on_the_cpu


def is_scan_kernel(func) -> bool:
    """Whether ``func`` (a module function, or None) is a scan kernel ``scan_kernel`` wrote."""
    return isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and SCAN_ATTR in func.attrs


@mutator
class _Scanned(PyExprMutator):
    """A function with each chain's states read from one scan: the kernel emitted where the
    chain's first step was, each step bound to its slice of the kernel's output."""

    def __init__(self, mod: tvm.IRModule, chains: list[list[_Step]]):
        super().__init__(mod)
        self.first = {chain[0].state: chain for chain in chains}
        self.slice_of = {step.state: (chain[0].state, step.t, step.axis) for chain in chains for step in chain}
        self.scans: dict[relax.Var, relax.Var] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.first:
            self.scans[binding.var] = self._scan(self.first[binding.var])
        if binding.var not in self.slice_of:
            return super().visit_var_binding_(binding)
        first, t, axis = self.slice_of[binding.var]
        state = self.builder_.emit(relax.op.take(self.scans[first], relax.const(t, "int64"), axis=axis),
                                   name_hint=binding.var.name)  # fmt: skip
        self.set_var_remap(binding.var, state)
        return None

    def _scan(self, chain: list[_Step]) -> relax.Var:
        first = chain[0]
        shape, dtype = static_shape(first.a), str(first.a.ty.dtype)
        outer = math.prod(shape[: first.axis])
        inner = math.prod(shape[first.axis + 1 :])
        length = shape[first.axis]
        kernel = self.builder_.add_func(scan_kernel(outer, length, inner, dtype), "linear_recurrence")
        emit = self.builder_.emit
        a = emit(relax.op.reshape(self.visit_expr(first.a), (outer, length, inner)))
        b = emit(relax.op.reshape(self.visit_expr(first.b), (outer, length, inner)))
        h0 = emit(relax.op.reshape(self.visit_expr(first.previous), (outer, inner)))
        states = emit(relax.call_tir(kernel, [a, b, h0], relax.TensorType((outer, length, inner), dtype)))
        return emit(relax.op.reshape(states, shape))


class LinearRecurrenceAsScan:
    """The simplification step rolling each chain into a scan kernel."""

    name = "linear_recurrence_as_scan"

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        return rewritten(mod, {gvar: chains for gvar, func in relax_functions(mod) if (chains := _chains(func))}, _Scanned)


def rewritten(mod: tvm.IRModule, found: dict, rewriter) -> tuple[tvm.IRModule, int]:
    """``mod`` with each function of ``found`` (its global -> the loops found in it) visited by
    ``rewriter`` (made of ``mod`` and every loop), what no longer is read dropped; and how many
    loops were rolled up."""
    if not found:
        return mod, 0
    visitor = rewriter(mod, [loop for loops in found.values() for loop in loops])
    for gvar in found:
        visitor.builder_.update_func(gvar, relax.analysis.remove_all_unused(visitor.visit_expr(mod[gvar])))
    return visitor.builder_.get(), sum(len(loops) for loops in found.values())


LINEAR_RECURRENCE_AS_SCAN = LinearRecurrenceAsScan()


# ------------------------------------------------------------------ stacked steps


def _op_name(call: relax.Call) -> str:
    return call.op.name.removeprefix("relax.") if isinstance(call.op, tvm.ir.Op) else ""


# A loop's step is a handful of operators. Two steps that still differ this deep are two
# branches of a model (two towers concatenated), not a loop: comparing them further is waste.
_MAX_STEP_DEPTH = 32


class _Unrolled:
    """The steps of one stack checked against its first, ``e0``: which of ``e0``'s
    sub-expressions vary with the step (``varying``), and which of those are a slice at the
    step's index (``indexed``, each t-th step reading index ``first + t``)."""

    def __init__(self, values: dict):
        self.values = values
        self.varying: dict[relax.Expr, bool] = {}
        self.indexed: dict[relax.Expr, _Slice] = {}
        self.agreed: dict[tuple, bool] = {}  # (x0, xt) -> agree's answer: branches rejoin

    def agree(self, x0: relax.Expr, xt: relax.Expr, t: int, depth: int = 0) -> bool:
        """Whether ``xt``, of step ``t`` (from 1), is ``x0`` of step 0 at the next index."""
        if (x0, xt) not in self.agreed:
            self.agreed[(x0, xt)] = depth < _MAX_STEP_DEPTH and self._agree(x0, xt, t, depth)
        return self.agreed[(x0, xt)]

    def _agree(self, x0: relax.Expr, xt: relax.Expr, t: int, depth: int) -> bool:
        shared = x0.same_as(xt) or (not isinstance(x0, (relax.Var, relax.Call)) and tvm_ffi.structural_equal(x0, xt))
        seen = self.varying.get(x0)
        if seen is False or (seen is None and shared):
            self.varying[x0] = False
            return shared  # the same value in every step: the loop reads it as it is
        self.varying[x0] = True
        s0, st = slice_at_constant(x0, self.values), slice_at_constant(xt, self.values)
        if s0 is not None and st is not None and s0.tensor.same_as(st.tensor) and s0.axis == st.axis \
                and st.index == s0.index + t:  # fmt: skip
            self.indexed[x0] = s0
            return True
        c0, ct = self.values.get(x0, x0), self.values.get(xt, xt)
        return (isinstance(c0, relax.Call) and isinstance(ct, relax.Call) and c0.op.same_as(ct.op)
                and len(c0.args) == len(ct.args) and x0 not in self.indexed
                and tvm_ffi.structural_equal(c0.attrs, ct.attrs)
                and all(self.agree(a0, at, t, depth + 1) for a0, at in zip(c0.args, ct.args)))  # fmt: skip


class _NotBatched(Exception):
    """An operator of the step this module does not know how to batch."""


_ELEMENT_WISE = {
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "where", "exp", "log", "sqrt",
    "rsqrt", "tanh", "sigmoid", "negative", "abs", "erf", "astype", "clip", "nn.silu", "nn.gelu", "nn.relu",
}  # fmt: skip
_REDUCTIONS = {"sum", "mean", "max", "min", "prod"}


def _rank(expr: relax.Expr) -> int:
    return len(static_shape(expr))


class _Batched:
    """``e0``'s expression on all ``steps`` at once, the step axis in front of every value
    that varies."""

    def __init__(self, unrolled: _Unrolled, steps: int):
        self.unrolled, self.steps = unrolled, steps
        self.done: dict[relax.Expr, relax.Expr] = {}
        self.is_batched: dict[relax.Expr, bool] = {}

    def batched(self, x0: relax.Expr) -> bool:
        """Whether ``x0`` reads a step's slice, however deep. A sub-expression the steps
        compute alike but not from one binding (no common-subexpression pass ran) differs
        between steps without varying with them."""
        if x0 not in self.is_batched:
            call = self.unrolled.values.get(x0)
            self.is_batched[x0] = x0 in self.unrolled.indexed or (
                self.unrolled.varying.get(x0, False) and isinstance(call, relax.Call)
                and any(self.batched(arg) for arg in call.args))  # fmt: skip
        return self.is_batched[x0]

    def of(self, x0: relax.Expr) -> relax.Expr:
        if not self.batched(x0):
            return x0
        if x0 not in self.done:
            self.done[x0] = self._indexed(self.unrolled.indexed[x0]) if x0 in self.unrolled.indexed else self._call(x0)
        return self.done[x0]

    def _indexed(self, s: _Slice) -> relax.Expr:
        shape = static_shape(s.tensor)
        whole = s.tensor
        if (s.index, self.steps) != (0, shape[s.axis]):
            whole = relax.op.strided_slice(whole, [s.axis], [s.index], [s.index + self.steps])
        if s.axis == 0:
            return whole
        return relax.op.permute_dims(whole, [s.axis, *(a for a in range(len(shape)) if a != s.axis)])

    def _padded(self, x0: relax.Expr, rank: int) -> relax.Expr:
        """``x0`` batched, with unit axes after the step axis up to ``rank`` per step: how a
        step broadcasts a lower-rank value, which must not meet the step axis."""
        if not self.batched(x0):
            if isinstance(x0.ty, relax.TensorType) and _rank(x0) > rank:
                raise _NotBatched("an invariant operand of higher rank than the step's")
            return x0
        own = _rank(x0)
        batched = self.of(x0)
        return batched if own == rank else relax.op.expand_dims(batched, list(range(1, 1 + rank - own)))

    def _call(self, x0: relax.Expr) -> relax.Expr:
        call = self.unrolled.values.get(x0)
        if not isinstance(call, relax.Call) or static_shape(x0) is None:
            raise _NotBatched("not an operator on tensors of known shape")
        name, args, attrs = _op_name(call), call.args, call.attrs
        rank = _rank(x0)
        if name in _ELEMENT_WISE:
            return relax.Call(call.op, [self._padded(a, rank) if isinstance(a.ty, relax.TensorType) else a
                                        for a in args], attrs)  # fmt: skip
        if name == "matmul":
            if min(_rank(args[0]), _rank(args[1])) < 2:
                raise _NotBatched("a matrix-vector product")
            return relax.op.matmul(self._padded(args[0], rank), self._padded(args[1], rank), attrs.out_dtype)
        if any(self.batched(a) for a in args[1:]):
            raise _NotBatched(f"{name} of a varying index or shape")
        x, inner = self.of(args[0]), _rank(args[0])
        if name == "take":
            return relax.op.take(x, args[1], axis=int(attrs.axis) % inner + 1, mode=attrs.mode)
        if name == "expand_dims":
            return relax.op.expand_dims(x, [int(a) % rank + 1 for a in attrs.axis])
        if name == "squeeze" and attrs.axis is not None:
            return relax.op.squeeze(x, [int(a) % inner + 1 for a in attrs.axis])
        if name == "permute_dims":
            axes = reversed(range(inner)) if attrs.axes is None else [int(a) for a in attrs.axes]
            return relax.op.permute_dims(x, [0, *(a + 1 for a in axes)])
        if name == "reshape":
            return relax.op.reshape(x, [self.steps, *static_shape(x0)])
        if name in _REDUCTIONS and attrs.axis is not None:
            return getattr(relax.op, name)(x, [int(a) % inner + 1 for a in attrs.axis], attrs.keepdims)
        raise _NotBatched(name)


def _stacked_steps(value: relax.Expr, values: dict) -> relax.Expr | None:
    """``value``, a concat of the steps' outputs, as the steps' expression batched, or None.
    torch stacks them either way: a concat of their ``expand_dims`` on the new axis, or a
    concat on an axis they have (reshaped after, to split it)."""
    concat = _call(value, values, "concat")
    if concat is None or not isinstance(concat.args[0], relax.Tuple) or len(concat.args[0].fields) < 2:
        return None
    out_shape = static_shape(concat)
    axis = int(concat.attrs.axis) % len(out_shape)
    fields = list(concat.args[0].fields)
    expands = [_call(field, values, "expand_dims") for field in fields]
    stacked = all(e is not None and [int(a) % len(out_shape) for a in e.attrs.axis] == [axis] for e in expands)
    steps = [e.args[0] for e in expands] if stacked else fields
    if static_shape(steps[0]) is None:
        return None
    unrolled = _Unrolled(values)
    if not all(unrolled.agree(steps[0], step, t) for t, step in enumerate(steps[1:], start=1)):
        return None
    batching = _Batched(unrolled, len(steps))
    if not batching.batched(steps[0]):
        return None
    try:
        batched = batching.of(steps[0])
    except _NotBatched:
        return None
    rank = len(static_shape(steps[0]))
    if axis:  # the step axis, in front, goes where the concat put the steps
        batched = relax.op.permute_dims(batched, [*range(1, axis + 1), 0, *range(axis + 1, rank + 1)])
    return batched if stacked else relax.op.reshape(batched, out_shape)


# ------------------------------------------------------------------ slices written in turn


def _written_position(cond: relax.Expr, out_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(axis, index) where a constant mask of ``where`` is true exactly on one index of one
    axis of ``out_shape`` (how torch.export writes ``out[:, t] = x``), or None."""
    if not isinstance(cond, tvm.ir.GenericConst) or str(cond.ty.dtype) != "bool":
        return None
    mask = cond.value.numpy()
    if mask.ndim != len(out_shape):
        return None
    try:
        mask = np.broadcast_to(mask, out_shape)
    except ValueError:
        return None
    for axis, size in enumerate(out_shape):
        hit = np.moveaxis(mask, axis, 0).reshape(size, -1)
        rows = hit.any(axis=1)
        if size > 1 and rows.sum() == 1 and hit[rows].all():
            return axis, int(np.argmax(rows))
    return None


def _written_slices(value: relax.Expr, values: dict) -> relax.Expr | None:
    """``value``, the last of a chain of ``where``s each writing one index of one axis (the
    rest from the one before), as the concat of what was written at each index, when every
    index was; else None."""
    out_shape = static_shape(value)
    out_shape = None if out_shape is None else tuple(out_shape)
    written: dict[int, relax.Expr] = {}
    axis = None
    while (where := _call(value, values, "where")) is not None and out_shape is not None:
        at = _written_position(where.args[0], out_shape)
        x = where.args[1]
        if at is None or (axis is not None and at[0] != axis) or static_shape(x) is None:
            break
        axis = at[0]
        if len(static_shape(x)) != len(out_shape) or static_shape(x)[axis] != 1:
            break
        written.setdefault(at[1], x)  # a later write wins
        value = where.args[2]
    if axis is None or len(written) != out_shape[axis]:
        return None
    piece = (*out_shape[:axis], 1, *out_shape[axis + 1 :])
    fields = [x if tuple(static_shape(x)) == piece else relax.op.broadcast_to(x, piece)
              for x in (written[index] for index in range(out_shape[axis]))]  # fmt: skip
    return relax.op.concat(fields, axis)


def _given_back_its_axis(x: relax.Expr, values: dict, axis: int) -> _Slice | None:
    """The slice ``x`` is with its axis given back (``expand_dims(take(t, i, axis), axis)``),
    else None."""
    expand = _call(x, values, "expand_dims")
    if expand is None or [int(a) % len(static_shape(x)) for a in expand.attrs.axis] != [axis]:
        return None
    taken = slice_at_constant(expand.args[0], values)
    return taken if taken is not None and taken.axis == axis else None


def _joined_slices(value: relax.Expr, values: dict) -> relax.Expr | None:
    """``value``, a concat, with each run of fields that are slices of one tensor at
    consecutive indices of the concat's axis (each given back that axis) as one slice of
    it: a recurrence kernel's outputs, written in turn (``_written_slices``); else None."""
    concat = _call(value, values, "concat")
    if concat is None or not isinstance(concat.args[0], relax.Tuple):
        return None
    axis = int(concat.attrs.axis) % len(static_shape(value))
    fields: list = []  # a field as it is, or [tensor, first index, last index] of slices in turn
    for x in concat.args[0].fields:
        taken = _given_back_its_axis(x, values, axis) if static_shape(x) is not None else None
        if taken is None:
            fields.append(x)
        elif fields and isinstance(fields[-1], list) and fields[-1][0].same_as(taken.tensor) \
                and fields[-1][2] + 1 == taken.index:  # fmt: skip
            fields[-1][2] = taken.index
        else:
            fields.append([taken.tensor, taken.index, taken.index])
    if len(fields) == len(concat.args[0].fields):
        return None
    fields = [relax.op.strided_slice(f[0], [axis], [f[1]], [f[2] + 1]) if isinstance(f, list) else f for f in fields]
    return fields[0] if len(fields) == 1 else relax.op.concat(fields, axis)


class _Replaced:
    """A simplification step binding each variable ``replacement`` gives a value for to it."""

    def __init__(self, name: str, replacement):
        self.name, self.replacement = name, replacement

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        rewritten_mod, total = mod, 0
        for gvar, func in relax_functions(mod):
            values = relax.analysis.get_var2val(func)
            replacements = {b.var: r for block in func.body.blocks for b in block.bindings
                            if isinstance(b, relax.VarBinding) and (r := self.replacement(b.var, values)) is not None}  # fmt: skip
            if replacements:
                if total == 0:
                    rewritten_mod = mod.clone()
                rewritten_mod[gvar] = relax.analysis.remove_all_unused(Rebound(replacements).visit_expr(func))
                total += len(replacements)
        return rewritten_mod, total


# A stack of unrolled steps as one batched expression.
STACKED_STEPS_BATCHED = _Replaced("stacked_steps_batched", _stacked_steps)
# A chain of one-index writes (``out[:, t] = x`` in a loop) as one concat of what was written.
WRITTEN_SLICES_STACKED = _Replaced("written_slices_stacked", _written_slices)
# Slices at consecutive indices, concatenated, as one slice.
CONSECUTIVE_SLICES_JOINED = _Replaced("consecutive_slices_joined", _joined_slices)
