"""Constant sources that FoldConstant cannot start from, and the one fold it is slow at.

FoldConstant evaluates a call once all of its tensor operands are constants; ``arange``
has no tensor operands, so a chain that starts at one (BERT's position ids and attention
mask) is never folded. Materializing the ``arange`` lets FoldConstant fold the rest.
``index_tensor`` takes its indices as a tuple, which FoldConstant does not look into: a
transformer's attention mask indexed out of constants stayed a run-time computation.
FoldConstant folds a transpose of a constant by compiling and running a TVM kernel for it:
a linear layer's weight, as PyTorch's exporters write it, is transposed before its matmul,
and ViT-B's 72 took 3.3 s of its simplification. NumPy transposes them in milliseconds.
FoldConstant leaves a cast of a bfloat16 constant (TVM builds no bfloat16 kernel for the CPU
here): RecurrentGemma's ``sqrt(hidden)`` normalizer, made in bfloat16 and cast to float32,
stayed an ``astype`` of bfloat16 that no engine's conversion takes, and it kept ONNX Runtime
and OpenVINO from the whole model. NumPy (with ml_dtypes) casts it exactly.
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


_cast_constant = is_const()
_astype_constant = is_op("relax.astype")(_cast_constant)


def _fold_astype(matches: Matches, single_use: set) -> relax.Expr | None:
    import ml_dtypes  # TVM's own dependency: NumPy's bfloat16

    data = matches[_cast_constant].value.numpy()
    dtype = str(matches[_astype_constant].attrs.dtype)
    target = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if "bfloat16" not in (str(data.dtype), dtype) or target.kind not in "fV" or data.dtype.kind not in "fiubV":
        return None  # FoldConstant folds the rest; a float to an integer is cast as TVM casts it there
    return relax.const(data.astype(target), dtype)


FOLD_BFLOAT16_CASTS = PatternRewrite("fold_bfloat16_casts", _astype_constant, _fold_astype)
