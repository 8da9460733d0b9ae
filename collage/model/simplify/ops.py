"""Counting operators: the one definition of "op count" that every report and test uses."""

from collections import Counter

import tvm
from tvm import relax


def _calls(mod: tvm.IRModule, func_name: str):
    for block in mod[func_name].body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call):
                yield binding.value


def op_count(mod: tvm.IRModule, func_name: str = "main") -> int:
    """Number of bindings in ``func_name`` whose value is an operator call.

    Tuples, TupleGetItem, constants and variable aliases are not operators: they cost
    nothing at run time, so a rewrite that only moves them around removes no ops.
    """
    return sum(1 for _ in _calls(mod, func_name))


def op_histogram(mod: tvm.IRModule, func_name: str = "main") -> Counter:
    """Operator calls in ``func_name`` by operator name, e.g. ``{"relax.nn.conv2d": 53}``."""
    return Counter(
        call.op.name if isinstance(call.op, tvm.ir.Op) else str(call.op)
        for call in _calls(mod, func_name)
    )


def binding_count(mod: tvm.IRModule, func_name: str = "main") -> int:
    """Number of bindings of any kind in ``func_name``."""
    return sum(len(block.bindings) for block in mod[func_name].body.blocks)


def literal(value) -> int | float | None:
    """The number a literal argument holds (an IntImm or FloatImm: arange's bounds, clip's),
    or None when it is not one."""
    if isinstance(value, tvm.tirx.IntImm):
        return int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    return None


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The static shape of ``expr``; None when some extent is symbolic or the rank unknown."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        return None
    values = [literal(v) for v in shape.values]
    return None if None in values else values
