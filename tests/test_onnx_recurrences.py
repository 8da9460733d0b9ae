"""nn.GRU and nn.LSTM arrive from torch.export unrolled; the ONNX conversion rolls each layer
and direction back into one GRU or LSTM node, and both engines compute what PyTorch does."""

from collections import Counter

import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest
import torch
from torch import nn

from collage.candidates.onnx_convert import to_onnx
from collage.model.frontend import load_torch
from collage.model.simplify import simplify


class Recurrent(nn.Module):
    def __init__(self, kind: str, layers: int, bidirectional: bool, batch_first: bool, initial_state: bool):
        super().__init__()
        self.kind, self.initial_state = kind, initial_state
        self.rnn = getattr(nn, kind)(12, 8, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)

    def forward(self, x, h0, c0):
        if not self.initial_state:
            return self.rnn(x)[0]
        return self.rnn(x, (h0, c0) if self.kind == "LSTM" else h0)[0]


def converted(kind, layers=1, bidirectional=False, batch_first=True, initial_state=False, steps=6):
    torch.manual_seed(0)
    net = Recurrent(kind, layers, bidirectional, batch_first, initial_state).eval()
    x = torch.randn((2, steps, 12) if batch_first else (steps, 2, 12))
    states = torch.randn(layers * (1 + bidirectional), 2, 8)
    args = (x, states, states * 0.5)
    model = to_onnx(simplify(load_torch(net, args))["main"])
    return model, [a.numpy() for a in args], net(*args).detach().numpy()


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def onnx_runtime(model, arrays):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays[: len(names)])))[0]


def openvino(model, arrays):
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled.create_infer_request().infer(arrays[: len(compiled.inputs)])[0]


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize("layers, bidirectional, batch_first", [(1, False, True), (2, True, False)])
def test_each_layer_is_one_node_and_both_engines_compute_what_torch_does(kind, layers, bidirectional, batch_first):
    """A layer's two directions are one bidirectional node, as exporters write them: OpenVINO
    2026.4 computes the first of two GRU nodes reading one input wrong."""
    model, arrays, expected = converted(kind, layers, bidirectional, batch_first)
    counts = ops(model)
    # torch runs a first step from the zero state with its product folded away: it joins too
    assert counts[kind] == layers
    directions = {n.attribute[[a.name for a in n.attribute].index("direction")].s for n in model.graph.node if n.op_type == kind}
    assert directions == ({b"bidirectional"} if bidirectional else {b"forward"})
    assert counts["Sigmoid"] == counts["Tanh"] == counts["MatMul"] == 0  # no step is left written out
    # the stacked states, both directions side by side, are the node's output reshaped
    assert counts["Slice"] == counts["Concat"] == 0
    for engine in (onnx_runtime, openvino):
        np.testing.assert_allclose(engine(model, arrays), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_given_initial_state_is_the_nodes_initial_state(kind, bidirectional):
    model, arrays, expected = converted(kind, bidirectional=bidirectional, initial_state=True)
    (node,) = [n for n in model.graph.node if n.op_type == kind]
    assert node.input[5] != "" and (kind == "GRU" or node.input[6] != "")
    np.testing.assert_allclose(onnx_runtime(model, arrays), expected, rtol=1e-5, atol=1e-5)


def test_a_single_step_stays_written_out():
    model, arrays, expected = converted("GRU", steps=1)
    assert ops(model)["GRU"] == 0 and ops(model)["Sigmoid"] == 2
    np.testing.assert_allclose(onnx_runtime(model, arrays), expected, rtol=1e-5, atol=1e-5)


class HandWrittenCell(nn.Module):
    """A recurrence of the user's own, ``h = tanh(x W + h U)``: no engine operator computes it."""

    def __init__(self):
        super().__init__()
        self.w, self.u = nn.Linear(12, 8), nn.Linear(8, 8)

    def forward(self, x):
        h, states = torch.zeros(x.shape[0], 8), []
        for t in range(x.shape[1]):
            h = torch.tanh(self.w(x[:, t]) + self.u(h))
            states.append(h)
        return torch.stack(states, 1)


def test_a_recurrence_that_is_no_gru_or_lstm_is_left_as_written():
    torch.manual_seed(0)
    net, x = HandWrittenCell().eval(), torch.randn(2, 5, 12)
    model = to_onnx(simplify(load_torch(net, (x,)))["main"])
    assert ops(model)["GRU"] == ops(model)["LSTM"] == 0 and ops(model)["Tanh"] == 5
    np.testing.assert_allclose(onnx_runtime(model, [x.numpy()]), net(x).detach().numpy(), rtol=1e-5, atol=1e-5)
