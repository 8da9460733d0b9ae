"""``attention_as_matmuls``: Relax's fused attention written in the operators it computes.

TVM's PyTorch importer turns ``scaled_dot_product_attention`` (what transformers runs by
default, and ``nn.MultiheadAttention`` on its fast path) into ``relax.nn.attention``, and
TVM's own ``relax.frontend.nn`` writes attention so; TVM's ONNX importer does the same for
ONNX Runtime's Attention. No engine here converts that operator, so each one was kept off
every attention and off the model whole. Written as the two matmuls, the scale, the masks
and the softmax between them (what ``_te_attention``, its legalization, computes, and what
torch's ONNX exporter writes for the same module), every engine takes it and fuses it as it
fuses that file, and the placement may split it where a library is faster.

A sliding window, and key/value heads fewer than the query's, are left fused: TVM's
legalization computes neither, so there is nothing to match.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .ops import literal, static_shape
from .pattern_rewrite import Matches, PatternRewrite

_query, _key, _value, _bias = wildcard(), wildcard(), wildcard(), wildcard()
_attention = is_op("relax.nn.attention")(_query, _key, _value) | is_op("relax.nn.attention_bias")(
    _query, _key, _value, _bias
)

_HEADS_FIRST = [0, 2, 1, 3]  # (batch, tokens, heads, size) <-> (batch, heads, tokens, size)


def causal_mask(tokens: int, tokens_kv: int, corner: str, dtype: str) -> np.ndarray:
    """The additive mask of a causal attention (tokens, tokens_kv): 0 where a query may look,
    -inf where it may not. Query i sees keys j <= i + offset, the offset 0 from the top left
    corner and, from the bottom right, the two lengths' difference, as TVM's legalization
    counts it (``trilu`` with k = |tokens - tokens_kv|)."""
    offset = {"TopLeft": 0, "BottomRight": abs(tokens - tokens_kv)}[corner]
    sees = np.tril(np.ones((tokens, tokens_kv), dtype=bool), k=offset)
    return np.where(sees, 0.0, -np.inf).astype(dtype)


def _as_matmuls(matches: Matches, single_use: set) -> relax.Expr | None:
    call = matches[_attention]
    query, key, value = matches[_query], matches[_key], matches[_value]
    shapes = [static_shape(x) for x in (query, key, value)]
    if call.attrs.window_size is not None or None in shapes or shapes[0][2] != shapes[1][2]:
        return None
    (_, tokens, _, size), (_, tokens_kv, _, _) = shapes[0], shapes[1]
    dtype = str(query.ty.dtype)
    scale = literal(call.attrs.scale) if call.attrs.scale is not None else 1.0 / math.sqrt(size)
    keys = relax.op.permute_dims(key, [0, 2, 3, 1])  # (batch, heads, size, tokens_kv)
    scores = relax.op.matmul(relax.op.permute_dims(query, _HEADS_FIRST), keys)
    scores = relax.op.multiply(scores, relax.const(scale, dtype))
    if _bias in matches:
        scores = relax.op.add(scores, matches[_bias])
    if call.attrs.causal_mask is not None:
        scores = relax.op.add(scores, relax.const(causal_mask(tokens, tokens_kv, call.attrs.causal_mask, dtype)))
    weights = relax.op.nn.softmax(scores, axis=-1)
    return relax.op.permute_dims(relax.op.matmul(weights, relax.op.permute_dims(value, _HEADS_FIRST)), _HEADS_FIRST)


ATTENTION_AS_MATMULS = PatternRewrite("attention_as_matmuls", _attention, _as_matmuls)
