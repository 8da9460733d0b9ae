"""Compiling and calling: a module built by TVM's default pipeline (on CUDA with TVM's CUDA
graphs where every library kernel allows them), TVM's reference result of a sub-graph, a
backend's kernel compiled without ever raising (``compile_kernel``: a reason instead), run
on preallocated outputs and checked against TVM (``check_candidate``).

Backend tests and the measurer share these, so "matches TVM's result" means one thing:
seeded random inputs of the function's types, TVM's default pipeline for the reference,
outputs preallocated for a kernel that writes them in place.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..candidates.backend import Backend, cuda_graph_blocker
from ..candidates.precision import FLOAT32, precision_argument
from ..errors import first_line
from ..model.simplify.recurrences import scan_kernels_for_the_gpu
from .arrays import empty_outputs, mismatch, numpy_outputs, random_inputs, static_shape, to_tensors
from .fast_math import with_fast_math
from .parallel_loops import with_parallel_loops
from .pipeline import relax_pipeline


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


# References are run once and only compared: LLVM's optimizations are most of the compile
# time and none of the answer (EfficientNet's whole graph: 1.96 s to compile at the default
# level, 0.50 s unoptimized; the same outputs to the bit).
REFERENCE_TARGET = {"kind": "llvm", "opt-level": 0}


def reference_vm(mod: tvm.IRModule, target=REFERENCE_TARGET) -> relax.VirtualMachine:
    """``mod`` compiled by TVM's default CPU pipeline, unoptimized by LLVM
    (``REFERENCE_TARGET``) unless another CPU ``target`` is given; for another, a heavy
    model's (``values_target``), with its loops on every core (``parallel_loops``: the same
    values, in a fraction of the time). A light model runs serially in less time than
    scheduling its loops takes."""
    if target != REFERENCE_TARGET:
        mod = with_parallel_loops(mod, tvm.target.Target(target))
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
    values = run_reference(whole.extract(outputs=tensors), [arrays[p] for p in whole.arguments()], values_target(graph))
    return {**arrays, **{graph[i].var: value for i, value in zip(tensors, values)}}


# A model's values are computed once per optimization, before any candidate can be measured:
# unoptimized, LLVM's loops run large convolutions six times slower (ResNet-50's: 11.0 s at
# opt-level 0 against 1.8 s optimized, compiled in 0.4 s against 0.9, on a Zen 5). Below about
# this many multiply-adds the compile is what counts, and opt-level 0 stays the cheaper.
OPTIMIZED_VALUES_MACS = 5e8

# The operators whose multiply-adds ``multiply_adds`` counts: each output element takes the
# product of the weight's dimensions past the first (convolutions) or the reduced axis (matmul).
_CONVOLUTIONS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"})


def values_target(graph) -> dict | str:
    """The CPU target that computes all of ``graph``'s values soonest: LLVM unoptimized, or
    optimized where its convolutions and products are heavy (``OPTIMIZED_VALUES_MACS``)."""
    return REFERENCE_TARGET if multiply_adds(graph) < OPTIMIZED_VALUES_MACS else "llvm"


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


def run_kernel(kernel, func: relax.Function, arrays: list[np.ndarray], device=None) -> list[np.ndarray]:
    """Call a backend kernel destination-passing style and return its outputs."""
    outputs = empty_outputs(func, device)
    kernel(*to_tensors(arrays, device), *outputs)
    return [o.numpy() for o in outputs]


def check_candidate(backend, func: relax.Function, pattern: str, target: str = "llvm", seed: int = 0,
                    threads: int = 0, reference=run_reference) -> str | None:
    """Compile ``func`` on ``backend``, run it on seeded random inputs and compare with TVM.

    Returns None when the kernel matches, else one line saying why it does not: the library
    cannot run it (``Unsupported``), compiling or running failed, or the values differ. A
    failing candidate is excluded with this reason; it never raises. ``reference(func,
    arrays)`` gives TVM's result: a caller checking several
    backends on the same sub-graphs may pass one that remembers it.
    """
    kernel, reason = compile_kernel(backend, func, pattern, target, threads)
    if reason is not None:
        return reason
    arrays = random_inputs(func, seed)
    try:
        actual = run_kernel(kernel, func, arrays, device_for(target))
    except Exception as err:
        return f"run failed: {type(err).__name__}: {first_line(err)}"
    return mismatch(actual, reference(func, arrays))


def compile_kernel(backend, func: relax.Function, pattern: str, target: str, threads: int, alone: bool = False,
                   precision: str = FLOAT32, beside_spinning: bool = False):
    """``(kernel, None)``, or ``(None, why not)``: the library cannot run here, rejects the
    sub-graph (``Unsupported``), or fails compiling it. Never raises. The kernel runs on
    ``threads`` threads (0: the library's default), in ``precision`` (a reduced one is passed
    as ``precision=``; ``Backend.precisions``). ``alone`` compiles an
    inference engine's kernel with its users' settings (``Backend.compile_onnx``), for a
    partition that nothing of another library runs beside; ``beside_spinning``, for one
    beside a library whose threads spin after its calls (``Backend.spins_after_calls``)."""
    from ..candidates.onnx_convert import to_onnx

    if (alone or beside_spinning) and backend.compile_onnx is not None:
        return compile_onnx_kernel(backend, to_onnx(func), target, threads, alone, precision, beside_spinning)
    return _compiled(backend, target, lambda: backend.compile(func, pattern, target, threads, **precision_argument(precision)))


def compile_onnx_kernel(backend, model, target: str, threads: int, alone: bool = True, precision: str = FLOAT32,
                        beside_spinning: bool = False):
    """An inference engine's kernel for an ONNX model, as ``compile_kernel`` returns one."""
    settings = {"alone": alone} | precision_argument(precision) | ({"beside_spinning": True} if beside_spinning else {})
    return _compiled(backend, target, lambda: backend.compile_onnx(model, target, threads, **settings))


def compile_program_kernel(backend, program, main: relax.Function, target: str, threads: int, precision: str = FLOAT32,
                           module=None):  # fmt: skip
    """An engine's kernel compiling the user's PyTorch ``module`` (or its ``program``) whole in
    place of ``main`` (``Backend.compile_program``), as ``compile_kernel`` returns one."""
    reduced = precision_argument(precision)
    return _compiled(backend, target,
                     lambda: backend.compile_program(program, main, target, threads, module=module, **reduced))


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


# TVM's PassContext switch for its RewriteCUDAGraph pass: the static regions of a module (runs
# of kernels whose buffers keep their addresses between calls, library kernels called by
# call_dps_packed included) are recorded once as CUDA graphs and replayed.
USE_CUDA_GRAPH = "relax.backend.use_cuda_graph"


def build_vm(mod: tvm.IRModule, target: str = "llvm", kernels: Mapping[str, Backend] | None = None) -> relax.VirtualMachine:
    """``mod`` built by TVM's default pipeline for ``target`` (``compile_module``), on the Relax VM."""
    return relax.VirtualMachine(compile_module(mod, target, kernels), device_for(target))


def compile_module(mod: tvm.IRModule, target="llvm", kernels: Mapping[str, Backend] | None = None):
    """``mod`` compiled by TVM's default pipeline for ``target`` (``tvm_compile``). For CUDA,
    with CUDA graphs unless ``module_cuda_graph_blocker`` says why not: ``kernels`` names the
    backend of each library kernel ``mod`` calls (``kernel_backends``), and only graph-safe
    ones may be captured. With them, inputs and results are copied (``staged_at_the_edges``),
    so that every kernel is in the graph. On the CPU, beside a library whose threads spin
    after its calls (``Backend.spins_after_calls``), TVM's kernels stay on one thread
    (``tvm_compile``'s ``parallel``)."""
    if not is_cuda(target):
        return tvm_compile(mod, target, parallel=not any(b.spins_after_calls for b in (kernels or {}).values()))
    if module_cuda_graph_blocker(mod, kernels) is not None:
        return tvm_compile(mod, target)
    mod = staged_at_the_edges(mod)
    outer = tvm.transform.PassContext.current()  # keep what a caller set; add the switch
    with tvm.transform.PassContext(opt_level=outer.opt_level, required_pass=list(outer.required_pass),
                                   disabled_pass=list(outer.disabled_pass),
                                   config={**dict(outer.config), USE_CUDA_GRAPH: True}):  # fmt: skip
        return tvm_compile(mod, target)


def staged_at_the_edges(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every tensor an entry function takes copied before anything reads it, and
    every tensor it returns copied after its last kernel, each by a TVM kernel of its own.

    TVM's RewriteCUDAGraph captures a kernel only when each buffer it touches keeps its
    address from call to call. A parameter is the caller's buffer and a result a fresh one
    each call, so the kernels reading parameters or writing results stay out of the graph,
    launched from the host on every call, and one in the middle (an attention mask every
    layer reads) splits the graph. When such a kernel is a library's, that launch is Python:
    on a lent H200, ResNet-50's op-level placement ran its first partition (cuDNN's stem
    convolution, its bias and ReLU: three PyTorch calls) and its last (cuBLAS's classifier)
    so on every call, the device idle 0.17 ms of each call's 2.26 under torch's profiler, and
    an inductor partition there would launch each of its kernels from the host. With the
    copies every other kernel is captured; a copy costs a launch and microseconds (ResNet-50's
    input is 0.6 MB)."""
    from tvm import topi

    bb = relax.BlockBuilder(mod)

    def copied(expr, ty, bindings: list) -> relax.Expr:
        if isinstance(ty, relax.TupleType):
            fields = expr.fields if isinstance(expr, relax.Tuple) else [relax.TupleGetItem(expr, i)
                                                                         for i in range(len(ty.fields))]  # fmt: skip
            return relax.Tuple([copied(f, t, bindings) for f, t in zip(fields, ty.fields)])
        if not isinstance(ty, relax.TensorType) or not _static(ty):
            return expr
        if not isinstance(expr, relax.Var):  # a tuple's field: named first, as a call's argument must be
            field, expr = expr, relax.Var("field", ty)
            bindings.append(relax.VarBinding(expr, field))
        var = relax.Var("staged", ty)
        bindings.append(relax.VarBinding(var, bb.normalize(bb.call_te(topi.identity, expr))))
        return var

    for gvar, func in mod.functions_items():
        if not (isinstance(func, relax.Function) and func.attrs and "global_symbol" in func.attrs):
            continue
        params = [relax.Var(p.name, p.ty) for p in func.params]
        # Outside any dataflow block, where TVM would rewrite a copy into a view of its input.
        first: list = []
        for old, new in zip(func.params, params):
            value = copied(new, new.ty, first)
            first.append(relax.VarBinding(old, value))  # the body reads the copy under the parameter's name
        last: list = []
        result = copied(func.body.body, func.ret_ty, last)
        body = relax.SeqExpr([relax.BindingBlock(first), *func.body.blocks, relax.BindingBlock(last)], result)
        bb.update_func(gvar, relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs))
    return relax.transform.Normalize()(bb.get())


def _static(ty: relax.TensorType) -> bool:
    try:
        static_shape(ty)
        return True
    except ValueError:
        return False


def tvm_compile(mod: tvm.IRModule, target, parallel: bool = True):
    """``tvm.compile`` of ``mod`` for ``target`` with TVM's own pipeline for the target, each
    function collage marked ``Primitive`` one fused kernel (``pipeline.relax_pipeline``). On
    the CPU, for this machine's own CPU (``host_target``), float32 transcendentals as loops
    LLVM vectorizes (``fast_math``), element-wise kernels on every core unless not
    ``parallel``; for CUDA, each power of a small whole exponent first written as
    multiplications (``powers_as_multiplies``), and each scan kernel simplification wrote
    (``loops``) in its GPU form."""
    if is_cuda(target):
        target = tvm.target.Target(target)
        mod = scan_kernels_for_the_gpu(powers_as_multiplies(mod))
        return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline(target))
    target = host_target(target)
    mod = with_fast_math(mod)
    try:
        lowered = relax_pipeline(target, parallel)(mod)
    except tvm.error.InternalError:
        # A group FuseTIR still refuses (it refused every group calling the scan kernel until
        # ``pipeline.unfusable_groups_ungrouped``): TVM's target-agnostic pipeline fuses
        # nothing and builds it, a kernel per operator, as collage did before it fused on the CPU.
        return tvm.compile(mod, target=target)
    # Code generation apart: an error of LLVM's would fail the unfused build too, paid twice.
    return tvm.compile(lowered, target=target, relax_pipeline=None)


def host_target(target) -> tvm.target.Target:
    """A CPU ``target`` for this machine's CPU where it names none (``host_cpu``). TVM's plain
    ``llvm`` is x86-64's baseline: SSE2, no AVX, no AVX-512, so no loop of TVM's used more
    than a quarter of a Zen 4's vector width (``exp`` of 256K float32 values: 0.72 ms so,
    0.084 ms for ``x86-64-v4`` with ``fast_math``). Code is built where it runs: each worker
    compiles what it measures, a server of a fleet what it races, ``load_placement`` what it
    loads; only an export carries this CPU's code (``deploying.exported``)."""
    given = tvm.target.Target(target)
    if given.kind.name != "llvm" or "mcpu" in given.attrs:
        return given
    return tvm.target.Target({**dict(given.attrs), "kind": "llvm", "mcpu": host_cpu()})


# x86-64's microarchitecture levels, highest first, with the instruction sets each requires.
X86_LEVELS = (
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    ("x86-64-v3", ("avx2", "fma", "bmi", "bmi2", "f16c", "lzcnt", "movbe")),
    ("x86-64-v2", ("sse4.2", "popcnt", "ssse3", "cx16")),
)


@functools.cache
def host_cpu() -> str:
    """What TVM's CPU code is built for here: the highest x86-64 level this machine's CPU
    reaches, elsewhere LLVM's name of the CPU. A level, not the name: LLVM tuned for
    ``znver4`` took 21 s to build and load the transformer encoder's candidates, 12 s for
    ``x86-64-v4`` (the same instructions, generic tuning) and 12 for the baseline, for
    kernels 10-20% faster (2-core Zen 4)."""
    name = tvm.target.codegen.llvm_get_system_cpu()
    host = tvm.target.Target({"kind": "llvm", "mcpu": name})
    for level, features in X86_LEVELS:
        if tvm.target.codegen.llvm_cpu_has_features(list(features), host):
            return level
    return name


# Up to this exponent a power is written as multiplications for CUDA; above it stays a power.
LARGEST_WHOLE_POWER = 4


def powers_as_multiplies(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``power(x, n)`` for a whole ``n`` from 2 to ``LARGEST_WHOLE_POWER`` as
    ``x * x ...``: exact, and cheaper. TVM compiles CUDA with nvcc's ``--use_fast_math``,
    whose ``powf`` is ``exp2(n * log2(x))``: NaN for every negative ``x``, whatever ``n`` (TVM
    warns of it when it lowers a power of 3 or more). GPT-2's GELU (``0.044715 * x ** 3``) and
    the variance of Llama's and T5's RMSNorm (``x ** 2``) put NaN in every output. Done here,
    where TVM builds for CUDA, not to the model: the engines' fusions (ONNX Runtime's RMSNorm
    and ReduceL2) match the power as exporters write it."""
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    base, exponent = wildcard(), is_const()
    power = is_op("relax.power")(base, exponent)

    def multiplied(call: relax.Call, matches) -> relax.Expr:
        x, n = matches[base], matches[exponent].value.numpy()
        if n.size == 0 or np.any(n != n.flat[0]) or not tvm_ffi.structural_equal(call.ty, x.ty):
            return call  # exponents that differ, or ones that broadcast or cast x
        n = float(n.flat[0])
        if n != int(n) or not 2 <= n <= LARGEST_WHOLE_POWER:
            return call
        product = x
        for _ in range(int(n) - 1):
            product = relax.op.multiply(product, x)
        return product

    rewritten = mod.clone()
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewritten[gvar] = rewrite_call(power, multiplied, func)
    return rewritten


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

