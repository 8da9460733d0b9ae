"""The cudnn and cublas backends. Their patterns are matched everywhere; their kernels are
compiled and run against TVM's default result only where PyTorch has a CUDA device, and
skip with the backend's own reason elsewhere."""

import pytest
from collage.backends import cublas, cudnn, dnnl, mkl
from tvm.script import ir as I
from tvm.script import relax as R

from collage.measuring.build import check_candidate, synchronized
from collage.candidates.backend import Unsupported
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from collage.candidates.subgraph import SubGraph
from tests.helpers import failures, sample, with_weights_bound, zoo_candidates


# fmt: off
@I.ir_module
class ResidualBlock:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 8), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
             b: R.Tensor((8,), "float32"),
             xh: R.Tensor((1, 8, 8, 8), "float16"), wh: R.Tensor((8, 8, 3, 3), "float16")):
        with R.dataflow():
            c1 = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])   # 0 conv2d
            bs = R.reshape(b, R.shape([1, 8, 1, 1]))        # 1
            b1 = R.add(c1, bs)                             # 2 conv2d_bias
            r1 = R.nn.relu(b1)                             # 3 conv2d_bias_relu
            c2 = R.nn.conv2d(r1, w, padding=[1, 1, 1, 1])   # 4 conv2d
            a2 = R.add(c2, x)                              # 5 conv2d_add
            z2 = R.nn.relu(a2)                             # 6 conv2d_add_relu
            half = R.nn.conv2d(xh, wh, padding=[1, 1, 1, 1])  # 7 float16: rejected
            out = (z2, half)
            R.output(out)
        return out


@I.ir_module
class Matmuls:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((8, 16), "float32"), b: R.Tensor((8,), "float32"),
             s: R.Tensor((6, 5, 16), "float32"), t: R.Tensor((6, 16, 5), "float32"),
             xi: R.Tensor((4, 16), "int32"), wi: R.Tensor((16, 8), "int32")):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])  # 0
            d = R.matmul(x, wt)                  # 1 dense
            db = R.add(d, b)                     # 2 dense_bias
            r = R.nn.relu(db)                    # 3 dense_bias_relu
            bm = R.matmul(s, t)                  # 4 batch_matmul
            ints = R.matmul(xi, wi)              # 5 int32: rejected
            out = (r, bm, ints)
            R.output(out)
        return out


@I.ir_module
class WideWeights:
    @R.function
    def main(x: R.Tensor((1, 2048, 7, 7), "float32"), w: R.Tensor((2048, 2048, 1, 1), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w)  # 0: 16 MB of weights, within a GPU's cache
            d = R.add(w, w)        # 1: reads them and writes as much
            out = (c, d)
            R.output(out)
        return out
# fmt: on


def found(graph, backend):
    return {(c.pattern, frozenset(c.subgraph.nodes)) for c in generate(graph, [backend])}


def S(*nodes):
    return frozenset(nodes)


def require_gpu(backend):
    reason = backend.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"{backend.name}: {reason}")


# ------------------------------------------------------------------ patterns, everywhere


def test_cudnn_patterns_match():
    assert found(DataflowGraph.from_module(ResidualBlock), cudnn.BACKEND) == {
        ("cudnn.conv2d", S(0)), ("cudnn.conv2d_bias", S(0, 1, 2)), ("cudnn.conv2d_bias_relu", S(0, 1, 2, 3)),
        ("cudnn.conv2d", S(4)), ("cudnn.conv2d_add", S(4, 5)), ("cudnn.conv2d_add_relu", S(4, 5, 6)),
    }  # fmt: skip


def test_cublas_patterns_match():
    assert found(DataflowGraph.from_module(Matmuls), cublas.BACKEND) == {
        ("cublas.dense", S(0, 1)), ("cublas.dense_bias", S(0, 1, 2)), ("cublas.dense_bias_relu", S(0, 1, 2, 3)),
        ("cublas.batch_matmul", S(4)),
    }  # fmt: skip


def without_backend(patterns):
    return {p.name.split(".", 1)[1] for p in patterns}


def test_gpu_libraries_share_the_cpu_libraries_patterns():
    # oneDNN takes 1-D convolutions too, which cuDNN is offered only as PyTorch views them: 2-D.
    conv = {name for name in without_backend(dnnl.BACKEND.patterns) if name.startswith(("conv2d", "conv3d"))}
    assert without_backend(cudnn.BACKEND.patterns) == conv
    assert without_backend(cublas.BACKEND.patterns) == without_backend(mkl.BACKEND.patterns)


def test_float32_only_is_a_clear_refusal():
    # float16 and int32 were rejected by the checks above; asked anyway, compile says why.
    conv16 = SubGraph(DataflowGraph.from_module(ResidualBlock), S(7)).extract()
    with pytest.raises(Unsupported, match="^cudnn.conv2d: float32 only: data is float16$"):
        cudnn.BACKEND.compile(conv16, "cudnn.conv2d", "cuda", 0)
    ints = SubGraph(DataflowGraph.from_module(Matmuls), S(5)).extract()
    with pytest.raises(Unsupported, match="^cublas.dense: float32 only: lhs is int32$"):
        cublas.BACKEND.compile(ints, "cublas.dense", "cuda", 0)


@pytest.mark.parametrize("backend", [cudnn.BACKEND, cublas.BACKEND], ids=lambda b: b.name)
def test_missing_gpu_is_a_reason_not_a_crash(backend):
    import torch

    assert backend.unavailable_reason("llvm") == "does not serve target 'llvm'"
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    func = SubGraph(DataflowGraph.from_module(Matmuls), S(4)).extract()
    reason = "PyTorch has no CUDA device (CPU build or no GPU)"
    assert backend.unavailable_reason("cuda") == reason
    assert check_candidate(backend, func, f"{backend.name}.batch_matmul", "cuda") == reason


# ------------------------------------------------------------------ kernels, on a GPU


@pytest.mark.parametrize("weights", [(), ("w", "b")], ids=["inputs", "constants"])
def test_cudnn_kernels_match_tvm(weights):
    require_gpu(cudnn.BACKEND)
    graph = DataflowGraph.from_module(with_weights_bound(ResidualBlock, weights))
    assert failures(cudnn.BACKEND, generate(graph, [cudnn.BACKEND]), "cuda") == {}


@pytest.mark.parametrize("weights", [(), ("w", "b")], ids=["inputs", "constants"])
def test_cublas_kernels_match_tvm(weights):
    require_gpu(cublas.BACKEND)
    graph = DataflowGraph.from_module(with_weights_bound(Matmuls, weights))
    assert failures(cublas.BACKEND, generate(graph, [cublas.BACKEND]), "cuda") == {}


def test_a_cudnn_kernel_is_captured_without_running_its_benchmark():
    """cuDNN's benchmark (which times algorithms) runs when the kernel is compiled; a CUDA
    graph's capture never runs it, even on a thread where no plan was found, and the replay
    computes what a plain call does."""
    require_gpu(cudnn.BACKEND)
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch
    import tvm
    import tvm_ffi

    from collage.measuring.arrays import empty_outputs, random_inputs, to_tensors
    from collage.measuring.build import compile_kernel

    graph = DataflowGraph.from_module(with_weights_bound(ResidualBlock, ("w", "b")))
    candidate = next(c for c in generate(graph, [cudnn.BACKEND]) if c.pattern == "cudnn.conv2d_bias_relu")
    func = candidate.subgraph.extract()
    kernel, reason = compile_kernel(cudnn.BACKEND, func, candidate.pattern, "cuda", 0)
    assert reason is None
    inputs, (out,) = to_tensors(random_inputs(func), tvm.cuda()), empty_outputs(func, tvm.cuda())
    kernel(*inputs, out)
    expected = out.numpy()

    def captured():  # on a thread of its own, where PyTorch keeps no plan for this shape
        recorded = torch.cuda.CUDAGraph()
        with torch.cuda.graph(recorded, capture_error_mode="thread_local"), tvm_ffi.use_torch_stream():
            kernel(*inputs, out)
        return recorded

    with ThreadPoolExecutor(1) as pool:
        recorded = pool.submit(captured).result()
    out.copyfrom(np.zeros_like(expected))
    recorded.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_a_kernel_timed_cold_reads_its_weights_from_memory_and_is_charged_nothing_else():
    """Timed with the cache flushed before each call (``Timing.cache_flush_bytes``), as inside
    a model whose weights exceed the cache, a kernel reading 16 MB of weights (which fit the
    cache) takes longer than back to back: cuDNN's, replayed from a CUDA graph, and TVM's, its
    VM launching on torch's stream. The flush itself is not charged: an empty launch is free."""
    require_gpu(cudnn.BACKEND)
    import tvm

    from collage.candidates.backend import default_backends
    from collage.measuring.arrays import empty_outputs, random_inputs, to_tensors
    from collage.measuring.build import compile_kernel
    from collage.measuring.cost import gpu_cache_bytes
    from collage.measuring.timing import Timing, time_captured, time_flushed

    warm, cold = Timing(), Timing(cache_flush_bytes=2 * gpu_cache_bytes())
    graph = DataflowGraph.from_module(WideWeights)
    conv = next(c for c in generate(graph, [cudnn.BACKEND]) if c.subgraph.nodes == {0})
    add = next(c for c in generate(graph, [default_backends()["tvm"]]) if c.subgraph.nodes == {1})
    ms = {}
    for candidate in (conv, add):
        func = candidate.subgraph.extract()
        backend = cudnn.BACKEND if candidate is conv else default_backends()["tvm"]
        kernel, reason = compile_kernel(backend, func, candidate.pattern, "cuda", 0)
        assert reason is None
        inputs, outputs = to_tensors(random_inputs(func), tvm.cuda()), empty_outputs(func, tvm.cuda())
        if candidate is conv:
            call = lambda: kernel(*inputs, *outputs)  # noqa: E731
            ms[backend.name] = [time_captured(call, timing).value_ms for timing in (warm, cold)]
        else:
            ms[backend.name] = [kernel.time_ms(inputs, timing).value_ms for timing in (warm, cold)]
    assert all(back_to_back < flushed for back_to_back, flushed in ms.values()), ms
    assert time_flushed(lambda: None, cold).value_ms < 0.01


@pytest.mark.parametrize("backend, model", [(cudnn.BACKEND, "resnet50"), (cublas.BACKEND, "bert")], ids=["cudnn", "cublas"])
def test_zoo_candidates_match_tvm(backend, model):
    require_gpu(backend)
    cands = sample(zoo_candidates(model, backend, simplified=True), limit=30)
    assert cands and failures(backend, cands, "cuda") == {}


# ------------------------------------------------------------------ the whole pipeline, on a GPU


def test_a_cpu_call_is_timed_as_it_is():
    call = lambda: None  # noqa: E731
    assert synchronized(call, "llvm") is call


def test_optimize_on_the_gpu(tmp_path):
    """``optimize(target="cuda")`` over every GPU backend: the module it returns is right
    against torch, and its kernels ran on the GPU (the libraries' and TVM's)."""
    import numpy as np

    import collage
    from collage.backends import tvm as tvm_backend
    from experiments import models
    from tests.helpers import REL_TOL

    for backend in (cudnn.BACKEND, cublas.BACKEND, tvm_backend.BACKEND):
        require_gpu(backend)
    w = models.load("kws_dscnn")
    opt = collage.optimize(w.relax, target="cuda", cost_log=tmp_path / "costs.sqlite", progress=False)
    (expected,) = w.reference()
    (actual,) = opt(*[t.numpy() for t in w.inputs])
    assert np.abs(actual - expected).max() <= REL_TOL * np.abs(expected).max()
    assert {p.backend for p in opt.placement} <= {"cudnn", "cublas", "tvm", "tensorrt", "inductor"}
    assert opt.measured.is_valid


def test_gpt2_optimized_for_the_gpu_matches_torch(tmp_path):
    """GPT-2's GELU takes ``x ** 3`` of negative numbers, which TVM's CUDA build (nvcc's fast
    math) computed as NaN: the reference and every TVM kernel with it were NaN, and every
    right placement was rejected. On a GPU the module is right against torch, and so is the
    reference it was checked against (computed on the CPU)."""
    import numpy as np

    import collage
    from collage.backends import tvm as tvm_backend
    from experiments import models
    from tests.helpers import REL_TOL

    for backend in (cublas.BACKEND, tvm_backend.BACKEND):
        require_gpu(backend)
    w = models.load("gpt2", small=True)
    opt = collage.optimize(w.relax, target="cuda", backends=["tvm", "cublas"], cost_log=tmp_path / "costs.sqlite",
                           progress=False)  # fmt: skip
    (expected,) = w.reference()
    (actual,) = opt(*[t.numpy() for t in w.inputs])
    assert np.isfinite(actual).all() and np.abs(actual - expected).max() <= REL_TOL * np.abs(expected).max()
    assert not opt.fallbacks, opt.report()
