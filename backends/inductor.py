"""PyTorch's inductor (``torch.compile``): a whole-graph compiler on the GPU, in TensorRT's place.

A candidate becomes a ``torch.fx`` graph of ATen ops (``collage.candidates.fx_convert``),
compiled by ``torch.compile`` (inductor: Triton kernels for what it fuses, cuDNN and cuBLAS
for convolutions and matmuls). Like the ONNX engines on the CPU it optimizes across kernels,
so it offers regions only (``max_size=0``): its largest regions, their parts at single-tensor
cuts, and the whole model when every op converts ("inductor alone"). When the user hands
over a PyTorch module, its own ``torch.export`` program compiled whole is a finalist too
(``compile_program``), as ``torch.compile`` of that module would run. Compiling takes seconds
per candidate; each is compiled at ``compile`` time, with inputs of the right shapes, so no
compile ever falls inside a CUDA graph's capture.

The kernel reads TVM's buffers through DLPack, runs on TVM's current stream and copies its
outputs into the caller's buffers there (``patterns.torch_stream``): graph-safe. Bound to
fixed buffers (``Kernel.bound``), it is recorded once as a CUDA graph and replayed.
Precision: float32 with TF32 off in cuDNN and cuBLAS, as TVM computes; with an accuracy
budget, also TF32 (tensor cores, 10-bit mantissa products) and bfloat16 (``torch.autocast``).
"""

import contextlib

from tvm import relax

from collage.patterns.fusion import never_fuse

from collage.candidates.backend import GRAPH_LEVEL, Backend, installed_version
from collage.candidates.fx_convert import convertible, to_fx
from collage.candidates.pattern import PatternRule
from collage.candidates.precision import BFLOAT16, FLOAT32, TF32
from collage.candidates.static import dtype_of, static_shape


def probe(target: str) -> str | None:
    import torch

    return None if torch.cuda.is_available() else "PyTorch has no CUDA device (CPU build or no GPU)"


def _settings(precision: str, device: str):
    """The math the kernel's convolutions and matmuls run in, set around each call: PyTorch
    reads these switches when a kernel runs, not when it is compiled."""
    import torch

    stack = contextlib.ExitStack()
    tf32 = precision == TF32
    stack.enter_context(torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=tf32))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    stack.callback(setattr, torch.backends.cuda.matmul, "allow_tf32", previous)
    if precision == BFLOAT16:
        stack.enter_context(torch.autocast(device, dtype=torch.bfloat16))
    stack.enter_context(torch.no_grad())
    return stack


def compile(func, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    import torch

    device = _device(target)
    return _kernel(torch.compile(to_fx(func, device), fullgraph=True, dynamic=False), func, device, precision)


def compile_program(program, main, target: str, threads: int, precision: str = FLOAT32):
    """The user's own ``torch.export`` program compiled whole, as ``torch.compile`` of their
    module compiles it (attention as PyTorch's fused kernels, not as collage's graph has it),
    in place of ``main``, the Relax function imported from it."""
    import torch

    device = _device(target)
    module = program.module().to(device)
    return _kernel(torch.compile(module, fullgraph=True, dynamic=False), main, device, precision)


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


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
    examples = [torch.zeros(static_shape(p.ty), dtype=getattr(torch, dtype_of(p.ty)), device=device) for p in func.params]
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
        return kernel
    kernel = on_tvm_stream(kernel)
    kernel.bound = lambda tensors: _replayed(kernel, tensors)
    return kernel


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
    targets=("cuda",),
    compile=compile,
    compile_program=compile_program,
    rules=(PatternRule("inductor.fused", convertible, never_fuse, max_size=0),),
    requires=("torch", "triton"),
    probe=probe,
    library=f"inductor in PyTorch {installed_version('torch')} (torch.compile)",
    precisions=lambda target: (TF32, BFLOAT16),
    graph_safe=True,
    compile_cache=True,
)
