"""Recurrent layers rolled back into ONNX's ``GRU`` and ``LSTM`` for the engines.

``torch.export`` hands ``nn.GRU`` and ``nn.LSTM`` over unrolled, in the form of torch's
decompositions ``gru_cell`` and ``lstm_cell``: per time step, the hidden state times the
recurrent weight plus its bias, split into gates, added to that step's slice of the input
projection, sigmoids and tanhs. An engine then runs a dozen small kernels per step, where
the user's own ONNX file gives ONNX Runtime and OpenVINO one recurrent kernel for the whole
sequence: a GRU over 32 tokens ran 0.085-0.11 ms unrolled (OpenVINO, the best of any
backend), against 0.042-0.061 ms as one ``GRU`` node (ONNX Runtime, 2-core Xeon).

A step is recognised by what it computes, not by the order its nodes were written in: sums
and products match either way round, and each gate is told apart by its activation and by
where it is used, not by its position in the split. Steps chain when each reads the state the
one before wrote, the same recurrent weight and bias, and the next (or previous) time slice of
one input tensor; a chain of two or more steps whose inner values are read by no one else
becomes one node. Its per-step states are slices of the node's output, and a concatenation of
consecutive states (how torch stacks them) one slice.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from onnx import numpy_helper

from ..model.onnx_nodes import NodeWriter, attributes

GRU, LSTM = "GRU", "LSTM"
_GATES = {GRU: 3, LSTM: 4}
# Steps name their gates in ONNX's order: GRU's update (z), reset (r) and new (n) gates;
# LSTM's input (i), output (o), forget (f) and cell (g) gates.
_ORDER = {GRU: "zrn", LSTM: "iofg"}


@dataclass(frozen=True, eq=False)
class Step:
    """One time step of a recurrent layer, as written out node by node."""

    kind: str  # GRU or LSTM
    h_prev: str | None  # the hidden state read; None when it is zero (see ``weight``)
    h: str  # the hidden state written
    c_prev: str | None  # LSTM's cell state read (a zero constant in a first step)
    c: str | None  # and written
    x: str  # this step's input projection, all gates (the recurrence's input at this step)
    # The recurrent weight, [hidden, gates * hidden] as MatMul reads it; None in a first step
    # from a zero state, where constant folding left only the recurrent bias of the product.
    weight: str | None
    bias: np.ndarray  # the recurrent bias, laid out as the step's split
    gates: tuple[int, ...]  # each gate's position in the step's split, in ONNX's gate order
    nodes: frozenset[int]  # ids of the nodes computing the step

    def continues(self, before: "Step") -> bool:
        """Whether this step runs the same layer on the state ``before`` wrote."""
        return self.kind == before.kind and self.gates == before.gates and before.weight in (None, self.weight) \
            and np.array_equal(self.bias, before.bias) and (self.h_prev, self.c_prev) == (before.h, before.c)  # fmt: skip


class _Match:
    """Who writes and who reads each value of the written nodes."""

    def __init__(self, w):
        self.w = w
        self.readers = defaultdict(list)
        self._canonical = {}
        for n in w.nodes:
            for name in n.input:
                self.readers[name].append(n)

    def made(self, name: str, op_type: str):
        n = self.w.producer.get(name)
        return n if n is not None and n.op_type == op_type else None

    @staticmethod
    def both(n):
        """A two-input node's inputs, either way round (sums and products commute)."""
        if n is None or len(n.input) != 2:
            return []
        return [(n.input[0], n.input[1]), (n.input[1], n.input[0])]

    def canonical(self, name: str) -> str:
        """The first constant holding the same values as constant ``name``: importers may
        write one weight once per step."""
        t = self.w.constants[name]
        return self._canonical.setdefault((tuple(t.dims), t.data_type, numpy_helper.to_array(t).tobytes()), name)

    def array(self, name: str) -> np.ndarray | None:
        t = self.w.constants.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def zeros(self, name: str) -> bool:
        """Whether ``name`` is a constant of zeros only."""
        array = self.array(name)
        return array is not None and not array.any()

    def split_of(self, name: str, parts: int):
        """(the Split node, the output's position) when ``name`` is one of ``parts`` equal
        parts of a Split along the last axis, else None."""
        n = self.w.producer.get(name)
        if n is None or n.op_type != "Split" or len(n.output) != parts:
            return None
        rank = len(self.w.shapes.get(n.input[0], ()))
        axis = attributes(n).get("axis", 0)
        sizes = self.w.ints(n.input[1]) if len(n.input) > 1 else None
        if rank == 0 or axis not in (-1, rank - 1) or sizes is None or len(set(sizes)) != 1:
            return None
        return n, list(n.output).index(name)

    def projection(self, name: str):
        """(x, weight, bias, nodes) when ``name`` is ``x @ weight (+ bias)`` with constant
        weight and bias, the sum either way round, else None."""
        add = self.made(name, "Add")
        bias, product, nodes = None, name, []
        for a, b in self.both(add):
            if b in self.w.constants and self.made(a, "MatMul") is not None:
                bias, product, nodes = b, a, [add]
                break
        matmul = self.made(product, "MatMul")
        if matmul is None or matmul.input[1] not in self.w.constants:
            return None
        return matmul.input[0], self.canonical(matmul.input[1]), bias, nodes + [matmul]

    def time_slice(self, name: str):
        """(tensor, time axis, time) when ``name`` is one time step of a 3-D tensor: a Slice
        of length one (squeezed or not) or a Gather of one index."""
        squeezed = self.w.producer.get(name)
        if squeezed is not None and squeezed.op_type in ("Reshape", "Squeeze"):
            name = squeezed.input[0]
        n = self.w.producer.get(name)
        if n is None:
            return None
        if n.op_type == "Slice" and len(n.input) >= 4:
            starts, ends, axes = (self.w.ints(i) for i in n.input[1:4])
            steps = self.w.ints(n.input[4]) if len(n.input) > 4 else [1]
            if None in (starts, ends, axes, steps) or len(axes) != 1 or steps != [1] or ends[0] != starts[0] + 1:
                return None
            tensor, axis, time = n.input[0], axes[0], starts[0]
        elif n.op_type == "Gather":
            index = self.w.constants.get(n.input[1])
            if index is None or index.dims:
                return None
            tensor, time = n.input[0], int(numpy_helper.to_array(index))
            axis = attributes(n).get("axis", 0)
        else:
            return None
        shape = self.w.shapes.get(tensor)
        if shape is None or len(shape) != 3 or axis not in (0, 1) or not 0 <= time < shape[axis]:
            return None
        flipped = self.flipped(tensor, axis, shape[axis])
        if flipped is not None:  # how torch runs a reverse direction: forward over the input flipped
            return flipped, axis, shape[axis] - 1 - time
        return tensor, axis, time

    def flipped(self, name: str, axis: int, length: int) -> str | None:
        """The tensor ``name`` is, reversed along ``axis``, else None."""
        n = self.made(name, "Slice")
        if n is None or len(n.input) != 5:
            return None
        starts, ends, axes, steps = (self.w.ints(i) for i in n.input[1:5])
        if axes != [axis] or steps != [-1] or None in (starts, ends):
            return None
        everything = list(range(length))
        return n.input[0] if everything[starts[0]:ends[0]:-1] == everything[::-1] else None


def _gru_step(m: _Match, h: str) -> Step | None:
    """torch's ``gru_cell``: h = (h_prev - n) * z + n, n = tanh(x_n + r * hh_n),
    r = sigmoid(hh_r + x_r), z = sigmoid(hh_z + x_z), where hh = h_prev @ R + b and x is
    split from this step's input projection."""
    out = m.made(h, "Add")
    for a, n_name in m.both(out):
        tanh, mul = m.made(n_name, "Tanh"), m.made(a, "Mul")
        for d, z_name in m.both(mul) if tanh is not None else []:
            sub, z = m.made(d, "Sub"), m.made(z_name, "Sigmoid")
            if sub is None or z is None or sub.input[1] != n_name:
                continue
            for x_n, scaled in m.both(m.made(tanh.input[0], "Add")):
                for hh_n, r_name in m.both(m.made(scaled, "Mul")):
                    r, x_part = m.made(r_name, "Sigmoid"), m.split_of(x_n, 3)
                    gated = {"z": _gate(m, z, x_part), "r": _gate(m, r, x_part) if r is not None else None}
                    if x_part is None or None in gated.values():
                        continue
                    hidden = {"z": gated["z"][1], "r": gated["r"][1], "n": hh_n}
                    positions = {"z": gated["z"][0], "r": gated["r"][0], "n": x_part[1]}
                    nodes = [out, mul, sub, z, r, tanh, x_part[0]] + [m.w.producer[v] for v in
                             (tanh.input[0], scaled, z.input[0], r.input[0])]  # fmt: skip
                    step = _gru_from_hidden(m, h, sub.input[0], hidden, positions, x_part[0], nodes)
                    if step is not None:
                        return step
    return None


def _gate(m: _Match, activation, x_part) -> tuple[int, str] | None:
    """(the gate's position in the input's split, the hidden term) when ``activation``
    reads the sum of a part of the input's split and a hidden term, else None."""
    for hidden, x in m.both(m.made(activation.input[0], "Add")) if x_part is not None else []:
        part = m.split_of(x, 3)
        if part is not None and part[0] is x_part[0]:
            return part[1], hidden
    return None


def _gru_from_hidden(m: _Match, h, h_prev, hidden: dict, positions: dict, x_split, nodes) -> Step | None:
    """The GRU step whose gates' hidden terms are ``hidden``: parts of ``h_prev @ R + b``
    at the input's positions, or, from a zero state, constants (the bias alone)."""
    gates = tuple(positions[g] for g in _ORDER[GRU])
    parts = [m.split_of(hidden[g], 3) for g in _ORDER[GRU]]
    if all(p is not None and p[0] is parts[0][0] and p[1] == positions[g] for p, g in zip(parts, _ORDER[GRU])):
        split = parts[0][0]
        projected = m.projection(split.input[0])
        if projected is None or projected[0] != h_prev:
            return None
        _, weight, bias, projection = projected
        bias = _bias(m, bias, m.w.shapes.get(split.input[0], [0])[-1])
        own = nodes + projection + [split]
    elif all(hidden[g] in m.w.constants for g in _ORDER[GRU]) and m.zeros(h_prev):
        blocks = {positions[g]: _bias(m, hidden[g], m.array(hidden[g]).shape[-1]) for g in _ORDER[GRU]}
        if any(b is None for b in blocks.values()) or len({b.size for b in blocks.values()}) != 1:
            return None
        weight, h_prev, bias, own = None, None, np.concatenate([blocks[k] for k in range(3)]), nodes
    else:
        return None
    step = Step(GRU, h_prev, h, None, None, x_split.input[0], weight, bias, gates, frozenset(id(n) for n in own))
    return _own(m, step, own)


def _bias(m: _Match, name: str | None, width: int) -> np.ndarray | None:
    """A constant bias of ``width`` values as a vector (zeros when there is none), also when
    constant folding repeated it along leading axes (a zero state's bias, per batch row)."""
    if name is None:
        return np.zeros(width, "float32")
    array = m.array(name)
    if array.ndim == 0 or array.shape[-1] != width:
        return None
    rows = array.reshape(-1, width)
    return rows[0] if (rows == rows[0]).all() else None


def _lstm_step(m: _Match, h: str) -> Step | None:
    """torch's ``lstm_cell``: h = o * tanh(c), c = f * c_prev + i * g, with sigmoid gates
    i, f, o and tanh gate g split from h_prev @ R + b + this step's input projection."""
    out = m.made(h, "Mul")
    for o_name, t_name in m.both(out):
        o, tanh_c = m.made(o_name, "Sigmoid"), m.made(t_name, "Tanh")
        if o is None or tanh_c is None:
            continue
        c = tanh_c.input[0]
        for forget_term, input_term in m.both(m.made(c, "Add")):
            for f_name, c_prev in m.both(m.made(forget_term, "Mul")):
                for i_name, g_name in m.both(m.made(input_term, "Mul")):
                    gates = {"i": m.made(i_name, "Sigmoid"), "o": o, "f": m.made(f_name, "Sigmoid"),
                             "g": m.made(g_name, "Tanh")}  # fmt: skip
                    at = {g: m.split_of(n.input[0], 4) if n is not None else None for g, n in gates.items()}
                    if None in at.values() or len({id(s) for s, _ in at.values()}) != 1:
                        continue
                    split = at["i"][0]
                    nodes = [out, tanh_c, m.w.producer[c], m.w.producer[forget_term], m.w.producer[input_term],
                             *gates.values(), split]  # fmt: skip
                    step = _lstm_from_sum(m, h, c_prev, c, split.input[0], tuple(at[g][1] for g in _ORDER[LSTM]), nodes)
                    if step is not None:
                        return step
    return None


def _lstm_from_sum(m: _Match, h, c_prev, c, total, order, nodes) -> Step | None:
    """The LSTM step whose gates are ``total``: h_prev @ R, a constant bias and the input,
    summed in any order; from a zero state (``c_prev`` zeros) the product is folded away."""
    terms, adds = _sum_terms(m, total)
    width = m.w.shapes.get(total, [0])[-1]
    products = [t for t in terms if m.made(t, "MatMul") is not None and m.made(t, "MatMul").input[1] in m.w.constants]
    constants = [t for t in terms if t in m.w.constants]
    x = [t for t in terms if t not in constants and t not in products]
    if len(x) != 1 or len(constants) > 1 or len(products) > 1 or (not products and not m.zeros(c_prev)):
        return None
    bias = _bias(m, (constants or [None])[0], width)
    if bias is None:
        return None
    product = m.made(products[0], "MatMul") if products else None
    h_prev, weight = (product.input[0], m.canonical(product.input[1])) if product is not None else (None, None)
    own = nodes + adds + ([product] if product is not None else [])
    return _own(m, Step(LSTM, h_prev, h, c_prev, c, x[0], weight, bias, order, frozenset(id(n) for n in own)), own)


def _sum_terms(m: _Match, name: str) -> tuple[list[str], list]:
    """The terms of ``name``, a tree of Adds whose inner sums are read once, and the Adds."""
    add = m.made(name, "Add")
    if add is None:
        return [name], []
    terms, adds = [], [add]
    for operand in add.input:
        if m.made(operand, "Add") is not None and len(m.readers[operand]) == 1:
            more, more_adds = _sum_terms(m, operand)
            terms, adds = terms + more, adds + more_adds
        else:
            terms.append(operand)
    return terms, adds


def _own(m: _Match, step: Step, nodes: list) -> Step | None:
    """``step`` (computed by ``nodes``) when no one else reads what it computes inside, its
    states aside."""
    for n in nodes:
        for name in n.output:
            if name not in (step.h, step.c) and any(id(r) not in step.nodes for r in m.readers[name]):
                return None
    return step


# --------------------------------------------------------------------------- chains


@dataclass(frozen=True)
class _Chain:
    steps: tuple[Step, ...]
    tensor: str  # the 3-D input projection the steps slice
    axis: int  # its time axis
    times: tuple[int, ...]  # each step's time

    @property
    def forward(self) -> bool:
        return self.times[-1] > self.times[0]


def _chains(m: _Match) -> list[_Chain]:
    steps = []
    for n in m.w.nodes:
        find = {"Add": _gru_step, "Mul": _lstm_step}.get(n.op_type)
        step = find(m, n.output[0]) if find is not None else None
        if step is not None:
            steps.append(step)
    after = {s.h_prev: s for s in steps if s.h_prev is not None}
    followed = {id(after[s.h]) for s in steps if s.h in after and after[s.h].continues(s)}
    chains = []
    for first in steps:
        sliced = m.time_slice(first.x)
        if id(first) in followed or sliced is None:
            continue
        run, times = [first], [sliced[2]]
        while run[-1].h in after:
            step, at = after[run[-1].h], m.time_slice(after[run[-1].h].x)
            if not step.continues(run[-1]) or at is None or at[:2] != sliced[:2] or abs(at[2] - times[-1]) != 1:
                break
            if len(times) > 1 and at[2] - times[-1] != times[1] - times[0]:
                break  # one direction only
            if run[-1].c is not None and any(id(r) not in step.nodes | run[-1].nodes for r in m.readers[run[-1].c]):
                break  # a cell state read elsewhere: only the last one is an output
            run.append(step)
            times.append(at[2])
        if len(run) >= 2:
            chains.append(_Chain(tuple(run), sliced[0], sliced[1], tuple(times)))
    return chains


# --------------------------------------------------------------------------- the ONNX node


def _blocks(array: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """``array``'s equal blocks along its first axis, in ``order``."""
    parts = np.split(array, len(order))
    return np.concatenate([parts[k] for k in order])


@dataclass(frozen=True, eq=False)
class _Layer:
    """A chain as ONNX's operator reads it: weights in ONNX's gate order."""

    chain: _Chain
    x: str  # the sequence the node reads: the input of the chain's input projection, or that projection
    w: np.ndarray  # [gates * hidden, input]
    r: np.ndarray  # [gates * hidden, hidden]
    b: np.ndarray  # [2 * gates * hidden]: the input's bias, then the recurrent one
    batch: int

    @property
    def kind(self) -> str:
        return self.chain.steps[0].kind

    @property
    def hidden(self) -> int:
        return self.r.shape[1]

    @property
    def sequence(self) -> tuple:
        """What the node reads as its input, and the times it runs."""
        times = self.chain.times
        return self.kind, self.x, self.chain.axis, min(times), max(times), self.hidden, self.w.shape


def _layer(m: _Match, chain: _Chain) -> _Layer | None:
    """``chain`` as one node's weights, or None when it does not fit ONNX's operator."""
    first = chain.steps[0]
    recurrent = m.array(chain.steps[1].weight)  # [hidden, gates * hidden]; the first may start from zero
    shape = m.w.shapes.get(chain.tensor)
    if recurrent is None or recurrent.ndim != 2 or shape is None:
        return None
    hidden, width = recurrent.shape
    if width != _GATES[first.kind] * hidden or shape[2] != width or first.bias.size != width:
        return None
    x, w_in, b_in = chain.tensor, np.eye(width, dtype=recurrent.dtype), np.zeros(width, recurrent.dtype)
    source = m.projection(chain.tensor)  # the input's own projection, which the node runs too
    if source is not None and len(m.w.shapes.get(source[0], ())) == 3:
        weight, bias = m.array(source[1]), _bias(m, source[2], width)
        if weight.ndim == 2 and weight.shape[1] == width and bias is not None:
            x, w_in, b_in = source[0], weight, bias
    order = first.gates
    b = np.concatenate([_blocks(b_in, order), _blocks(first.bias, order)])
    return _Layer(chain, x, _blocks(w_in.T, order), _blocks(recurrent.T, order), b, shape[1 - chain.axis])


def _nodes(layers: list[_Layer]) -> list[list[_Layer]]:
    """The layers as nodes: a forward and a reverse layer of one sequence as one
    bidirectional node, as exporters write them (OpenVINO 2026.4 computes the first of two
    GRU nodes reading one input wrong), any other layer alone."""
    grouped = defaultdict(list)
    for layer in layers:
        grouped[layer.sequence].append(layer)
    nodes = []
    for group in grouped.values():
        forward = [layer for layer in group if layer.chain.forward]
        reverse = [layer for layer in group if not layer.chain.forward]
        while forward and reverse:
            nodes.append([forward.pop(0), reverse.pop(0)])
        nodes += [[layer] for layer in forward + reverse]
    return nodes


def rolled_recurrences(w) -> tuple[dict, set]:
    """The fusion (``onnx_convert``'s ``_FUSED_FORMS``): each chain of steps as one GRU or
    LSTM node, and each state read afterwards as its slice of the node's output."""
    m = _Match(w)
    layers = [layer for layer in map(functools.partial(_layer, m), _chains(m)) if layer is not None]
    replaced, dropped = {}, set()
    for group in _nodes(layers):
        emitted = _Emitted(w)
        emitted.recurrence(group)
        # Nodes reading the states are rewritten too, all where the first node replaced was:
        # ``_engines_forms`` then puts them in order.
        stacks = _stacked_states(m, group, emitted, dropped)
        if len(stacks) == 2:
            _directions_side_by_side(m, emitted, stacks, dropped)
        nodes = [n for n in w.nodes if any(id(n) in s.nodes for layer in group for s in layer.chain.steps)]
        replaced[id(nodes[0])] = emitted.nodes
        dropped.update(id(n) for n in nodes[1:])
    return replaced, dropped


def _directions_side_by_side(m: _Match, emitted: "_Emitted", stacks: dict[int, str], dropped: set) -> None:
    """A Concat of the two directions' whole stacks along the features (how torch joins a
    bidirectional layer's outputs) written as Y itself, transposed and reshaped, as exporters
    write it; the Concat joins ``dropped``."""
    for concat in m.readers[stacks[0]]:
        axis = attributes(concat).get("axis", 0)
        shape = m.w.shapes.get(concat.output[0])
        if concat.op_type == "Concat" and list(concat.input) == [stacks[0], stacks[1]] and shape is not None \
                and axis in (-1, len(shape) - 1) and len(shape) == 3:  # fmt: skip
            turned = emitted.op("Transpose", [emitted.y], perm=[0, 2, 1, 3])  # [time, batch, direction, hidden]
            emitted.op("Reshape", [turned, emitted.ints(shape)], name=concat.output[0])
            dropped.add(id(concat))
            return


class _Emitted(NodeWriter):
    """Nodes written for one recurrent node, named in the name space of the graph written."""

    def __init__(self, w):
        super().__init__(initializers=w.initializers)
        self.w = w
        self.y, self.positions, self.directions = None, {}, 1  # each state's (direction, time) in Y

    def fresh(self, hint: str) -> str:
        return self.w.fresh(hint)

    def of_y(self, direction: int, time: int, count: int, shape, name: str | None = None) -> str:
        """``count`` states of one direction from ``time`` on, as ``shape`` (named ``name``)."""
        whole = count == self.w.shapes.get(self.y, [None])[0] and self.directions == 1
        part = self.y if whole else self.op(
            "Slice", [self.y, self.ints([time, direction]), self.ints([time + count, direction + 1]), self.ints([0, 1])])
        return self.op("Reshape", [part, self.ints(shape)], name=name)

    def states(self, group: list[_Layer], name: str) -> str:
        """The initial states (``name``: "h_prev" or "c_prev") as the node reads them:
        "" (zeros) when every direction starts from zero."""
        first = [layer.chain.steps[0] for layer in group]
        if all(step.h_prev is None for step in first):
            return ""
        layer = group[0]
        shape = [1, layer.batch, layer.hidden]
        parts = [self.op("Reshape", [getattr(step, name), self.ints(shape)]) if step.h_prev is not None
                 else self.initializer(np.zeros(shape, layer.r.dtype), "zeros") for step in first]  # fmt: skip
        return parts[0] if len(parts) == 1 else self.op("Concat", parts, axis=0)

    def recurrence(self, group: list[_Layer]) -> None:
        """Write ``group`` (one layer, or a forward and a reverse one) as one node, and each
        state as its slice of the node's output."""
        w, layer = self.w, group[0]
        chain, kind = layer.chain, layer.kind
        x = layer.x if chain.axis == 0 else self.op("Transpose", [layer.x], perm=[1, 0, 2])
        lo, hi = min(chain.times), max(chain.times)
        if (lo, hi) != (0, w.shapes[chain.tensor][chain.axis] - 1):
            x = self.slice(x, lo, hi + 1, 0)
        inputs = [x] + [self.initializer(np.stack([getattr(lay, a) for lay in group]), a.upper()) for a in "wrb"]
        inputs += ["", self.states(group, "h_prev")]
        self.directions = len(group)
        direction = "bidirectional" if len(group) == 2 else "forward" if chain.forward else "reverse"
        attrs = {"hidden_size": layer.hidden, "direction": direction}
        if kind == LSTM:
            inputs.append(self.states(group, "c_prev"))
            self.y, _, y_c = self.op(LSTM, inputs, 3, **attrs)
            w.shapes[y_c] = [len(group), layer.batch, layer.hidden]
        else:
            self.y, _ = self.op(GRU, inputs, 2, linear_before_reset=1, **attrs)
        w.shapes[self.y] = [hi - lo + 1, len(group), layer.batch, layer.hidden]
        for d, lay in enumerate(group):
            for step, time in zip(lay.chain.steps, lay.chain.times):  # Y holds the states in time order
                self.positions[step.h] = (d, time - lo)
                self.of_y(d, time - lo, 1, w.shapes[step.h], name=step.h)
            if kind == LSTM:
                last = lay.chain.steps[-1].c
                self.op("Reshape", [self.slice(y_c, d, d + 1, 0), self.ints(w.shapes[last])], name=last)


def _stacked_states(m: _Match, group: list[_Layer], emitted: _Emitted, dropped: set) -> dict[int, str]:
    """Concatenations of consecutive states along a leading unit axis (how torch stacks a
    layer's outputs) written to read Y, or a slice of it, at once, the Concats joining
    ``dropped``; the names of those that stack all of one direction's states, by direction."""
    positions, stacks = emitted.positions, {}
    steps = len(group[0].chain.steps)
    concats = {id(n): n for layer in group for s in layer.chain.steps for n in m.readers[s.h] if n.op_type == "Concat"}
    for concat in concats.values():
        axis, names = attributes(concat).get("axis", 0), list(concat.input)
        inputs, k = [], 0
        while k < len(names):
            end = k  # the run of states names[k:end + 1], consecutive in Y
            while end + 1 < len(names) and _follows(positions, names[end], names[end + 1]):
                end += 1
            shape, count = m.w.shapes.get(names[k]), end - k + 1
            if count == 1 or axis != 0 or shape is None or len(shape) != 3 or shape[0] != 1:
                inputs += names[k:end + 1]
            else:
                whole = count == len(names)  # the concatenation is this run
                direction, time = positions[names[k]]
                inputs.append(emitted.of_y(direction, time, count, [count, *shape[1:]],
                                           name=concat.output[0] if whole else None))  # fmt: skip
                if whole and count == steps:
                    stacks[direction] = concat.output[0]
            k = end + 1
        if len(inputs) < len(names):
            if len(inputs) > 1:
                emitted.op("Concat", inputs, name=concat.output[0], axis=axis)
            dropped.add(id(concat))
    return stacks


def _follows(positions: dict, a: str, b: str) -> bool:
    """Whether state ``b`` comes right after state ``a`` in one direction of Y."""
    return a in positions and b in positions and positions[b] == (positions[a][0], positions[a][1] + 1)
