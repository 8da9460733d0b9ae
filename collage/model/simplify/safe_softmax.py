"""``safe_softmax_of_finite``: torch's safe softmax as the softmax it is when no row can be
all -inf.

``torch.export`` writes the softmax of ``scaled_dot_product_attention`` as
``aten._safe_softmax``, which gives 0 instead of NaN on a row masked out entirely: the
softmax, and beside it ``x == -inf``, a ``max`` over the row, two ``not``s and a ``where``.
torch's own ONNX exporter writes a plain ``Softmax`` for the same module, and the engines fuse
attention around that: on ``nn.TransformerEncoder`` (2 layers), ONNX Runtime ran collage's
conversion 7% slower than torch's file and OpenVINO 12% slower.

Where no -inf can reach the softmax's input the two agree, and the softmax alone stays. The
analysis is a walk back through what the input is computed from: -inf may come from a
constant that is not finite and from the model's inputs (an additive attention mask given
by the user), and passes through arithmetic, products and moving data around; sigmoid, tanh,
exp, ReLU, softmax and normalizations (with finite constants) never give -inf, whatever they
read. Anything else counts as a source. An overflow of finite float32 values to -inf is not
counted, as torch's exporter and the engines' attention fusions do not count it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .ops import static_shape
from .pattern_rewrite import Matches, PatternRewrite

# Operators whose result holds -inf only where an argument does (or by float overflow).
_PASS_ALONG = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.matmul", "relax.negative", "relax.nn.linear",
    "relax.reshape", "relax.permute_dims", "relax.strided_slice", "relax.take", "relax.concat", "relax.split",
    "relax.squeeze", "relax.expand_dims", "relax.broadcast_to", "relax.astype", "relax.flatten",
    "relax.maximum", "relax.minimum", "relax.clip", "relax.sum", "relax.mean", "relax.max", "relax.min",
}  # fmt: skip
# Operators whose result never holds -inf when their constant arguments are finite.
_NEVER = {
    "relax.sigmoid", "relax.tanh", "relax.exp", "relax.nn.relu", "relax.nn.softmax", "relax.abs", "relax.sqrt",
    "relax.nn.layer_norm", "relax.nn.rms_norm", "relax.nn.group_norm", "relax.nn.gelu", "relax.nn.gelu_tanh",
    "relax.nn.silu",
}  # fmt: skip


class _Infinities:
    """Whether an infinity may reach a value of one function (memoized walk back): -inf, or
    +inf, which a product may turn into -inf."""

    def __init__(self, func: relax.Function):
        self.values = relax.analysis.get_var2val(func)
        self.memo: dict = {}

    def may_hold(self, expr: relax.Expr) -> bool:
        key = expr
        if key not in self.memo:
            self.memo[key] = True  # a cycle cannot occur in a dataflow block; this guards anyway
            self.memo[key] = self._may_hold(expr)
        return self.memo[key]

    def _may_hold(self, expr: relax.Expr) -> bool:
        if isinstance(expr, relax.Var):
            value = self.values.get(expr)
            return True if value is None else self.may_hold(value)  # a parameter: the user's values
        if isinstance(expr, tvm.ir.GenericConst):
            data = expr.value.numpy()
            return data.dtype.kind == "f" and not np.isfinite(data).all()
        if isinstance(expr, relax.Tuple):
            return any(self.may_hold(f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            return self.may_hold(expr.tuple_value)
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
            return True
        arguments = [a for a in expr.args if _holds_tensors(a.ty)]  # not shapes, axes, bounds
        if expr.op.name in _NEVER:
            return any(self.may_hold(a) for a in arguments if isinstance(a, tvm.ir.GenericConst))
        if expr.op.name in _PASS_ALONG:
            return any(self.may_hold(a) for a in arguments)
        return True


def _holds_tensors(ty) -> bool:
    if isinstance(ty, relax.TupleType):
        return all(_holds_tensors(field) for field in ty.fields)
    return isinstance(ty, relax.TensorType)


_scores, _minus_infinity, _zeros = wildcard(), is_const(), is_const()
_softmax = is_op("relax.nn.softmax")(_scores)
_finite = is_op("relax.logical_not")(is_op("relax.equal")(_scores, _minus_infinity))
_finite_int = is_op("relax.astype")(_finite) | _finite
_any_finite = is_op("relax.max")(_finite_int)
_any_finite_bool = is_op("relax.astype")(_any_finite) | _any_finite
_safe_softmax = is_op("relax.where")(is_op("relax.logical_not")(_any_finite_bool), _zeros, _softmax)


def _softmax_alone(walk: _Infinities, matches: Matches) -> relax.Expr | None:
    minus_infinity, zeros = matches[_minus_infinity].value.numpy(), matches[_zeros].value.numpy()
    softmax, row_max = matches[_softmax], matches[_any_finite]
    if minus_infinity.size != 1 or not np.isneginf(minus_infinity).all() or zeros.any():
        return None
    axes = [int(a) for a in row_max.attrs.axis] if row_max.attrs.axis is not None else None
    rank = len(softmax.ty.shape)
    if axes is None or [a % rank for a in axes] != [int(softmax.attrs.axis) % rank]:
        return None
    return softmax if _rows_keep_a_finite(walk, matches[_scores], int(softmax.attrs.axis) % rank) else None


def _rows_keep_a_finite(walk: _Infinities, scores: relax.Expr, axis: int) -> bool:
    """Whether every row of ``scores`` along ``axis`` keeps a value other than -inf: no
    -inf reaches it, or it is such a value plus a constant mask of which every row has a
    finite entry (a causal mask: the diagonal)."""
    if not walk.may_hold(scores):
        return True
    value = walk.values.get(scores) if isinstance(scores, relax.Var) else scores
    if not isinstance(value, relax.Call) or value.op != tvm.ir.Op.get("relax.add"):
        return False
    shape = static_shape(value)
    for x, mask in (value.args, value.args[::-1]):
        if isinstance(mask, tvm.ir.GenericConst) and shape is not None and not walk.may_hold(x):
            try:
                rows = np.broadcast_to(mask.value.numpy(), shape)
            except ValueError:
                return False
            return bool(np.isfinite(rows).any(axis=axis).all())
    return False


class SafeSoftmaxOfFinite:
    """The simplification step (``collage.simplify``)."""

    name = "safe_softmax_of_finite"

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        total, rewritten = 0, mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                walk = _Infinities(func)
                step = PatternRewrite(self.name, _safe_softmax, lambda matches, _: _softmax_alone(walk, matches))
                new_func, applied = step.rewrite_function(func)
                if applied:
                    rewritten[gvar], total = new_func, total + applied
        return (relax.transform.CanonicalizeBindings()(rewritten), total) if total else (mod, 0)


SAFE_SOFTMAX_OF_FINITE = SafeSoftmaxOfFinite()
