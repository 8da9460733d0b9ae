"""Constant sources that FoldConstant cannot start from.

FoldConstant evaluates a call once all of its tensor operands are constants; ``arange``
has no tensor operands, so a chain that starts at one (BERT's position ids and attention
mask) is never folded. Materializing the ``arange`` lets FoldConstant fold the rest.
``index_tensor`` takes its indices as a tuple, which FoldConstant does not look into: a
transformer's attention mask indexed out of constants stayed a run-time computation.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

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


_indexed, _index_tuple = is_const(), wildcard()
_index_tensor = is_op("relax.index_tensor")(_indexed, _index_tuple)


def _fold_index_tensor(matches: Matches, single_use: set) -> relax.Expr | None:
    indices = matches[_index_tuple]
    if not isinstance(indices, relax.Tuple) or not all(isinstance(i, tvm.ir.GenericConst) for i in indices.fields):
        return None
    data = matches[_indexed].value.numpy()
    # index_tensor is numpy's (and torch's) advanced indexing of the leading axes.
    result = data[tuple(i.value.numpy() for i in indices.fields)]
    return relax.const(np.ascontiguousarray(result), str(data.dtype))


# transformers' attention masks: a constant mask indexed by constant position ids.
FOLD_INDEX_TENSOR = PatternRewrite("fold_index_tensor", _index_tensor, _fold_index_tensor)
