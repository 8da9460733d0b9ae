"""Unrolled loops over a sequence (how torch.export writes a Python loop over time steps) roll
back into whole-tensor work: a linear recurrence into one scan kernel, a stack of the steps'
outputs into one batched expression; near-misses stay as they are, and the numbers never
change."""

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
from collage.model.simplify.loops import STACKED_STEPS_BATCHED
from collage.model.simplify.recurrences import scan_kernels_for_the_gpu


class SelectiveScan(nn.Module):
    """Mamba's selective scan as transformers writes it when exporting: the state
    ``h = a[t] * h + b[t]`` over the tokens, each token's output ``h @ c[t]``, stacked.
    ``first`` and ``last`` bound the loop; ``shift`` reads ``a`` one token ahead."""

    def __init__(self, first=0, last=None, shift=0, start=None):
        super().__init__()
        self.first, self.last, self.shift, self.start = first, last, shift, start

    def forward(self, a, b, c):
        h = torch.zeros(a.shape[0], a.shape[1], a.shape[3]) if self.start is None else self.start
        outputs = []
        for t in range(self.first, self.last or a.shape[2]):
            h = a[:, :, min(t + self.shift, a.shape[2] - 1)] * h + b[:, :, t]
            outputs.append(torch.matmul(h, c[:, t, :].unsqueeze(-1))[:, :, 0])
        return torch.stack(outputs, dim=-1)


def _scan_inputs(tokens=7):
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(1, 6, tokens, 4, generator=generator) * 0.5 + 0.5
    b = torch.randn(1, 6, tokens, 4, generator=generator)
    c = torch.randn(1, tokens, 4, generator=generator)
    return a, b, c


def _simplified(net: nn.Module, inputs: tuple):
    """The module simplified, its report, and its outputs against torch's (which they must match)."""
    mod = load_torch(net.eval(), inputs)
    simplified, report = simplify(mod, report=True)
    arrays = [x.numpy() for x in inputs]
    (got,) = numpy_outputs(reference_vm(simplified)["main"](*to_tensors(arrays)))
    with torch.no_grad():
        np.testing.assert_allclose(got, net(*inputs).numpy(), rtol=1e-5, atol=1e-5)
    return mod, simplified, report


def test_the_selective_scan_becomes_one_scan_kernel_and_one_batched_product():
    _, simplified, report = _simplified(SelectiveScan(), _scan_inputs())
    assert report.applied("linear_recurrence_as_scan") == 1
    assert report.applied("stacked_steps_batched") == 1
    histogram = op_histogram(simplified)
    assert histogram["relax.call_tir"] == 1
    assert histogram["relax.matmul"] == 1
    assert histogram["relax.take"] <= 1  # the product's unit axis dropped once, not per token
    assert op_count(simplified) <= 10


def test_a_state_that_starts_from_a_value_of_the_model_starts_the_scan_from_it():
    start = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(1))
    _, simplified, report = _simplified(SelectiveScan(start=start), _scan_inputs())
    assert report.applied("linear_recurrence_as_scan") == 1


@pytest.mark.parametrize("loop", [dict(first=1), dict(last=5), dict(shift=1)], ids=["from-1", "to-5", "a-ahead"])
def test_a_loop_that_is_not_the_whole_recurrence_in_order_stays_unrolled(loop):
    """Only a chain through every index of the axis, in order, reading the step's own slice of
    both tensors, is the scan the kernel computes. A loop over part of the axis is still an
    element-wise recurrence (``recurrences``), whose kernel starts and ends anywhere."""
    mod, simplified, report = _simplified(SelectiveScan(**loop), _scan_inputs())
    assert report.applied("linear_recurrence_as_scan") == 0
    assert op_histogram(simplified)["relax.call_tir"] == report.applied("elementwise_recurrence_as_scan")


class PerToken(nn.Module):
    """A per-token projection written as a loop, stacked on axis ``axis``."""

    def __init__(self, axis=1, reverse=False, softmax=False):
        super().__init__()
        self.axis, self.reverse, self.softmax = axis, reverse, softmax
        self.weight = nn.Parameter(torch.randn(8, 5, generator=torch.Generator().manual_seed(2)))

    def forward(self, x):
        tokens = range(x.shape[1] - 1, -1, -1) if self.reverse else range(x.shape[1])
        steps = [torch.tanh(x[:, t] @ self.weight) * 2.0 for t in tokens]
        if self.softmax:
            steps = [torch.softmax(s, dim=-1) for s in steps]
        return torch.stack(steps, dim=self.axis)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_stacked_steps_become_one_batched_expression_wherever_the_stack_puts_the_steps(axis):
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(3))
    mod, simplified, report = _simplified(PerToken(axis), (x,))
    assert report.applied("stacked_steps_batched") == 1
    assert op_histogram(simplified)["relax.matmul"] == 1
    assert op_count(simplified) <= 6


@pytest.mark.parametrize("net", [PerToken(reverse=True), PerToken(softmax=True)], ids=["reversed", "softmax"])
def test_steps_out_of_order_or_with_an_operator_not_known_batched_stay_unrolled(net):
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(3))
    mod, simplified, report = _simplified(net, (x,))
    assert report.applied("stacked_steps_batched") == 0
    assert op_histogram(simplified)["relax.matmul"] == 6


def test_a_value_each_step_computes_alike_is_read_as_it_is_not_as_a_step_axis():
    """Without common subexpressions eliminated, each step computes exp(w) again: the steps
    differ there without varying, and the batched expression reads exp(w) once."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5, 3), "float32"))
    w = relax.Var("w", relax.TensorType((3,), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            steps = []
            for t in range(5):
                row = bb.emit(relax.op.take(x, relax.const(t, "int64"), axis=0))
                scale = bb.emit(relax.op.exp(w))
                steps.append(bb.emit(relax.op.expand_dims(bb.emit(relax.op.multiply(row, scale)), [0])))
            out = bb.emit_output(relax.op.concat(steps, axis=0))
        bb.emit_func_output(out)
    mod = bb.get()
    batched, applied = STACKED_STEPS_BATCHED.apply(mod)
    assert applied == 1
    arrays = [np.random.default_rng(4).standard_normal(s).astype("float32") for s in ((5, 3), (3,))]
    (got,) = numpy_outputs(reference_vm(batched)["main"](*to_tensors(arrays)))
    np.testing.assert_allclose(got, arrays[0] * np.exp(arrays[1]), rtol=1e-6)


def test_the_scan_kernel_compiles_for_the_gpu_in_its_gpu_form():
    """Simplification does not know the target: its kernel is the CPU's, and a build for CUDA
    swaps in a thread per lane (here sm_90, which nvcc compiles for without a GPU)."""
    _, simplified, _ = _simplified(SelectiveScan(), _scan_inputs())
    (kernel,) = [f for _, f in simplified.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    gpu = scan_kernels_for_the_gpu(simplified)
    (gpu_kernel,) = [f for _, f in gpu.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert "T.parallel" in kernel.script() and "threadIdx.x" in gpu_kernel.script()
    # The kernel alone: TVM's GPU schedules of the model's other operators are not this test's.
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(p.shape, str(p.dtype))) for name, p in zip(("a", "b", "h0"), kernel.params)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(bb.add_func(kernel, "linear_recurrence"), params,
                                                relax.TensorType(kernel.params[0].shape, "float32")))
        bb.emit_func_output(out)
    tvm_compile(bb.get(), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
