"""An ONNX file with GRU or LSTM layers imports (TVM's importer has neither): each layer is
written out step by step, TVM computes what ONNX Runtime does on the file, and the ONNX
conversion rolls a layer back into one node for the engines."""

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from collage.candidates.onnx_convert import to_onnx
from collage.measuring.arrays import numpy_outputs, to_tensors
from collage.measuring.build import reference_vm, run_reference
from collage.model.frontend import export_onnx, import_model
from collage.model.simplify import simplify

STEPS, BATCH, INPUT, HIDDEN = 4, 2, 5, 3


def recurrent_model(kind="GRU", direction="forward", layout=0, initial_state=False, **attrs) -> onnx.ModelProto:
    """One ``kind`` node of random weights with all of its outputs."""
    rng = np.random.default_rng(0)
    directions, gates = 2 if direction == "bidirectional" else 1, 3 if kind == "GRU" else 4
    x_shape = (BATCH, STEPS, INPUT) if layout else (STEPS, BATCH, INPUT)
    state_shape = (BATCH, directions, HIDDEN) if layout else (directions, BATCH, HIDDEN)
    weights = {"W": (directions, gates * HIDDEN, INPUT), "R": (directions, gates * HIDDEN, HIDDEN),
               "B": (directions, 2 * gates * HIDDEN)}  # fmt: skip
    initializers = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.5, n) for n, s in weights.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    node_inputs = ["x", "W", "R", "B", ""]
    if initial_state:
        states = ["h0"] + (["c0"] if kind == "LSTM" else [])
        inputs += [helper.make_tensor_value_info(s, TensorProto.FLOAT, state_shape) for s in states]
        node_inputs += states
    outputs = ["y", "y_h"] + (["y_c"] if kind == "LSTM" else [])
    y_shape = (BATCH, STEPS, directions, HIDDEN) if layout else (STEPS, directions, BATCH, HIDDEN)
    node = helper.make_node(kind, node_inputs, outputs, hidden_size=HIDDEN, direction=direction, layout=layout, **attrs)
    graph = helper.make_graph([node], "recurrent", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape if o == "y" else state_shape)
                               for o in outputs], initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def inputs_of(model) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
    return [rng.standard_normal(s).astype("float32") for s in shapes]


def onnx_runtime(model, arrays) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def expected(case, arrays) -> list[np.ndarray]:
    """ONNX Runtime's outputs; batch first (layout 1), which it does not run, from the same
    weights time first, inputs and outputs transposed."""
    if not case.get("layout"):
        return onnx_runtime(recurrent_model(**case), arrays)
    time_first = onnx_runtime(recurrent_model(**{**case, "layout": 0}), [a.swapaxes(0, 1) for a in arrays])
    return [time_first[0].transpose(2, 0, 1, 3)] + [state.swapaxes(0, 1) for state in time_first[1:]]


CASES = [
    dict(kind="GRU", linear_before_reset=1),  # as torch writes it
    dict(kind="GRU"),  # ONNX's default: the reset gate before the new gate's product
    dict(kind="GRU", direction="reverse", linear_before_reset=1, initial_state=True),
    dict(kind="LSTM"),
    dict(kind="LSTM", direction="bidirectional", initial_state=True),
    dict(kind="GRU", direction="bidirectional", layout=1, linear_before_reset=1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_tvm_computes_every_output_of_the_file_as_onnx_runtime_does(case):
    model = recurrent_model(**case)
    arrays = inputs_of(model)
    got = run_reference(import_model(model).mod["main"], arrays)
    for ours, theirs in zip(got, expected(case, arrays), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if c.get("linear_before_reset")], ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_the_engines_get_the_layer_back_as_one_node(case):
    model = recurrent_model(**case)
    converted = to_onnx(simplify(import_model(model).mod)["main"])
    ops = Counter(n.op_type for n in converted.graph.node)
    assert ops[case["kind"]] == 1 and ops["Sigmoid"] == ops["MatMul"] == 0
    arrays = inputs_of(model)
    for ours, theirs in zip(onnx_runtime(converted, arrays), expected(case, arrays), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_layer_of_other_settings_is_left_to_the_importer_which_names_it():
    # The engines still run the file whole; the model itself, as given, stands in for TVM's import.
    model = recurrent_model("GRU", clip=1.0)
    imported = import_model(model)
    assert imported.not_imported.endswith("does not support operator(s) GRU")
    arrays = inputs_of(model)
    got = numpy_outputs(reference_vm(imported.mod)["main"](*to_tensors(arrays)))
    for ours, theirs in zip(got, onnx_runtime(model, arrays), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)



class PaddedLSTM(torch.nn.Module):
    """Two layers fed a sequence padded to whole frames, the padding computed from the
    input's length as EnCodec's encoder computes it: torch's ONNX export writes that
    arithmetic as operators, and the layers' input has no static shape until they are folded."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(INPUT, HIDDEN, num_layers=2)

    def forward(self, x):  # (batch, channels, samples)
        frames = torch.ceil(torch.tensor(x.shape[-1], dtype=torch.float32) / 4).to(torch.int64)
        x = torch.nn.functional.pad(x, (0, int(frames * 4 - x.shape[-1])))
        return self.lstm(x.permute(2, 0, 1))[0]


def test_a_layer_whose_length_the_model_computes_from_its_input_is_written_out_too():
    module, x = PaddedLSTM().eval(), torch.randn(BATCH, INPUT, 7)
    exported, _ = export_onnx(module, x)
    assert Counter(n.op_type for n in exported.graph.node)["LSTM"] == 2
    got = numpy_outputs(reference_vm(import_model(exported).mod)["main"](*to_tensors([x.numpy()])))
    np.testing.assert_allclose(got[0], module(x).detach().numpy(), rtol=1e-5, atol=1e-5)
