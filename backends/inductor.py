"""PyTorch's inductor (``torch.compile``): a whole-graph compiler on the GPU, in TensorRT's place,
and on the CPU the user's own module compiled whole.

A candidate becomes a ``torch.fx`` graph of ATen ops (``collage.candidates.fx_convert``),
compiled by ``torch.compile`` (inductor: Triton kernels for what it fuses, cuDNN and cuBLAS
for convolutions and matmuls). Like the ONNX engines on the CPU it optimizes across kernels,
so it offers regions only (``max_size=0``): its largest regions, their parts at single-tensor
cuts, and the whole model when every op converts ("inductor alone"). When the user hands
over a PyTorch module, ``torch.compile`` of that very module is a finalist too
(``compile_program``), as its users would call it. Compiling takes seconds per candidate;
each is compiled at ``compile`` time, with inputs of the right shapes, so no compile ever
falls inside a CUDA graph's capture.

On the CPU it offers no candidates (``candidates_on``), only the user's module compiled
whole: each candidate is seconds of C++ compile there (Mamba's whole graph 36 s on a 2-core
Zen 4), and on collage's graph its kernels were no faster than the engines' (Mamba: 3.5-3.7
ms against OpenVINO's 3.4). The user's module is another matter: transformers' Mamba takes
its associative scan only under ``torch.compile``, never when exported, and ran in 1.15 ms
against 1.75 for its exported program compiled alike (same process, 2 threads).

Compiled ahead of time: candidates go through AOTInductor, which writes a
package (``.pt2``: the generated kernels and a C++ wrapper, weights inside) that any process
loads in milliseconds. ``torch.compile`` of the same graph in a second process, even on a
hit of inductor's FX graph cache, traces it again with Dynamo and loads the cached module:
seconds per candidate, ViT's 67 candidates were 284 s of an H100 host's optimization. The
packages are kept beside inductor's own cache (the least recently used going past
``PACKAGE_CACHE_BYTES``), named by a hash of the graph, its weights, its inputs' shapes, the
precision and the device (``_package``), so the compile pool
(``measuring.warm``) builds each once and the worker measuring it, the assembled module and
an exported one loading later only load it. A bfloat16 or float16 package is exported from
the graph under ``torch.autocast`` in its ``forward`` (``_exported``): export records the
casts autocast makes, which an autocast around the call would not reach inside a package.

The kernel reads TVM's buffers through DLPack, runs on TVM's current stream and copies its
outputs into the caller's buffers there (``patterns.torch_stream``): graph-safe. Bound to
fixed buffers (``Kernel.bound``), it is recorded once as a CUDA graph and replayed.
Precision: float32 with TF32 off in cuDNN and cuBLAS, as TVM computes; with an accuracy
budget, also TF32 (tensor cores, 10-bit mantissa products), bfloat16 and float16
(``torch.autocast``).
"""

import contextlib
import copy
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tvm import relax

from collage.errors import first_line
from collage.measuring.arrays import output_types
from collage.measuring.cost import cpu_info
from collage.patterns.fusion import never_fuse

from collage.candidates.backend import GRAPH_LEVEL, Backend, installed_version
from collage.candidates.fx_convert import convertible, to_fx
from collage.candidates.pattern import PatternRule
from collage.candidates.precision import BFLOAT16, FLOAT16, FLOAT32, TF32, bf16_unavailable
from collage.candidates.static import dtype_of, static_shape

# The precisions computed under ``torch.autocast`` (named as torch names their dtypes): its
# matmuls and convolutions in them on tensor cores, the ops that need float32's range or
# accuracy (softmax, norms, sums, exp) kept in float32.
AUTOCAST = (BFLOAT16, FLOAT16)


def probe(target: str) -> str | None:
    import torch

    if target == "llvm":
        return _no_cpp_compiler()
    if importlib.util.find_spec("triton") is None:
        return "missing Python module(s): triton (inductor's GPU kernels)"
    return None if torch.cuda.is_available() else "PyTorch has no CUDA device (CPU build or no GPU)"


def _no_cpp_compiler() -> str | None:
    """Why inductor cannot compile for the CPU here (it writes C++ and compiles it with the
    compiler ``$CXX`` names, else ``g++``, as its ``config.cpp.cxx`` searches), or None.
    Looked up on the path rather than asked of inductor, whose import takes a second."""
    compiler = os.environ.get("CXX") or "g++"
    return None if shutil.which(compiler) else f"no C++ compiler ({compiler}) for inductor's CPU kernels"


def _precisions(target: str) -> tuple[str, ...]:
    """TF32, bfloat16 and float16 on the GPU's tensor cores; on the CPU bfloat16 where it is
    computed natively (AVX512_BF16, AMX), as ``torch.autocast`` computes it there."""
    if target == "cuda":
        return (TF32, *AUTOCAST)
    return () if bf16_unavailable(cpu_info()["isa"]) else (BFLOAT16,)


def _settings(precision: str, device: str):
    """The math the kernel's convolutions and matmuls run in, set around each call: PyTorch
    reads these switches when a kernel runs, not when it is compiled. On the GPU its
    convolutions take the algorithm cuDNN's benchmark finds fastest (as ``backends.cudnn``'s
    do, and for the same reason): found at the compile's first call, outside any capture,
    and kept by PyTorch for the calls a CUDA graph records on the same thread."""
    import torch

    if device == "cpu":  # no cuDNN or cuBLAS switch to set: 5 us a call, not 26 (2-core Zen 4)
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
    else:
        stack = _tf32_settings(precision, find=not torch.cuda.is_current_stream_capturing())
    if precision in AUTOCAST:
        stack.enter_context(torch.autocast(device, dtype=getattr(torch, precision)))
    return stack


def _tf32_settings(precision: str, find: bool = False):
    """TF32 on in cuDNN and cuBLAS for ``TF32``, off otherwise, no autograd, and with
    ``find`` cuDNN's benchmark on (never inside a capture, where nothing may be timed)."""
    import torch

    stack = contextlib.ExitStack()
    tf32 = precision == TF32
    stack.enter_context(torch.backends.cudnn.flags(enabled=True, benchmark=find, deterministic=False, allow_tf32=tf32))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    stack.callback(setattr, torch.backends.cuda.matmul, "allow_tf32", previous)
    stack.enter_context(torch.no_grad())
    return stack


def compile(func, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    import torch

    device = _device(target)
    module = to_fx(func, "cpu")  # weights hashed for the package's name where they are, then moved
    try:
        return _kernel(_package(module, _examples(func, device), device, precision), func, device, precision)
    except Exception as err:  # noqa: BLE001 -- no package here (a C++ toolchain or CUDA's headers missing)
        _no_package(f"{type(err).__name__}: {first_line(err)}")
    return _kernel(torch.compile(module.to(device), fullgraph=True, dynamic=False), func, device, precision)


@functools.cache
def _no_package(reason: str) -> None:
    warnings.warn(f"inductor: no AOTInductor package ({reason}); compiling with torch.compile, seconds a candidate")


def _package(module, examples: list, device: str, precision: str):
    """``module`` compiled by AOTInductor for ``device``, as a call taking its inputs and
    returning its outputs: the package on disk when one was built for the same graph, weights,
    inputs, precision and device, else built now and kept (written whole, then renamed, so a
    process never loads a half-written one)."""
    import torch
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    _remember_isa_probes()
    path = _package_dir() / f"{_package_key(module, examples, device, precision)}.pt2"
    if path.exists():
        os.utime(path)  # recently used: the last to go (``_prune``)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.pt2")  # renamed once whole
        with _tf32_settings(precision):  # the math it is compiled for is the math it runs
            program = torch.export.export(_exported(module.to(device), precision, device), tuple(examples))
            aoti_compile_and_package(program, package_path=str(partial))
        os.replace(partial, path)
        _prune(path.parent, keep=path)
    # Single-threaded: one call at a time, with none of the host waits between calls that a
    # CUDA graph's capture forbids (its default waits for an instance's previous run).
    run = aoti_load_package(str(path), run_single_threaded=True).loader.boxed_run
    return lambda *tensors: run(list(tensors))


def _remember_isa_probes() -> None:
    """Inductor's probes of the host's vector instructions (AVX2, AVX-512 and its VNNI and
    BF16, AMX) made once a machine, their verdicts kept on disk beside the packages.

    Every process that compiles or loads a package asks inductor which to use (for its C++
    wrapper's flags; on loading, to warn if the compiling machine's differed), and inductor
    probes each the CPU reports by compiling a test program and loading it in a new Python
    process, which before PyTorch 2.13 imports torch there: on an H100's host (torch 2.11),
    45-58 s in every process, paid by each compile ahead (a process each), the measuring
    worker and the assembly. A verdict depends on the machine, the compiler, PyTorch, the
    flags and the test program, all in its key (``_probe_key``); the first process to probe
    keeps it, the others read it, or wait for it (under a lock: compiles ahead start a dozen
    processes at once, which would otherwise all probe, each slower for the others)."""
    from filelock import FileLock  # PyTorch's own dependency, as its locks
    from torch._inductor.cpu_vec_isa import VecISA

    probe = VecISA.check_build
    if getattr(probe, "remembered", False):
        return

    @functools.wraps(probe)
    def remembered(isa, code: str) -> bool:
        path = _package_dir().parent / "collage-isa-probes" / _probe_key(isa, code)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            verdict = path.read_text() if path.exists() else ""
            if verdict not in ("supported", "unsupported"):  # none yet, or cut off while written
                verdict = "supported" if probe(isa, code) else "unsupported"
                path.write_text(verdict)
        return verdict == "supported"

    remembered.remembered = True
    VecISA.check_build = remembered


def prepare(target: str) -> None:
    """Inductor's checks of the host's vector instruction sets made now, each set's in a
    thread of its own, and kept on disk (``_remember_isa_probes``): on a machine that has no
    verdicts yet (torch 2.11 on an H100's host: ten probes, 58.5 s one after another, in
    chains of one to five by set), the compiles ahead, each reaching them after its lowering,
    then read them or wait for less. In the optimizing process only, beside the pool: each
    set's check changes that set's flags while it runs, so two threads must not check one."""
    from torch._inductor import cpu_vec_isa

    _remember_isa_probes()
    try:
        reported = cpu_vec_isa.x86_isa_checker()  # the sets the CPU says it has
        isas = [isa for isa in cpu_vec_isa.supported_vec_isa_list if reported and set(str(isa).split()) <= set(reported)]
    except AttributeError:  # another PyTorch: its own check, in its own order, when a compile asks
        return
    with ThreadPoolExecutor(max(1, len(isas))) as pool:
        list(pool.map(bool, isas))


def _probe_key(isa, code: str) -> str:
    import torch
    from torch._inductor import config

    digest = hashlib.blake2b(digest_size=16)
    parts = (torch.__version__, sys.executable, os.environ.get("CXX", ""), repr(config.cpp.cxx),
             _cpu_flags(), str(isa), isa.build_arch_flags(), code)  # fmt: skip
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


@functools.cache
def _cpu_flags() -> str:
    """The CPU's model and instruction-set flags, where Linux lists them: a cache directory
    shared between machines keeps each machine's verdicts apart."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))
    return platform.processor()


def _exported(module, precision: str, device: str):
    """What a package is exported from: ``module``, or for bfloat16 and float16 ``module``
    under ``torch.autocast`` in its ``forward``, which export records (as a higher-order op
    that inductor lowers to the casts autocast makes)."""
    import torch

    if precision not in AUTOCAST:
        return module

    class Autocast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *args):
            with torch.autocast(device, dtype=getattr(torch, precision)):
                return self.inner(*args)

    return Autocast()


# A package holds its weights: one model's candidates take up to a few GB (ViT-B/16's whole
# graph alone 344 MB). Past this, the least recently used packages go.
PACKAGE_CACHE_BYTES = 16 * 2**30


def _prune(directory: Path, keep: Path) -> None:
    """The least recently used packages in ``directory`` removed until the rest fit in
    ``PACKAGE_CACHE_BYTES``; ``keep`` (just built) and packages other processes are still
    writing (``<key>.<pid>.pt2``) stay."""
    sizes = {}
    for package in directory.glob("*.pt2"):
        try:
            if len(package.suffixes) == 1:
                stat = package.stat()
                sizes[package] = (stat.st_mtime, stat.st_size)
        except FileNotFoundError:  # removed by another process meanwhile
            continue
    total = sum(size for _, size in sizes.values())
    for package in sorted(sizes, key=lambda p: sizes[p][0]):
        if total <= PACKAGE_CACHE_BYTES:
            break
        if package != keep:
            package.unlink(missing_ok=True)
            total -= sizes[package][1]


def _package_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "collage-packages"


def _package_key(module, examples: list, device: str, precision: str) -> str:
    """What a package depends on: the graph's code, its weights, its inputs' shapes and
    dtypes, the precision, PyTorch's version and the device (a GPU's architecture)."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    machine = f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}" if device == "cuda" else platform.machine()
    for part in (torch.__version__, device, machine, precision, module.code):
        digest.update(part.encode() + b"\0")
    for name, tensor in module.named_buffers():
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    for tensor in examples:
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)}".encode())
    return digest.hexdigest()


def compile_program(program, main, target: str, threads: int, precision: str = FLOAT32, module=None):
    """The user's ``module`` compiled whole, as ``torch.compile`` of it runs (attention as
    PyTorch's fused kernels, not as collage's graph has it; a library's branches for the
    compiler taken), in place of ``main``, the Relax function imported from its ``torch.export``
    ``program``. Without ``module`` (the user handed over a program, or an export loads
    one), or where Dynamo cannot capture it whole, the program is compiled instead."""
    device = _device(target)
    _remember_isa_probes()  # torch.compile for the CPU asks them too
    if module is not None:
        try:
            return _compiled_whole(module, main, device, precision)
        except Exception as err:  # noqa: BLE001 -- a graph break, or what inductor fails on: the program, as exported
            if program is None and device == "cpu":
                # torch.export could not export the module either (EnCodec's padding guards on
                # a value it computes): compiled as torch.compile's default compiles it, its
                # graph breaks run by Python, which on CUDA would break the kernel's graph.
                return _compiled_whole(module, main, device, precision, fullgraph=False)
            if program is None:
                raise
            warnings.warn(f"inductor: torch.compile cannot take the PyTorch module whole ({type(err).__name__}: "
                          f"{first_line(err)}); its torch.export program is compiled instead", stacklevel=2)  # fmt: skip
    return _compiled_whole(program.module(), main, device, precision)


def _compiled_whole(module, main, device: str, precision: str, fullgraph: bool = True):
    import torch

    if device != "cpu":  # Module.to moves parameters in place, and these are the user's module's own
        module = copy.deepcopy(module).to(device)
    return _kernel(torch.compile(module, fullgraph=fullgraph, dynamic=False), main, device, precision)


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def _examples(func, device: str) -> list:
    """Zeros of each parameter's shape and dtype: what a compile traces with."""
    import torch

    return [torch.zeros(static_shape(p.ty), dtype=getattr(torch, dtype_of(p.ty)), device=device) for p in func.params]


def _tensors_in(ty) -> int:
    return sum(map(_tensors_in, ty.fields)) if isinstance(ty, relax.TupleType) else 1


def _kernel(compiled, func, device: str, precision: str):
    """``compiled`` (a ``torch.compile``d callable taking ``func``'s inputs) as a Kernel:
    compiled now on inputs of the right shapes, never inside a capture; on CUDA on TVM's
    stream, and bound to fixed buffers as one CUDA graph."""
    import torch
    from torch.utils._pytree import tree_leaves

    from collage.patterns.torch_stream import on_tvm_stream

    count = len(func.params)
    examples = _examples(func, device)
    with _settings(precision, device):
        returned = len(tree_leaves(compiled(*examples)))
    outputs = _tensors_in(func.ret_ty)
    if returned != outputs:
        raise ValueError(f"the compiled graph returns {returned} tensor(s); the function it replaces returns {outputs}")

    def kernel(*tensors):
        with _settings(precision, device):
            results = compiled(*(torch.from_dlpack(t) for t in tensors[:count]))
            for out, result in zip(tensors[count:], tree_leaves(results)):
                torch.from_dlpack(out).copy_(result)

    if device == "cpu":
        kernel.plain = _plain_call(compiled, func, precision)
        return kernel
    kernel = on_tvm_stream(kernel)
    kernel.bound = lambda tensors: _replayed(kernel, tensors)
    return kernel


def _plain_call(compiled, func, precision: str):
    """``compiled``'s own call on numpy arrays, one per input, returning its outputs as numpy
    arrays that share its new tensors' memory (``Kernel.plain``): ``opt(x)`` then costs what
    ``torch.compile``'s call costs. Dynamo would compile again for another shape or dtype
    where an engine refuses one, so each input's is checked first (a microsecond each)."""
    import torch
    from torch.utils._pytree import tree_leaves

    expected = [(tuple(static_shape(p.ty)), getattr(torch, dtype_of(p.ty))) for p in func.params]
    dtypes = [getattr(torch, dtype_of(t)) for t in output_types(func)]  # under autocast, float32 as the buffers are

    def plain(arrays):
        tensors = [torch.from_numpy(a) for a in arrays]
        for t, (shape, dtype) in zip(tensors, expected):
            if t.shape != shape or t.dtype != dtype:
                raise ValueError(f"expected {dtype} of shape {shape}, got {t.dtype} of shape {tuple(t.shape)}")
        with _settings(precision, "cpu"):
            return [t.to(dtype).numpy() for t, dtype in zip(tree_leaves(compiled(*tensors)), dtypes)]

    return plain


def _replayed(kernel, tensors):
    """A call with no arguments that runs ``kernel`` on ``tensors`` (inputs, then outputs) as
    one CUDA graph, recorded here once: what ``torch.compile(mode="reduce-overhead")`` does,
    for a module that is this kernel alone and so is called without TVM's VM, whose own
    CUDA graphs it would otherwise have (``assembling.assemble.bound_function``)."""
    import torch
    import tvm_ffi

    kernel(*tensors)  # warm, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"), tvm_ffi.use_torch_stream():
        kernel(*tensors)
    return graph.replay


BACKEND = Backend(
    name="inductor",
    kind=GRAPH_LEVEL,
    targets=("cuda", "llvm"),
    candidates_on=("cuda",),
    compile=compile,
    compile_program=compile_program,
    rules=(PatternRule("inductor.fused", convertible, never_fuse, max_size=0),),
    requires=("torch",),
    probe=probe,
    # The algorithms of cuDNN's benchmark since stop 58: costs logged before, of its heuristic's, are not reused.
    library=f"inductor in PyTorch {installed_version('torch')} (torch.compile, cuDNN's benchmark)",
    precisions=_precisions,
    graph_safe=True,
    compile_cache=True,
    prepare=prepare,
)
