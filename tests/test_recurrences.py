"""An unrolled loop of element-wise steps (RWKV's time mixing, as transformers writes it for
export) rolls back into one recurrence kernel; near-misses stay unrolled, the numbers never
change, and the kernel has a GPU form."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

from collage.measuring.arrays import numpy_outputs, to_tensors
from collage.measuring.build import reference_vm, tvm_compile
from collage.model.frontend import load_torch
from collage.model.simplify import op_count, op_histogram, simplify
from collage.model.simplify.recurrences import scan_kernels_for_the_gpu
from collage.model.simplify.recurrences import is_recurrence_kernel


class TimeMixing(nn.Module):
    """RWKV-4's WKV as transformers' ``rwkv_linear_attention_cpu`` writes it: three states
    per channel, each token's output their quotient. ``lag`` reads ``k`` that many tokens
    back: the steps are cut elsewhere, one template still."""

    def __init__(self, channels=16, lag=0):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.time_decay = nn.Parameter(torch.randn(channels, generator=generator))
        self.time_first = nn.Parameter(torch.randn(channels, generator=generator))
        self.lag = lag

    def forward(self, k, v):
        out = torch.zeros_like(k)
        aa = torch.zeros(k.shape[0], k.shape[2])
        bb, pp = torch.zeros_like(aa), torch.full_like(aa, -1e38)
        w, u = -torch.exp(self.time_decay), self.time_first
        for t in range(k.shape[1]):
            kt, vt = k[:, max(t - self.lag, 0)], v[:, t]
            ww = u + kt
            q = torch.maximum(pp, ww)
            e1, e2 = torch.exp(pp - q), torch.exp(ww - q)
            out[:, t] = (e1 * aa + e2 * vt) / (e1 * bb + e2)
            ww = pp + w
            q = torch.maximum(ww, kt)
            e1, e2 = torch.exp(ww - q), torch.exp(kt - q)
            aa, bb, pp = e1 * aa + e2 * vt, e1 * bb + e2, q
        return out


class Elman(nn.Module):
    """A recurrent cell whose step multiplies its state by a matrix: not element-wise."""

    def __init__(self, channels=16):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels, channels, generator=torch.Generator().manual_seed(0)) / 4)

    def forward(self, k, v):
        h, outputs = torch.zeros(k.shape[0], k.shape[2]), []
        for t in range(k.shape[1]):
            h = torch.tanh(k[:, t] + h @ self.weight) * v[:, t]
            outputs.append(h)
        return torch.stack(outputs, 1)


def _simplified(net: nn.Module, tokens: int):
    generator = torch.Generator().manual_seed(1)
    inputs = (torch.randn(2, tokens, 16, generator=generator), torch.randn(2, tokens, 16, generator=generator))
    mod = load_torch(net.eval(), inputs)
    simplified, report = simplify(mod, report=True)
    (got,) = numpy_outputs(reference_vm(simplified)["main"](*to_tensors([x.numpy() for x in inputs])))
    with torch.no_grad():
        np.testing.assert_allclose(got, net(*inputs).numpy(), rtol=1e-5, atol=1e-6)
    return mod, simplified, report


@pytest.mark.parametrize("lag", [0, 1])
def test_rwkvs_time_mixing_becomes_one_recurrence_kernel(lag):
    mod, simplified, report = _simplified(TimeMixing(lag=lag), tokens=24)
    assert report.applied("elementwise_recurrence_as_scan") == 1
    assert op_histogram(simplified)["relax.call_tir"] == 1
    # The first tokens and the last differ from the rest (constant initial states, states
    # unused after the last) and stay unrolled, a few tokens' four exps each; the rest is one call.
    assert op_histogram(simplified)["relax.exp"] <= 5 * 4 < 24 * 4
    # The outputs written in turn (``out[:, t] = ...``, a ``where`` a token) are one concat of
    # the unrolled tokens' values and one slice of the kernel's output.
    assert "relax.where" not in op_histogram(simplified)
    assert op_histogram(simplified)["relax.strided_slice"] == 1
    assert op_count(simplified) < op_count(mod) / 2


class WrittenInTurn(nn.Module):
    """``out[:, t] = x[:, t] * t`` for the tokens from ``first``: a token before it is never
    written, and keeps the zeros the output started with."""

    def __init__(self, first=0):
        super().__init__()
        self.first = first

    def forward(self, k, v):
        out = torch.zeros_like(k)
        for t in range(self.first, k.shape[1]):
            out[:, t] = k[:, t] * t + v[:, t]
        return out


@pytest.mark.parametrize("first", [0, 1])
def test_writes_to_every_index_in_turn_are_one_concat_and_others_stay(first):
    _, simplified, report = _simplified(WrittenInTurn(first), tokens=6)
    assert report.applied("written_slices_stacked") == (first == 0)
    assert ("relax.where" in op_histogram(simplified)) == (first > 0)


@pytest.mark.parametrize("net, tokens", [(Elman(), 24), (TimeMixing(), 6)], ids=["matrix-product", "too-short"])
def test_steps_not_element_wise_or_too_few_stay_unrolled(net, tokens):
    _, simplified, report = _simplified(net, tokens)
    assert report.applied("elementwise_recurrence_as_scan") == 0
    assert "relax.call_tir" not in op_histogram(simplified)


def test_the_recurrence_kernel_compiles_for_the_gpu_in_its_gpu_form():
    """Simplification does not know the target: its kernel is the CPU's, and a build for
    CUDA writes it again from the step it carries, a thread per lane (sm_90, which nvcc
    compiles for without a GPU)."""
    _, simplified, _ = _simplified(TimeMixing(), tokens=12)
    (kernel,) = [f for _, f in simplified.functions_items() if is_recurrence_kernel(f)]
    gpu = scan_kernels_for_the_gpu(simplified)
    (gpu_kernel,) = [f for _, f in gpu.functions_items() if is_recurrence_kernel(f)]
    assert "T.parallel" in kernel.script() and "threadIdx.x" in gpu_kernel.script()
    # The kernel alone: TVM's GPU schedules of the model's other operators are not this test's.
    bb = relax.BlockBuilder()
    named = [(str(p), relax.TensorType(p.shape, str(p.dtype))) for p in kernel.params]
    ins = [relax.Var(name, ty) for name, ty in named if not name.startswith("y")]  # the outputs are y0, y1, ...
    with bb.function("main", ins):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(bb.add_func(kernel, "elementwise_recurrence"), ins,
                                                [ty for name, ty in named if name.startswith("y")]))  # fmt: skip
        bb.emit_func_output(out)
    tvm_compile(bb.get(), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))


def test_the_kernels_float32_exp_is_within_two_ulps():
    """On the CPU the kernel computes exp as TVM's other kernels do (a polynomial LLVM
    vectorizes, not libm element by element): within 2 float32 ulps wherever exp is finite
    and normal, and 0 below."""
    from collage.model.simplify.recurrences import KernelSpec, recurrence_kernel

    spec = KernelSpec(template=(("relax.exp", (("slice", 0),)),), outer=1, inner=4096, lengths=(2,), first_index=0,
                      steps=2, outside=0, states=(), outputs=(0,), dtype="float32")  # fmt: skip
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 4096), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(bb.add_func(recurrence_kernel(spec), "exp"), [x], x.ty))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm_compile(bb.get(), "llvm"), tvm.cpu())
    arrays = np.concatenate([np.linspace(-87, 88.3, 4096), np.full(4096, -1e38)]).astype("float32").reshape(1, 2, 4096)
    (got,) = numpy_outputs(vm["main"](*to_tensors([arrays])))
    want = np.exp(arrays[0, 0].astype("float64"))
    assert np.max(np.abs(got[0, 0] - want) / want) < 2 * 2.0**-24
    assert not got[0, 1].any()  # RWKV's first running maximum, -1e38
