"""TVM's transcendental operators on the CPU as loops LLVM vectorizes.

TVM lowers ``exp``, ``erf``, ``tanh``, ``sigmoid``, ``sin`` and ``cos`` for LLVM to its
intrinsics, which LLVM has no vector form of without a vector math library: each element is
a call of libm's scalar function. On a 2-core Zen 4 with AVX-512, over 256K float32 values,
TVM took 2.2 ms for ``sin`` where ``torch.compile``'s loop (SLEEF's vector functions) took
0.08, 0.72 ms for ``exp`` against 0.11, 4.5 ms for ``erf`` (so GELU) against 0.13, 0.74 ms
for ``sigmoid`` (so SiLU) against 0.14: DAC's Snake activations (``x + sin(a x)^2 / a``)
alone cost TVM 7.6 ms of a model ``torch.compile`` runs in 12.

TVM's own answer is ``relax.transform.FastMathTransform``: TOPI's polynomial ``fast_exp``,
``fast_erf`` and ``fast_tanh``, within a few float32 ulps. Here the same functions legalize
those operators and the ones TVM writes with them (``sigmoid``, ``silu``, ``gelu``,
``gelu_tanh``, ``softmax``), and ``sin`` and ``cos`` get a polynomial of their own (below).
Only float32 is rewritten; other types keep TVM's lowering. The references every kernel is
checked against keep libm (``build.reference_vm``).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, topi

FLOAT32 = "float32"

# sin and cos on [-pi/4, pi/4] (Cephes' sinf and cosf): within about 1e-7 there.
SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)
# pi/2 in two float64 parts, the first of 33 bits, so that k * HIGH is exact for every
# quadrant count k under 2^20: the argument is reduced without losing bits up to |x| ~ 1.6e6,
# and beyond that float32's own spacing (0.125 at 1.6e6) is the larger error.
HALF_PI_HIGH = math.ldexp(math.floor(math.ldexp(math.pi / 2, 32)), -32)
HALF_PI_LOW = math.pi / 2 - HALF_PI_HIGH


def _polynomial(z, coefficients):
    """c0 + z (c1 + z (c2 ...)) in float32, Horner's way."""
    result = tvm.tirx.const(coefficients[-1], FLOAT32)
    for c in reversed(coefficients[:-1]):
        result = result * z + tvm.tirx.const(c, FLOAT32)
    return result


def _sine(x: te.Tensor, quarter_turns: int) -> te.Tensor:
    """sin(x + quarter_turns * pi/2), elementwise: the argument reduced in float64 to r in
    [-pi/4, pi/4] and its quadrant q, then sin(r) or cos(r) by q, signed by q. Only float
    arithmetic, floor and selects: each a vector instruction."""

    def element(*index):
        value = x(*index).astype("float64")
        k = tvm.tirx.floor(value * (2 / math.pi) + 0.5)
        r = ((value - k * HALF_PI_HIGH) - k * HALF_PI_LOW).astype(FLOAT32)
        quadrant = k + quarter_turns
        quadrant = quadrant - tvm.tirx.floor(quadrant * 0.25) * 4.0  # 0, 1, 2 or 3
        z = r * r
        sin_r = r + r * z * _polynomial(z, SIN)
        cos_r = 1.0 - 0.5 * z + z * z * _polynomial(z, COS)
        odd = tvm.tirx.any(quadrant == 1.0, quadrant == 3.0)
        negative = quadrant >= 2.0
        magnitude = tvm.tirx.Select(odd, cos_r, sin_r)
        return tvm.tirx.Select(negative, -magnitude, magnitude)

    return te.compute(x.shape, element, name="fast_sin" if quarter_turns == 0 else "fast_cos", tag="elemwise")


def _sigmoid(x: te.Tensor) -> te.Tensor:
    # fast_exp clamps its argument to float32's range, so the sum never overflows to inf.
    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def _gelu(x: te.Tensor) -> te.Tensor:
    return topi.multiply(x, topi.add(0.5, topi.multiply(topi.fast_erf(topi.multiply(x, math.sqrt(0.5))), 0.5)))


def _gelu_tanh(x: te.Tensor) -> te.Tensor:
    inner = topi.multiply(math.sqrt(2 / math.pi), topi.add(x, topi.multiply(0.044715, topi.multiply(x, topi.multiply(x, x)))))
    return topi.multiply(topi.multiply(0.5, x), topi.add(1.0, topi.fast_tanh(inner)))


# Relax operator -> the TE function of its one tensor argument computing it vectorized.
ELEMENTWISE = {
    "relax.exp": topi.fast_exp,
    "relax.erf": topi.fast_erf,
    "relax.tanh": topi.fast_tanh,
    "relax.sigmoid": _sigmoid,
    "relax.nn.silu": lambda x: topi.multiply(x, _sigmoid(x)),
    "relax.nn.gelu": _gelu,
    "relax.nn.gelu_tanh": _gelu_tanh,
    "relax.sin": lambda x: _sine(x, 0),
    "relax.cos": lambda x: _sine(x, 1),
}


SOFTMAX = "relax.nn.softmax"  # TOPI's fast_softmax, which takes the axis as well


def _legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """``call`` as a call of its vectorizable TE function, or None to keep it as it is."""
    name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
    if (name not in ELEMENTWISE and name != SOFTMAX) or call.args[0].ty.dtype != FLOAT32:
        return None
    hint = name.split(".")[-1]
    if name == SOFTMAX:
        return bb.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis), primfunc_name_hint=hint)
    return bb.call_te(ELEMENTWISE[name], call.args[0], primfunc_name_hint=hint)


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        fast = _legalize(self.builder_, call)
        return call if fast is None else fast


def with_fast_math(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its float32 transcendental operators (``ELEMENTWISE``, and softmax as
    TOPI's ``fast_softmax``) legalized to vectorizable loops, as TVM's FastMathTransform
    does for three of them; ``tvm.compile`` legalizes the rest as it would have."""
    mutator = _FastMath(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
