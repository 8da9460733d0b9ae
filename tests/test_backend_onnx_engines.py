"""The engines that run a sub-graph as an ONNX model: onnxruntime and openvino on CPU,
tensorrt on CUDA. Their rule on graphs, their kernels against TVM's results, and the
reason each gives when it cannot run. Kernel checks take the candidates the rule grows on
small zoo models, one per structural key, sampled so every operator seen is covered.
"""

import importlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from collage.measuring.arrays import empty_outputs, mismatch, random_inputs, relative_error, to_tensors
from collage.measuring.build import check_candidate, compile_kernel, run_kernel, run_reference
from collage.candidates.backend import GRAPH_LEVEL, Unsupported
from collage.backends import tensorrt as tensorrt_backend
from collage.candidates.precision import BFLOAT16, FLOAT32, INT8, bf16_unavailable, int8_unavailable
from collage.measuring.cost import cpu_info
from collage.backends.tvm import BACKEND as TVM
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from tests.helpers import failures, sample, zoo_candidates, zoo_graph

ENGINES = [("onnxruntime", "llvm"), ("openvino", "llvm"), ("tensorrt", "cuda")]
CPU_ENGINES = [e for e in ENGINES if e[1] == "llvm"]


def engine(name):
    return importlib.import_module(f"collage.backends.{name}").BACKEND


def runnable(backend, target):
    reason = backend.unavailable_reason(target)
    if reason is not None:
        pytest.skip(f"{backend.name} cannot run here: {reason}")
    return backend


# fmt: off
@I.ir_module
class WithUnknownOp:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)          # 0
            b = R.nn.relu(a)            # 1
            c = R.cumprod(b, axis=1)    # 2: ONNX has no CumProd
            d = R.nn.relu(c)            # 3
            R.output(d)
        return d


@I.ir_module
class ZeroPadThenMaxPool:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], "constant", 0.0)  # zeros, not MaxPool's -inf
            y = R.nn.max_pool2d(p, pool_size=[3, 3], strides=[2, 2])
            R.output(y)
        return y


@I.ir_module
class UnsignedNegative:
    @R.function
    def main(x: R.Tensor((4,), "uint8")):
        with R.dataflow():
            y = R.negative(x)
            R.output(y)
        return y
# fmt: on


# ------------------------------------------------------------------ everywhere


@pytest.mark.parametrize("name, target", ENGINES)
def test_record(name, target):
    backend = engine(name)
    assert (backend.name, backend.kind, backend.targets) == (name, GRAPH_LEVEL, (target,))
    assert [rule.name for rule in backend.rules] == [f"{name}.fused"]
    other = "cuda" if target == "llvm" else "llvm"
    assert backend.unavailable_reason(other) == f"does not serve target {other!r}"


def test_library_versions_are_named():
    assert engine("onnxruntime").library.startswith("ONNX Runtime 1.")
    assert engine("openvino").library.startswith("OpenVINO 20")


def test_openvino_offers_bfloat16_only_where_the_cpu_computes_it_natively():
    native = bf16_unavailable(cpu_info()["isa"]) is None
    assert engine("openvino").reduced_precisions("llvm") == ((BFLOAT16,) if native else ())
    assert bf16_unavailable(["avx2", "fma"]) == "this CPU has neither AVX512_BF16 nor AMX (flags: avx2 fma)"
    assert bf16_unavailable(["avx2", "amx_bf16"]) is None


def test_onnx_runtime_offers_int8_where_the_cpu_has_avx2():
    has_avx2 = int8_unavailable(cpu_info()["isa"]) is None
    assert engine("onnxruntime").reduced_precisions("llvm") == ((INT8,) if has_avx2 else ())
    assert int8_unavailable(["sse4_2"]) == "this CPU has no AVX2 for int8 kernels"


WEIGHT = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")


# fmt: off
@I.ir_module
class Dense:  # a matmul with a constant weight, as a model's layers are
    @R.function
    def main(x: R.Tensor((16, 64), "float32")):
        with R.dataflow():
            w = R.const(WEIGHT)
            d = R.nn.relu(R.matmul(x, w))
            R.output(d)
        return d
# fmt: on


@pytest.mark.skipif(int8_unavailable(cpu_info()["isa"]) is not None, reason=str(int8_unavailable(cpu_info()["isa"])))
def test_onnx_runtime_computes_matmuls_with_constant_weights_in_int8():
    backend = engine("onnxruntime")
    func = DataflowGraph.from_module(Dense).func
    arrays = random_inputs(func)
    expected = run_reference(func, arrays)
    errors = {}
    for precision in (FLOAT32, INT8):
        kernel, reason = compile_kernel(backend, func, "onnxruntime.fused", "llvm", 1, precision=precision)
        assert reason is None
        errors[precision] = relative_error(run_kernel(kernel, func, arrays), expected)
    # Weights and inputs rounded to 8 bits: about a percent off, far from float32's noise.
    assert errors[FLOAT32] < 1e-5 < 1e-3 < errors[INT8] < 5e-2, errors
    nothing_to_quantize = DataflowGraph.from_module(WithUnknownOp)  # its matmul's weight is an input
    (matmul_relu,) = [c for c in generate(nothing_to_quantize, [backend]) if c.subgraph.nodes == {0, 1}]
    _, reason = compile_kernel(backend, matmul_relu.subgraph.extract(), "onnxruntime.fused", "llvm", 1, precision=INT8)
    assert reason == "unsupported: int8: no matmul with a constant weight to quantize"


def test_onnx_runtime_keeps_a_zero_pad_before_a_max_pool():
    # ONNX Runtime's Pad_Fusion would make the Pad the pool's own padding, -inf: on negative
    # inputs every window over the border would give a negative maximum instead of the 0.
    backend = runnable(engine("onnxruntime"), "llvm")
    func = DataflowGraph.from_module(ZeroPadThenMaxPool).func
    arrays = [-np.abs(a) - 0.5 for a in random_inputs(func)]
    kernel, reason = compile_kernel(backend, func, "onnxruntime.fused", "llvm", 1)
    assert reason is None
    (actual,) = run_kernel(kernel, func, arrays)
    assert mismatch([actual], run_reference(func, arrays)) is None
    assert actual[..., 0, 0].max() == 0.0  # a corner window: four negative values and five zeros


@pytest.mark.parametrize("name, target", ENGINES)
def test_rule_excludes_what_does_not_convert(name, target):
    cands = generate(DataflowGraph.from_module(WithUnknownOp), [engine(name)])
    assert {c.pattern for c in cands} == {f"{name}.fused"}
    assert {frozenset(c.subgraph.nodes) for c in cands} == {frozenset(s) for s in ({0}, {0, 1}, {1}, {3})}


@pytest.mark.parametrize("name, target", ENGINES)
def test_rule_on_a_zoo_model_groups_like_tvm(name, target):
    """Every MLP operator converts, so the rule finds exactly TVM's fusion groups, and the
    engine's one region is the whole graph."""
    found = zoo_candidates("mlp", engine(name))
    groups = {frozenset(c.subgraph.nodes) for c in found if c.pattern == f"{name}.fused"}
    assert groups == {frozenset(c.subgraph.nodes) for c in generate(zoo_graph("mlp"), [TVM])}
    regions = [c.subgraph.nodes for c in found if c.pattern == f"{name}.region"]
    assert regions == [frozenset(range(len(zoo_graph("mlp"))))]


@pytest.mark.parametrize("name, target", ENGINES)
def test_missing_library_is_a_reason_not_a_crash(name, target, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # `import <library>` now fails
    monkeypatch.delitem(sys.modules, f"collage.backends.{name}")
    reloaded = importlib.import_module(f"collage.backends.{name}").BACKEND
    assert reloaded.unavailable_reason(target) == f"missing Python module(s): {name}"
    func = DataflowGraph.from_module(WithUnknownOp).func
    assert check_candidate(reloaded, func, f"{name}.fused", target) == f"missing Python module(s): {name}"


def test_tensorrt_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(tensorrt_backend.tvm, "cuda", lambda: SimpleNamespace(exist=False))
    assert tensorrt_backend.BACKEND.probe("cuda") == "no CUDA device visible to TVM"


class FakeEngine:
    """What the TensorRT kernel reads of an engine: its I/O tensor names and a context."""

    def __init__(self, names):
        self.names, self.calls = names, []
        self.num_io_tensors = len(names)

    def get_tensor_name(self, i):
        return self.names[i]

    def create_execution_context(self):
        fake = self

        class Context:
            def set_tensor_address(self, name, address):
                fake.calls.append((name, address))

            def execute_async_v3(self, stream):
                fake.calls.append(("run", stream))
                return True

        return Context()


def test_tensorrt_kernel_binds_device_pointers_by_name(monkeypatch):
    """Without a GPU: the kernel's bookkeeping, on CPU tensors and a CPU 'stream'."""
    monkeypatch.setattr(tensorrt_backend.tvm, "cuda", tvm.cpu)
    trt_engine = FakeEngine(["x", "out0"])  # TensorRT dropped the unread input "shape_only"
    kernel = tensorrt_backend._EngineKernel(trt_engine, ["x", "shape_only", "out0"])
    x, unread, out = (tvm.runtime.empty((2, 2), "float32", tvm.cpu()) for _ in range(3))
    kernel(x, unread, out)
    assert trt_engine.calls == [("x", x.data_ptr()), ("out0", out.data_ptr()), ("run", 0)]


# ------------------------------------------------------------------ where the engine runs


@pytest.mark.parametrize("name, target", CPU_ENGINES)
def test_unknown_operator_excludes_the_candidate_with_its_reason(name, target):
    backend, func = engine(name), DataflowGraph.from_module(WithUnknownOp).func
    with pytest.raises(Unsupported, match="relax.cumprod has no ONNX conversion"):
        backend.compile(func, f"{name}.fused", target, 0)
    reason = check_candidate(backend, func, f"{name}.fused", target)
    assert reason == "unsupported: operator relax.cumprod has no ONNX conversion"


def test_what_onnx_runtime_rejects_is_unsupported():
    """ONNX's Neg takes signed numbers and floats only: the model converts, and ONNX Runtime says no."""
    with pytest.raises(Unsupported, match="ONNX Runtime cannot run this sub-graph: .*uint8"):
        engine("onnxruntime").compile(UnsignedNegative["main"], "onnxruntime.fused", "llvm", 0)


@pytest.mark.parametrize("name, target", CPU_ENGINES)
def test_kernel_reads_and_writes_the_callers_buffers_on_every_call(name, target):
    backend = engine(name)
    graph = DataflowGraph.from_module(WithUnknownOp)
    (matmul_relu,) = [c for c in generate(graph, [backend]) if c.subgraph.nodes == {0, 1}]
    sub = matmul_relu.subgraph.extract()
    kernel = backend.compile(sub, matmul_relu.pattern, target, 0)
    inputs, outputs = to_tensors(random_inputs(sub)), empty_outputs(sub)
    for seed in (1, 2):  # the same buffers, new contents
        arrays = random_inputs(sub, seed)
        for tensor, array in zip(inputs, arrays):
            tensor.copyfrom(array)
        kernel(*inputs, *outputs)
        assert mismatch([o.numpy() for o in outputs], run_reference(sub, arrays)) is None


@pytest.mark.parametrize("name, target", ENGINES)
@pytest.mark.parametrize("model, limit", [("mlp", 20), ("squeezenet", 30), ("bert", 40)])
def test_candidates_match_tvm(name, target, model, limit):
    backend = runnable(engine(name), target)
    candidates = zoo_candidates(model, backend)
    patterns = {c.pattern for c in candidates}
    assert {f"{name}.fused", f"{name}.region"} <= patterns <= {f"{name}.fused", f"{name}.region", f"{name}.part"}
    assert failures(backend, sample(candidates, limit), target) == {}
