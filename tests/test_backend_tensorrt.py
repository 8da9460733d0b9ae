"""The tensorrt backend: its record and rule everywhere; its kernels against TVM's results
only where TensorRT and a CUDA device are present (skipped with the reason otherwise)."""

import importlib
import sys
from types import SimpleNamespace

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from collage import runner
from collage.backend import GRAPH_LEVEL
from collage.backends import tensorrt as tensorrt_backend
from collage.backends.tensorrt import BACKEND
from collage.backends.tvm import BACKEND as TVM
from collage.candidates import generate
from collage.graph import DataflowGraph
from experiments import models
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
# fmt: on


def test_record():
    assert (BACKEND.name, BACKEND.kind, BACKEND.targets) == ("tensorrt", GRAPH_LEVEL, ("cuda",))
    assert BACKEND.requires == ("tensorrt",)
    assert [rule.name for rule in BACKEND.rules] == ["tensorrt.fused"]
    assert BACKEND.unavailable_reason("llvm") == "does not serve target 'llvm'"


def test_rule_excludes_what_does_not_convert():
    cands = generate(DataflowGraph.from_module(WithUnknownOp), [BACKEND])
    assert {c.pattern for c in cands} == {"tensorrt.fused"}
    assert {frozenset(c.subgraph.nodes) for c in cands} == {frozenset(s) for s in ({0}, {0, 1}, {1}, {3})}


def test_rule_on_a_zoo_model_groups_like_tvm():
    """Every MLP operator converts, so the rule finds exactly TVM's fusion groups."""
    graph = DataflowGraph.from_module(models.load("mlp", small=True).relax)
    groups = {frozenset(c.subgraph.nodes) for c in generate(graph, [BACKEND])}
    assert groups == {frozenset(c.subgraph.nodes) for c in generate(graph, [TVM])}


def test_missing_library_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` now fails
    monkeypatch.delitem(sys.modules, "collage.backends.tensorrt")
    reloaded = importlib.import_module("collage.backends.tensorrt")
    assert reloaded.BACKEND.unavailable_reason("cuda") == "missing Python module(s): tensorrt"


def test_no_gpu_is_a_reason(monkeypatch):
    monkeypatch.setattr(tensorrt_backend.tvm, "cuda", lambda: SimpleNamespace(exist=False))
    assert BACKEND.probe("cuda") == "no CUDA device visible to TVM"


class FakeEngine:
    """What the kernel reads of a TensorRT engine: its I/O tensor names and a context."""

    def __init__(self, names):
        self.names, self.calls = names, []
        self.num_io_tensors = len(names)

    def get_tensor_name(self, i):
        return self.names[i]

    def create_execution_context(self):
        engine = self

        class Context:
            def set_tensor_address(self, name, address):
                engine.calls.append((name, address))

            def execute_async_v3(self, stream):
                engine.calls.append(("run", stream))
                return True

        return Context()


def test_kernel_binds_device_pointers_by_name(monkeypatch):
    """Without a GPU: the kernel's bookkeeping, on CPU tensors and a CPU 'stream'."""
    monkeypatch.setattr(tensorrt_backend.tvm, "cuda", tvm.cpu)
    engine = FakeEngine(["x", "out0"])  # TensorRT dropped the unread input "shape_only"
    kernel = tensorrt_backend._EngineKernel(engine, ["x", "shape_only", "out0"])
    x, unread, out = (tvm.runtime.empty((2, 2), "float32", tvm.cpu()) for _ in range(3))
    kernel(x, unread, out)
    assert engine.calls == [("x", x.data_ptr()), ("out0", out.data_ptr()), ("run", 0)]


# ------------------------------------------------------------------ kernels, on a GPU


@pytest.mark.parametrize("name, limit", [("mlp", 20), ("squeezenet", 30), ("bert", 40)])
def test_candidates_match_tvm(name, limit):
    reason = BACKEND.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"TensorRT cannot run here: {reason}")
    failures = {
        f"{cand} {'+'.join(cand.subgraph.ops)}": reason
        for cand in sample(zoo_candidates(name, BACKEND), limit)
        if (reason := runner.check_candidate(BACKEND, cand.subgraph.extract(), cand.pattern, "cuda")) is not None
    }
    assert failures == {}
