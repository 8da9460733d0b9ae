"""NVIDIA cuBLAS, through PyTorch CUDA: float32 GEMM and batched GEMM on the GPU.

The same kernel as ``backends/mkl.py`` on CUDA tensors, where PyTorch calls cuBLAS
(``mm``, ``bmm``) and cuBLASLt (``addmm`` with its bias epilogue, ``_addmm_activation``
with bias and ReLU fused). Outputs are written in place with ``out=``; inputs are DLPack
views of TVM's CUDA buffers; constant weights are copied to the GPU once, at compile time.
PyTorch's default keeps float32 matmuls in full precision (no TF32), as TVM computes them;
under an accuracy budget TF32 is offered too (``allow_tf32`` set around the call: PyTorch
reads it when the matmul runs).
The kernel runs on TVM's current stream and never waits on the host
(``patterns.torch_stream``), so a CUDA graph may capture it.
"""

from collage.backends.mkl import matmul_kernel
from collage.patterns import kernels

from collage.candidates.backend import OP_LEVEL, Backend, installed_version
from collage.candidates.precision import FLOAT32, TF32

PATTERNS = {p.name: p for p in kernels.matmul_patterns("cublas")}


def probe(target: str) -> str | None:
    import torch

    return None if torch.cuda.is_available() else "PyTorch has no CUDA device (CPU build or no GPU)"


def compile(func, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    import torch

    from collage.patterns.torch_stream import on_tvm_stream

    kernel = matmul_kernel(func, kernels.compile_match(func, PATTERNS, pattern), device="cuda")
    tf32 = precision == TF32
    matmul = torch.backends.cuda.matmul

    def in_precision(*tensors):
        previous, matmul.allow_tf32 = matmul.allow_tf32, tf32
        try:
            kernel(*tensors)
        finally:
            matmul.allow_tf32 = previous

    return on_tvm_stream(in_precision)


BACKEND = Backend(
    name="cublas",
    kind=OP_LEVEL,
    targets=("cuda",),
    compile=compile,
    patterns=tuple(PATTERNS.values()),
    requires=("torch",),
    probe=probe,
    library=f"cuBLAS in PyTorch {installed_version('torch')}",
    graph_safe=True,
    precisions=lambda target: (TF32,),
)
