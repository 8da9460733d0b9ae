"""SubGraph: a frozen set of node indices of one DataflowGraph.

Cheap to build, hash and compare; a Relax function is extracted from it only when it is
compiled or measured (``extract``). ``structural_key`` names what a backend would compile, as
far as its cost goes: two sub-graphs with the same ops, attributes, shapes and dtypes share a
key wherever they sit, whatever their weights hold and whichever element their ``take``s
read, so each is measured once.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..model.graph import CALLEES_ATTR, DataflowGraph, global_vars

Constant = tvm.ir.GenericConst  # relax.const(...)
TAKE = tvm.ir.Op.get("relax.take")


@dataclass(frozen=True)
class SubGraph:
    graph: DataflowGraph = field(compare=False, repr=False)
    nodes: frozenset[int]

    def __post_init__(self):
        if not self.nodes:
            raise ValueError("a sub-graph holds at least one node")

    def __len__(self):
        return len(self.nodes)

    def __contains__(self, index: int):
        return index in self.nodes

    def union(self, other: SubGraph | int) -> SubGraph:
        more = other.nodes if isinstance(other, SubGraph) else {other}
        return SubGraph(self.graph, self.nodes | more)

    @property
    def ops(self) -> list[str]:
        return [self.graph[i].op for i in sorted(self.nodes)]

    @functools.cached_property
    def depth(self) -> int:
        """The operators on its longest path: how many roundings a value may pass through."""
        longest: dict[int, int] = {}
        for i in sorted(self.nodes):  # node indices are in topological order
            longest[i] = 1 + max((longest[p] for p in self.graph[i].inputs if p in longest), default=0)
        return max(longest.values())

    # ------------------------------------------------------------------ boundary

    @functools.cached_property
    def outputs(self) -> tuple[int, ...]:
        """Nodes whose value is needed outside: by a node outside, or as a graph output."""
        g = self.graph
        return tuple(
            i
            for i in sorted(self.nodes)
            if i in g.outputs or any(c not in self.nodes for c in g.consumers[i])
        )

    @functools.cached_property
    def inputs(self) -> tuple[relax.Expr, ...]:
        """Values read from outside, in first-use order: producer vars, function parameters
        and constants."""
        seen: dict[relax.Expr, None] = {}
        for i in sorted(self.nodes):
            for value in _leaf_args(self.graph[i].value):
                if isinstance(value, Constant) or (
                    isinstance(value, relax.Var) and self.graph.index_of_var.get(value) not in self.nodes
                ):
                    seen.setdefault(value, None)
        return tuple(seen)

    @functools.cached_property
    def mask(self) -> int:
        """The member nodes as a bit mask (bit i: node i), as the placement's searches and the
        graph's ``descendants`` hold node sets."""
        bits = 0
        for i in self.nodes:
            bits |= 1 << i
        return bits

    @functools.cached_property
    def input_nodes(self) -> frozenset[int]:
        return frozenset(p for i in self.nodes for p in self.graph[i].inputs if p not in self.nodes)

    # ------------------------------------------------------------------ shape checks

    def has_tensor_boundary(self) -> bool:
        """Every value crossing the boundary is a tensor. A kernel reads and writes flat
        tensors, so a tuple may live inside a partition but not pass between two."""
        crossing = [v.ty for v in self.inputs] + [self.graph[i].ty for i in self.outputs]
        return all(isinstance(ty, relax.TensorType) for ty in crossing)

    def is_connected(self) -> bool:
        """Connected when edges are read in both directions."""
        g, start = self.graph, min(self.nodes)
        seen, todo = {start}, [start]
        while todo:
            i = todo.pop()
            for j in (*g[i].inputs, *g.consumers[i]):
                if j in self.nodes and j not in seen:
                    seen.add(j)
                    todo.append(j)
        return len(seen) == len(self.nodes)

    def is_convex(self) -> bool:
        """No path leaves the sub-graph and comes back: such a sub-graph could not run as one
        kernel, since it would need a value computed from its own output."""
        g, members = self.graph, self.mask
        leaving = {c for i in self.nodes for c in g.consumers[i] if not (members >> c) & 1}
        return not any(g.descendants[c] & members for c in leaving)

    # ------------------------------------------------------------------ extraction

    def arguments(self, lift_constants: bool = False) -> list[relax.Expr]:
        """What a call of the extracted function passes, in parameter order: the inputs, less
        the constants that stay inside it."""
        return [
            value
            for value in self.inputs
            if not isinstance(value, Constant) or (lift_constants and is_tensor_constant(value))
        ]

    def extract(self, lift_constants: bool = False, outputs: tuple[int, ...] | None = None) -> relax.Function:
        """The sub-graph as a standalone Relax function ``main(inputs...) -> outputs``
        (``self.outputs`` unless other member nodes are named).

        With ``lift_constants``, tensor constants (weights) become parameters too; scalar
        constants stay, since their values change what is computed (``x ** 2`` vs ``x ** 3``).
        """
        params_for = {value: relax.Var(f"p{k}", value.ty) for k, value in enumerate(self.arguments(lift_constants))}
        remap = Remap(params_for)
        bb = relax.BlockBuilder()
        with bb.function("main", list(params_for.values()), {"global_symbol": "main"}):
            with bb.dataflow():
                for i in sorted(self.nodes):
                    remap.mapping[self.graph[i].var] = bb.emit(remap.visit_expr(self.graph[i].value))
                outs = [remap.mapping[self.graph[i].var] for i in (self.outputs if outputs is None else outputs)]
                out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
            bb.emit_func_output(out)
        func = bb.get()["main"]
        callees = self.callees()
        return func.with_attr(CALLEES_ATTR, callees) if callees else func

    def callees(self) -> dict[relax.GlobalVar, tvm.ir.BaseFunc]:
        """The module functions the sub-graph's nodes call (``call_tir``'s PrimFuncs)."""
        used = [gv for i in sorted(self.nodes) for gv in global_vars(self.graph[i].value)]
        return {gv: self.graph.callees[gv] for gv in dict.fromkeys(used) if gv in self.graph.callees}

    @functools.cached_property
    def structural_key(self) -> str:
        """sha256 of the extracted function's TVMScript, weights lifted to typed parameters and
        the element a ``take`` reads written as the first (``AnyPosition``)."""
        func = self.extract(lift_constants=True).without_attr(CALLEES_ATTR)
        if TAKE.name in self.ops:  # the mutator's walk in Python is paid only where it changes something
            func = AnyPosition().visit_expr(func)
        texts = [func.script(show_meta=False), *(f.script(show_meta=False) for f in self.callees().values())]
        return hashlib.sha256("\n".join(texts).encode()).hexdigest()

    def __repr__(self):
        return f"SubGraph({sorted(self.nodes)})"


def is_tensor_constant(const: Constant) -> bool:
    """A weight, not a scalar: a constant with some axis longer than one."""
    return any(int(d) != 1 for d in const.ty.shape)


def _leaf_args(value: relax.Expr):
    """Vars and constants a binding reads, through inline tuples."""
    if isinstance(value, relax.Call):
        for arg in value.args:
            yield from _leaf_args(arg)
    elif isinstance(value, relax.Tuple):
        for field_ in value.fields:
            yield from _leaf_args(field_)
    elif isinstance(value, relax.TupleGetItem):
        yield from _leaf_args(value.tuple_value)
    elif isinstance(value, (relax.Var, Constant)):
        yield value


@mutator
class AnyPosition(PyExprMutator):
    """``take``'s scalar index written as 0, for the structural key only: which element of an
    axis a kernel reads changes neither its code's shape nor its cost, and a loop unrolled by
    ``torch.export`` reads one step per element (Mamba's scan over 64 tokens: 513 ``take``s,
    and 40,000 candidates to measure where every step's kernels counted as new ones)."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if call.op != TAKE or not isinstance(call.args[1], Constant) or is_tensor_constant(call.args[1]):
            return call
        index = call.args[1]
        first = relax.const(np.zeros([int(d) for d in index.ty.shape], str(index.ty.dtype)))
        return relax.Call(call.op, [call.args[0], first, *call.args[2:]], call.attrs, call.ty_args)


@mutator
class Remap(PyExprMutator):
    """Rewrites the vars and constants a binding reads to the extracted function's own."""

    def __init__(self, mapping):
        super().__init__()
        self.mapping = dict(mapping)

    def visit_var_(self, var):
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.mapping.get(var, var)

    def visit_generic_const_(self, const):
        return self.mapping.get(const, const)
