"""Transposes (``permute_dims``) that cancel, chain, or can be paid for once instead of twice.

Relax's ``matmul`` has no transpose flags, so a transposed operand cannot be absorbed into
it; a transposed *constant* operand is pre-transposed by FoldConstant instead. What is left
to rewrite here is transposes meeting each other.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .pattern_rewrite import Matches, PatternRewrite


def _axes(permute: relax.Call) -> list[int] | None:
    """The permutation of a ``permute_dims`` call; None when its rank is unknown."""
    ndim = permute.args[0].ty.ndim
    if ndim < 0:
        return None
    if permute.attrs.axes is None:  # no axes: reverse them all
        return list(reversed(range(ndim)))
    return [int(axis) % ndim for axis in permute.attrs.axes]


def _is_identity(axes: list[int] | None) -> bool:
    return axes is not None and axes == list(range(len(axes)))


def _swaps_last_two(axes: list[int] | None) -> bool:
    if axes is None or len(axes) < 2:
        return False
    return axes == list(range(len(axes) - 2)) + [len(axes) - 1, len(axes) - 2]


# --------------------------------------------------------------------------- identity_permute_dims

_input = wildcard()
_permute = is_op("relax.permute_dims")(_input)


def _identity_permute(matches: Matches, single_use: set) -> relax.Expr | None:
    return matches[_input] if _is_identity(_axes(matches[_permute])) else None


IDENTITY_PERMUTE_DIMS = PatternRewrite("identity_permute_dims", _permute, _identity_permute)

# --------------------------------------------------------------------------- compose_permute_dims

_outer = is_op("relax.permute_dims")(_permute)


def _compose_permutes(matches: Matches, single_use: set) -> relax.Expr | None:
    inner, outer = _axes(matches[_permute]), _axes(matches[_outer])
    if inner is None or outer is None:
        return None
    # Output axis i of the outer transpose is axis outer[i] of the inner result, which is
    # axis inner[outer[i]] of the input.
    composed = [inner[axis] for axis in outer]
    if _is_identity(composed):
        return matches[_input]  # a transpose and its inverse
    if matches[_permute] not in single_use:
        return None  # the inner transpose stays for its other reader: nothing saved
    return relax.op.permute_dims(matches[_input], composed)


COMPOSE_PERMUTE_DIMS = PatternRewrite("compose_permute_dims", _outer, _compose_permutes)

# --------------------------------------------------------------------------- matmul_of_transposes

_lhs, _rhs = wildcard(), wildcard()
_lhs_t, _rhs_t = is_op("relax.permute_dims")(_lhs), is_op("relax.permute_dims")(_rhs)
_matmul = is_op("relax.matmul")(_lhs_t, _rhs_t)


def _matmul_of_transposes(matches: Matches, single_use: set) -> relax.Expr | None:
    """``matmul(a^T, b^T)`` is ``matmul(b, a)^T``: one transpose instead of two."""
    lhs_t, rhs_t = matches[_lhs_t], matches[_rhs_t]
    if not (_swaps_last_two(_axes(lhs_t)) and _swaps_last_two(_axes(rhs_t))):
        return None
    if lhs_t not in single_use or rhs_t not in single_use:
        return None  # a transpose with another reader stays, and nothing is saved
    matmul = matches[_matmul]
    product = relax.Call(matmul.op, [matches[_rhs], matches[_lhs]], matmul.attrs)
    ndim = matmul.ty.ndim
    return relax.op.permute_dims(product, list(range(ndim - 2)) + [ndim - 1, ndim - 2])


MATMUL_OF_TRANSPOSES = PatternRewrite("matmul_of_transposes", _matmul, _matmul_of_transposes)
