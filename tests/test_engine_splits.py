"""The engine-splits experiment: its multiply-add count, its cut points, and one run on the MLP."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from experiments import engine_splits


def chain_model():
    """conv 3->4 (3x3, pad 1) on 8x8 -> relu -> conv-transpose 4->2 (2x2, stride 2) -> flatten
    -> matmul by 512x10: a chain, so every tensor between two nodes is a cut point."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w1"),
        numpy_helper.from_array(rng.standard_normal((4, 2, 2, 2)).astype("float32"), "w2"),
        numpy_helper.from_array(np.array([1, -1], "int64"), "flat"),
        numpy_helper.from_array(rng.standard_normal((2 * 16 * 16, 10)).astype("float32"), "m"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "w2"], ["t"], strides=[2, 2]),
        helper.make_node("Reshape", ["t", "flat"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 10))],
        weights,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_multiply_adds_count_conv_conv_transpose_and_matmul():
    from tvm.relax.frontend.onnx import from_onnx

    conv = (4 * 8 * 8) * (3 * 3 * 3)  # each output: Cin x 3 x 3
    transpose = (4 * 8 * 8) * (2 * 2 * 2)  # each input element feeds Cout x 2 x 2 outputs
    matmul = 10 * 512
    assert engine_splits.multiply_adds(from_onnx(chain_model(), keep_params_in_input=False)) == conv + transpose + matmul


def test_cut_points_are_the_tensors_that_alone_cross():
    # After Reshape only "f" crosses; "flat" and "m" are weights, not node outputs.
    assert engine_splits.cut_points(chain_model()) == ["c", "r", "t", "f"]


def test_the_mlp_runs_whole_and_split_on_both_engines():
    result = engine_splits.measure("mlp", threads=1, cuts=2, rounds=2)
    assert set(engine_splits.ENGINES) <= set(result["times_ms"])
    splits = [label for label in result["times_ms"] if "|" in label]
    assert len(splits) == 2 * 2  # two cut points, both directions
    assert all(ms > 0 for ms in result["times_ms"].values())
    assert result["best_engine"] in engine_splits.ENGINES and result["best_split"] in splits
    assert result["gmacs"] > 0 and 0 < result["share_of_peak"]
