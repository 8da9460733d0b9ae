"""Running one extracted sub-graph function: on TVM as the reference, or as a backend kernel.

Backend tests and the measurer share these, so "matches TVM's result" means one thing:
seeded random inputs of the function's types, TVM's default pipeline for the reference,
outputs preallocated for a kernel that writes them in place.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tvm
from tvm import relax

from ..candidates.backend import Backend, cuda_graph_blocker
from ..candidates.precision import FLOAT32

# float32 results of different kernels for the same sub-graph agree to ~1e-5 relative;
# the tolerance leaves room for reassociated sums in large reductions (GEMM, conv).
RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def as_module(func: relax.Function) -> tvm.IRModule:
    """``func`` as the ``main`` of a module, with the functions it calls (``SubGraph.extract``
    carries them in an attribute) beside it."""
    from ..model.graph import CALLEES_ATTR

    callees = func.attrs.get(CALLEES_ATTR) if func.attrs else None
    if not callees:
        return tvm.IRModule({"main": func})
    return module_with_callees(func.without_attr(CALLEES_ATTR), callees)


def module_with_callees(main: relax.Function, callees) -> tvm.IRModule:
    """A module of ``main`` and the functions it calls, keyed by the very GlobalVars its calls
    hold (so that ``call_tir`` still finds its PrimFunc)."""
    mod = tvm.IRModule(dict(callees.items()))
    mod["main"] = main
    return mod


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


# References are run once and only compared: LLVM's optimizations are most of the compile
# time and none of the answer (EfficientNet's whole graph: 1.96 s to compile at the default
# level, 0.50 s unoptimized; the same outputs to the bit).
REFERENCE_TARGET = {"kind": "llvm", "opt-level": 0}


def reference_vm(mod: tvm.IRModule, target=REFERENCE_TARGET) -> relax.VirtualMachine:
    """``mod`` compiled by TVM's default CPU pipeline, unoptimized by LLVM (``REFERENCE_TARGET``)
    unless another CPU ``target`` is given."""
    return relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target(target)), tvm.cpu())


def run_reference(func: relax.Function, arrays: list[np.ndarray], target=REFERENCE_TARGET) -> list[np.ndarray]:
    """``func``'s outputs on ``arrays`` from its ``reference_vm`` (for ``target``), as numpy arrays."""
    return numpy_outputs(reference_vm(as_module(func), target)["main"](*to_tensors(arrays)))


# Above this, a model's intermediate values are not all kept (``intermediate_values``).
MAX_VALUES_BYTES = 2 << 30


def intermediate_values(graph, seed: int = 0) -> dict[relax.Expr, np.ndarray] | None:
    """Every tensor ``graph`` computes on its seeded inputs, by node var, and those inputs
    by parameter: one TVM run of the whole graph, unoptimized by LLVM unless its convolutions
    and products are heavy (``OPTIMIZED_VALUES_MACS``). A sub-graph's inputs and
    reference outputs are read off it, instead of compiling a reference per sub-graph (a
    large one takes a second). None where they would not fit in ``MAX_VALUES_BYTES`` or a
    shape is not static."""
    from ..candidates.subgraph import SubGraph

    tensors = tuple(node.index for node in graph if isinstance(node.ty, relax.TensorType))
    try:
        if not tensors or sum(_bytes(graph[i].ty) for i in tensors) > MAX_VALUES_BYTES:
            return None
        arrays = dict(zip(graph.func.params, random_inputs(graph.func, seed)))
    except ValueError:  # a symbolic shape
        return None
    whole = SubGraph(graph, frozenset(range(len(graph))))
    target = REFERENCE_TARGET if multiply_adds(graph) < OPTIMIZED_VALUES_MACS else "llvm"
    values = run_reference(whole.extract(outputs=tensors), [arrays[p] for p in whole.arguments()], target)
    return {**arrays, **{graph[i].var: value for i, value in zip(tensors, values)}}


# A model's values are computed once per optimization, before any candidate can be measured:
# unoptimized, LLVM's loops run large convolutions six times slower (ResNet-50's: 11.0 s at
# opt-level 0 against 1.8 s optimized, compiled in 0.4 s against 0.9, on a Zen 5). Below about
# this many multiply-adds the compile is what counts, and opt-level 0 stays the cheaper.
OPTIMIZED_VALUES_MACS = 5e8
# The operators whose multiply-adds ``multiply_adds`` counts: each output element takes the
# product of the weight's dimensions past the first (convolutions) or the reduced axis (matmul).
_CONVOLUTIONS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"})


def multiply_adds(graph) -> float:
    """Roughly how many multiply-adds one run of ``graph`` takes: its convolutions' and
    matrix products' (what decides how long an unoptimized run takes)."""
    total = 0.0
    for node in graph:
        if node.op not in _CONVOLUTIONS and node.op != "relax.matmul":
            continue
        try:
            out = np.prod(static_shape(node.ty), dtype=np.float64)
            operand = static_shape(node.call.args[1 if node.op in _CONVOLUTIONS else 0].ty)
        except (ValueError, TypeError, AttributeError):
            continue
        total += out * (np.prod(operand[1:], dtype=np.float64) if node.op in _CONVOLUTIONS else operand[-1])
    return total


def _bytes(ty: relax.TensorType) -> int:
    return int(np.prod(static_shape(ty), dtype=np.int64)) * np.dtype(str(ty.dtype)).itemsize


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


def run_kernel(kernel, func: relax.Function, arrays: list[np.ndarray], device=None) -> list[np.ndarray]:
    """Call a backend kernel destination-passing style and return its outputs."""
    outputs = empty_outputs(func, device)
    kernel(*to_tensors(arrays, device), *outputs)
    return [o.numpy() for o in outputs]


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


def mismatch(actual: list[np.ndarray], expected: list[np.ndarray], rtol: float | None = None) -> str | None:
    """Why ``actual`` disagrees with ``expected`` (shape, dtype or values), or None. Values
    may differ by ``rtol`` (default: per dtype, ``RTOL``) times the largest finite expected
    value. NaN and infinities are compared position by position: NaN where the reference has
    NaN is right (log of a negative input, a causal mask of -inf), as is the same infinity."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}"
        if e.dtype.kind == "f":
            tol = rtol if rtol is not None else RTOL.get(str(e.dtype), 1e-4)
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


def check_candidate(backend, func: relax.Function, pattern: str, target: str = "llvm", seed: int = 0,
                    threads: int = 0) -> str | None:
    """Compile ``func`` on ``backend``, run it on seeded random inputs and compare with TVM.

    Returns None when the kernel matches, else one line saying why it does not: the library
    cannot run it (``Unsupported``), compiling or running failed, or the values differ. A
    failing candidate is excluded with this reason; it never raises.
    """
    kernel, reason = compile_kernel(backend, func, pattern, target, threads)
    if reason is not None:
        return reason
    arrays = random_inputs(func, seed)
    try:
        actual = run_kernel(kernel, func, arrays, device_for(target))
    except Exception as err:
        return f"run failed: {type(err).__name__}: {first_line(err)}"
    return mismatch(actual, run_reference(func, arrays))


def compile_kernel(backend, func: relax.Function, pattern: str, target: str, threads: int, alone: bool = False,
                   precision: str = FLOAT32):
    """``(kernel, None)``, or ``(None, why not)``: the library cannot run here, rejects the
    sub-graph (``Unsupported``), or fails compiling it. Never raises. The kernel runs on
    ``threads`` threads (0: the library's default), in ``precision`` (a reduced one is passed
    as ``precision=``; ``Backend.precisions``). ``alone`` compiles an
    inference engine's kernel with its users' settings (``Backend.compile_onnx``), for a
    partition that nothing of another library runs beside."""
    from ..candidates.onnx_convert import to_onnx

    reduced = {} if precision == FLOAT32 else {"precision": precision}
    if alone and backend.compile_onnx is not None:
        return _compiled(backend, target, lambda: backend.compile_onnx(to_onnx(func), target, threads, alone=True, **reduced))
    return _compiled(backend, target, lambda: backend.compile(func, pattern, target, threads, **reduced))


def compile_onnx_kernel(backend, model, target: str, threads: int, alone: bool = True, precision: str = FLOAT32):
    """An inference engine's kernel for an ONNX model, as ``compile_kernel`` returns one."""
    reduced = {} if precision == FLOAT32 else {"precision": precision}
    return _compiled(backend, target, lambda: backend.compile_onnx(model, target, threads, alone=alone, **reduced))


def _compiled(backend, target: str, build):
    from ..candidates.backend import Unsupported

    reason = backend.unavailable_reason(target)
    if reason is not None:
        return None, reason
    try:
        return build(), None
    except Unsupported as err:
        return None, f"unsupported: {err}"
    except Exception as err:  # a library's own compile error: exclude the candidate, keep going
        return None, f"compile failed: {type(err).__name__}: {first_line(err)}"


# TVM's PassContext switch for its RewriteCUDAGraph pass: the static regions of a module (every
# kernel between the first that reads an input and the last that writes an output, library
# kernels called by call_dps_packed included) are recorded once as CUDA graphs and replayed.
USE_CUDA_GRAPH = "relax.backend.use_cuda_graph"


def build_vm(mod: tvm.IRModule, target: str = "llvm", kernels: Mapping[str, Backend] | None = None) -> relax.VirtualMachine:
    """``mod`` built by TVM's default pipeline for ``target`` (``compile_module``), on the Relax VM."""
    return relax.VirtualMachine(compile_module(mod, target, kernels), device_for(target))


def compile_module(mod: tvm.IRModule, target="llvm", kernels: Mapping[str, Backend] | None = None):
    """``mod`` compiled by TVM's default pipeline for ``target``. For CUDA, with CUDA graphs
    unless ``module_cuda_graph_blocker`` says why not: ``kernels`` names the backend of each
    library kernel ``mod`` calls (``kernel_backends``), and only graph-safe ones may be
    captured."""
    if not is_cuda(target) or module_cuda_graph_blocker(mod, kernels) is not None:
        return tvm.compile(mod, target=target)
    outer = tvm.transform.PassContext.current()  # keep what a caller set; add the switch
    with tvm.transform.PassContext(opt_level=outer.opt_level, required_pass=list(outer.required_pass),
                                   disabled_pass=list(outer.disabled_pass),
                                   config={**dict(outer.config), USE_CUDA_GRAPH: True}):  # fmt: skip
        return tvm.compile(mod, target=target)


def module_cuda_graph_blocker(mod: tvm.IRModule, kernels: Mapping[str, Backend] | None = None) -> str | None:
    """Why ``mod`` cannot run as CUDA graphs, in one line, or None. TVM's pass captures every
    function a module calls outside TVM (an ``ExternFunc``: a library kernel under
    ``call_dps_packed``) with no way to leave one out, so each must be the kernel of a
    graph-safe backend (``kernels``: backend by registered name; ``cuda_graph_blocker``)."""
    kernels = kernels or {}
    called = sorted(extern_functions(mod))
    unknown = [name for name in called if name not in kernels]
    if unknown:
        return f"it calls {unknown[0]!r}, which no backend declares graph-safe"
    return cuda_graph_blocker(kernels[name] for name in called)


def extern_functions(mod: tvm.IRModule) -> set[str]:
    """The functions outside TVM that ``mod``'s Relax functions call, by global symbol (TVM's
    own ``vm.builtin`` helpers, which its pass never captures, left out)."""
    found: set[str] = set()

    def visit(expr):
        if isinstance(expr, relax.ExternFunc) and not expr.global_symbol.startswith("vm.builtin"):
            found.add(str(expr.global_symbol))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def kernel_backends(assembly, backends) -> dict[str, Backend]:
    """The backend of each library kernel an ``Assembly`` calls, by the name it is registered
    under: what ``compile_module`` asks to decide on CUDA graphs."""
    return {name: backends[part.backend] for part, name, _ in assembly.kernels}


def is_cuda(target) -> bool:
    """Whether ``target`` (a name such as "cuda", a JSON dict or a ``tvm.target.Target``) is CUDA."""
    if isinstance(target, str):
        return target == "cuda"
    return tvm.target.Target(target).kind.name == "cuda"


def device_for(target: str):
    """The TVM device a target runs on."""
    return tvm.cuda() if target == "cuda" else tvm.cpu()


def synchronized(call, target: str):
    """``call`` followed by waiting for ``target``'s device to finish: on a GPU a call returns
    once its kernels are queued, and a timer around it would time the queueing. TVM's and
    PyTorch's kernels share CUDA's default stream, so one wait covers both. On the CPU,
    ``call`` itself."""
    if target != "cuda":
        return call
    device = device_for(target)

    def call_and_wait():
        call()
        device.sync()

    return call_and_wait


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"
