"""collage.simplify: each rewrite fires where it must, leaves near-misses alone, and keeps
the numbers; over the zoo, the simplified module matches torch and never has more ops.

Numerical checks compile with TVM's default pipeline, unoptimized by LLVM as collage's own
references are (``collage.measuring.build.reference_vm``), on seeded inputs: small graphs
agree within rtol 1e-5 and atol 1e-5 * max|expected| (float32).
"""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import collage
from collage.measuring.build import reference_vm
from collage.model.simplify import op_count, op_histogram
from experiments import models
from tests.helpers import zoo

RNG = np.random.default_rng(0)


def _random(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _positive(*shape):
    return RNG.uniform(0.5, 2.0, shape).astype("float32")


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    vm = reference_vm(mod)
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [t.numpy() for t in out]


def _assert_close(actual, expected, tolerance):
    for a, e in zip(actual, expected, strict=True):
        atol = tolerance * max(np.abs(e).max(), 1e-30)
        np.testing.assert_allclose(a, e, rtol=tolerance, atol=atol)


def _assert_same_numbers(before: tvm.IRModule, after: tvm.IRModule, tolerance=1e-5):
    seeded = np.random.default_rng(1)
    inputs = [
        seeded.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
        for p in before["main"].params
    ]
    _assert_close(_run(after, inputs), _run(before, inputs), tolerance)


def _simplify(mod):
    """Simplify, check the numbers did not change, and return the module and its report."""
    simplified, report = collage.simplify(mod, report=True)
    _assert_same_numbers(mod, simplified)
    return simplified, report


def _module(input_shape, build) -> tvm.IRModule:
    """``main(x)`` returning ``build(bb, x)``, for a float32 ``x`` of ``input_shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(input_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _conv(bb, op, data, weight_shape, **attrs):
    return bb.emit(op(data, relax.const(_random(*weight_shape)), **attrs))


def _batch_norm(bb, data, channels, axis=1, training=False):
    gamma, beta, mean = (relax.const(_random(channels)) for _ in range(3))
    var = relax.const(_positive(channels))
    bn = relax.op.nn.batch_norm(data, gamma, beta, mean, var, axis=axis, training=training)
    return bb.emit(relax.TupleGetItem(bb.emit(bn), 0))


# --------------------------------------------------------------------------- BatchNorm

nn = relax.op.nn
# name: (input shape, convolution, weight shape, its attributes, channel axis of its output)
CONV_BN_CASES = {
    "conv1d": ((1, 3, 16), nn.conv1d, (4, 3, 3), {}, 1),
    "conv2d": ((1, 3, 8, 8), nn.conv2d, (4, 3, 3, 3), {}, 1),
    "conv2d_grouped": ((1, 6, 8, 8), nn.conv2d, (6, 2, 3, 3), {"groups": 3}, 1),
    "conv2d_nhwc": (
        (1, 8, 8, 3), nn.conv2d, (3, 3, 3, 4), {"data_layout": "NHWC", "kernel_layout": "HWIO"}, 3,
    ),
    "conv3d": ((1, 3, 4, 8, 8), nn.conv3d, (4, 3, 3, 3, 3), {}, 1),
    "conv1d_transpose": ((1, 3, 16), nn.conv1d_transpose, (3, 4, 3), {"strides": 2}, 1),
    "conv2d_transpose": ((1, 3, 8, 8), nn.conv2d_transpose, (3, 4, 3, 3), {"strides": 2}, 1),
}


@pytest.mark.parametrize("case", CONV_BN_CASES)
def test_batch_norm_folds_into_the_convolution(case):
    shape, conv, weight_shape, attrs, axis = CONV_BN_CASES[case]

    def build(bb, x):
        y = _conv(bb, conv, x, weight_shape, **attrs)
        return nn.relu(_batch_norm(bb, y, int(y.ty.shape.values[axis]), axis))

    after, report = _simplify(_module(shape, build))
    conv_op = f"relax.nn.{conv.__name__}"
    assert op_histogram(after) == {conv_op: 1, "relax.add": 1, "relax.nn.relu": 1}
    assert report.applied("batch_norm_to_affine") == 1
    assert report.applied("fold_scale_into_conv") == 1


def test_batch_norm_after_a_consumer_of_the_conv_becomes_a_multiply_add():
    def build(bb, x):
        y = bb.emit(nn.relu(_conv(bb, nn.conv2d, x, (4, 3, 3, 3))))
        return _batch_norm(bb, y, 4)

    after, report = _simplify(_module((1, 3, 8, 8), build))
    assert op_histogram(after) == {
        "relax.nn.conv2d": 1, "relax.nn.relu": 1, "relax.multiply": 1, "relax.add": 1,
    }
    assert report.applied("fold_scale_into_conv") == 0


def test_batch_norm_does_not_duplicate_a_conv_that_has_another_reader():
    def build(bb, x):
        y = _conv(bb, nn.conv2d, x, (4, 3, 3, 3))
        return relax.op.add(_batch_norm(bb, y, 4), y)

    after, report = _simplify(_module((1, 3, 8, 8), build))
    assert op_histogram(after) == {"relax.nn.conv2d": 1, "relax.multiply": 1, "relax.add": 2}
    assert report.applied("fold_scale_into_conv") == 0


def test_batch_norm_stays_out_of_grouped_transposed_convolution_weights():
    def build(bb, x):
        return _batch_norm(bb, _conv(bb, nn.conv2d_transpose, x, (4, 3, 3, 3), groups=2), 6)

    after, report = _simplify(_module((1, 4, 8, 8), build))
    assert op_histogram(after) == {
        "relax.nn.conv2d_transpose": 1, "relax.multiply": 1, "relax.add": 1,
    }
    assert report.applied("fold_scale_into_conv") == 0


def test_scale_that_is_not_per_channel_stays_out_of_the_weights():
    def build(bb, x):
        conv = _conv(bb, nn.conv2d, x, (4, 3, 3, 3))
        return relax.op.multiply(conv, relax.const(_random(6, 6)))  # varies along H and W

    after, report = _simplify(_module((1, 3, 8, 8), build))
    assert op_histogram(after) == {"relax.nn.conv2d": 1, "relax.multiply": 1}
    assert report.applied("fold_scale_into_conv") == 0


def test_batch_norm_whose_statistics_are_read_is_kept():
    def build(bb, x):
        gamma, beta, mean = (relax.const(_random(4)) for _ in range(3))
        var = relax.const(_positive(4))
        bn = bb.emit(nn.batch_norm(x, gamma, beta, mean, var, axis=1, training=False))
        return relax.Tuple([bb.emit(relax.TupleGetItem(bn, i)) for i in (0, 1)])  # output, mean

    after, report = _simplify(_module((1, 4, 8, 8), build))
    assert op_histogram(after) == {"relax.nn.batch_norm": 1}
    assert report.applied("batch_norm_to_affine") == 0


def test_batch_norm_in_training_mode_is_kept():
    def build(bb, x):
        return _batch_norm(bb, x, 4, training=True)

    before = _module((2, 4, 8, 8), build)
    after, report = collage.simplify(before, report=True)
    assert op_histogram(after) == {"relax.nn.batch_norm": 1}
    assert report.applied("batch_norm_to_affine") == 0


@pytest.mark.parametrize("case", ["conv2d", "conv1d_transpose"])
def test_batch_norm_after_a_conv_with_a_bias_folds_into_it_leaving_one_bias(case):
    # nn.Conv2d(bias=True) then nn.BatchNorm2d, as PyTorch's importer emits it.
    shape, conv, weight_shape, attrs, axis = CONV_BN_CASES[case]

    def build(bb, x):
        y = _conv(bb, conv, x, weight_shape, **attrs)
        channels = int(y.ty.shape.values[axis])
        bias = _random(channels).reshape((channels,) + (1,) * (len(shape) - 2))
        biased = bb.emit(relax.op.add(y, relax.const(bias)))
        return nn.relu(_batch_norm(bb, biased, channels, axis))

    after, report = _simplify(_module(shape, build))
    assert op_histogram(after) == {f"relax.nn.{conv.__name__}": 1, "relax.add": 1, "relax.nn.relu": 1}
    assert report.applied("scale_before_bias") == 1 and report.applied("merge_constant_adds") == 1


def test_a_biased_conv_read_elsewhere_keeps_its_scale_after_the_bias():
    def build(bb, x):
        biased = bb.emit(relax.op.add(_conv(bb, nn.conv2d, x, (4, 3, 3, 3)), relax.const(_random(4, 1, 1))))
        return relax.op.add(_batch_norm(bb, biased, 4), biased)

    after, report = _simplify(_module((1, 3, 8, 8), build))
    assert op_histogram(after) == {"relax.nn.conv2d": 1, "relax.multiply": 1, "relax.add": 3}
    assert report.applied("scale_before_bias") == 0


def test_constant_adds_in_a_row_merge_unless_the_first_sum_is_read():
    def build(bb, x):
        first = bb.emit(relax.op.add(x, relax.const(_random(4))))
        return relax.op.add(first, relax.const(_random(1, 4)))

    after, report = _simplify(_module((2, 4), build))
    assert op_histogram(after) == {"relax.add": 1} and report.applied("merge_constant_adds") == 1

    def read_twice(bb, x):
        first = bb.emit(relax.op.add(x, relax.const(_random(4))))
        return relax.Tuple([bb.emit(relax.op.add(first, relax.const(_random(4)))), first])

    after, report = _simplify(_module((2, 4), read_twice))
    assert op_histogram(after) == {"relax.add": 2} and report.applied("merge_constant_adds") == 0


# --------------------------------------------------------------------------- branches summed


def _branch(bb, x, weight_shape, padding, **attrs):
    """A convolution of ``x`` and its BatchNorm, as RepVGG trains a branch."""
    y = _conv(bb, nn.conv2d, x, weight_shape, padding=padding, **attrs)
    return _batch_norm(bb, y, weight_shape[0])


def _rep_block(bb, x, stride=1, groups=1, identity=True):
    """RepVGG's block (TextNet's, ACNet's): 3x3, 3x1 and 1x3 branches and the input's BatchNorm, summed."""
    channels = int(x.ty.shape.values[1])
    kernels = {(3, 3): [1, 1, 1, 1], (3, 1): [1, 0, 1, 0], (1, 3): [0, 1, 0, 1]}
    total = None
    for (kh, kw), padding in kernels.items():
        branch = _branch(bb, x, (channels, channels // groups, kh, kw), padding, strides=stride, groups=groups)
        total = branch if total is None else bb.emit(relax.op.add(total, branch))
    if identity:
        total = bb.emit(relax.op.add(total, _batch_norm(bb, x, channels)))
    return nn.relu(total)


@pytest.mark.parametrize("stride, groups, identity", [(1, 1, True), (1, 4, True), (2, 1, False)])
def test_branches_of_one_input_summed_become_one_convolution(stride, groups, identity):
    after, report = _simplify(_module((1, 4, 8, 8), lambda bb, x: _rep_block(bb, x, stride, groups, identity)))
    assert op_histogram(after) == {"relax.nn.conv2d": 1, "relax.add": 1, "relax.nn.relu": 1}
    assert report.applied("merge_summed_convolutions") == 3 if identity else 2


def test_a_residual_added_to_its_own_convolution_folds_in_and_a_dilated_one_too():
    def build(bb, x):
        y = _conv(bb, nn.conv2d, x, (4, 4, 3, 3), padding=[2, 2, 2, 2], dilation=2)
        return nn.relu(bb.emit(relax.op.add(y, x)))

    after, _ = _simplify(_module((1, 4, 8, 8), build))
    assert op_histogram(after) == {"relax.nn.conv2d": 1, "relax.nn.relu": 1}


def test_branches_whose_merged_kernel_needs_more_taps_stay_apart():
    def build(bb, x):  # a 3x1 and a 1x3 would become a 3x3: 9 multiply-adds a point for 6
        return bb.emit(relax.op.add(_branch(bb, x, (4, 4, 3, 1), [1, 0, 1, 0]), _branch(bb, x, (4, 4, 1, 3), [0, 1, 0, 1])))

    after, report = _simplify(_module((1, 4, 8, 8), build))
    assert op_histogram(after)["relax.nn.conv2d"] == 2 and report.applied("merge_summed_convolutions") == 0


def test_branches_that_are_read_elsewhere_or_of_other_inputs_stay_apart():
    def read_elsewhere(bb, x):
        a = _conv(bb, nn.conv2d, x, (4, 4, 3, 3), padding=1)
        return relax.Tuple([bb.emit(relax.op.add(a, _conv(bb, nn.conv2d, x, (4, 4, 1, 1)))), a])

    def other_inputs(bb, x):
        y = bb.emit(nn.relu(x))
        return relax.op.add(_conv(bb, nn.conv2d, x, (4, 4, 3, 3), padding=1), _conv(bb, nn.conv2d, y, (4, 4, 1, 1)))

    for build in (read_elsewhere, other_inputs):
        after, report = _simplify(_module((1, 4, 8, 8), build))
        assert op_histogram(after)["relax.nn.conv2d"] == 2 and report.applied("merge_summed_convolutions") == 0


def test_a_lora_adapter_left_unmerged_becomes_one_matmul():
    import torch

    from collage.model.frontend import import_model
    from experiments.torch_nn import LoraLinear

    torch.manual_seed(0)
    model, x = LoraLinear(64, 48, rank=4).eval(), torch.randn(2, 5, 64)
    after, report = _simplify(import_model(model, example_inputs=x).mod)
    assert op_histogram(after) == {"relax.matmul": 1, "relax.add": 1}
    assert report.applied("merge_summed_matmuls") == 1
    np.testing.assert_allclose(_run(after, [x.numpy()])[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_low_rank_terms_alone_or_read_elsewhere_stay_apart():
    def low_rank(bb, x, rank=4):
        down = bb.emit(relax.op.matmul(x, relax.const(_random(64, rank))))
        return bb.emit(relax.op.matmul(down, relax.const(_random(rank, 48))))

    def two_low_rank(bb, x):  # 2 * 4 * (64 + 48) multiply-adds a row, where one matrix needs 64 * 48
        return relax.op.add(low_rank(bb, x), low_rank(bb, x))

    def read_elsewhere(bb, x):
        base = bb.emit(relax.op.matmul(x, relax.const(_random(64, 48))))
        return relax.Tuple([bb.emit(relax.op.add(base, low_rank(bb, x))), base])

    for build, matmuls in ((two_low_rank, 4), (read_elsewhere, 3)):
        after, report = _simplify(_module((5, 64), build))
        assert op_histogram(after)["relax.matmul"] == matmuls and report.applied("merge_summed_matmuls") == 0


# --------------------------------------------------------------------------- identities

ZEROS, ONES = np.zeros((4,), "float32"), np.ones((4,), "float32")


def test_neutral_elements_are_removed():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.add(R.const(ZEROS), x)
                b = R.multiply(a, R.const(ONES))
                c = R.subtract(b, R.const(ZEROS))
                d = R.divide(c, R.const(1.0, "float32"))
                y = R.nn.relu(d)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert (report.applied("add_zero"), report.applied("multiply_one")) == (2, 2)


def test_near_neutral_elements_are_kept():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.add(x, R.const(np.array([0, 0, 0, 1e-3], "float32")))
                b = R.multiply(a, R.const(np.full((4,), 1.0001, "float32")))
                c = R.subtract(R.const(ZEROS), b)  # 0 - x is a negation
                y = R.add(c, R.const(np.zeros((2, 4), "float32")))  # broadcasts to (2, 4)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Before)
    assert report.applied("add_zero") == report.applied("multiply_one") == 0


def test_broadcast_to_own_shape_is_removed_and_a_real_broadcast_kept():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4), "float32")) -> R.Tensor((3, 4), "float32"):
            with R.dataflow():
                a = R.broadcast_to(x, R.shape([1, 4]))
                y = R.broadcast_to(a, R.shape([3, 4]))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4), "float32")) -> R.Tensor((3, 4), "float32"):
            with R.dataflow():
                y = R.broadcast_to(x, R.shape([3, 4]))
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("broadcast_to_same_shape") == 1


def test_reshape_to_the_same_shape_and_reshape_chains_collapse():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 6), "float32")) -> R.Tensor((4, 3), "float32"):
            with R.dataflow():
                a = R.reshape(x, R.shape([2, 6]))
                b = R.reshape(a, R.shape([12]))
                y = R.reshape(b, R.shape([4, 3]))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 6), "float32")) -> R.Tensor((4, 3), "float32"):
            with R.dataflow():
                y = R.reshape(x, R.shape([4, 3]))
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("RemoveRedundantReshape") == 2


# --------------------------------------------------------------------------- transposes


def test_transpose_and_its_inverse_cancel():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
            with R.dataflow():
                a = R.permute_dims(x, axes=[1, 2, 0])
                b = R.permute_dims(a, axes=[2, 0, 1])
                c = R.permute_dims(b, axes=[0, 1, 2])
                y = R.nn.relu(c)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("compose_permute_dims") + report.applied("identity_permute_dims") == 2


def test_transposes_that_are_not_inverse_become_one():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((3, 4, 2), "float32"):
            with R.dataflow():
                a = R.permute_dims(x, axes=[0, 2, 1])  # (2, 4, 3)
                y = R.permute_dims(a, axes=[2, 1, 0])  # (3, 4, 2): not the inverse
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((3, 4, 2), "float32"):
            with R.dataflow():
                y = R.permute_dims(x, axes=[1, 2, 0])
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("compose_permute_dims") == 1


def test_a_transpose_that_moves_axes_of_length_one_moves_only_the_others():
    # PyTorch's einsum exports as 5-d transposes with unit axes (Funnel's relative attention);
    # OpenVINO's generic transpose ran them at 4x the time of the same move in fewer axes.
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 6, 1, 1, 5), "float32"), z: R.Tensor((1, 6, 5, 1, 1), "float32"),
                 w: R.Tensor((1, 6, 5, 2, 3), "float32"), v: R.Tensor((4, 6, 1, 5), "float32")):  # fmt: skip
            with R.dataflow():
                a = R.permute_dims(x, axes=[3, 1, 0, 4, 2])  # (1, 6, 4, 5, 1): 4 moves past 6
                b = R.permute_dims(z, axes=[3, 1, 0, 2, 4])  # (1, 6, 1, 5, 1): only unit axes move
                c = R.permute_dims(w, axes=[0, 2, 1, 4, 3])  # the batch of one stays in front: kept
                d = R.permute_dims(v, axes=[2, 1, 0, 3])  # four axes, a fast transpose: kept
                R.output(a, b, c, d)
            return (a, b, c, d)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 6, 1, 1, 5), "float32"), z: R.Tensor((1, 6, 5, 1, 1), "float32"),
                 w: R.Tensor((1, 6, 5, 2, 3), "float32"), v: R.Tensor((4, 6, 1, 5), "float32")):  # fmt: skip
            with R.dataflow():
                s = R.reshape(x, R.shape([4, 6, 5]))
                t = R.permute_dims(s, axes=[1, 0, 2])
                a = R.reshape(t, R.shape([1, 6, 4, 5, 1]))
                b = R.reshape(z, R.shape([1, 6, 1, 5, 1]))
                c = R.permute_dims(w, axes=[0, 2, 1, 4, 3])
                d = R.permute_dims(v, axes=[2, 1, 0, 3])
                R.output(a, b, c, d)
            return (a, b, c, d)

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("permute_dims_of_unit_axes") == 2


def test_transpose_with_another_reader_is_not_composed():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tuple(
            R.Tensor((2, 4, 3), "float32"), R.Tensor((3, 4, 2), "float32")
        ):
            with R.dataflow():
                a = R.permute_dims(x, axes=[0, 2, 1])
                b = R.permute_dims(a, axes=[2, 1, 0])
                y = (a, b)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Before)
    assert report.applied("compose_permute_dims") == 0


def test_matmul_of_two_transposes_transposes_once():
    @I.ir_module
    class Before:
        @R.function
        def main(
            a: R.Tensor((2, 5, 3), "float32"), b: R.Tensor((2, 4, 5), "float32")
        ) -> R.Tensor((2, 3, 4), "float32"):
            with R.dataflow():
                at = R.permute_dims(a, axes=[0, 2, 1])
                bt = R.permute_dims(b, axes=[0, 2, 1])
                y = R.matmul(at, bt)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(
            a: R.Tensor((2, 5, 3), "float32"), b: R.Tensor((2, 4, 5), "float32")
        ) -> R.Tensor((2, 3, 4), "float32"):
            with R.dataflow():
                ba = R.matmul(b, a)
                y = R.permute_dims(ba, axes=[0, 2, 1])
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("matmul_of_transposes") == 1


def test_matmul_of_transposes_that_swap_other_axes_is_kept():
    @I.ir_module
    class Before:
        @R.function
        def main(
            a: R.Tensor((3, 2, 5), "float32"), b: R.Tensor((2, 4, 5), "float32")
        ) -> R.Tensor((2, 3, 4), "float32"):
            with R.dataflow():
                at = R.permute_dims(a, axes=[1, 0, 2])  # (2, 3, 5): batch axis moved
                bt = R.permute_dims(b, axes=[0, 2, 1])
                y = R.matmul(at, bt)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Before)
    assert report.applied("matmul_of_transposes") == 0


def test_transposed_constant_matmul_operand_is_pre_transposed():
    weight = _random(8, 4)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 8), "float32"):
            with R.dataflow():
                wt = R.permute_dims(R.const(weight), axes=[1, 0])
                y = R.matmul(x, wt)
                R.output(y)
            return y

    after, report = _simplify(Before)
    assert op_histogram(after) == {"relax.matmul": 1}
    assert report.applied("fold_permute_dims") == 1  # by NumPy, before FoldConstant compiles a kernel for it
    (binding,) = after["main"].body.blocks[0].bindings
    np.testing.assert_array_equal(binding.value.args[1].value.numpy(), weight.T)


@pytest.mark.parametrize("axes", [None, [2, 0, 1]])
def test_a_constant_permuted_on_any_axes_is_folded_as_numpy_permutes_it(axes):
    data = _random(2, 3, 4)
    x = relax.Var("x", relax.TensorType(np.transpose(data, axes).shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, bb.emit(relax.op.permute_dims(relax.const(data), axes))))
        bb.emit_func_output(out)
    after, report = _simplify(bb.get())
    (binding,) = after["main"].body.blocks[0].bindings
    np.testing.assert_array_equal(binding.value.args[1].value.numpy(), np.transpose(data, axes))
    assert report.applied("fold_permute_dims") == 1


def test_a_constant_matmul_operand_with_unit_leading_axes_becomes_its_matrix():
    # The form exporters write and ONNX Runtime pre-packs (LeViT's stage linears); where the
    # unit axis adds an axis to the product, it stays.
    stacked = _random(1, 16, 8)

    def weights(mod):
        return [tuple(b.value.args[1].ty.shape) for b in mod["main"].body.blocks[0].bindings
                if getattr(b.value.op, "name", "") == "relax.matmul"]  # fmt: skip

    after, report = _simplify(_module((1, 4, 16), lambda bb, x: relax.op.matmul(x, relax.const(stacked))))
    assert report.applied("matrix_weight") == 1 and [tuple(map(int, s)) for s in weights(after)] == [(16, 8)]
    kept, report = _simplify(_module((4, 16), lambda bb, x: relax.op.matmul(x, relax.const(stacked))))
    assert report.applied("matrix_weight") == 0 and [tuple(map(int, s)) for s in weights(kept)] == [(1, 16, 8)]


def test_a_matmul_operand_broadcast_to_the_batch_the_matmul_broadcasts_to_anyway_stays_itself():
    # nn.MultiheadAttention's projection on a (tokens, batch, features) input, as PyTorch
    # decomposes it: the transposed weight expanded to one copy per token. Folded, that was
    # a (32, 16, 24) constant; the matmul broadcasts the (16, 24) matrix itself.
    weight = _random(24, 16)

    def projection(bb, x, tokens=32):
        w = bb.emit(relax.op.broadcast_to(relax.op.permute_dims(relax.const(weight)), (tokens, 16, 24)))
        return relax.op.matmul(bb.emit(relax.op.broadcast_to(x, x.ty.shape)), w)

    def weights(mod):
        return [tuple(map(int, b.value.args[1].ty.shape)) for b in mod["main"].body.blocks[0].bindings
                if getattr(b.value.op, "name", "") == "relax.matmul"]  # fmt: skip

    after, report = _simplify(_module((32, 2, 16), projection))
    assert report.applied("matmul_broadcasts_itself") == 1 and weights(after) == [(16, 24)]
    # Where the broadcast adds the batch the input lacks, it is the product's own: it stays.
    kept, report = _simplify(_module((1, 2, 16), projection))
    assert report.applied("matmul_broadcasts_itself") == 0 and weights(kept) == [(32, 16, 24)]


def test_an_elementwise_operand_broadcast_to_the_shape_the_operator_broadcasts_to_anyway_stays_itself():
    # RecurrentGemma's import: where(mask, state expanded to the sequence, constant), 128 times.
    # Each was an Expand before a Where in the engines' file, which OpenVINO ran as a Broadcast
    # between layout reorders.
    mask, other = relax.const(_random(1, 64, 1) > 0), relax.const(_random(1, 64, 256))

    def masked(bb, x, shape=(1, 64, 256)):
        expanded = bb.emit(relax.op.broadcast_to(x, shape))
        return relax.op.add(bb.emit(relax.op.where(mask, expanded, other)), bb.emit(relax.op.broadcast_to(x, shape)))

    def broadcasts(mod):
        return sum(getattr(b.value.op, "name", "") == "relax.broadcast_to" for b in mod["main"].body.blocks[0].bindings)

    after, report = _simplify(_module((1, 1, 256), masked))
    assert report.applied("elementwise_broadcasts_itself") == 2 and broadcasts(after) == 0
    # Where the broadcast adds extents no other operand has, it is the result's own: it stays.
    kept, report = _simplify(_module((1, 1, 256), lambda bb, x: relax.op.add(
        bb.emit(relax.op.broadcast_to(x, (1, 64, 256))), relax.const(_random(256)))))
    assert report.applied("elementwise_broadcasts_itself") == 0 and broadcasts(kept) == 1


# --------------------------------------------------------------------------- constants and clean-up


def test_arange_chain_folds_to_a_constant():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            with R.dataflow():
                positions = R.arange(0, 4, 1, dtype="int64")
                shifted = R.add(positions, R.const(0, "int64"))
                y = R.add(x, R.astype(shifted, "float32"))
                R.output(y)
            return y

    after, report = _simplify(Before)
    assert op_histogram(after) == {"relax.add": 1}
    assert report.applied("fold_arange") == 1


def test_common_subexpressions_and_dead_code_are_removed():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.nn.relu(x)
                b = R.nn.relu(x)
                unused = R.exp(x)
                y = R.add(a, b)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.nn.relu(x)
                y = R.add(a, a)
                R.output(y)
            return y

    after, report = _simplify(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert report.applied("EliminateCommonSubexpr") == report.applied("DeadCodeElimination") == 1


# --------------------------------------------------------------------------- the report


def test_report_counts_and_iterations():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.multiply(x, R.const(ONES))
                y = R.nn.relu(a)
                R.output(y)
            return y

    after, report = collage.simplify(Before, report=True)
    assert (report.ops_before, report.ops_after) == (2, 1) == (op_count(Before), op_count(after))
    assert report.applied("multiply_one") == 1
    assert sum(step.ops_removed for step in report.steps) == 1
    assert report.converged and report.iterations == 2  # the second iteration finds nothing
    assert "multiply_one" in str(report) and "ops 2 -> 1" in str(report)

    _, capped_report = collage.simplify(Before, report=True, max_iterations=1)
    assert not capped_report.converged and capped_report.iterations == 1
    assert isinstance(collage.simplify(Before), tvm.IRModule)


# --------------------------------------------------------------------------- the zoo

# Against the torch model the module came from (one compile per model keeps the test short).
# fp32 rounding over 50-100 layers already puts the unsimplified TVM module a few 1e-4 of
# max|output| away from torch.
ZOO_TOLERANCE = 1e-3


@pytest.mark.parametrize("name", models.MODELS)
def test_zoo_model_simplifies_without_changing_its_output(name):
    workload = zoo(name)
    simplified, report = collage.simplify(workload.relax, report=True)

    assert report.converged
    assert op_count(simplified) <= op_count(workload.relax)
    assert "relax.nn.batch_norm" not in op_histogram(simplified)
    inputs = [t.numpy() for t in workload.inputs]
    _assert_close(_run(simplified, inputs), workload.reference(), ZOO_TOLERANCE)


def _imported_onnx_node(op_type: str, shape, out_shape, constants: dict[str, np.ndarray], **attributes):
    """A one-node ONNX model ``y = op_type(x, *constants)``, float32 ``x`` and ``y`` of
    ``shape`` and ``out_shape``, as TVM's importer brings it in."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    inits = [numpy_helper.from_array(value, name) for name, value in constants.items()]
    node = helper.make_node(op_type, ["x", *constants], ["y"], **attributes)
    graph = helper.make_graph([node], op_type.lower(), [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    return from_onnx(model, keep_params_in_input=False)


def _onnx_clip_model(low: float, high: float):
    """``Clip(x, low, high)`` imported by TVM: call_tir of private maximum/minimum PrimFuncs
    between isnan/where of the bounds."""
    return _imported_onnx_node("Clip", [2, 8], [2, 8], {"lo": np.array(low, np.float32), "hi": np.array(high, np.float32)})


def test_the_onnx_importers_clip_becomes_one_clip_again():
    imported = _onnx_clip_model(0.0, 6.0)
    assert "relax.call_tir" in op_histogram(imported)
    simplified, report = collage.simplify(imported, report=True)
    assert dict(op_histogram(simplified)) == {"relax.clip": 1}
    assert report.applied("te_calls_as_ops") == 2 and report.applied("clip_from_max_min") == 1
    x = _random(2, 8) * 4
    _assert_close(_run(simplified, [x]), _run(imported, [x]), 1e-6)


@pytest.mark.parametrize("op_type, pairwise", [("Max", "relax.maximum"), ("Min", "relax.minimum"), ("Sum", "relax.add")])
def test_the_onnx_importers_max_min_and_sum_of_tensors_are_their_element_wise_operators(op_type, pairwise):
    """TVM imports ONNX's Max, Min and Sum of several tensors as a stack reduced along the
    stacked axis (RWKV's torch.maximum, 512 times): they become the operator, pairwise."""
    imported = _imported_onnx_node(op_type, [2, 8], [2, 8], {"b": _random(2, 8), "c": _random(2, 8)})
    assert "relax.stack" in op_histogram(imported)
    simplified = collage.simplify(imported)
    assert set(op_histogram(simplified)) == {pairwise}  # (Sum's two constants fold into one)
    x = _random(2, 8)
    _assert_close(_run(simplified, [x]), _run(imported, [x]), 1e-6)


def _onnx_pad_model(pads: list[int], value: float, mode: str = "constant"):
    """``Pad(x, pads, value)`` on a (1, 3, 5, 6) input imported by TVM: call_tir of a private
    ``pad`` PrimFunc (``topi.nn.pad``, or ``mirror_pad`` for reflect)."""
    shape = [1, 3, 5, 6]
    padded = [n + before + after for n, before, after in zip(shape, pads[:4], pads[4:])]
    widths = {"pads": np.array(pads, np.int64), "value": np.array(value, np.float32)}
    return _imported_onnx_node("Pad", shape, padded, widths, mode=mode)


@pytest.mark.parametrize(
    "pads, value, left",
    [
        ([0, 0, 1, 0, 0, 0, 2, 3], 0.0, {"relax.nn.pad": 1}),  # uneven, as a "same" convolution's
        ([0, 1, 0, 1, 0, 0, 0, 1], -np.inf, {"relax.nn.pad": 1}),  # before a max pool
        ([0, 0, 0, 0, 0, 0, 0, 0], 0.0, {}),  # a padding that computed to nothing: gone
    ],
)
def test_the_onnx_importers_pad_becomes_a_pad_again(pads, value, left):
    imported = _onnx_pad_model(pads, value)
    assert "relax.call_tir" in op_histogram(imported)
    simplified, report = collage.simplify(imported, report=True)
    assert dict(op_histogram(simplified)) == left and report.applied("te_calls_as_ops") == 1
    x = _random(1, 3, 5, 6)
    assert all(np.array_equal(a, b) for a, b in zip(_run(simplified, [x]), _run(imported, [x])))


def test_a_pad_of_another_mode_stays_as_imported():
    imported = _onnx_pad_model([0, 0, 1, 1, 0, 0, 1, 1], 0.0, mode="reflect")
    simplified, report = collage.simplify(imported, report=True)
    assert "relax.call_tir" in op_histogram(simplified) and report.applied("te_calls_as_ops") == 0


@pytest.mark.parametrize("reps", [(2, 1, 3), (3, 2), (2,)])
def test_a_tile_the_importer_computes_itself_becomes_a_tile_again(reps):
    from tvm import topi

    def tiled(bb, x):
        return bb.emit_te(topi.tile, x, reps)

    imported = _module((2, 3), tiled)
    simplified, report = collage.simplify(imported, report=True)
    assert dict(op_histogram(simplified)) == {"relax.tile": 1} and report.applied("te_calls_as_ops") == 1
    x = _random(2, 3)
    assert np.array_equal(_run(simplified, [x])[0], np.tile(x, reps))


@pytest.mark.parametrize(
    "subscripts, shapes",
    [("bhwc,hkc->bhwk", [(1, 4, 5, 8), (4, 6, 8)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)])],
)
def test_an_einsum_the_importer_computes_itself_becomes_an_einsum_again(subscripts, shapes):
    from tvm import topi

    operands = [relax.Var(f"x{k}", relax.TensorType(shape, "float32")) for k, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", operands):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(topi.einsum, subscripts, *operands))
        bb.emit_func_output(out)
    simplified, report = collage.simplify(bb.get(), report=True)
    assert dict(op_histogram(simplified)) == {"relax.einsum": 1} and report.applied("te_calls_as_ops") == 1
    arrays = [_random(*shape) for shape in shapes]
    _assert_close(_run(simplified, arrays), [np.einsum(subscripts, *arrays)], 1e-5)


def _attention_module(tokens, tokens_kv, heads_kv=3, bias=False, **attrs) -> tvm.IRModule:
    """``main`` of one ``relax.nn.attention`` of 3 heads of size 8 (values of size 5), batch 2."""
    q = relax.Var("q", relax.TensorType((2, tokens, 3, 8), "float32"))
    k = relax.Var("k", relax.TensorType((2, tokens_kv, heads_kv, 8), "float32"))
    v = relax.Var("v", relax.TensorType((2, tokens_kv, heads_kv, 5), "float32"))
    b = relax.Var("b", relax.TensorType((2, 1, tokens, tokens_kv), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, b] if bias else [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(q, k, v, b if bias else None, **attrs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "tokens, tokens_kv, bias, attrs",
    [(4, 4, False, {}), (4, 4, False, {"causal_mask": "TopLeft"}), (3, 6, False, {"causal_mask": "BottomRight", "scale": 0.3}),
     (5, 5, True, {"causal_mask": "TopLeft"}), (5, 7, True, {"scale": 0.5})],
)  # fmt: skip
def test_attention_becomes_the_matmuls_and_softmax_its_legalization_computes(tokens, tokens_kv, bias, attrs):
    fused = _attention_module(tokens, tokens_kv, bias=bias, **attrs)
    simplified, report = _simplify(fused)  # checked against TVM's legalization of the fused operator
    ops = op_histogram(simplified)
    assert report.applied("attention_as_matmuls") == 1 and "relax.nn.attention" not in ops
    assert ops["relax.matmul"] == 2 and ops["relax.nn.softmax"] == 1


def test_attention_with_fewer_key_heads_than_query_heads_stays_fused():
    simplified, report = collage.simplify(_attention_module(4, 4, heads_kv=1), report=True)
    assert report.applied("attention_as_matmuls") == 0 and "relax.nn.attention" in op_histogram(simplified)


def test_clips_in_a_row_become_one_unless_the_first_is_read():
    # ReLU6 as PyTorch's importer writes it: clip(0, inf), then clip(-inf, 6).
    def relu6(bb, x):
        return relax.op.clip(bb.emit(relax.op.clip(x, 0.0, float("inf"))), float("-inf"), 6.0)

    after, report = _simplify(_module((2, 8), lambda bb, x: relu6(bb, bb.emit(x * relax.const(4.0)))))
    assert dict(op_histogram(after)) == {"relax.multiply": 1, "relax.clip": 1} and report.applied("merge_clips") == 1

    def first_read_too(bb, x):
        first = bb.emit(relax.op.clip(x, 0.0, float("inf")))
        return relax.op.add(bb.emit(relax.op.clip(first, float("-inf"), 6.0)), first)

    after, report = _simplify(_module((2, 8), first_read_too))
    assert op_histogram(after)["relax.clip"] == 2 and report.applied("merge_clips") == 0


def test_a_call_tir_that_is_not_its_namesakes_legalization_stays():
    from tvm import topi

    x, y = (relax.Var(n, relax.TensorType((4,), "float32")) for n in "xy")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            # Named maximum, computes a sum.
            out = bb.emit_output(bb.call_te(topi.add, x, y, primfunc_name_hint="maximum"))
        bb.emit_func_output(out)
    not_maximum = bb.get()
    simplified, report = collage.simplify(not_maximum, report=True)
    assert report.applied("te_calls_as_ops") == 0
    assert "relax.call_tir" in op_histogram(simplified)


def _linear(bb, x, flat_shape, out_shape, bias_shape=(12,), bias_read_too=False):
    """A linear layer as PyTorch's importer writes it on a rank-3+ input: flatten, matmul, bias, unflatten."""
    flat = bb.emit(relax.op.reshape(x, flat_shape))
    product = bb.emit(relax.op.matmul(flat, relax.const(_random(flat_shape[-1], 12))))
    out = relax.op.reshape(bb.emit(relax.op.add(relax.const(_random(*bias_shape)), product)), out_shape)
    return relax.op.add(bb.emit(out), relax.op.sum(product)) if bias_read_too else out


@pytest.mark.parametrize(
    "out_shape, left", [((2, 3, 12), {}), ((2, 3, 3, 4), {"relax.reshape": 1})]  # restored; split into heads
)
def test_linear_on_a_flattened_input_runs_on_every_axis(out_shape, left):
    after, report = _simplify(_module((2, 3, 8), lambda bb, x: _linear(bb, x, (6, 8), out_shape)))
    assert dict(op_histogram(after)) == {"relax.matmul": 1, "relax.add": 1, **left}
    assert report.applied("linear_on_all_axes") == 1
    matmul = [b.value for b in after["main"].body.blocks[0].bindings if b.value.op.name == "relax.matmul"][0]
    assert [int(d) for d in matmul.args[0].ty.shape.values] == [2, 3, 8]


@pytest.mark.parametrize(
    "input_shape, flat_shape, out_shape, bias_shape, bias_read_too",
    [
        ((2, 3, 8), (3, 16), (2, 3, 12), (12,), False),  # flattens the features with a leading axis
        ((2, 3, 8), (6, 8), (2, 3, 12), (6, 12), False),  # a bias per row of the flat product
        ((2, 3, 8), (6, 8), (2, 3, 12), (12,), True),  # the flat product is read elsewhere
    ],
)
def test_linear_that_needs_its_flat_layout_keeps_it(input_shape, flat_shape, out_shape, bias_shape, bias_read_too):
    if flat_shape == (3, 16):
        out = lambda bb, x: relax.op.reshape(  # noqa: E731
            bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(x, flat_shape)), relax.const(_random(16, 8)))), (2, 3, 4)
        )
    else:
        out = lambda bb, x: _linear(bb, x, flat_shape, out_shape, bias_shape, bias_read_too)  # noqa: E731
    _, report = _simplify(_module(input_shape, out))
    assert report.applied("linear_on_all_axes") == 0


def test_linears_sharing_one_flattened_input_each_run_on_every_axis():
    # Attention's query, key and value projections read one flattened norm; its output
    # projection reads the heads merged into the features (batch, tokens, heads, size).
    def attention_like(bb, x):
        flat = bb.emit(relax.op.reshape(x, (6, 8)))
        q, k, v = (bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(flat, relax.const(_random(8, 8)))), (2, 3, 2, 4)))
                   for _ in range(3))  # fmt: skip
        merged = bb.emit(relax.op.reshape(bb.emit(q * k + v), (6, 8)))
        return relax.op.reshape(bb.emit(relax.op.matmul(merged, relax.const(_random(8, 8)))), (2, 3, 8))

    after, report = _simplify(_module((2, 3, 8), attention_like))
    assert report.applied("linear_on_all_axes") == 4
    matmuls = [b.value for b in after["main"].body.blocks[0].bindings if b.value.op.name == "relax.matmul"]
    assert all(len(m.args[0].ty.shape.values) == 3 for m in matmuls)


def test_batched_matmul_runs_on_every_batch_axis():
    def heads(bb, a, b, back):
        flat = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(a, (6, 4, 5))), bb.emit(relax.op.reshape(b, (6, 5, 4)))))
        return relax.op.reshape(flat, back)

    def build(back):
        bb = relax.BlockBuilder()
        a, b = relax.Var("a", relax.TensorType((2, 3, 4, 5), "float32")), relax.Var("b", relax.TensorType((2, 3, 5, 4), "float32"))
        with bb.function("main", [a, b]):
            with bb.dataflow():
                out = bb.emit_output(heads(bb, a, b, back))
            bb.emit_func_output(out)
        return bb.get()

    after, report = _simplify(build((2, 3, 4, 4)))
    assert dict(op_histogram(after)) == {"relax.matmul": 1} and report.applied("matmul_on_all_axes") == 1
    _, report = _simplify(build((3, 2, 4, 4)))  # split back otherwise: the merged layout is needed
    assert report.applied("matmul_on_all_axes") == 0


@pytest.mark.parametrize("through_reshape", [False, True])
def test_batch_norm_after_a_linear_without_bias_folds_into_its_weights(through_reshape):
    # LeViT's Linear + BatchNorm1d: the importer reshapes (batch, tokens, features) to 2-D for it.
    def linear_bn(bb, x):
        product = bb.emit(relax.op.matmul(x, relax.const(_random(8, 6))))
        if through_reshape:
            product = bb.emit(relax.op.reshape(product, (6, 6)))
        normed = _batch_norm(bb, product, 6, axis=-1)
        return relax.op.reshape(normed, (2, 3, 6)) if through_reshape else normed

    after, report = _simplify(_module((2, 3, 8), linear_bn))
    assert report.applied("fold_scale_into_matmul") == 1
    assert op_histogram(after)["relax.multiply"] == 0 and op_histogram(after)["relax.add"] == 1


def test_a_flattening_two_matmuls_read_and_a_folded_constant_operand_keep_their_batch_axes():
    # DeBERTa's disentangled attention: one flattened query is read by the content-to-content
    # product and by the content-to-position one, whose right operand (the relative positions,
    # projected) is a constant folded in its merged (heads, size, positions) layout.
    bb = relax.BlockBuilder()
    q, k = relax.Var("q", relax.TensorType((1, 4, 6, 5), "float32")), relax.Var("k", relax.TensorType((1, 4, 5, 6), "float32"))
    positions = _random(4, 5, 7)
    with bb.function("main", [q, k]):
        with bb.dataflow():
            flat_q = bb.emit(relax.op.reshape(q, (4, 6, 5)))
            c2c = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(flat_q, bb.emit(relax.op.reshape(k, (4, 5, 6))))), (1, 4, 6, 6)))
            c2p = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(flat_q, relax.const(positions))), (1, 4, 6, 7)))
            out = bb.emit_output(relax.Tuple([c2c, c2p]))
        bb.emit_func_output(out)
    after, report = _simplify(bb.get())  # the numbers checked too
    assert report.applied("matmul_on_all_axes") == 2
    matmuls = [b.value for b in after["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"]  # fmt: skip
    assert [len(m.args[0].ty.shape.values) for m in matmuls] == [4, 4]
    assert [len(m.args[1].ty.shape.values) for m in matmuls] == [4, 4]
    assert op_histogram(after)["relax.reshape"] == 0


def test_a_grouped_query_operand_is_regrouped_for_the_batched_matmul():
    # Attention probabilities (1, 4, 6, 6) times values repeated for grouped-query attention,
    # which arrive as (1, groups 2, repeats 2, 6, 5): the importer flattened both to 3-D.
    bb = relax.BlockBuilder()
    p, v = relax.Var("p", relax.TensorType((1, 4, 6, 6), "float32")), relax.Var("v", relax.TensorType((1, 2, 2, 6, 5), "float32"))
    with bb.function("main", [p, v]):
        with bb.dataflow():
            flat = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(p, (4, 6, 6))), bb.emit(relax.op.reshape(v, (4, 6, 5)))))
            out = bb.emit_output(relax.op.reshape(flat, (1, 4, 6, 5)))
        bb.emit_func_output(out)
    after, report = _simplify(bb.get())
    assert report.applied("matmul_on_all_axes") == 1
    assert dict(op_histogram(after)) == {"relax.matmul": 1, "relax.reshape": 1}


def test_negative_take_indices_count_from_the_end_as_in_torch():
    # Falcon's key/value split, qkv[..., [-2], :], as PyTorch's importer writes it.
    def split(bb, x):
        return relax.op.take(x, relax.const(np.array([-2, 1], "int64")), axis=2, mode="fast")

    mod = _module((1, 3, 6, 4), split)
    after, report = collage.simplify(mod, report=True)
    assert report.applied("wrap_negative_take_indices") == 1
    x = _random(1, 3, 6, 4)
    np.testing.assert_array_equal(_run(after, [x])[0], x[:, :, [4, 1], :])


def test_negative_take_indices_keep_their_meaning_where_the_mode_gives_them_one():
    # Clipped, -1 is index 0; as NaN, it is out of bounds: counted from the end, neither is.
    for mode in ("clip", "nan"):
        def taken(bb, x, mode=mode):
            return relax.op.take(x, relax.const(np.array([-1], "int64")), axis=1, mode=mode)

        _, report = collage.simplify(_module((2, 5), taken), report=True)
        assert report.applied("wrap_negative_take_indices") == 0


def test_indexing_a_constant_with_constant_indices_folds():
    # transformers' attention mask: a constant mask indexed by constant position ids, then used.
    mask = RNG.random((8, 8)) > 0.5
    rows, cols = np.array([[0]]), np.array([[2, 5, 7]])

    def masked(bb, x):
        picked = bb.emit(relax.op.index_tensor(relax.const(mask), relax.Tuple([relax.const(rows), relax.const(cols)])))
        return relax.op.where(picked, x, relax.const(0.0))

    after, report = _simplify(_module((1, 3), masked))
    assert report.applied("fold_index_tensor") == 1 and "relax.index_tensor" not in op_histogram(after)
