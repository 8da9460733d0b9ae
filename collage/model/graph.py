"""DataflowGraph: an indexed, read-only view of a Relax function's dataflow bindings.

Everything downstream (sub-graphs, candidates, placement) names operators by their index
here, so candidates stay cheap sets of integers and the IR is only touched to extract a
function for measuring, and once more at assembly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tvm
from tvm import relax

# Structural bindings are nodes too: they can sit inside or between partitions.
TUPLE = "tuple"
TUPLE_GET_ITEM = "tuple_get_item"
CONSTANT = "constant"  # lv = R.const(...), as the torch frontend writes for masks
ALIAS = "alias"  # lv = other_var

# An extracted function that calls functions of the module (call_tir of the PrimFuncs an
# importer wrote) carries them in this attribute: only TVM runs them, and it needs their code.
CALLEES_ATTR = "collage.callees"


@dataclass(frozen=True, eq=False)
class Node:
    """One binding ``var = value`` of the dataflow block, at position ``index``."""

    index: int
    var: relax.Var
    value: relax.Expr
    op: str  # operator name ("relax.nn.conv2d"), or TUPLE, TUPLE_GET_ITEM, CONSTANT, ALIAS
    inputs: tuple[int, ...]  # producing nodes, in argument order, without repeats

    @property
    def call(self) -> relax.Call | None:
        return self.value if isinstance(self.value, relax.Call) else None

    @property
    def attrs(self):
        return self.value.attrs if isinstance(self.value, relax.Call) else None

    @property
    def ty(self):
        """The Relax type of the value (``relax.TensorType``, ``relax.TupleType``, ...)."""
        return self.var.ty

    def __repr__(self):
        return f"Node({self.index}, {self.op})"


def op_name(value: relax.Expr) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    if isinstance(value, relax.Tuple):
        return TUPLE
    if isinstance(value, relax.TupleGetItem):
        return TUPLE_GET_ITEM
    if isinstance(value, tvm.ir.GenericConst):
        return CONSTANT
    if isinstance(value, relax.Var):
        return ALIAS
    raise ValueError(f"unsupported binding in the dataflow block: {type(value).__name__} {value}")


class DataflowGraph:
    """The bindings of ``func``'s single dataflow block, in topological (binding) order.

    Function parameters and constants are not nodes: they are the graph's free inputs. A
    final binding that only packs the function's results into a tuple is not a node either:
    the values it packs are the graph's outputs.
    """

    def __init__(self, func: relax.Function, callees: dict | None = None):
        blocks = list(func.body.blocks)
        if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
            raise ValueError(
                f"expected one dataflow block in the function, found {len(blocks)} block(s); "
                "normalize the module first (e.g. relax.transform.ConvertToDataflow)"
            )
        self.func = func
        # The module's functions ``func`` calls (GlobalVar -> PrimFunc or Relax function).
        self.callees: dict[relax.GlobalVar, tvm.ir.BaseFunc] = dict(callees or {})
        self.block = blocks[0]
        result = func.body.body
        index_of_var: dict[relax.Var, int] = {}
        nodes = []
        for binding in self.block.bindings:
            if isinstance(binding, relax.MatchCast):
                raise ValueError(f"a match_cast binding ({binding.var}): shapes known only at run time")
            if not isinstance(binding, relax.VarBinding):
                raise ValueError(f"unsupported binding kind {type(binding).__name__}: {binding.var}")
            if binding.var.same_as(result) and isinstance(binding.value, relax.Tuple):
                # Packing the function's results is not an operator: its fields are the outputs.
                result = binding.value
                continue
            i = len(nodes)
            used = [index_of_var[v] for v in relax.analysis.free_vars(binding.value) if v in index_of_var]
            nodes.append(Node(i, binding.var, binding.value, op_name(binding.value), tuple(dict.fromkeys(used))))
            index_of_var[binding.var] = i
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.result: relax.Expr = result  # what the function returns, in terms of node vars
        self.index_of_var = index_of_var
        self.outputs: frozenset[int] = frozenset(
            index_of_var[v] for v in relax.analysis.free_vars(result) if v in index_of_var
        )
        consumers: list[list[int]] = [[] for _ in nodes]
        for node in nodes:
            for p in node.inputs:
                consumers[p].append(node.index)
        self.consumers: tuple[tuple[int, ...], ...] = tuple(tuple(c) for c in consumers)

    @classmethod
    def from_module(cls, mod: tvm.IRModule, name: str = "main") -> DataflowGraph:
        return cls(mod[name], called_functions(mod, mod[name]))

    def __len__(self):
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def __iter__(self):
        return iter(self.nodes)

    @functools.cached_property
    def var2val(self) -> dict[relax.Var, relax.Expr]:
        """What tvm.relax.dpl needs to match patterns across bindings."""
        return relax.analysis.get_var2val(self.func)

    @functools.cached_property
    def descendants(self) -> tuple[int, ...]:
        """Per node, the nodes reachable from it along its consumers, as a bit mask (bit i:
        node i). Built once, backwards through the binding order, so that convexity is a few
        mask operations instead of a walk through the graph (an unrolled GRU's candidate
        generation walked 445,000 times, 80% of its 29 s)."""
        masks = [0] * len(self.nodes)
        for i in reversed(range(len(self.nodes))):
            for c in self.consumers[i]:
                masks[i] |= masks[c] | (1 << c)
        return tuple(masks)

    @functools.cached_property
    def input_bytes(self) -> int:
        """Bytes of the graph's free inputs, its parameters and constants (a model's weights):
        what one call reads at the least. Where that exceeds a GPU's cache, a kernel inside
        the model finds its weights evicted by the kernels before it (``Timing.cache_flush_bytes``)."""
        constants = {}
        for node in self.nodes:
            relax.analysis.post_order_visit(node.value, lambda e: constants.setdefault(e, None)
                                            if isinstance(e, tvm.ir.GenericConst) else None)  # fmt: skip
        return sum(_tensor_bytes(x.ty) for x in (*self.func.params, *constants))

    @functools.cached_property
    def index_of_value(self) -> dict[relax.Expr, int]:
        return {node.value: node.index for node in self.nodes}

    def ops(self) -> list[str]:
        return [node.op for node in self.nodes]

    def __repr__(self):
        return f"DataflowGraph({len(self.nodes)} nodes, outputs={sorted(self.outputs)})"


def _tensor_bytes(ty) -> int:
    """The bytes of a value of type ``ty``: a tensor's of static shape, a tuple's fields' summed;
    0 for anything else (a shape, a tensor of symbolic shape)."""
    if isinstance(ty, relax.TupleType):
        return sum(_tensor_bytes(field) for field in ty.fields)
    shape = getattr(ty, "shape", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(shape, relax.ShapeExpr):
        return 0
    if not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return 0
    return math.prod(int(d) for d in shape.values) * tvm.DataType(ty.dtype).bits // 8


def global_vars(expr: relax.Expr) -> list[relax.GlobalVar]:
    """The module functions ``expr`` calls, in order, each once (``call_tir``'s PrimFunc, a
    Relax function called directly)."""
    return list(dict.fromkeys(relax.analysis.all_global_vars(expr)))


def called_functions(mod: tvm.IRModule, func: relax.Function) -> dict[relax.GlobalVar, tvm.ir.BaseFunc]:
    """The functions of ``mod`` that ``func`` calls, directly or through Relax functions it calls."""
    found: dict[relax.GlobalVar, tvm.ir.BaseFunc] = {}
    todo = [func]
    while todo:
        caller = todo.pop()
        if not isinstance(caller, relax.Function):
            continue  # a PrimFunc's own calls are compiled with it
        for gv in global_vars(caller):
            if gv not in found and gv.name_hint in mod:
                found[gv] = mod[gv.name_hint]
                todo.append(found[gv])
    return found
