"""The arrays a measurement feeds a kernel and compares its results with: seeded random
inputs of a function's types, tensors on a device and back, and one meaning of "matches
TVM's result" (``mismatch``; ``relative_error`` for a reduced precision's own error)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

# float32 results of different kernels for the same sub-graph agree to ~1e-5 relative;
# the tolerance leaves room for reassociated sums in large reductions (GEMM, conv).
RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
# End to end, rounding differences of the kernels add up along the model: the check allows
# ten times one operator's tolerance (the zoo's measured error is under a quarter of it).
END_TO_END_RTOL = 1e-3


def tolerance(dtype: str, ops: int = 1) -> float:
    """How far another backend's result for a sub-graph with ``ops`` operators on its longest
    path may be from TVM's, relative to the largest value: ``RTOL`` for one operator, growing
    with the square root of the count as independent rounding differences add up (a random
    walk), to at most ``END_TO_END_RTOL``, what the whole assembled model is held to. At one
    operator's 1e-4, ONNX Runtime and OpenVINO on HGNetV2 whole (1.2e-4 from TVM, which is
    itself 5.6e-4 from torch) were refused, and only mixes of their regions were left to race."""
    base = RTOL.get(dtype, 1e-4)
    return max(base, min(END_TO_END_RTOL, base * math.sqrt(max(ops, 1))))


class Reference(NamedTuple):
    """Inputs with the unoptimized model's outputs on them: what every module built from the
    model is checked against, traveling as one value."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def param_types(func: relax.Function) -> list[relax.TensorType]:
    return [p.ty for p in func.params]


def output_types(func: relax.Function) -> list[relax.TensorType]:
    """The tensor types a kernel for ``func`` writes, in order (a tuple return is flattened)."""
    ret = func.ret_ty
    return list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]


def static_shape(ty: relax.TensorType) -> tuple[int, ...]:
    if ty.shape is None:
        raise ValueError(f"dynamic shapes are not supported: {ty}")
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:
        raise ValueError(f"symbolic shape {ty} is not supported; bind shapes first") from None


# Where a parameter feeds an operator with a restricted domain, inputs are drawn inside it, so
# checks compare numbers rather than NaN (log of a normal sample is NaN half the time).
POSITIVE = frozenset({"relax.log", "relax.sqrt", "relax.rsqrt", "relax.log2", "relax.log10", "relax.log1p", "relax.power"})

UNIT_INTERVAL = frozenset({"relax.asin", "relax.acos", "relax.atanh"})

AT_LEAST_ONE = frozenset({"relax.acosh"})


def random_inputs(func: relax.Function, seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs matching ``func``'s parameters: normal floats (positive, within (-1, 1) or
    at least 1 where the parameter feeds an operator defined only there), small non-negative
    ints (valid indices for gathers and embeddings), booleans."""
    rng = np.random.default_rng(seed)
    consumers = _direct_consumers(func)
    return [random_array(rng, static_shape(p.ty), str(p.ty.dtype), consumers.get(p, set())) for p in func.params]


def random_array(rng: np.random.Generator, shape, dtype: str, consumers=frozenset()) -> np.ndarray:
    """One input of ``random_inputs``: ``consumers`` names the operators it feeds, which
    decide the domain of a float input."""
    if dtype.startswith("float"):
        x = rng.standard_normal(shape)
        if consumers & UNIT_INTERVAL:
            x = np.tanh(x) * 0.95
        elif consumers & POSITIVE:
            x = np.abs(x) + 0.1
        elif consumers & AT_LEAST_ONE:
            x = np.abs(x) + 1.0
        return np.asarray(x).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 8, shape).astype(dtype)


def _direct_consumers(func: relax.Function) -> dict[relax.Var, set[str]]:
    """The names of the operators each parameter is a direct argument of."""
    params = set(func.params)
    found: dict[relax.Var, set[str]] = {}
    body = func.body
    for block in body.blocks if isinstance(body, relax.SeqExpr) else ():
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                for arg in value.args:
                    if isinstance(arg, relax.Var) and arg in params:
                        found.setdefault(arg, set()).add(value.op.name)
    return found


def empty_outputs(func: relax.Function, device=None) -> list[tvm.runtime.Tensor]:
    device = device or tvm.cpu()
    return [
        tvm.runtime.empty(static_shape(ty), str(ty.dtype), device) for ty in output_types(func)
    ]


def to_tensors(arrays, device=None) -> list[tvm.runtime.Tensor]:
    return [tvm.runtime.tensor(a, device or tvm.cpu()) for a in arrays]


def to_numpy(result):
    """A VM result as numpy: one array, or a tuple (of tuples) of them, as ``main`` returns."""
    if isinstance(result, tvm.runtime.Tensor):
        return result.numpy()
    return tuple(to_numpy(r) for r in result)


def numpy_outputs(result) -> list[np.ndarray]:
    """A VM result as a flat list of numpy arrays, in order (``to_numpy`` keeps its tuples)."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [array for r in result for array in numpy_outputs(r)]


# An error as large as the largest output itself: no accuracy budget accepts it. A reduced
# precision is checked against this where its error is held to the budget later, by whoever
# knows the budget (``Measurer``: a logged measurement serves every budget).
GROSS_FAULT = 1.0


def relative_error(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """The largest, over the outputs, of max |actual - expected| over the largest finite
    magnitude of that expected output: the metric of an accuracy budget (``Config.accuracy``).
    NaN where a value is NaN or infinite and the reference's is not."""
    errors = []
    for a, e in zip(actual, expected):
        if e.dtype.kind != "f":
            errors.append(0.0 if np.array_equal(a, e) else np.inf)
            continue
        a64, e64 = a.astype("float64"), e.astype("float64")
        err, scale = _max_diff_and_scale(a64, e64, np.isfinite(e64))
        errors.append(err / scale)
    return float(np.max(errors, initial=0.0))  # np.max keeps a NaN


def _max_diff_and_scale(a64: np.ndarray, e64: np.ndarray, finite: np.ndarray) -> tuple[float, float]:
    """max |actual - expected| where the expected value is finite, and the largest finite
    magnitude expected (at least 1e-6): the two sides of every float comparison here."""
    err = float(np.abs(a64[finite] - e64[finite]).max(initial=0.0))
    return err, max(float(np.abs(e64[finite]).max(initial=0.0)), 1e-6)


def mismatch(actual: list[np.ndarray], expected: list[np.ndarray], rtol: float | None = None,
             ops: int = 1) -> str | None:
    """Why ``actual`` disagrees with ``expected`` (shape, dtype or values), or None. Values
    may differ by ``rtol`` (default: per dtype, ``tolerance`` of a sub-graph of ``ops``
    operators) times the largest finite expected value. NaN and infinities are compared position by position: NaN where the reference has
    NaN is right (log of a negative input, a causal mask of -inf), as is the same infinity."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}"
        if e.dtype.kind == "f":
            tol = rtol if rtol is not None else tolerance(str(e.dtype), ops)
            a64, e64 = a.astype("float64"), e.astype("float64")
            finite = np.isfinite(e64)
            special = ~finite & ~((np.isnan(a64) & np.isnan(e64)) | (a64 == e64))
            if special.any():
                return f"output {k}: {int(special.sum())} value(s) differ where the reference is NaN or infinite"
            err, scale = _max_diff_and_scale(a64, e64, finite)
            if not err <= tol * scale:  # also catches NaN where the reference is finite
                return f"output {k}: max |diff| {err:.3g} exceeds {tol} x max |expected| {scale:.3g}"
        elif not np.array_equal(a, e):
            return f"output {k}: {int((a != e).sum())} of {e.size} values differ"
    return None

