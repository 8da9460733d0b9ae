"""Relax -> torch.fx, operator by operator: each converted module, run by PyTorch eagerly,
matches TVM's default pipeline on the same tiny function (``mismatch`` tolerances),
on the ONNX conversion's cases; whole zoo models too; what does not convert says why."""

import numpy as np
import pytest
import torch
from tvm import relax

from collage.candidates.backend import Unsupported
from collage.candidates.fx_convert import CONVERTERS, supports, to_fx
from collage.measuring.arrays import mismatch, random_inputs
from collage.measuring.build import run_reference
from collage.model.graph import DataflowGraph
from tests.helpers import zoo
from tests.test_onnx_convert import CASES, IMG, X, function, t

op = relax.op
nn = relax.op.nn


def run_fx(func, arrays):
    module = to_fx(func)
    with torch.no_grad():
        return [o.numpy() for o in module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))]


def converts(func) -> bool:
    graph = DataflowGraph(func)
    return all(supports(graph, node) is None for node in graph)


# Cases beyond the ONNX conversion's: what differs between the two converters' paths.
# fmt: off
FX_CASES = [
    ("conv_pool_gap", function(lambda x, w: nn.adaptive_avg_pool2d(nn.max_pool2d(
        nn.relu(nn.conv2d(x, w, padding=(1, 1), groups=2)), (3, 3), strides=(2, 2), padding=(1, 1)), (1, 1)),
        IMG, t(6, 2, 3, 3))),
    ("avg_pool_ceil", function(lambda x: nn.avg_pool2d(x, (3, 3), strides=(2, 2), ceil_mode=True), IMG)),
    ("batch_norm", function(lambda x, g, b, m, v: nn.batch_norm(x, g, b, m, v, axis=1)[0],
                            IMG, t(4), t(4), t(4), t(4))),
    ("sin_cos", function(lambda x: op.add(op.sin(x), op.cos(x)), X)),
    ("conv1d", function(lambda x, w: nn.conv1d(x, w, padding=(1, 1), strides=2), t(1, 4, 9), t(2, 4, 3))),
    ("take_2d_indices", function(lambda x, i: op.take(x, i, axis=1), X, t(2, 5, dtype="int64"))),
]
# fmt: on

CONVERTED = [(name, f) for name, f in CASES + FX_CASES if converts(f)]


@pytest.mark.parametrize("func", [f for _, f in CONVERTED], ids=[name for name, _ in CONVERTED])
def test_operator_matches_tvm(func):
    arrays = random_inputs(func)
    if "take" in str(func) or "gather" in str(func):  # indices within the axis
        arrays = [a % 3 if a.dtype.kind == "i" else a for a in arrays]
    if any(a.dtype.kind == "f" for a in arrays) and "batch_norm" in str(func):
        arrays[-1] = np.abs(arrays[-1]) + 0.5  # a variance
    assert mismatch(run_fx(func, arrays), run_reference(func, arrays)) is None


def test_every_converter_is_tested():
    tested = {node.op for _, func in CONVERTED for node in DataflowGraph(func)}
    # call_tir converts simplification's scan kernel only, tested on a loop it rolled up below.
    assert set(CONVERTERS) - tested == {"relax.call_tir"}


@pytest.mark.parametrize("kind", ["linear", "element-wise"])
def test_a_rolled_up_recurrence_is_written_out_again_for_inductor(kind):
    from collage.candidates.subgraph import SubGraph
    from collage.model.frontend import import_model
    from tests.test_onnx_convert import rolled_up_recurrences

    import collage

    net = dict(zip(["linear", "element-wise"], rolled_up_recurrences()))[kind].eval()
    a, b = torch.rand(2, 12, 16), torch.randn(2, 12, 16)
    graph = DataflowGraph.from_module(collage.simplify(import_model(net, example_inputs=(a, b)).mod))
    assert "relax.call_tir" in {node.op for node in graph}  # the loop, one kernel
    assert {node.op: why for node in graph if (why := supports(graph, node))} == {}
    func = SubGraph(graph, frozenset(range(len(graph)))).extract()
    got = run_fx(func, [a.numpy(), b.numpy()])
    assert mismatch(got, run_reference(func, [a.numpy(), b.numpy()])) is None
    with torch.no_grad():
        assert mismatch(got, [net(a, b).numpy()]) is None


def test_what_does_not_convert_says_why():
    graph = DataflowGraph(function(lambda x: op.image.resize2d(x, (12, 20)), IMG))
    assert "relax.image.resize2d has no torch.fx conversion" in supports(graph, graph[0])
    asymmetric = DataflowGraph(function(lambda x, w: nn.conv2d(x, w, padding=(0, 0, 1, 1)), IMG, t(4, 4, 3, 3)))
    assert "asymmetric padding" in supports(asymmetric, asymmetric[0])
    with pytest.raises(Unsupported, match="mixed dtypes"):
        to_fx(function(lambda x, y: op.matmul(x, y, out_dtype="float16"), X, t(4, 2)))


@pytest.mark.parametrize("name", ["mlp", "resnet50", "mobilenet_v2", "bert", "vit", "gpt2", "convnext"])
def test_whole_zoo_model_matches_tvm(name):
    func = zoo(name).relax["main"]
    arrays = random_inputs(func)
    graph = DataflowGraph(func)
    assert {node.op: why for node in graph if (why := supports(graph, node))} == {}
    assert mismatch(run_fx(func, arrays), run_reference(func, arrays)) is None
