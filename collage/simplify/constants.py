"""Constant sources that FoldConstant cannot start from.

FoldConstant evaluates a call once all of its tensor operands are constants; ``arange``
has no tensor operands, so a chain that starts at one (BERT's position ids and attention
mask) is never folded. Materializing the ``arange`` lets FoldConstant fold the rest.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .ops import literal
from .pattern_rewrite import Matches, PatternRewrite

_arange = is_op("relax.arange")(wildcard(), wildcard(), wildcard())


def _fold_arange(matches: Matches, single_use: set) -> relax.Expr | None:
    call = matches[_arange]
    start, end, step = (literal(arg) for arg in call.args)
    if None in (start, end, step):
        return None  # a symbolic bound: the length is not known before run time
    dtype = str(call.ty.dtype)
    return relax.const(np.arange(start, end, step, dtype=dtype), dtype)


FOLD_ARANGE = PatternRewrite("fold_arange", _arange, _fold_arange)
