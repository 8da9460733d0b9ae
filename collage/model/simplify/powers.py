"""``power(x, n)`` for a small whole ``n`` as ``n - 1`` multiplications: ``x * x * x``.

Exact, cheaper, and the form every library runs right. TVM compiles CUDA with nvcc's
``--use_fast_math``, which makes ``powf`` ``exp2(n * log2(x))``: not a number for every
negative ``x``, whatever ``n`` (TVM warns of it when it lowers a power of 3 or more).
GPT-2's GELU (``0.044715 * x ** 3``) and the variance of Llama's and T5's RMSNorm
(``x ** 2``) then put NaN in every output on the GPU. PyTorch's inductor and ONNX Runtime
rewrite such powers the same way.
"""

from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .pattern_rewrite import Matches, PatternRewrite

LARGEST = 4  # above this a power stays a power: one kernel beats a chain of multiplications

_base, _exponent = wildcard(), is_const()
_power = is_op("relax.power")(_base, _exponent)


def _as_multiplies(matches: Matches, single_use: set) -> relax.Expr | None:
    x, exponent = matches[_base], matches[_exponent].value.numpy()
    if exponent.size == 0 or np.any(exponent != exponent.flat[0]) or not tvm_ffi.structural_equal(matches[_power].ty, x.ty):
        return None  # exponents that differ, or ones that broadcast or cast x
    n = float(exponent.flat[0])
    if n != int(n) or not 2 <= n <= LARGEST:
        return None
    product = x
    for _ in range(int(n) - 1):
        product = relax.op.multiply(product, x)
    return product


POWER_AS_MULTIPLIES = PatternRewrite("power_as_multiplies", _power, _as_multiplies)
