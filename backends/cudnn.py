"""NVIDIA cuDNN, through PyTorch CUDA: float32 convolution (2-D, 3-D) with its post-ops, and
TF32 (tensor cores) under an accuracy budget.

``aten::cudnn_convolution.out`` runs cuDNN's convolution straight into the caller's buffer
(a DLPack view of TVM's CUDA tensor), with TF32 off so results match TVM's float32. The
bias, residual add and ReLU follow as in-place passes on that buffer: cuDNN's fused
``cudnn_convolution_add_relu`` has no ``out=`` of its own and follows PyTorch's global
TF32 switch, so it would cost a copy and the precision. Constant weights and biases are
copied to the GPU once, at compile time. With ``precision=TF32`` the convolution may use
tensor cores (``allow_tf32``), as PyTorch's default does. Every pass runs on TVM's current stream and none
waits on the host (``patterns.torch_stream``), so a CUDA graph may capture the kernel.

The convolution's algorithm is the fastest cuDNN's benchmark finds for its shapes on this GPU
(``benchmark=True``, what ``torch.backends.cudnn.benchmark`` does), not its instant
heuristic's first choice: on a lent H200 that choice ran ResNet-50's stage-4 3x3 convolutions
(7x7 pixels, 512 channels, batch 1) as an FFMA kernel of 32 thread blocks on 132
multiprocessors, 163 us each. The benchmark times candidate algorithms, which a CUDA graph's
capture forbids, so it runs when the kernel is compiled, outside any capture; PyTorch keeps
the plan it finds per thread and per shape, and a capture on the same thread records that
plan. A capture that finds no plan kept (another thread) takes the heuristic's, as before.
"""

import tvm

from collage.patterns import kernels
from collage.patterns.kernels import shape_of

from collage.candidates.backend import OP_LEVEL, Backend, installed_version
from collage.candidates.precision import FLOAT32, TF32
from collage.measuring.arrays import random_inputs
from collage.measuring.build import run_kernel

PATTERNS = {p.name: p for p in kernels.conv_patterns("cudnn", dims=(2, 3))}


def probe(target: str) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "PyTorch has no CUDA device (CPU build or no GPU)"
    if not torch.backends.cudnn.is_available():
        return "this PyTorch build has no cuDNN"
    return None


def compile(func, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    import torch

    from collage.patterns.torch_stream import on_tvm_stream

    match = kernels.compile_match(func, PATTERNS, pattern)
    padding, stride, dilation, groups = kernels.conv_params(match)
    channel_shape = (1, shape_of(match["conv"])[1], *[1] * len(stride))  # [1, C, 1, 1]

    def on_gpu(t):
        return t.to("cuda")

    data = kernels.reader(func, match, "data", torch.from_dlpack, on_gpu)
    weight = kernels.reader(func, match, "weight", torch.from_dlpack, on_gpu)
    bias = kernels.reader(func, match, "bias", lambda t: torch.from_dlpack(t).reshape(channel_shape), on_gpu)
    residual = kernels.reader(func, match, "residual", torch.from_dlpack, on_gpu)
    relu = "relu" in match.captures
    tf32 = precision == TF32

    def kernel(*tensors):
        inputs, out = tensors[:-1], torch.from_dlpack(tensors[-1])
        torch.ops.aten.cudnn_convolution.out(
            data(inputs), weight(inputs), padding, stride, dilation, groups,
            not torch.cuda.is_current_stream_capturing(), False, tf32, out=out,  # benchmark, deterministic, allow_tf32
        )  # fmt: skip
        if bias is not None:
            out.add_(bias(inputs))
        if residual is not None:
            out.add_(residual(inputs))
        if relu:
            out.relu_()

    kernel = on_tvm_stream(kernel)
    run_kernel(kernel, func, random_inputs(func), tvm.cuda())  # cuDNN's benchmark, outside any capture
    return kernel


BACKEND = Backend(
    name="cudnn",
    kind=OP_LEVEL,
    targets=("cuda",),
    compile=compile,
    patterns=tuple(PATTERNS.values()),
    requires=("torch",),
    probe=probe,
    # Costs logged before stop 58, of the heuristic's algorithms, are not reused.
    library=f"cuDNN in PyTorch {installed_version('torch')}, algorithms by its benchmark",
    graph_safe=True,
    precisions=lambda target: (TF32,),
)
