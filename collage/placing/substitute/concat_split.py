"""Concatenation and split: pairs that cancel, and element-wise operators moved across a split
so that what follows a merged operator runs once, on the whole tensor, and can fuse with it.

- ``split_of_concat``: the parts of ``split(concat(a, b, ...))`` cut where the concatenation
  joined are ``a, b, ...``;
- ``concat_of_split``: every part of ``split(y)``, in order, side by side in a ``concat``
  along the same axis, is ``y`` (and the concat of ``y`` alone is ``y``);
- ``elementwise_before_split``: when every part of ``split(y)`` goes through the same unary
  element-wise operator (ReLU after merged convolutions), or adds its own constant (their
  biases), the operator runs on ``y`` before the split.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...measuring.arrays import static_shape
from ...model.graph import TUPLE_GET_ITEM, DataflowGraph, Node
from .rule import Matches, Rewrite, index_of
from .site import Emitter, Site, read_outside

_split = is_op("relax.split")(wildcard())
_concat = is_op("relax.concat")(wildcard())
_split_of_concat = is_op("relax.split")(_concat)

# Operators of one tensor that act on each element alone (their other arguments are scalars).
UNARY_ELEMENTWISE = frozenset({
    "relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid",
    "relax.tanh", "relax.exp", "relax.clip", "relax.nn.leakyrelu", "relax.negative", "relax.abs",
})  # fmt: skip


def _axis(call: relax.Call, ndim: int) -> int:
    return int(call.attrs.axis) % ndim


def _cut_points(call: relax.Call) -> list[int] | None:
    """Where ``split`` cuts its input, as offsets along its axis (sections made explicit)."""
    size = static_shape(call.args[0].ty)[_axis(call, call.args[0].ty.ndim)]
    spec = call.attrs.indices_or_sections
    if isinstance(spec, tvm_ffi.Array | list | tuple):
        return [int(i) for i in spec]
    sections = int(spec)
    return [size // sections * k for k in range(1, sections)]


def _parts(graph: DataflowGraph, split_node: int) -> list[Node] | None:
    """The TupleGetItem readers of a split, one per part in order, or None if it has other
    readers, a part is read twice or not at all, or the split is an output."""
    if split_node in graph.outputs:
        return None
    readers = [graph[c] for c in graph.consumers[split_node]]
    if any(r.op != TUPLE_GET_ITEM for r in readers):
        return None
    by_index = {r.value.index: r for r in readers}
    count = len(_cut_points(graph[split_node].value)) + 1
    if len(by_index) != len(readers) or sorted(by_index) != list(range(count)):
        return None
    return [by_index[k] for k in range(count)]


def _split_of_concat_site(graph: DataflowGraph, matches: Matches) -> Site | None:
    split, concat = matches[_split_of_concat], matches[_concat]
    split_node, concat_node = index_of(graph, split), index_of(graph, concat)
    fields = concat.args[0]
    if split_node is None or concat_node is None or not isinstance(fields, relax.Tuple):
        return None
    ndim = concat.ty.ndim
    if _axis(split, ndim) != _axis(concat, ndim):
        return None
    widths = [static_shape(f.ty)[_axis(concat, ndim)] for f in fields.fields]
    if _cut_points(split) != np.cumsum(widths)[:-1].tolist():
        return None  # the split cuts elsewhere than the concatenation joined
    parts = _parts(graph, split_node)
    if parts is None:
        return None
    nodes = [split_node] + [p.index for p in parts]
    if read_outside(graph, [concat_node, *nodes]) <= {p.index for p in parts}:
        nodes.append(concat_node)  # the concatenation has no other reader: it goes too

    def build(emit: Emitter) -> dict[int, relax.Expr]:
        return {p.index: fields.fields[k] for k, p in enumerate(parts)}

    return Site("split_of_concat", tuple(sorted(nodes)), build)


SPLIT_OF_CONCAT = Rewrite("split_of_concat", _split_of_concat, _split_of_concat_site)


def _whole_split_run(graph: DataflowGraph, fields) -> tuple[int, int, list[int]] | None:
    """The first run of ``fields`` that is every part of one split in order: (where it starts,
    the split's node, the parts' nodes)."""
    producers = [graph.index_of_var.get(f) for f in fields]
    for start, first in enumerate(producers):
        if first is None or graph[first].op != TUPLE_GET_ITEM or graph[first].value.index != 0:
            continue
        split_node = graph.index_of_var.get(graph[first].value.tuple_value)
        if split_node is None or graph[split_node].op != "relax.split":
            continue
        count = len(_cut_points(graph[split_node].value)) + 1
        run = producers[start : start + count]
        if all(p is not None and graph[p].op == TUPLE_GET_ITEM and graph[p].value.index == k
               and graph.index_of_var.get(graph[p].value.tuple_value) == split_node
               for k, p in enumerate(run)) and len(run) == count:  # fmt: skip
            return start, split_node, run
    return None


def _concat_of_split_site(graph: DataflowGraph, matches: Matches) -> Site | None:
    concat = matches[_concat]
    fields = concat.args[0]
    concat_node = index_of(graph, concat)
    if concat_node is None or not isinstance(fields, relax.Tuple):
        return None
    found = _whole_split_run(graph, fields.fields)
    if found is None:
        return None
    start, split_node, parts = found
    split = graph[split_node].value
    if _axis(split, split.args[0].ty.ndim) != _axis(concat, concat.ty.ndim):
        return None
    nodes = {concat_node}
    if read_outside(graph, {concat_node, split_node, *parts}) == {concat_node}:
        nodes |= {split_node, *parts}  # the parts have no other reader: the split goes too
    joined = [*fields.fields[:start], split.args[0], *fields.fields[start + len(parts) :]]

    def build(emit: Emitter) -> dict[int, relax.Expr]:
        if len(joined) == 1:
            return {concat_node: joined[0]}
        return {concat_node: relax.Call(concat.op, [relax.Tuple(joined)], concat.attrs)}

    return Site("concat_of_split", tuple(sorted(nodes)), build)


CONCAT_OF_SPLIT = Rewrite("concat_of_split", _concat, _concat_of_split_site)


def _same_operator(calls: list[relax.Call]) -> bool:
    """Every call applies the same operator with the same attributes and scalar arguments."""
    first = calls[0]
    return all(
        c.op.same_as(first.op)
        and tvm_ffi.structural_equal(c.attrs, first.attrs)
        and len(c.args) == len(first.args)
        and all(tvm_ffi.structural_equal(a, b) for a, b in zip(c.args[1:], first.args[1:]))
        for c in calls
    )


def _per_part_constants(calls, parts, axis: int) -> np.ndarray | None:
    """For ``add(part_k, c_k)`` on every part: the constants joined along the split axis, if
    each has the part's extent there (or 1) and all have the same rank and dtype."""
    values = []
    for call, part in zip(calls, parts):
        other = call.args[1]
        if not isinstance(other, tvm.ir.GenericConst) or not call.args[0].same_as(part.var):
            return None
        value = other.value.numpy()
        ndim = part.ty.ndim
        if value.ndim != ndim or str(value.dtype) != str(part.ty.dtype):
            return None
        extent = static_shape(part.ty)[axis]
        if value.shape[axis] not in (1, extent):
            return None
        values.append(np.broadcast_to(value, value.shape[:axis] + (extent,) + value.shape[axis + 1:]))
    if len({v.shape[:axis] + v.shape[axis + 1:] for v in values}) != 1:
        return None
    return np.concatenate(values, axis=axis)


def _elementwise_before_split_site(graph: DataflowGraph, matches: Matches) -> Site | None:
    split = matches[_split]
    split_node = index_of(graph, split)
    if split_node is None:
        return None
    parts = _parts(graph, split_node)
    if parts is None:
        return None
    readers = [graph.consumers[p.index] for p in parts]
    if any(len(r) != 1 for r in readers):
        return None
    users = [graph[r[0]] for r in readers]
    if len({u.index for u in users}) != len(users) or any(u.call is None for u in users):
        return None  # each part must feed its own operator
    calls = [u.call for u in users]
    whole = split.args[0]
    axis = _axis(split, whole.ty.ndim)
    if all(c.op.name in UNARY_ELEMENTWISE for c in calls) and _same_operator(calls):
        if any(not c.args[0].same_as(p.var) for c, p in zip(calls, parts)):
            return None

        def apply_to(emit: Emitter) -> relax.Var:
            first = calls[0]
            return emit(relax.Call(first.op, [whole, *first.args[1:]], first.attrs, first.ty_args))

    elif all(c.op.name == "relax.add" for c in calls):
        constants = _per_part_constants(calls, parts, axis)
        if constants is None:
            return None

        def apply_to(emit: Emitter) -> relax.Var:
            return emit(relax.op.add(whole, relax.const(np.ascontiguousarray(constants), str(constants.dtype))))

    else:
        return None
    if any(not tvm_ffi.structural_equal(u.ty, p.ty) for u, p in zip(users, parts)):
        return None  # the operator changed the part's type (broadcast): not element-wise here
    nodes = tuple(sorted([split_node] + [p.index for p in parts] + [u.index for u in users]))

    def build(emit: Emitter) -> dict[int, relax.Expr]:
        moved = emit(relax.Call(split.op, [apply_to(emit)], split.attrs))
        return {u.index: relax.TupleGetItem(moved, k) for k, u in enumerate(users)}

    return Site("elementwise_before_split", nodes, build)


ELEMENTWISE_BEFORE_SPLIT = Rewrite("elementwise_before_split", _split, _elementwise_before_split_site)
