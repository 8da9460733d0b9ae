"""The engines fuse collage's conversion as they fuse torch's own ONNX export: for models
written by others (``experiments.corpus``), every operator kind ONNX Runtime's optimizer and
OpenVINO's compiler make of torch's file (Gelu, FusedMatMul, SimplifiedLayerNormalization,
OpenVINO's attention subgraphs) they also make of collage's (``experiments.conversion_parity``,
which times the two as well)."""

import functools

import pytest

from experiments import models
from experiments.conversion_parity import converted, onnxruntime_ops, openvino_ops

# Shape plumbing, which the two files may spell differently at no cost; and arithmetic, which
# no fusion makes: a kind of it missing from collage's file was folded there (DeBERTa's scale
# computed from a shape, a Mul in torch's file), not lost.
PLUMBING = {"Unsqueeze", "Squeeze", "Reshape", "Cast", "Convert", "Const", "Identity"}
ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Multiply", "Divide", "Subtract"}


@functools.cache
def files(name: str):
    """A corpus model, torch's ONNX export of it and collage's conversion, made once for
    every test and engine that reads them (DeBERTa's two: 5 s)."""
    w = models.load(name)
    return w, w.onnx, converted(w)


@pytest.mark.parametrize(
    "name",
    [
        "convnextv2",  # GELU (Div by sqrt 2), ReduceL2, linear layers on NHWC tensors
        "llama",  # RMSNorm (rsqrt as Div), grouped-query attention's 4-D matmuls, constant mask
        "deberta",  # FusedMatMul of a query two products read, one with a folded constant operand
    ],
)
@pytest.mark.parametrize("engine_ops", [onnxruntime_ops, openvino_ops], ids=["onnxruntime", "openvino"])
def test_the_engine_fuses_the_conversion_as_it_fuses_torchs_export(name, engine_ops):
    _, torchs_file, our_file = files(name)
    export, ours = engine_ops(torchs_file, 2), engine_ops(our_file, 2)
    lost = set(export) - set(ours) - PLUMBING - ARITHMETIC
    assert lost == set(), f"fusions lost: {sorted(lost)}"
    for kind in ("MatMul", "Softmax", "Erf", "Pow", "Sqrt"):  # what the fusions take in
        assert ours[kind] <= export[kind], f"{kind}: {ours[kind]} left where torch's file leaves {export[kind]}"


@pytest.mark.parametrize("name", ["regnet", "mlp"])
def test_biases_are_folded_into_convolutions_and_gemms_as_exporters_write_them(name):
    """A folded BatchNorm's or a linear layer's bias is the Conv's or Gemm's own input, as in
    torch's file, not an Add after it; the model computes what torch's does."""
    import numpy as np
    from collections import Counter

    from experiments.peers import onnxruntime_session

    w, torchs_file, ours = files(name)
    written = {m: Counter((n.op_type, len(n.input)) for n in f.graph.node) for m, f in (("export", torchs_file), ("ours", ours))}
    for op in ("Conv", "Gemm", "MatMul"):
        assert written["ours"][(op, 3)] == written["export"][(op, 3)], f"{op} with a bias: {written}"
    assert sum(c for (op, _), c in written["ours"].items() if op == "Add") == sum(
        c for (op, _), c in written["export"].items() if op == "Add")
    session = onnxruntime_session(ours, 2)
    (got,) = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), w.inputs)})
    (expected,) = w.reference()
    assert np.abs(got.reshape(expected.shape) - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("name", ["mlp", "regnet"])
@pytest.mark.parametrize("engine_ops", [onnxruntime_ops, openvino_ops], ids=["onnxruntime", "openvino"])
def test_the_engine_runs_no_layer_more_of_the_conversion(name, engine_ops):
    """No layer kind the engine runs more often of collage's file than of torch's: a linear
    layer's weight is written [out, in] for ``Gemm(transB=1)``, as exporters write it, where an
    [in, out] weight made OpenVINO run a Transpose of it as a layer of its own."""
    _, torchs_file, our_file = files(name)
    export, ours = engine_ops(torchs_file, 2), engine_ops(our_file, 2)
    more = {kind: (export[kind], n) for kind, n in ours.items() if n > export[kind] and kind not in PLUMBING - {"Reshape"}}
    assert more == {}, f"(torch's file, collage's) counts: {more}"
