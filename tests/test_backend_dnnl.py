"""The dnnl backend: each pattern matches where it should, its checks reject what oneDNN
cannot run, and every kernel agrees with TVM's default result for the same sub-graph."""

import pytest
from collage.backends import dnnl
from tvm.script import ir as I
from tvm.script import relax as R

from collage.candidates.precision import BFLOAT16, FLOAT32, amx_unavailable
from collage.measuring.arrays import random_inputs, relative_error
from collage.measuring.build import check_candidate, compile_kernel, run_kernel, run_reference
from collage.measuring.cost import cpu_info
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from collage.candidates.subgraph import SubGraph
from tests.helpers import failures, sample, with_weights_bound, zoo_candidates
from tests.test_backend_mkl import Matmuls

BACKEND = dnnl.BACKEND


# fmt: off
@I.ir_module
class ConvBlocks2d:  # every conv2d pattern and both poolings match once, rooted at the comment
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w1: R.Tensor((8, 4, 3, 3), "float32"),
             w: R.Tensor((8, 8, 3, 3), "float32"), wg: R.Tensor((8, 4, 3, 3), "float32"),
             b: R.Tensor((8,), "float32")):
        with R.dataflow():
            c1 = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])                 # 0 conv2d
            r1 = R.nn.relu(c1)                                           # 1 conv2d_relu
            c2 = R.nn.conv2d(r1, w, padding=[1, 1, 1, 1])                 # 2
            bs2 = R.reshape(b, R.shape([1, 8, 1, 1]))                     # 3
            b2 = R.add(c2, bs2)                                          # 4 conv2d_bias
            y2 = R.nn.relu(b2)                                           # 5 conv2d_bias_relu
            c3 = R.nn.conv2d(y2, wg, padding=[1, 1, 1, 1], groups=2)      # 6
            a3 = R.add(y2, c3)                                           # 7 conv2d_add
            z3 = R.nn.relu(a3)                                           # 8 conv2d_add_relu
            c4 = R.nn.conv2d(z3, w, strides=[2, 2], padding=[1, 1, 1, 1])  # 9
            bs4 = R.reshape(b, R.shape([1, 8, 1, 1]))                     # 10
            b4 = R.add(bs4, c4)                                          # 11 conv2d_bias
            p = R.nn.max_pool2d(z3, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])  # 12
            a4 = R.add(b4, p)                                            # 13 conv2d_bias_add
            z4 = R.nn.relu(a4)                                           # 14 conv2d_bias_add_relu
            q = R.nn.avg_pool2d(z4, pool_size=[2, 2], strides=[2, 2])     # 15 avg_pool2d
            R.output(q)
        return q


@I.ir_module
class ConvBlocks3d:  # the bias comes already shaped [1, C, 1, 1, 1]
    @R.function
    def main(x: R.Tensor((1, 2, 4, 6, 6), "float32"), w: R.Tensor((4, 2, 3, 3, 3), "float32"),
             w1: R.Tensor((4, 4, 1, 1, 1), "float32"), b: R.Tensor((1, 4, 1, 1, 1), "float32")):
        with R.dataflow():
            c1 = R.nn.conv3d(x, w, padding=[1, 1, 1, 1, 1, 1])  # 0 conv3d
            b1 = R.add(c1, b)                                   # 1 conv3d_bias
            r1 = R.nn.relu(b1)                                  # 2 conv3d_bias_relu
            c2 = R.nn.conv3d(r1, w1)                            # 3 conv3d
            a2 = R.add(c2, r1)                                  # 4 conv3d_add
            z2 = R.nn.relu(a2)                                  # 5 conv3d_add_relu
            c3 = R.nn.conv3d(z2, w1)                            # 6 conv3d
            b3 = R.add(c3, b)                                   # 7 conv3d_bias
            a3 = R.add(b3, z2)                                  # 8 conv3d_bias_add
            z3 = R.nn.relu(a3)                                  # 9 conv3d_bias_add_relu
            c4 = R.nn.conv3d(z3, w1, strides=[2, 2, 2])         # 10 conv3d
            r4 = R.nn.relu(c4)                                  # 11 conv3d_relu
            R.output(r4)
        return r4


@I.ir_module
class ConvBlocks1d:  # audio: strided, dilated, grouped; the bias as frontends reshape it, [1, C, 1]
    @R.function
    def main(x: R.Tensor((1, 2, 40), "float32"), w: R.Tensor((4, 2, 7), "float32"),
             wd: R.Tensor((4, 2, 3), "float32"), ws: R.Tensor((4, 4, 4), "float32"), b: R.Tensor((4,), "float32")):
        with R.dataflow():
            c1 = R.nn.conv1d(x, w, padding=[3, 3])                              # 0 conv1d
            b1 = R.add(c1, R.reshape(b, [1, 4, 1]))                             # 1, 2 conv1d_bias
            r1 = R.nn.relu(b1)                                                  # 3 conv1d_bias_relu
            c2 = R.nn.conv1d(r1, wd, padding=[3, 3], dilation=[3], groups=2)    # 4 conv1d
            a2 = R.add(c2, r1)                                                  # 5 conv1d_add
            c3 = R.nn.conv1d(a2, ws, strides=[2], padding=[1, 1])               # 6 conv1d
            R.output(c3)
        return c3


@I.ir_module
class NearMisses:  # one thing oneDNN (through PyTorch) cannot do per operator
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((8, 4, 3, 3), "float32"),
             xh: R.Tensor((1, 8, 8, 4), "float32"), wh: R.Tensor((8, 3, 3, 4), "float32"),
             x16: R.Tensor((1, 4, 8, 8), "float16"), w16: R.Tensor((8, 4, 3, 3), "float16"),
             row: R.Tensor((1, 1, 1, 8), "float32")):
        with R.dataflow():
            nhwc = R.nn.conv2d(xh, wh, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI",
                               out_layout="NHWC")                                     # 0 layout
            half = R.nn.conv2d(x16, w16, padding=[1, 1, 1, 1])                         # 1 float16
            lopsided = R.nn.conv2d(x, w, padding=[0, 0, 1, 1])                         # 2 padding
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])                                # 3 conv2d
            by_row = R.add(c, row)                                                     # 4 not per channel
            avg = R.nn.avg_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
                                  ceil_mode=True, count_include_pad=True)              # 5 divisor
            R.output(nhwc, half, lopsided, by_row, avg)
        return (nhwc, half, lopsided, by_row, avg)
# fmt: on


def found(graph):
    return {(c.pattern, frozenset(c.subgraph.nodes)) for c in generate(graph, [BACKEND])}


def S(*nodes):
    return frozenset(nodes)


# ------------------------------------------------------------------ patterns


def test_every_conv2d_and_pool_pattern_matches():
    graph = DataflowGraph.from_module(with_weights_bound(ConvBlocks2d))
    assert found(graph) == {
        ("dnnl.conv2d", S(0)), ("dnnl.conv2d_relu", S(0, 1)),
        ("dnnl.conv2d", S(2)), ("dnnl.conv2d_bias", S(2, 3, 4)), ("dnnl.conv2d_bias_relu", S(2, 3, 4, 5)),
        ("dnnl.conv2d", S(6)), ("dnnl.conv2d_add", S(6, 7)), ("dnnl.conv2d_add_relu", S(6, 7, 8)),
        ("dnnl.conv2d", S(9)), ("dnnl.conv2d_bias", S(9, 10, 11)), ("dnnl.conv2d_bias_add", S(9, 10, 11, 13)),
        ("dnnl.conv2d_bias_add_relu", S(9, 10, 11, 13, 14)),
        ("dnnl.max_pool2d", S(12)), ("dnnl.avg_pool2d", S(15)),
    }  # fmt: skip


def test_every_conv3d_pattern_matches():
    graph = DataflowGraph.from_module(ConvBlocks3d)
    assert found(graph) == {
        ("dnnl.conv3d", S(0)), ("dnnl.conv3d_bias", S(0, 1)), ("dnnl.conv3d_bias_relu", S(0, 1, 2)),
        ("dnnl.conv3d", S(3)), ("dnnl.conv3d_add", S(3, 4)), ("dnnl.conv3d_add_relu", S(3, 4, 5)),
        ("dnnl.conv3d", S(6)), ("dnnl.conv3d_bias", S(6, 7)), ("dnnl.conv3d_bias_add", S(6, 7, 8)),
        ("dnnl.conv3d_bias_add_relu", S(6, 7, 8, 9)), ("dnnl.conv3d", S(10)), ("dnnl.conv3d_relu", S(10, 11)),
    }  # fmt: skip


def test_every_kind_of_conv1d_matches():
    graph = DataflowGraph.from_module(with_weights_bound(ConvBlocks1d))
    assert found(graph) == {
        ("dnnl.conv1d", S(0)), ("dnnl.conv1d_bias", S(0, 1, 2)), ("dnnl.conv1d_bias_relu", S(0, 1, 2, 3)),
        ("dnnl.conv1d", S(4)), ("dnnl.conv1d_add", S(4, 5)), ("dnnl.conv1d", S(6)),
    }  # fmt: skip


def test_checks_reject_what_onednn_cannot_run():
    # NHWC, float16, lopsided padding, a bias along W, an average pool TVM divides differently:
    # only the plain convolution at 3 is left.
    assert found(DataflowGraph.from_module(NearMisses)) == {("dnnl.conv2d", S(3))}


def test_declares_every_combination():
    names = {p.name for p in BACKEND.patterns}
    assert len(names) == 29 and {"dnnl.conv1d_bias_add_relu", "dnnl.conv3d_bias_add_relu", "dnnl.max_pool2d",
                                 "dnnl.avg_pool2d"} <= names


# ------------------------------------------------------------------ kernels against TVM


@pytest.mark.parametrize("module", [ConvBlocks1d, ConvBlocks2d, ConvBlocks3d], ids=["1d", "2d", "3d"])
def test_kernels_match_tvm_with_constant_weights(module):
    graph = DataflowGraph.from_module(with_weights_bound(module))
    assert failures(BACKEND, generate(graph, [BACKEND])) == {}


@pytest.mark.parametrize("module", [ConvBlocks1d, ConvBlocks2d], ids=["1d", "2d"])
def test_kernels_match_tvm_with_weights_as_inputs(module):
    graph = DataflowGraph.from_module(module)  # unpacked weights, read on each call
    assert failures(BACKEND, generate(graph, [BACKEND])) == {}


@pytest.mark.parametrize("weights", [(), ("w", "b", "v", "c")], ids=["inputs", "constants"])
def test_dense_kernels_match_tvm(weights):
    graph = DataflowGraph.from_module(with_weights_bound(Matmuls, weights))
    dense = [c for c in generate(graph, [BACKEND]) if "dense" in c.pattern]
    # Weights transposed (w) or not (v); bias first or last; leading dimensions folded.
    assert {c.pattern for c in dense} == {"dnnl.dense", "dnnl.dense_bias", "dnnl.dense_bias_relu"}
    assert failures(BACKEND, dense) == {}


def test_unsupported_is_a_reason_not_a_crash():
    graph = DataflowGraph.from_module(NearMisses)
    half = SubGraph(graph, S(1)).extract()
    assert check_candidate(BACKEND, half, "dnnl.conv2d") == "unsupported: dnnl.conv2d: float32 only: data is float16"
    nhwc = SubGraph(graph, S(0)).extract()
    assert "layouts NCHW/OIHW only, not NHWC/OHWI" in check_candidate(BACKEND, nhwc, "dnnl.conv2d")
    conv_and_row = SubGraph(graph, S(3, 4)).extract()
    assert check_candidate(BACKEND, conv_and_row, "dnnl.conv2d") == (
        "unsupported: dnnl.conv2d does not cover this sub-graph (relax.nn.conv2d -> relax.add)"
    )
    assert check_candidate(BACKEND, conv_and_row, "dnnl.softmax").startswith(
        "unsupported: no pattern named 'dnnl.softmax'; known: dnnl.conv1d, "
    )


NO_BF16 = amx_unavailable(cpu_info()["isa"])


# fmt: off
@I.ir_module
class Dense:  # large enough that oneDNN takes its bf16 path: on a 4x16x8 product it keeps float32
    @R.function
    def main(x: R.Tensor((16, 64), "float32"), w: R.Tensor((32, 64), "float32"), b: R.Tensor((32,), "float32")):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])
            d = R.add(R.matmul(x, wt), b)
            R.output(d)
        return d
# fmt: on


@pytest.mark.skipif(NO_BF16 is not None, reason=str(NO_BF16))
def test_convolutions_and_dense_layers_compute_in_bfloat16_where_asked_and_restore_the_math_mode():
    import torch

    graph = DataflowGraph.from_module(with_weights_bound(ConvBlocks2d))
    dense_graph = DataflowGraph.from_module(with_weights_bound(Dense))
    chosen = [next(c for c in generate(g, [BACKEND]) if c.pattern == name)
              for g, name in ((graph, "dnnl.conv2d_bias_relu"), (dense_graph, "dnnl.dense_bias"))]
    assert BACKEND.reduced_precisions("llvm") == (BFLOAT16,)
    for c in chosen:
        func = c.subgraph.extract()
        arrays = random_inputs(func)
        expected = run_reference(func, arrays)
        errors = {}
        for precision in (FLOAT32, BFLOAT16):
            kernel, reason = compile_kernel(BACKEND, func, c.pattern, "llvm", 1, precision=precision)
            assert reason is None
            errors[precision] = relative_error(run_kernel(kernel, func, arrays), expected)
        # bfloat16 keeps 8 bits of mantissa: its rounding shows, well within a percent.
        assert errors[FLOAT32] < 1e-5 < errors[BFLOAT16] < 1e-2, (c.pattern, errors)
    assert torch.backends.mkldnn.conv.fp32_precision == torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_pooling_has_no_bfloat16_kernel():
    graph = DataflowGraph.from_module(with_weights_bound(ConvBlocks2d))
    pool = SubGraph(graph, S(12)).extract()
    _, reason = compile_kernel(BACKEND, pool, "dnnl.max_pool2d", "llvm", 1, precision=BFLOAT16)
    assert reason == "unsupported: oneDNN pools in float32 only, not bfloat16"


def test_serves_cpu_only():
    assert BACKEND.unavailable_reason("llvm") is None  # this PyTorch build has oneDNN
    assert BACKEND.unavailable_reason("cuda") == "does not serve target 'cuda'"


# ------------------------------------------------------------------ zoo


@pytest.mark.parametrize(
    "model, expected",
    [
        ("squeezenet", {"dnnl.conv2d_bias_relu", "dnnl.max_pool2d"}),  # conv + reshaped bias + relu
        ("resnet50", {"dnnl.conv2d_bias_relu", "dnnl.conv2d_bias_add_relu"}),  # BatchNorm folded
    ],
)
def test_zoo_candidates_match_tvm(model, expected):
    cands = zoo_candidates(model, BACKEND, simplified=True)
    assert expected <= {c.pattern for c in cands}
    assert failures(BACKEND, sample(cands, limit=30)) == {}


def test_bfloat16_is_offered_only_where_onednn_would_compute_in_it():
    # oneDNN's float32 math mode takes bfloat16 kernels on AMX only; on AVX512_BF16 alone it
    # keeps float32 ones, so offering bfloat16 there would measure every candidate twice.
    assert "only on AMX" in amx_unavailable(["avx2", "avx512f", "avx512_bf16"])
    assert amx_unavailable(["avx512_bf16", "amx_tile", "amx_bf16"]) is None
    assert BACKEND.reduced_precisions("llvm") == (() if NO_BF16 else (BFLOAT16,))
