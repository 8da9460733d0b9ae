"""ONNX's recurrent operators written out step by step, for TVM's ONNX importer.

TVM 0.27's importer has no ``GRU`` or ``LSTM``, so an ONNX file with a recurrent layer
could not be imported at all, where ONNX Runtime and OpenVINO run it. With static shapes a
layer is a fixed number of steps, each a few standard operators: written out in the form
torch's own decompositions take (``gru_cell``, ``lstm_cell``: the hidden state as
[1, batch, hidden], one product with the recurrent weight split into gates, the states
stacked by one Concat), which the ONNX conversion rolls back into one node for the engines
(``collage.candidates.onnx_recurrences``).

Only what the layers compute by default is written out: the default activations, no clip,
no peepholes, no ``input_forget``, no ``sequence_lens``. Anything else is left to the
importer, which then names the operator it does not support.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .onnx_nodes import NodeWriter, attributes

RECURRENT = ("GRU", "LSTM")
_DEFAULT_ACTIVATIONS = {"GRU": [b"Sigmoid", b"Tanh"], "LSTM": [b"Sigmoid", b"Tanh", b"Tanh"]}


def unrolled(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """``model`` with each GRU and LSTM node of static shapes (its inputs' dynamic axes
    fixed by ``shapes``, input name -> shape) and default settings written out step by step;
    ``model`` itself when it has none."""
    if not any(n.op_type in RECURRENT for n in model.graph.node):
        return model
    fixed = onnx.ModelProto.FromString(model.SerializeToString())
    for value in fixed.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, (shapes or {}).get(value.name, ())):
            dim.dim_value = int(size)
    inferred = onnx.shape_inference.infer_shapes(fixed)
    shapes = {v.name: _static(v) for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rewritten = onnx.ModelProto.FromString(model.SerializeToString())
    # The nodes written out for one layer at a time, under names the model does not use.
    writer = NodeWriter({n for node in model.graph.node for n in [*node.input, *node.output]} | set(constants))
    nodes = []
    for node in model.graph.node:
        written = _layer(writer, node, shapes, constants) if node.op_type in RECURRENT else None
        nodes += written if written is not None else [node]
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    rewritten.graph.initializer.extend(writer.initializers)
    return rewritten


def _static(value) -> tuple[int, ...] | None:
    dims = value.type.tensor_type.shape.dim
    if not value.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _layer(writer: NodeWriter, node, shapes: dict, constants: dict) -> list | None:
    """The nodes computing recurrent ``node`` step by step, or None when it is not of the
    kind written out here."""
    a = attributes(node)
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x_shape = shapes.get(inputs[0])
    weights = [constants.get(name) for name in inputs[1:4]]
    activations = a.get("activations", _DEFAULT_ACTIVATIONS[node.op_type][:])
    directions = 2 if a.get("direction", b"forward") == b"bidirectional" else 1
    if (x_shape is None or len(x_shape) != 3 or weights[0] is None or weights[1] is None
            or (inputs[3] and weights[2] is None) or inputs[4] or a.get("clip") is not None
            or activations != _DEFAULT_ACTIVATIONS[node.op_type] * directions and activations != _DEFAULT_ACTIVATIONS[node.op_type]
            or a.get("input_forget", 0) or (node.op_type == "LSTM" and inputs[7])):  # fmt: skip
        return None
    writer.nodes = []
    layout = a.get("layout", 0)
    x = inputs[0] if layout == 0 else writer.op("Transpose", [inputs[0]], perm=[1, 0, 2])
    steps, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    hidden = weights[1].shape[-1]
    gates = 3 if node.op_type == "GRU" else 4
    bias = weights[2] if weights[2] is not None else np.zeros((directions, 2 * gates * hidden), weights[0].dtype)
    reverse = [a.get("direction", b"forward") == b"reverse"] if directions == 1 else [False, True]
    ys, hs, cs = [], [], []
    for d in range(directions):
        w, r, b = weights[0][d], weights[1][d], bias[d]
        # The input's projection for every step at once, as torch's decompositions compute it.
        projected = writer.op("Add", [writer.op("MatMul", [x, writer.initializer(w.T)]), writer.initializer(b[: gates * hidden])])
        r_t, b_r = writer.initializer(r.T), writer.initializer(b[gates * hidden:])  # one recurrent weight for every step
        h = _initial(writer, inputs[5], d, batch, hidden, w.dtype)
        c = _initial(writer, inputs[6], d, batch, hidden, w.dtype) if node.op_type == "LSTM" else None
        states = [None] * steps
        for t in (reversed(range(steps)) if reverse[d] else range(steps)):
            x_t = writer.slice(projected, t, t + 1, 0)  # [1, batch, gates * hidden]
            recurrent = writer.op("Add", [writer.op("MatMul", [h, r_t]), b_r])
            if node.op_type == "GRU":
                h = _gru_step(writer, x_t, recurrent, h, hidden, a.get("linear_before_reset", 0), r, b)
            else:
                h, c = _lstm_step(writer, x_t, recurrent, c, hidden)
            states[t] = h
        ys.append(writer.op("Concat", states, axis=0))  # [steps, batch, hidden]
        hs.append(h)
        cs.append(c)
    _outputs(writer, node, ys, hs, cs, layout)
    return writer.nodes


def _initial(writer: NodeWriter, name: str, direction: int, batch: int, hidden: int, dtype) -> str:
    if not name:
        return writer.initializer(np.zeros((1, batch, hidden), dtype))
    return writer.slice(name, direction, direction + 1, 0)


def _gru_step(writer: NodeWriter, x_t: str, recurrent: str, h: str, hidden: int, linear_before_reset: int, r, b) -> str:
    """ONNX's gates z, r, h: h' = (h - n) * z + n, with n's recurrent term reset before
    (``linear_before_reset``) or after its product."""
    x_z, x_r, x_n = writer.op("Split", [x_t, writer.ints([hidden] * 3)], 3, axis=-1)
    h_z, h_r, h_n = writer.op("Split", [recurrent, writer.ints([hidden] * 3)], 3, axis=-1)
    z = writer.op("Sigmoid", [writer.op("Add", [h_z, x_z])])
    reset = writer.op("Sigmoid", [writer.op("Add", [h_r, x_r])])
    if linear_before_reset:
        recurrent_n = writer.op("Mul", [h_n, reset])
    else:  # (reset * h) @ R_h + Rb_h: the recurrent product of the new gate is its own
        product = writer.op("MatMul", [writer.op("Mul", [reset, h]), writer.initializer(r[2 * hidden:].T)])
        recurrent_n = writer.op("Add", [product, writer.initializer(b[5 * hidden:])])
    n = writer.op("Tanh", [writer.op("Add", [x_n, recurrent_n])])
    return writer.op("Add", [writer.op("Mul", [writer.op("Sub", [h, n]), z]), n])


def _lstm_step(writer: NodeWriter, x_t: str, recurrent: str, c: str, hidden: int) -> tuple[str, str]:
    """ONNX's gates i, o, f, c: c' = f * c + i * g, h' = o * tanh(c')."""
    gates = writer.op("Add", [recurrent, x_t])
    i, o, f, g = writer.op("Split", [gates, writer.ints([hidden] * 4)], 4, axis=-1)
    i, o, f = (writer.op("Sigmoid", [v]) for v in (i, o, f))
    c = writer.op("Add", [writer.op("Mul", [f, c]), writer.op("Mul", [i, writer.op("Tanh", [g])])])
    return writer.op("Mul", [o, writer.op("Tanh", [c])]), c


def _outputs(writer: NodeWriter, node, ys: list[str], hs: list[str], cs: list[str], layout: int) -> None:
    """Y [steps, directions, batch, hidden] (layout 1: [batch, steps, directions, hidden]),
    Y_h and Y_c [directions, batch, hidden] (layout 1: [batch, directions, hidden]), under
    the node's own output names."""
    outputs = list(node.output) + [""] * (3 - len(node.output))
    if outputs[0]:
        y = _joined(writer, [writer.op("Unsqueeze", [y, writer.ints([1])]) for y in ys], 1)
        writer.op("Transpose", [y], name=outputs[0], perm=[2, 0, 1, 3]) if layout else writer.op("Identity", [y], name=outputs[0])
    for name, states in ((outputs[1], hs), (outputs[2], cs)):
        if name:
            joined = _joined(writer, states, 0)
            writer.op("Transpose", [joined], name=name, perm=[1, 0, 2]) if layout else writer.op("Identity", [joined], name=name)


def _joined(writer: NodeWriter, names: list[str], axis: int) -> str:
    return names[0] if len(names) == 1 else writer.op("Concat", names, axis=axis)
