"""NodeWriter: ONNX nodes and initializers being written, each under a name not taken yet.

The ONNX conversion of a sub-graph, its fusions into the engines' forms, and the recurrent
layers written out for TVM's importer all write ONNX this way.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from onnx import helper, numpy_helper


def attributes(node) -> dict:
    """A node's attributes by name, as values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class NodeWriter:
    def __init__(self, taken: Iterable[str] = (), initializers: list | None = None):
        self.nodes: list = []
        self.initializers: list = [] if initializers is None else initializers
        self._taken = set(taken)

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, name: str | None = None, **attrs) -> str | list[str]:
        """Emit one node; its output name (``name`` when given), or names when ``outputs`` > 1.
        Optional inputs left out at the end ("") are dropped."""
        names = [name or self.fresh(op_type.lower())] + [self.fresh(op_type.lower()) for _ in range(outputs - 1)]
        while inputs and inputs[-1] == "":
            inputs = inputs[:-1]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def initializer(self, array, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        """A 1-D int64 initializer: shapes, axes, slice bounds."""
        return self.initializer(np.array([int(v) for v in values], dtype="int64"), "ints")

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        """``x[start:end]`` along ``axis``."""
        return self.op("Slice", [x, self.ints([start]), self.ints([end]), self.ints([axis])])
