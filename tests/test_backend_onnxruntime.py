"""The onnxruntime backend: its rule on graphs, and its kernels against TVM's results.

Kernel checks take the candidates the rule grows on small zoo models, one per structural
key, sampled so that every operator seen is covered (bounded to keep the test short).
"""

import importlib
import sys

import pytest
from tvm.script import ir as I
from tvm.script import relax as R

from collage import runner
from collage.backend import GRAPH_LEVEL, Unsupported
from collage.backends.onnxruntime import BACKEND
from collage.candidates import generate
from collage.graph import DataflowGraph
from tests.helpers import sample, zoo_candidates


# fmt: off
@I.ir_module
class WithUnknownOp:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)          # 0
            b = R.nn.relu(a)            # 1
            c = R.cumsum(b, axis=1)     # 2: no ONNX conversion
            d = R.nn.relu(c)            # 3
            R.output(d)
        return d


@I.ir_module
class IntegerFloor:
    @R.function
    def main(x: R.Tensor((4,), "int32")):
        with R.dataflow():
            y = R.floor(x)
            R.output(y)
        return y
# fmt: on


def nodes(candidates):
    return {frozenset(c.subgraph.nodes) for c in candidates}


def test_record():
    assert (BACKEND.name, BACKEND.kind, BACKEND.targets) == ("onnxruntime", GRAPH_LEVEL, ("llvm",))
    assert [rule.name for rule in BACKEND.rules] == ["onnxruntime.fused"]
    assert BACKEND.library.startswith("ONNX Runtime 1.")
    assert BACKEND.unavailable_reason("llvm") is None
    assert BACKEND.unavailable_reason("cuda") == "does not serve target 'cuda'"


def test_rule_excludes_what_does_not_convert():
    cands = generate(DataflowGraph.from_module(WithUnknownOp), [BACKEND])
    assert {c.pattern for c in cands} == {"onnxruntime.fused"}
    assert nodes(cands) == {frozenset(s) for s in ({0}, {0, 1}, {1}, {3})}


def test_missing_library_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    monkeypatch.delitem(sys.modules, "collage.backends.onnxruntime")
    reloaded = importlib.import_module("collage.backends.onnxruntime")
    assert reloaded.BACKEND.unavailable_reason("llvm") == "missing Python module(s): onnxruntime"
    func = DataflowGraph.from_module(WithUnknownOp).func
    reason = runner.check_candidate(reloaded.BACKEND, func, "onnxruntime.fused")
    assert reason == "missing Python module(s): onnxruntime"


def test_unknown_operator_excludes_the_candidate_with_its_reason():
    func = DataflowGraph.from_module(WithUnknownOp).func
    with pytest.raises(Unsupported, match="relax.cumsum has no ONNX conversion"):
        BACKEND.compile(func, "onnxruntime.fused", "llvm")
    reason = runner.check_candidate(BACKEND, func, "onnxruntime.fused")
    assert reason == "unsupported: operator relax.cumsum has no ONNX conversion"


def test_what_onnx_runtime_rejects_is_unsupported():
    """ONNX's Floor takes floats only: the model converts, and ONNX Runtime says no."""
    with pytest.raises(Unsupported, match="ONNX Runtime cannot run this sub-graph: .*Floor"):
        BACKEND.compile(IntegerFloor["main"], "onnxruntime.fused", "llvm")


def test_kernel_reads_and_writes_the_callers_buffers_on_every_call():
    graph = DataflowGraph.from_module(WithUnknownOp)
    (matmul_relu,) = [c for c in generate(graph, [BACKEND]) if c.subgraph.nodes == {0, 1}]
    sub = matmul_relu.subgraph.extract()
    kernel = BACKEND.compile(sub, matmul_relu.pattern, "llvm")
    inputs, outputs = runner.to_tensors(runner.random_inputs(sub)), runner.empty_outputs(sub)
    for seed in (1, 2):  # the same buffers, new contents
        arrays = runner.random_inputs(sub, seed)
        for tensor, array in zip(inputs, arrays):
            tensor.copyfrom(array)
        kernel(*inputs, *outputs)
        assert runner.mismatch([o.numpy() for o in outputs], runner.run_reference(sub, arrays)) is None


# ------------------------------------------------------------------ every rule, on the zoo


@pytest.mark.parametrize("name, limit", [("mlp", 20), ("squeezenet", 30), ("bert", 40)])
def test_candidates_match_tvm(name, limit):
    candidates = zoo_candidates(name, BACKEND)
    assert {c.pattern for c in candidates} == {rule.name for rule in BACKEND.rules}
    failures = {
        f"{cand} {'+'.join(cand.subgraph.ops)}": reason
        for cand in sample(candidates, limit)
        if (reason := runner.check_candidate(BACKEND, cand.subgraph.extract(), cand.pattern)) is not None
    }
    assert failures == {}
