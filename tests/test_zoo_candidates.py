"""Every CPU backend's candidates on the smaller zoo models compile and match TVM.

The large models (ResNet-50, BERT-base, ...) go through the same check as a script:
``python -m experiments.check_candidates --model resnet50 bert``.
"""

import pytest

from experiments.check_candidates import check_module
from tests.helpers import zoo


# A fixed list, not the whole zoo: every distinct candidate is compiled on every backend.
# kws_dscnn (depthwise convs) and transformer_encoder (attention, GELU) bring operator mixes
# the first two lack; mobilenet_v2 (ReLU6 as clip) would add 70 s to the suite, and its ops
# are those of kws_dscnn plus clip, which test_onnx_convert covers. SqueezeNet (90 s) adds
# only concat and ceil-mode pooling, which test_onnx_convert covers too.
@pytest.mark.parametrize("model", ["mlp", "dcgan", "kws_dscnn", "transformer_encoder"])
def test_every_cpu_candidate_compiles_and_matches(model):
    report = check_module(zoo(model).relax)
    assert report["uncovered_by_tvm"] == []
    assert {"tvm", "dnnl", "mkl", "onnxruntime", "openvino"} <= set(report["backends"])
    assert report["backends"]["tvm"]["candidates"] > 0
    assert {name: entry["failed"] for name, entry in report["backends"].items() if entry["failed"]} == {}
