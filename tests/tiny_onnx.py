"""A tiny ONNX model written with onnx.helper, for tests that start from a file on disk."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT_SHAPE = (1, 3, 8, 8)
OUTPUT_SHAPE = (1, 10)


def write_tiny_model(path, last_op: str = "Relu", seed: int = 0):
    """conv -> relu -> reshape -> matmul -> ``last_op``, weights from ``seed``; returns ``path``.
    A ``last_op`` TVM's ONNX importer lacks (``Celu``) makes a model it cannot import."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "w"),
        numpy_helper.from_array(rng.standard_normal((8 * 6 * 6, 10)).astype("float32"), "m"),
        numpy_helper.from_array(np.array([1, -1], "int64"), "flat"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["h"]),
        helper.make_node(last_op, ["h"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, INPUT_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, OUTPUT_SHAPE)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
