"""A site: one place where a substitution applies, and how to apply it there.

The search applies substitutions one site at a time (MetaFlow's ``S_i(G)`` yields one graph
per site), so a site names the bindings the source pattern covers, by their index in the
``DataflowGraph``, and builds their replacement. Applying it rewrites that one site and
nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax import transform

from ...measuring.build import module_with_callees
from ...model.graph import DataflowGraph


class Emitter:
    """Collects the bindings a replacement adds, in order. Each value must take leaves only
    (variables and constants), as a binding in normal form does."""

    def __init__(self):
        self._normalizer = relax.BlockBuilder()
        self.bindings: list[relax.VarBinding] = []

    def __call__(self, value: relax.Expr) -> relax.Var:
        value = self._normalizer.normalize(value)
        var = relax.DataflowVar(f"sub{len(self.bindings)}", value.ty)
        self.bindings.append(relax.VarBinding(var, value))
        return var


# Builds the replacement through the emitter, and returns the new value of each covered
# binding that something outside the site still reads (a leaf-argument Call, a
# TupleGetItem or a variable).
Build = Callable[[Emitter], dict[int, relax.Expr]]


@dataclass(frozen=True)
class Site:
    """Where ``rule`` applies: the bindings ``nodes`` (graph indices) of its source pattern.

    The new bindings go where the first of ``nodes`` was, and any binding the replacement
    reads that came later moves up before them. Covered bindings that the replacement does not return are dropped, so
    ``nodes`` must not include one that something outside the site still reads.
    """

    rule: str
    nodes: tuple[int, ...]  # ascending
    build: Build

    def __repr__(self):
        return f"Site({self.rule}, {list(self.nodes)})"


def read_outside(graph: DataflowGraph, nodes) -> set[int]:
    """The members of ``nodes`` whose values something outside ``nodes`` reads (another
    binding, or the function's result)."""
    members = set(nodes)
    return {i for i in members if i in graph.outputs or any(c not in members for c in graph.consumers[i])}


def apply(graph: DataflowGraph, site: Site) -> tvm.IRModule:
    """``graph``'s module with ``site`` replaced; the rest of the function is unchanged."""
    emitter = Emitter()
    outputs = site.build(emitter)
    missing = read_outside(graph, site.nodes) - set(outputs)
    if missing:
        raise ValueError(f"{site} drops node(s) {sorted(missing)} that are still read")
    covered = set(site.nodes)
    bindings = []
    for binding in graph.block.bindings:
        index = graph.index_of_var.get(binding.var)  # None: the binding packing the results
        if index == site.nodes[0]:
            bindings += emitter.bindings
            bindings += [relax.VarBinding(graph[i].var, value) for i, value in sorted(outputs.items())]
        if index not in covered:
            bindings.append(binding)
    old = graph.func
    body = relax.SeqExpr([relax.DataflowBlock(_in_dependency_order(bindings))], old.body.body)
    func = relax.Function(old.params, body, old.ret_ty, old.is_pure, old.attrs)
    # A replacement that returns a variable leaves an alias (``lv = other``): TVM's own pass
    # removes it, as the simplification does.
    return transform.CanonicalizeBindings()(module_with_callees(func, graph.callees))


def _in_dependency_order(bindings: list[relax.Binding]) -> list[relax.Binding]:
    """``bindings`` reordered so that each comes after the bindings it reads, and otherwise in
    the given order (a binding moves only as far up as a reader needs it)."""
    position = {b.var: k for k, b in enumerate(bindings)}
    ordered, placed = [], set()

    def place(k: int) -> None:
        if k in placed:
            return
        placed.add(k)
        for var in relax.analysis.free_vars(bindings[k].value):
            if var in position:
                place(position[var])
        ordered.append(bindings[k])

    for k in range(len(bindings)):
        place(k)
    return ordered
