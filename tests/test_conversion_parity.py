"""The engines fuse collage's conversion as they fuse torch's own ONNX export: for models
written by others (``experiments.corpus``), every operator kind ONNX Runtime's optimizer and
OpenVINO's compiler make of torch's file (Gelu, FusedMatMul, SimplifiedLayerNormalization,
OpenVINO's attention subgraphs) they also make of collage's (``experiments.conversion_parity``,
which times the two as well)."""

import pytest

from experiments import models
from experiments.conversion_parity import converted, onnxruntime_ops, openvino_ops

# Shape plumbing, which the two files may spell differently at no cost.
PLUMBING = {"Unsqueeze", "Squeeze", "Reshape", "Cast", "Convert", "Const", "Identity"}


@pytest.mark.parametrize(
    "name",
    [
        "convnextv2",  # GELU (Div by sqrt 2), ReduceL2, linear layers on NHWC tensors
        "llama",  # RMSNorm (rsqrt as Div), grouped-query attention's 4-D matmuls, constant mask
    ],
)
@pytest.mark.parametrize("engine_ops", [onnxruntime_ops, openvino_ops], ids=["onnxruntime", "openvino"])
def test_the_engine_fuses_the_conversion_as_it_fuses_torchs_export(name, engine_ops):
    w = models.load(name)
    export, ours = engine_ops(w.onnx, 2), engine_ops(converted(w), 2)
    lost = set(export) - set(ours) - PLUMBING
    assert lost == set(), f"fusions lost: {sorted(lost)}"
    for kind in ("MatMul", "Softmax", "Erf", "Pow", "Sqrt"):  # what the fusions take in
        assert ours[kind] <= export[kind], f"{kind}: {ours[kind]} left where torch's file leaves {export[kind]}"
