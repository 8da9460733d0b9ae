"""The tvm backend: its fusion rule's groups compile and match TVM's default pipeline."""


import numpy as np
import pytest

from collage.measuring.build import check_candidate
from collage.backends import tvm as tvm_backend
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from experiments import models
from tests.helpers import failures, sample, zoo, zoo_candidates, zoo_graph


# Every distinct group of the MLP; a sample (covering every op) of BERT's, each compiled twice.
# (tests/test_zoo_candidates.py checks every candidate of every CPU backend on squeezenet.)
@pytest.mark.parametrize("model, limit", [("mlp", None), ("bert", 30)])
def test_rule_groups_compile_and_match(model, limit):
    cands = zoo_candidates(model, tvm_backend.BACKEND)
    assert set().union(*(c.subgraph.nodes for c in cands)) == set(range(len(zoo_graph(model))))  # all placeable
    assert failures(tvm_backend.BACKEND, sample(cands, limit)) == {}


def test_cuda_target():
    reason = tvm_backend.BACKEND.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"tvm on cuda: {reason}")
    graph = DataflowGraph.from_module(models.load("mlp", small=True).relax)
    for c in generate(graph, [tvm_backend.BACKEND]):
        assert check_candidate(tvm_backend.BACKEND, c.subgraph.extract(), c.pattern, "cuda") is None


# ------------------------------------------------------------------ TVM's CUDA build

SM90 = {"kind": "cuda", "arch": "sm_90"}


def test_small_whole_powers_are_multiplied_out_for_cuda_only():
    """nvcc's fast math, which TVM builds CUDA with, computes ``powf`` of a negative base as
    NaN: for CUDA, ``x ** 3`` and ``x ** 2`` become multiplications; a power that is not
    whole, or large, stays, and so does the model the engines see."""
    import tvm
    from tvm.script import ir as I
    from tvm.script import relax as R

    from collage.measuring.build import powers_as_multiplies

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.power(x, R.const(3.0, "float32"))  # GPT-2's GELU
                b = R.power(a, R.const(np.full((4,), 2.0, "float32")))  # the variance of an RMSNorm
                y = R.power(b, R.const(0.5, "float32"))  # not whole: kept
                z = R.power(y, R.const(5.0, "float32"))  # large: one kernel is cheaper
                w = R.power(R.const(np.ones((3, 2, 4), "float32")), R.const(2.0, "float32"))
                R.output(z)
            return z

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                lv = R.multiply(x, x)
                a = R.multiply(lv, x)
                b = R.multiply(a, a)
                y = R.power(b, R.const(0.5, "float32"))
                z = R.power(y, R.const(5.0, "float32"))
                R.output(z)
            return z

    after = tvm.relax.transform.DeadCodeElimination()(powers_as_multiplies(Before))
    tvm.ir.assert_structural_equal(after, Expected)


def test_gpt2_built_for_cuda_computes_no_power_of_a_negative_base():
    """GPT-2's GELU takes ``x ** 3`` of negative numbers: TVM alone on CUDA, and every TVM
    kernel with it, returned NaN. Built for the GPU as collage builds (checked without a
    GPU), its CUDA source has no ``powf``, and the model keeps its powers for the engines."""
    import tvm

    from collage.measuring.build import compile_module

    mod = zoo("gpt2").relax
    assert "R.power(" in mod.script()
    modules, sources = [compile_module(mod, tvm.target.Target(SM90)).mod], []
    while modules:
        module = modules.pop()
        modules += list(module.imports)
        sources += [module.inspect_source()] if module.kind == "cuda" else []
    assert sources and not any("powf" in source for source in sources)
