"""Constant sources that FoldConstant cannot start from, and the one fold it is slow at.

FoldConstant evaluates a call once all of its tensor operands are constants; ``arange``
has no tensor operands, so a chain that starts at one (BERT's position ids and attention
mask) is never folded. Materializing the ``arange`` lets FoldConstant fold the rest.
``index_tensor`` takes its indices as a tuple, which FoldConstant does not look into: a
transformer's attention mask indexed out of constants stayed a run-time computation.
FoldConstant folds a transpose of a constant by compiling and running a TVM kernel for it:
a linear layer's weight, as PyTorch's exporters write it, is transposed before its matmul,
and ViT-B's 72 took 3.3 s of its simplification. NumPy transposes them in milliseconds.
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


_transposed = is_const()
_permute_constant = is_op("relax.permute_dims")(_transposed)


def _fold_permute_dims(matches: Matches, single_use: set) -> relax.Expr | None:
    axes = matches[_permute_constant].attrs.axes
    data = matches[_transposed].value.numpy()
    result = np.transpose(data, None if axes is None else [int(a) for a in axes])  # None: reversed, as numpy
    return relax.const(np.ascontiguousarray(result), str(data.dtype))


FOLD_PERMUTE_DIMS = PatternRewrite("fold_permute_dims", _permute_constant, _fold_permute_dims)
