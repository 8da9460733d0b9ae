"""Operations that return their input unchanged: ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``,
``broadcast_to`` a tensor's own shape and a pad of no widths (exporters write one where a
padding computes to zero). Each is replaced by ``x``.

An identity qualifies only when the result has exactly ``x``'s type: adding zeros of a
larger shape broadcasts ``x``, and that is not a no-op.
"""

from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .pattern_rewrite import Matches, PatternRewrite


def _same_type(a: relax.Expr, b: relax.Expr) -> bool:
    return tvm_ffi.structural_equal(a.ty, b.ty)


def _neutral_element(name: str, op: str, inverse_op: str, neutral: float) -> PatternRewrite:
    """``op(x, c)``, ``op(c, x)`` or ``inverse_op(x, c)``, every element of ``c`` ``neutral``."""
    x, c = wildcard(), is_const()
    # The dpl matcher tries both argument orders of add and multiply by itself.
    pattern: DFPattern = is_op(op)(x, c) | is_op(inverse_op)(x, c)

    def replace(matches: Matches, single_use: set) -> relax.Expr | None:
        is_neutral = np.all(matches[c].value.numpy() == neutral)
        return matches[x] if is_neutral and _same_type(matches[pattern], matches[x]) else None

    return PatternRewrite(name, pattern, replace)


ADD_ZERO = _neutral_element("add_zero", "relax.add", "relax.subtract", 0.0)
MULTIPLY_ONE = _neutral_element("multiply_one", "relax.multiply", "relax.divide", 1.0)


_broadcast_input = wildcard()
_broadcast = is_op("relax.broadcast_to")(_broadcast_input, wildcard())


def _broadcast_to_own_shape(matches: Matches, single_use: set) -> relax.Expr | None:
    data = matches[_broadcast_input]
    return data if _same_type(matches[_broadcast], data) else None


BROADCAST_TO_SAME_SHAPE = PatternRewrite(
    "broadcast_to_same_shape", _broadcast, _broadcast_to_own_shape
)


_padded = wildcard()
_pad = is_op("relax.nn.pad")(_padded)


def _pad_of_nothing(matches: Matches, single_use: set) -> relax.Expr | None:
    widths = [int(w) for w in matches[_pad].attrs.pad_width]
    return matches[_padded] if not any(widths) else None


PAD_OF_NOTHING = PatternRewrite("pad_of_nothing", _pad, _pad_of_nothing)
