"""The mkl backend: each pattern matches where it should, its checks reject what MKL's GEMM
cannot run, and every kernel agrees with TVM's default result for the same sub-graph."""

import pytest
from collage.backends import mkl
from tvm.script import ir as I
from tvm.script import relax as R

from collage.measuring.build import check_candidate
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from collage.candidates.subgraph import SubGraph
from tests.helpers import failures, sample, with_weights_bound, zoo_candidates

BACKEND = mkl.BACKEND


# fmt: off
@I.ir_module
class Matmuls:  # every pattern matches, rooted at the comment
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((8, 16), "float32"), b: R.Tensor((8,), "float32"),
             v: R.Tensor((8, 16), "float32"), c: R.Tensor((1, 16), "float32"),
             q: R.Tensor((2, 3, 4, 16), "float32"), k: R.Tensor((2, 3, 8, 16), "float32"),
             s: R.Tensor((6, 5, 16), "float32"), t: R.Tensor((6, 16, 5), "float32")):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])       # 0
            d = R.matmul(x, wt)                       # 1 dense: a torch Linear's weight, transposed
            db = R.add(b, d)                          # 2 dense_bias, bias first as frontends write it
            r = R.nn.relu(db)                         # 3 dense_bias_relu
            r3 = R.reshape(r, R.shape([2, 2, 8]))     # 4
            e = R.matmul(r3, v)                       # 5 dense: leading dimensions fold into rows
            eb = R.add(e, c)                          # 6 dense_bias
            kt = R.permute_dims(k, axes=[0, 1, 3, 2])  # 7
            att = R.matmul(q, kt)                     # 8 batch_matmul, 4-D, transposed right operand
            bm = R.matmul(s, t)                       # 9 batch_matmul
            out = (eb, att, bm)                       # 10
            R.output(out)
        return out


@I.ir_module
class NearMisses:  # one thing MKL's float32 GEMM cannot do per matmul
    @R.function
    def main(xi: R.Tensor((4, 16), "int32"), wi: R.Tensor((16, 8), "int32"),
             xh: R.Tensor((4, 16), "float16"), wh: R.Tensor((16, 8), "float16"),
             s: R.Tensor((6, 5, 16), "float32"), t: R.Tensor((1, 16, 5), "float32"),
             q: R.Tensor((2, 3, 4, 16), "float32"), k: R.Tensor((3, 2, 16, 8), "float32"),
             x: R.Tensor((4, 16), "float32"), vec: R.Tensor((16,), "float32"),
             w: R.Tensor((16, 8), "float32"), full: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            ints = R.matmul(xi, wi)                    # 0 int32
            half = R.matmul(xh, wh)                    # 1 float16
            bcast = R.matmul(s, t)                     # 2 batch dimensions broadcast
            kp = R.permute_dims(k, axes=[1, 0, 2, 3])  # 3
            mixed = R.matmul(q, kp)                    # 4 a permutation BLAS cannot read as a transpose: left out
            mv = R.matmul(x, vec)                      # 5 matrix-vector
            d = R.matmul(x, w)                         # 6 dense
            by_row = R.add(d, full)                    # 7 a bias that is not one value per column
            out = (ints, half, bcast, mixed, mv, by_row)
            R.output(out)
        return out
# fmt: on


def found(graph):
    return {(c.pattern, frozenset(c.subgraph.nodes)) for c in generate(graph, [BACKEND])}


def S(*nodes):
    return frozenset(nodes)


# ------------------------------------------------------------------ patterns


def test_every_pattern_matches():
    assert found(DataflowGraph.from_module(Matmuls)) == {
        ("mkl.dense", S(0, 1)), ("mkl.dense_bias", S(0, 1, 2)), ("mkl.dense_bias_relu", S(0, 1, 2, 3)),
        ("mkl.dense", S(5)), ("mkl.dense_bias", S(5, 6)),
        ("mkl.batch_matmul_transposed", S(7, 8)), ("mkl.batch_matmul", S(8)), ("mkl.batch_matmul", S(9)),
    }  # fmt: skip


def test_checks_reject_what_mkl_cannot_run():
    # int32, float16, broadcast batch, a non-transpose permutation, matrix-vector, a full-size
    # "bias": only the plain dense at 6 is left, and the matmul at 4 without the permutation
    # (which another kernel computes).
    assert found(DataflowGraph.from_module(NearMisses)) == {("mkl.dense", S(6)), ("mkl.batch_matmul", S(4))}


# ------------------------------------------------------------------ kernels against TVM


@pytest.mark.parametrize("weights", [(), ("w", "b", "v", "c")], ids=["inputs", "constants"])
def test_kernels_match_tvm(weights):
    graph = DataflowGraph.from_module(with_weights_bound(Matmuls, weights))
    assert failures(BACKEND, generate(graph, [BACKEND])) == {}


def test_unsupported_is_a_reason_not_a_crash():
    graph = DataflowGraph.from_module(NearMisses)
    ints, half = SubGraph(graph, S(0)).extract(), SubGraph(graph, S(1)).extract()
    assert check_candidate(BACKEND, ints, "mkl.dense") == "unsupported: mkl.dense: float32 only: lhs is int32"
    assert check_candidate(BACKEND, half, "mkl.dense") == "unsupported: mkl.dense: float32 only: lhs is float16"
    bcast = SubGraph(graph, S(2)).extract()
    assert check_candidate(BACKEND, bcast, "mkl.batch_matmul") == (
        "unsupported: mkl.batch_matmul: batch matmul needs equal batch dimensions, not (6, 5, 16) @ (1, 16, 5)"
    )
    assert check_candidate(BACKEND, SubGraph(graph, S(6)).extract(), "mkl.conv2d").startswith(
        "unsupported: no pattern named 'mkl.conv2d'"
    )


def test_serves_cpu_only():
    assert BACKEND.unavailable_reason("llvm") is None  # this PyTorch build has MKL
    assert BACKEND.unavailable_reason("cuda") == "does not serve target 'cuda'"


# ------------------------------------------------------------------ zoo


@pytest.mark.parametrize(
    "model, expected",
    [
        ("mlp", {"mkl.dense_bias", "mkl.dense_bias_relu"}),  # Linear: permute_dims(W), matmul, add
        ("bert", {"mkl.dense_bias", "mkl.batch_matmul"}),  # projections and attention
    ],
)
def test_zoo_candidates_match_tvm(model, expected):
    cands = zoo_candidates(model, BACKEND, simplified=True)
    assert expected <= {c.pattern for c in cands}
    assert failures(BACKEND, sample(cands)) == {}  # every distinct one: BERT's layers repeat
