"""Intel MKL's BLAS, through PyTorch's CPU build: float32 GEMM and batched GEMM.

``torch.mm``/``addmm``/``bmm`` on CPU float32 tensors call MKL's SGEMM and SGEMM_BATCH
(``MKL_VERBOSE=1`` shows them). Every kernel writes straight into the caller's buffer with
``out=``, and reads its operands as DLPack views: zero-copy both ways. A transposed weight
(``permute_dims``) is a strided view that SGEMM reads transposed; leading dimensions of
``x`` are folded into GEMM rows by a view. ReLU after the bias uses
``torch._addmm_activation``: ``addmm`` then ReLU in place on CPU, cuBLASLt's fused epilogue
on CUDA (``backends/cublas.py`` runs this same kernel on the GPU).
"""

from collage.patterns import kernels

from collage.candidates.backend import OP_LEVEL, Backend, installed_version

PATTERNS = {p.name: p for p in kernels.matmul_patterns("mkl")}


def probe(target: str) -> str | None:
    import torch

    return None if torch.backends.mkl.is_available() else "this PyTorch build has no MKL"


def compile(func, pattern: str, target: str, threads: int):
    kernels.use_torch_threads(threads)
    return matmul_kernel(func, kernels.compile_match(func, PATTERNS, pattern), device="cpu")


def matmul_kernel(func, match, device: str):
    """``func``'s matmul (+ bias) (+ ReLU) on ``device``; constant operands move there once."""
    import torch

    def on_device(t):
        return t.to(device)

    lhs = kernels.reader(func, match, "lhs", torch.from_dlpack, on_device)
    rhs = kernels.reader(func, match, "rhs", torch.from_dlpack, on_device)
    bias = kernels.reader(func, match, "bias", lambda t: torch.from_dlpack(t).reshape(-1), on_device)
    transposed, relu = "transpose" in match.captures, "relu" in match.captures

    def kernel(*tensors):
        inputs, out = tensors[:-1], torch.from_dlpack(tensors[-1])
        a, b = lhs(inputs), rhs(inputs)
        if transposed:
            b = b.transpose(-1, -2)
        if b.dim() == 2:  # dense: x[..., K] viewed as rows [M, K]
            rows, out_rows = a.reshape(-1, a.shape[-1]), out.view(-1, out.shape[-1])
            if bias is None:
                torch.mm(rows, b, out=out_rows)
            elif relu:
                torch._addmm_activation(bias(inputs), rows, b, out=out_rows)
            else:
                torch.addmm(bias(inputs), rows, b, out=out_rows)
        else:  # batch matmul: batch dimensions folded into one, by views
            batched = lambda t: t.reshape(-1, *t.shape[-2:])
            torch.bmm(batched(a), batched(b), out=out.view(-1, *out.shape[-2:]))

    return kernel


BACKEND = Backend(
    name="mkl",
    kind=OP_LEVEL,
    targets=("llvm",),
    compile=compile,
    patterns=tuple(PATTERNS.values()),
    requires=("torch",),
    probe=probe,
    library=f"Intel MKL in PyTorch {installed_version('torch')}",
    # PyTorch's GNU OpenMP workers spin after each parallel region until their spin count
    # runs out, without yielding the core: 0.5 ms apart, 200 products of 64x256 by 256x256 kept
    # one 120 ms busy in 122 (2-core Zen 4).
    spins_after_calls=True,
)
