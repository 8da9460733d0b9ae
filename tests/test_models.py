"""Every zoo model's ONNX export, run by ONNX Runtime, matches PyTorch. Its Relax module, run by
TVM's default pipeline, is checked against PyTorch once simplified, as collage places it
(``tests/test_simplify.py``), where an import that computes otherwise fails as well; compiling
each model before simplification too took 50 s of the suite.

Models run at their reduced test sizes (``experiments.models.SMALL_INPUTS``). Tolerance: the
largest absolute difference must stay within 1e-3 of the reference's largest magnitude;
float32 accumulation-order differences across 50+ layers sit around 1e-5..3e-4 of it.
"""

import numpy as np
import pytest

from experiments import models
from tests.helpers import assert_close, zoo


@pytest.fixture(scope="module", params=list(models.MODELS))
def workload(request):
    return zoo(request.param)


def test_onnx_export_runs_in_onnxruntime(workload):
    import onnxruntime as ort

    model = workload.onnx
    assert model.ir_version <= 10
    assert {op.version for op in model.opset_import if op.domain in ("", "ai.onnx")} == {models.ONNX_OPSET}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), workload.inputs)}
    for o, r in zip(sess.run(None, feeds), workload.reference()):
        assert_close(o, r, f"{workload.name} on onnxruntime")


def test_weights_are_seeded():
    a, b = models.load("mlp"), models.load("mlp")
    np.testing.assert_array_equal(a.reference()[0], b.reference()[0])
    assert not np.array_equal(a.reference()[0], models.load("mlp", seed=1).reference()[0])


def test_unknown_model_names_the_zoo():
    with pytest.raises(KeyError, match="resnet50"):
        models.load("resnet51")
