"""A hand-written rewrite: a ``tvm.relax.dpl`` pattern and the function that replaces a match."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern
from tvm.relax.expr_functor import PyExprMutator, mutator

Matches = Mapping[DFPattern, relax.Expr]


def single_use_values(func: relax.Function) -> set:
    """The values of ``func``'s bindings whose variable is read exactly once, inside its block.

    Folding a producer into its consumer only removes work when nothing else reads the
    producer; otherwise the producer stays and the rewrite duplicates it.
    """
    values = set()
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        users = relax.analysis.udchain(block)
        for binding in block.bindings:
            # A non-dataflow var is a block output: it has readers outside the block.
            if isinstance(binding.var, relax.DataflowVar) and len(users[binding.var]) == 1:
                values.add(binding.value)
    return values


@dataclass(frozen=True)
class PatternRewrite:
    """Where ``pattern`` matches, ``replace(matches, single_use)`` returns an equivalent
    expression, or None to leave that match alone. ``single_use`` is ``single_use_values``
    of the function being rewritten."""

    name: str
    pattern: DFPattern
    replace: Callable[[Matches, set], relax.Expr | None]

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        """The rewritten module and the number of matches that were replaced."""
        total = 0
        rewritten = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                new_func, applied = self.rewrite_function(func)
                if applied:
                    rewritten[gvar] = new_func
                    total += applied
        # A replacement that is a variable leaves an alias; read through, it and its binding go.
        return (relax.transform.CanonicalizeBindings()(rewritten), total) if total else (mod, 0)

    def rewrite_function(self, func: relax.Function) -> tuple[relax.Function, int]:
        """Each binding whose value matches (through the values of the variables it reads)
        bound to its replacement instead, then the bindings nothing reads any more dropped.

        Not ``relax.dpl.rewrite_call``: after each change it eliminates common subexpressions
        until nothing changes, each time hashing every constant's bytes: 0.85 s a call for
        ViT-B's 344 MB of weights, half of its 11 s simplification. The pipeline eliminates
        them once an iteration (``EliminateCommonSubexpr``)."""
        single_use = single_use_values(func)
        values = relax.analysis.get_var2val(func)
        replacements, bound = {}, {}  # bound: value -> variable, of the bindings before this one
        for block in func.body.blocks:
            for binding in block.bindings:
                replacement = self._replacement(binding, values, single_use)
                if replacement is not None:
                    replacements[binding.var] = _reading_variables(replacement, bound)
                if isinstance(binding.value, (relax.Call, relax.Tuple, relax.TupleGetItem)):
                    bound[binding.value] = binding.var
        if not replacements:
            return func, 0
        return relax.analysis.remove_all_unused(Rebound(replacements).visit_expr(func)), len(replacements)

    def _replacement(self, binding: relax.Binding, values: dict, single_use: set) -> relax.Expr | None:
        """What ``binding``'s value is to be replaced by, or None."""
        if not isinstance(binding, relax.VarBinding) or isinstance(binding.value, relax.Var):
            return None  # an alias matches through the variable it names: that binding's match
        matches = self.pattern.extract_matched_expr(binding.value, values)
        if matches is None:
            return None
        replacement = self.replace(matches, single_use)
        return None if replacement is None or replacement.same_as(binding.value) else replacement


def _reading_variables(expr: relax.Expr, bound: dict) -> relax.Expr:
    """``expr`` (a replacement) reading the variable of each value in it that is bound
    before it (``bound``: value -> variable). A replacement is built from what the pattern
    matched through variables: their values, not the variables; left so, a convolution
    another operator also reads would be computed twice."""
    var = bound.get(expr)
    if var is not None:
        return var
    if isinstance(expr, relax.Call):
        args = [_reading_variables(arg, bound) for arg in expr.args]
        if all(new.same_as(old) for new, old in zip(args, expr.args)):
            return expr
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        fields = [_reading_variables(field_, bound) for field_ in expr.fields]
        return expr if all(new.same_as(old) for new, old in zip(fields, expr.fields)) else relax.Tuple(fields)
    if isinstance(expr, relax.TupleGetItem):
        value = _reading_variables(expr.tuple_value, bound)
        return expr if value.same_as(expr.tuple_value) else relax.TupleGetItem(value, expr.index)
    return expr


@mutator
class Rebound(PyExprMutator):
    """A function with some variables bound to other values (``replacements``), normalized
    as they are emitted (their nested calls bound to variables of their own)."""

    def __init__(self, replacements: dict[relax.Var, relax.Expr]):
        super().__init__()
        self.replacements = replacements

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        replacement = self.replacements.get(binding.var)
        if replacement is None:
            return super().visit_var_binding_(binding)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.visit_expr(replacement)))
        return None
