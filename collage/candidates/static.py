"""What a converter reads off a Relax call, static or refused: a tensor's dtype and shape,
numbers and tuples of integers given as arguments. Shared by the ONNX and torch.fx
conversions (``onnx_convert``, ``fx_convert``), which raise ``Unsupported`` for anything
they cannot write down ahead of time: an unknown or symbolic shape, a dtype they lack."""

from __future__ import annotations

from tvm import relax

from .backend import Unsupported


def dtype_of(ty) -> str:
    return str(ty.dtype)


def static_shape(ty) -> tuple[int, ...]:
    """``ty``'s shape as integers; Unsupported when unknown or symbolic."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise Unsupported(f"a tensor of unknown shape ({ty}) has no static shape")
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:
        raise Unsupported(f"symbolic shape {ty} is not supported") from None


def check_type(ty, dtypes: tuple[str, ...]) -> None:
    """Unsupported unless ``ty`` is a tensor of one of ``dtypes`` with a static shape, or a
    tuple of such; shapes and prim values (attributes given as arguments) pass."""
    if isinstance(ty, relax.TupleType):
        for field in ty.fields:
            check_type(field, dtypes)
    elif isinstance(ty, relax.TensorType):
        if dtype_of(ty) not in dtypes:
            raise Unsupported(f"dtype {dtype_of(ty)} is not supported (supported: {', '.join(dtypes)})")
        static_shape(ty)


def ints(values) -> list[int]:
    return [int(v) for v in values]


def number(expr):
    """The value of a static scalar argument (an IntImm or FloatImm: clip's bounds, arange's)."""
    if isinstance(getattr(expr, "value", None), (int, float)):
        return expr.value
    raise Unsupported(f"argument {expr} is not a static number")


def static_ints(expr) -> list[int]:
    """A static tuple of integers given as an argument (strided_slice's bounds)."""
    if not isinstance(expr, relax.Tuple):
        raise Unsupported(f"argument {expr} is not a static tuple of integers")
    return [int(number(item)) for item in expr.fields]
