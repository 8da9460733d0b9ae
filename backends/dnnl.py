"""oneDNN, the build bundled in PyTorch (``torch.ops.mkldnn``; oneDNN 3.x in torch 2.13).

Convolution (1-D to 3-D; float32, channels-first) runs oneDNN's primitive through
``mkldnn._convolution_pointwise``, with the bias and, when nothing follows it, the ReLU
fused as post-ops. Constant weights of 2-D and 3-D ones are reordered into oneDNN's blocked
layout once, at compile time (``mkldnn._reorder_convolution_weight``); with them the primitive works
channels-last: PyTorch reorders the NCHW input for it and returns a new tensor (no
``out=``), which one pass moves into the caller's buffer: a ``copy_``, or with a residual
the add itself (``add``/``_add_relu`` with ``out=``). oneDNN fuses the residual add only
into channels-last buffers, and TVM's are NCHW.

Dense layers (``x @ W.T + b``, then ReLU) run oneDNN's inner-product primitive through
``mkldnn._linear_pointwise``, bias and ReLU fused as post-ops; its result is copied into the
caller's buffer (the op has no ``out=``).

Pooling (2-D max and average): PyTorch pools dense CPU tensors with ATen's own kernels, so
these convert to oneDNN tensors (``to_mkldnn``), pool with oneDNN's primitive and convert
back (``to_dense``, then ``copy_``): three copies, measured like any candidate.

Precision: with an accuracy budget, on a CPU with AMX, convolutions and dense layers are
offered in bfloat16 too: oneDNN's float32 math mode
(``torch.backends.mkldnn.{conv,matmul}.fp32_precision = "bf16"``, oneDNN's ``fpmath_mode``)
rounds their operands to bfloat16 and accumulates in float32 on AMX; tensors stay float32
at the boundary. On AVX512_BF16 without AMX (Zen 4, Zen 5) oneDNN keeps its float32 kernels
under that mode, so nothing is offered there (measuring each candidate twice for the same
kernel would only cost time). The mode is process-wide, so a kernel sets it around
its own call and restores what it found (under a microsecond). Pooling has no such mode.
"""

from collage.patterns import kernels
from collage.patterns.kernels import Check, shape_of

from collage.candidates.backend import OP_LEVEL, Backend, Unsupported, installed_version
from collage.candidates.pattern import Pattern
from collage.candidates.precision import BFLOAT16, FLOAT32, amx_unavailable
from collage.measuring.cost import cpu_info


def probe(target: str) -> str | None:
    import torch

    return None if torch.backends.mkldnn.is_available() else "this PyTorch build has no oneDNN (mkldnn)"


def avg_pool_rule(match) -> str | None:
    attrs = match["pool"].attrs
    if any(int(d) != 1 for d in attrs.dilation):  # oneDNN's average pooling has no dilation
        return "dilated average pooling"
    # A ceil_mode window overhanging the padding: oneDNN divides by its clipped size, TVM by k*k.
    if attrs.ceil_mode and attrs.count_include_pad:
        return "ceil_mode with count_include_pad"
    return None


PATTERNS = {
    p.name: p
    for p in (
        *kernels.conv_patterns("dnnl", dims=(1, 2, 3)),
        *(p for p in kernels.matmul_patterns("dnnl") if "batch_matmul" not in p.name),
        Pattern("dnnl.max_pool2d", *kernels.pool2d("relax.nn.max_pool2d"), check=kernels.POOL_CHECK),
        Pattern("dnnl.avg_pool2d", *kernels.pool2d("relax.nn.avg_pool2d"),
                check=Check((*kernels.POOL_CHECK.rules, avg_pool_rule))),
    )
}  # fmt: skip


def compile(func, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    kernels.use_torch_threads(threads)
    match = kernels.compile_match(func, PATTERNS, pattern)
    if "conv" in match.captures:
        return in_math_mode(conv_kernel(func, match), "conv", precision)
    if "matmul" in match.captures:
        return in_math_mode(dense_kernel(func, match), "matmul", precision)
    if precision != FLOAT32:
        raise Unsupported(f"oneDNN pools in float32 only, not {precision}")
    return pool_kernel(func, match)


def in_math_mode(kernel, primitive: str, precision: str):
    """``kernel`` with oneDNN's float32 math mode for ``primitive`` ("conv", "matmul") set to
    ``precision`` while it runs; float32 leaves the mode as it is."""
    if precision == FLOAT32:
        return kernel
    import torch

    mode = getattr(torch.backends.mkldnn, primitive)
    as_torch_spells = {BFLOAT16: "bf16"}[precision]

    def reduced(*tensors):
        found, mode.fp32_precision = mode.fp32_precision, as_torch_spells
        try:
            kernel(*tensors)
        finally:
            mode.fp32_precision = found

    return reduced


def conv_kernel(func, match):
    import torch

    padding, stride, dilation, groups = kernels.conv_params(match)
    data_shape = list(shape_of(match["data"]))
    # A 1-D convolution keeps its weight as it is: PyTorch blocks only 2-D and 3-D weights, and
    # run as a 2-D one of height 1 over a blocked weight it took a third longer (0.63 ms
    # against 0.48 for 32 channels, 4000 samples, 7 taps on a 2-core Zen 4).
    blocked = len(stride) > 1

    def pack(weight):  # into oneDNN's blocked layout for this convolution, once
        return torch.ops.mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups, data_shape)

    data = kernels.reader(func, match, "data", torch.from_dlpack)
    weight = kernels.reader(func, match, "weight", torch.from_dlpack, prepare=pack if blocked else lambda w: w)
    bias = kernels.reader(func, match, "bias", lambda t: torch.from_dlpack(t).reshape(-1))
    residual = kernels.reader(func, match, "residual", torch.from_dlpack)
    relu = "relu" in match.captures
    fused_relu = "relu" if relu and residual is None else "none"  # else ReLU follows the add

    def kernel(*tensors):
        inputs, out = tensors[:-1], torch.from_dlpack(tensors[-1])
        conv = torch.ops.mkldnn._convolution_pointwise(
            data(inputs), weight(inputs), bias(inputs) if bias else None,
            padding, stride, dilation, groups, fused_relu, [], "",
        )  # fmt: skip
        if residual is None:
            out.copy_(conv)
        elif relu:
            torch.ops.aten._add_relu(conv, residual(inputs), out=out)
        else:
            torch.add(conv, residual(inputs), out=out)

    return kernel


def dense_kernel(func, match):
    import torch

    # oneDNN's inner product takes the weight as [out, in], what permute_dims undid.
    as_out_in = (lambda w: w) if "transpose" in match.captures else (lambda w: w.t().contiguous())
    data = kernels.reader(func, match, "lhs", torch.from_dlpack)
    weight = kernels.reader(func, match, "rhs", lambda t: as_out_in(torch.from_dlpack(t)))
    bias = kernels.reader(func, match, "bias", lambda t: torch.from_dlpack(t).reshape(-1))
    post_op = "relu" if "relu" in match.captures else "none"

    def kernel(*tensors):
        inputs, out = tensors[:-1], torch.from_dlpack(tensors[-1])
        x = data(inputs)
        rows = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, x.shape[-1]), weight(inputs), bias(inputs) if bias else None, post_op, [], ""
        )
        out.view(-1, out.shape[-1]).copy_(rows)

    return kernel


def pool_kernel(func, match):
    import torch

    attrs = match["pool"].attrs
    size, stride, dilation = ([int(v) for v in a] for a in (attrs.pool_size, attrs.strides, attrs.dilation))
    padding, ceil_mode = [int(p) for p in attrs.padding][:2], bool(attrs.ceil_mode)
    if match["pool"].op.name == "relax.nn.max_pool2d":
        pool = lambda x: torch.ops.aten.mkldnn_max_pool2d(x, size, stride, padding, dilation, ceil_mode)
    else:
        include_pad = bool(attrs.count_include_pad)
        pool = lambda x: torch.ops.aten.avg_pool2d(x, size, stride, padding, ceil_mode, include_pad)
    data = kernels.reader(func, match, "data", torch.from_dlpack)

    def kernel(*tensors):
        inputs, out = tensors[:-1], torch.from_dlpack(tensors[-1])
        out.copy_(pool(data(inputs).to_mkldnn()).to_dense())

    return kernel


BACKEND = Backend(
    name="dnnl",
    kind=OP_LEVEL,
    targets=("llvm",),
    compile=compile,
    patterns=tuple(PATTERNS.values()),
    requires=("torch",),
    probe=probe,
    library=f"oneDNN in PyTorch {installed_version('torch')}",
    spins_after_calls=True,  # PyTorch's OpenMP pool, as MKL's kernels (backends/mkl.py)
    precisions=lambda target: () if amx_unavailable(cpu_info()["isa"]) else (BFLOAT16,),
)
