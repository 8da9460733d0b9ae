"""A hand-written rewrite: a ``tvm.relax.dpl`` pattern and the function that replaces a match."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, rewrite_call

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
                new_func, applied = self._rewrite_function(func)
                if applied:
                    rewritten[gvar] = new_func
                    total += applied
        return (rewritten, total) if total else (mod, 0)

    def _rewrite_function(self, func: relax.Function) -> tuple[relax.Function, int]:
        single_use = single_use_values(func)
        applied = 0

        def replace_match(expr: relax.Expr, matches: Matches) -> relax.Expr:
            nonlocal applied
            replacement = self.replace(matches, single_use)
            if replacement is None:
                return expr
            applied += 1
            return replacement

        return rewrite_call(self.pattern, replace_match, func), applied
