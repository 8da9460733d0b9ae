"""ONNX's own backend node tests as a peer's test suite: wherever TVM alone is right, collage is
right, and it never crashes. A fixed, fast subset: two families the zoo uses, and one case of
each way collage used to lose a case TVM ran (NaN in a reference, importer idioms and
``call_tir``, graphs with no operator, scalar inputs, shapes known only at run time).
``python -m experiments.onnx_node_tests`` runs every float32 case."""

import pytest

from collage.measuring.timing import Timing
from experiments.onnx_node_tests import CRASHED, RIGHT, case_named, run_collage, run_tvm

BACKENDS = ["tvm", "onnxruntime", "openvino"]
# What is right does not depend on how long each candidate is timed.
FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.2, budget_s=0.2)
CASES = [
    # families the zoo and common models use
    "test_gemm_default_single_elem_vector_bias", "test_averagepool_2d_ceil",
    # a reference holding NaN (log outside its domain), ops that simplification used to fail on
    "test_log", "test_batchnorm_example", "test_rms_normalization_2d_axis0",
    # importer idioms: Clip as maximum/minimum, Conv with SAME padding as a call_tir of a pad
    "test_clip", "test_conv_with_autopad_same",
    # no operator left; scalar (0-d) inputs with a shape known only at run time
    "test_identity", "test_range_float_type_positive_delta",
]  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_wherever_tvm_alone_is_right_collage_is_right(name, tmp_path):
    case = case_named(name)
    tvm_alone = run_tvm(case, tmp_path)
    # The engines take whole files; the op-level libraries' kernels are tested on their own.
    collage = run_collage(case, tmp_path, cost_log=tmp_path / "costs.sqlite", backends=BACKENDS, timing=FAST)
    assert collage.status != CRASHED, collage.detail
    if tvm_alone.status == RIGHT:
        assert collage.status == RIGHT, collage.detail
