"""What "matches TVM" means (arrays.mismatch), and the inputs candidates are checked on."""

import numpy as np
from tvm import relax

from collage.measuring.arrays import END_TO_END_RTOL, RTOL, mismatch, random_inputs, tolerance


# -- what "matches" means --


def test_nan_and_infinities_match_position_by_position():
    reference = np.array([1.0, np.nan, -np.inf, np.inf, 2.0], "float32")
    assert mismatch([reference.copy()], [reference]) is None
    shifted = reference.copy()
    shifted[0] = np.nan  # NaN where the reference is finite
    assert "exceeds" in mismatch([shifted], [reference])
    flipped = reference.copy()
    flipped[2] = np.inf  # the other infinity
    assert mismatch([flipped], [reference]) == "output 0: 1 value(s) differ where the reference is NaN or infinite"
    finite = reference.copy()
    finite[1] = 0.0  # a number where the reference has NaN
    assert "NaN or infinite" in mismatch([finite], [reference])


def test_the_tolerance_widens_with_the_operators_a_result_spans_up_to_the_whole_models():
    # HGNetV2 whole on ONNX Runtime: 1.2e-4 of its largest output from TVM, as deep
    # convolution stacks round; one operator's 1e-4 refused it, the model's 1e-3 does not.
    reference = np.linspace(-20.9, 20.9, 64).astype("float32")
    off = reference + np.float32(1.2e-4 * 20.9)
    assert "exceeds 0.0001" in mismatch([off], [reference])
    assert mismatch([off], [reference], ops=100) is None  # a hundred operators deep
    assert tolerance("float32") == RTOL["float32"] and tolerance("float32", 4) == 2 * RTOL["float32"]
    assert tolerance("float32", 10_000) == END_TO_END_RTOL  # never looser than the whole model's check
    assert tolerance("float16", 226) == RTOL["float16"]  # already looser than that: as it was
    assert "exceeds" in mismatch([reference + 1.0], [reference], ops=226)  # a wrong kernel stays wrong


def _unary(op_name: str, shape=(64,)) -> relax.Function:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, op_name)(x))
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_inputs_are_drawn_inside_each_operators_domain():
    (positive,) = random_inputs(_unary("log"))
    (unit,) = random_inputs(_unary("asin"))
    (at_least_one,) = random_inputs(_unary("acosh"))
    (anything,) = random_inputs(_unary("exp"))
    assert positive.min() > 0 and np.abs(unit).max() < 1 and at_least_one.min() >= 1
    assert anything.min() < 0 < anything.max()


def test_a_scalar_input_keeps_its_shape():
    (scalar,) = random_inputs(_unary("exp", shape=()))
    assert scalar.shape == () and scalar.dtype == np.float32


def test_multiply_adds_count_convolutions_and_products():
    # Heavy models get their values from optimized code (``OPTIMIZED_VALUES_MACS``).
    from collage.measuring.build import multiply_adds
    from collage.model.graph import DataflowGraph

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    a = relax.Var("a", relax.TensorType((2, 5), "float32"))
    with bb.function("main", [x, a]):
        with bb.dataflow():
            w = relax.const(np.ones((4, 3, 3, 3), "float32"))
            conv = bb.emit(relax.op.nn.conv2d(x, w))  # (1, 4, 6, 6): 144 outputs of 27 each
            prod = bb.emit(relax.op.matmul(a, relax.const(np.ones((5, 7), "float32"))))  # 14 outputs of 5
            out = bb.emit_output(relax.Tuple([conv, prod]))
        bb.emit_func_output(out)
    assert multiply_adds(DataflowGraph.from_module(bb.get())) == 144 * 27 + 14 * 5
