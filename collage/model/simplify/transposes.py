"""Transposes (``permute_dims``) that cancel, chain, or can be paid for once instead of twice.

Relax's ``matmul`` has no transpose flags, so a transposed operand cannot be absorbed into
it; a transposed *constant* operand is pre-transposed by FoldConstant instead. What is left
to rewrite here is transposes meeting each other.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .ops import static_shape
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

# --------------------------------------------------------------------------- permute_dims_of_unit_axes


# Transposes of up to this many axes are the engines' fast ones, and the ones their fusions
# recognise (a matmul's transposed operand, attention's heads): rewritten with reshapes around
# them, SegFormer's 4-d head transposes ran 3% slower in OpenVINO; past it, OpenVINO runs a
# generic transpose (below).
FAST_TRANSPOSE_RANK = 4


def _permute_dims_of_unit_axes(matches: Matches, single_use: set) -> relax.Expr | None:
    """A transpose that also moves axes of length one is a transpose of the other axes,
    between reshapes (views, which cost nothing); where those others keep their order, a
    reshape alone. Where the unit axes keep their places, or the transpose has at most
    ``FAST_TRANSPOSE_RANK`` axes, it is left as it is. PyTorch exports an einsum as 5-d
    transposes with unit axes around a batched matmul (Funnel's relative attention:
    [4, 64, 1, 1, 256] to [1, 64, 4, 256, 1]), which OpenVINO's generic transpose ran at 4x
    the time of the same move in fewer axes: 0.52 of Funnel's 1.87 ms, against 0.14 for
    torch's own ONNX export of the einsums."""
    permute = matches[_permute]
    axes, shape, out = _axes(permute), static_shape(matches[_input]), static_shape(permute)
    if axes is None or shape is None or out is None or 1 not in shape or len(shape) <= FAST_TRANSPOSE_RANK:
        return None
    kept = [axis for axis in range(len(shape)) if shape[axis] != 1]
    moved = [kept.index(axis) for axis in axes if shape[axis] != 1]
    if _is_identity(moved):
        return relax.op.reshape(matches[_input], out)
    if len(kept) < 2 or [d == 1 for d in shape] == [d == 1 for d in out]:
        # Unit axes that stay where they are (a batch of one in front) cost no engine anything,
        # and reshapes around a transpose hide it from the fusions that absorb it: CvT's token
        # layouts so rewritten ran 15% slower in OpenVINO (1.94 ms against 1.69).
        return None
    squeezed = relax.op.reshape(matches[_input], [shape[axis] for axis in kept])
    return relax.op.reshape(relax.op.permute_dims(squeezed, moved), out)


PERMUTE_DIMS_OF_UNIT_AXES = PatternRewrite("permute_dims_of_unit_axes", _permute, _permute_dims_of_unit_axes)

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
