"""TVM's CPU code: for the host's CPU, its float32 transcendentals as vectorizable loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from collage.measuring.build import host_cpu, host_target, tvm_compile
from collage.measuring.fast_math import ELEMENTWISE, SOFTMAX, with_fast_math

SHAPE = (4, 2048)


def _module(op, dtype: str = "float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    return bb.get()


def _values(rng) -> np.ndarray:
    """Every scale a model's activations take, and sin's and cos's arguments far out (a
    rotary embedding's position times its frequency reaches 1e5 at long contexts)."""
    x = rng.standard_normal(SHAPE) * np.logspace(-3, 1.5, SHAPE[1])
    x[0, :64] = [0.0, -0.0, 1e-30, -1e-30, 80.0, -80.0, 1e5, -3e4, 12345.678, np.pi / 4, np.pi / 2, np.pi] * 5 + [1.0] * 4
    return x.astype("float32")


OPS = {
    "relax.exp": (relax.op.exp, torch.exp),
    "relax.erf": (relax.op.erf, torch.erf),
    "relax.tanh": (relax.op.tanh, torch.tanh),
    "relax.sigmoid": (relax.op.sigmoid, torch.sigmoid),
    "relax.nn.silu": (relax.op.nn.silu, torch.nn.functional.silu),
    "relax.nn.gelu": (relax.op.nn.gelu, torch.nn.functional.gelu),
    "relax.nn.gelu_tanh": (relax.op.nn.gelu_tanh, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    "relax.sin": (relax.op.sin, torch.sin),
    "relax.cos": (relax.op.cos, torch.cos),
    "relax.nn.softmax": (lambda x: relax.op.nn.softmax(x, axis=-1), lambda x: torch.softmax(x, dim=-1)),
}


def test_every_fast_operator_is_tested():
    assert set(ELEMENTWISE) | {SOFTMAX} == set(OPS)


@pytest.mark.parametrize("name", sorted(OPS))
def test_float32_transcendentals_are_within_a_few_float32_steps_of_the_exact_value(name):
    """Within 1e-6 of float64's value plus 1e-6 of its size, over arguments from 1e-30 to 1e5:
    the float32 result of libm itself is within 6e-8 of it."""
    op, exact = OPS[name]
    x = _values(np.random.default_rng(0))
    vm = relax.VirtualMachine(tvm_compile(_module(op), "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    want = exact(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_rewrite_leaves_no_transcendental_of_float32_and_keeps_other_types():
    for name, (op, _) in OPS.items():
        written = name.replace("relax.", "R.") + "("  # as TVMScript writes the call
        assert written not in with_fast_math(_module(op)).script(), name  # a call_tir of its TE function instead
        assert written in with_fast_math(_module(op, "float64")).script(), name


def test_cpu_code_is_built_for_the_hosts_cpu_unless_the_target_names_one():
    assert host_target("llvm").attrs["mcpu"] == host_cpu() != ""
    assert host_target({"kind": "llvm", "mcpu": "x86-64"}).attrs["mcpu"] == "x86-64"
    assert host_target({"kind": "llvm", "opt-level": 0}).attrs["opt-level"] == 0
    assert "mcpu" not in host_target("cuda").attrs
