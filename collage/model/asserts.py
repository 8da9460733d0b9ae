"""Run-time checks a model makes of values it computes from constants alone, which hold.

PyTorch's importer writes ``torch._assert_async`` as ``R.assert_op`` and the whole function
then impure, its bindings in plain blocks. ``one_hot`` asserts its class values lie in range
(LongT5's transient-global attention takes ``one_hot`` of block ids it computes from a mask of
ones it makes itself). An assertion splits the dataflow collage places into pieces, and such a
model could not be placed at all: the whole model ran on TVM. Where a check reads only
constants, its outcome is known before the model runs: evaluated once here, by TVM, a check
that holds is dropped (and one that fails is kept: running the model raises, as it would).
A check of the model's inputs stays in the unoptimized model every placement is checked
against, and is dropped, with a note, from the module collage places (``without_asserts``).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

ASSERT = "relax.assert_op"


def asserts(func: relax.Function) -> list[relax.Call]:
    """``func``'s run-time checks, in binding order."""
    return [b.value for block in func.body.blocks for b in block.bindings if _is_assert(b.value)]


def assert_message(check: relax.Call) -> str:
    """What ``check`` says when it fails: its format (the call's second argument) filled
    with the values after it, where those are strings."""
    fmt, *values = [getattr(arg, "value", None) for arg in check.args[1:]]
    if not isinstance(fmt, str) or not all(isinstance(v, str) for v in values):
        return "an assertion"
    try:
        return fmt.format(*values)
    except (IndexError, KeyError, ValueError):
        return fmt


def without_asserts_that_hold(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` without the checks in ``main`` that read only constants and hold, and how many
    were dropped. With none left, ``main`` is pure again (as the importer would have made it)."""
    checks = asserts(mod["main"])
    holding = _holding(checks, {b.var: b for block in mod["main"].body.blocks for b in block.bindings}) if checks else []
    return (_without(mod, holding), len(holding)) if holding else (mod, 0)


def without_asserts(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """``mod`` without any of ``main``'s checks, and what each said: the module collage places,
    where a check of the inputs would split the dataflow (LongT5's ``one_hot`` of block ids
    computed from its attention mask). It computes the same on inputs that pass them and
    refuses none; torch's ONNX export drops them too, and the engines run that file so."""
    checks = asserts(mod["main"])
    return (_without(mod, checks), [assert_message(c) for c in checks]) if checks else (mod, [])


def _without(mod: tvm.IRModule, checks: list[relax.Call]) -> tvm.IRModule:
    main = mod["main"]
    blocks = []
    for block in main.body.blocks:
        kept = [b for b in block.bindings if not any(b.value.same_as(check) for check in checks)]
        blocks.append(type(block)(kept))
    pure = len(checks) == len(asserts(main))
    rewritten = mod.clone()
    body = relax.SeqExpr(blocks, main.body.body)
    rewritten["main"] = relax.Function(main.params, body, main.ret_ty, pure or main.is_pure, main.attrs)
    return relax.transform.Normalize()(rewritten)


def _is_assert(value) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == ASSERT


def _holding(checks: list[relax.Call], bindings: dict) -> list[relax.Call]:
    """The ``checks`` whose conditions read constants only and are true, computed by TVM
    (all in one function: one compile)."""
    # In binding order, which bindings read constants only: none of the function's
    # parameters (the inputs), through what they read, nor a module function (call_tir's).
    constant = {}
    for var, binding in bindings.items():
        read = relax.analysis.free_vars(binding.value)
        constant[var] = not relax.analysis.all_global_vars(binding.value) and all(constant.get(v, False) for v in read)
    known = [c for c in checks if all(constant.get(v, False) for v in relax.analysis.free_vars(c.args[0]))]
    if not known:
        return []
    needed, stack = set(), [v for c in known for v in relax.analysis.free_vars(c.args[0])]
    while stack:  # the bindings the conditions read, through what those read
        var = stack.pop()
        if var not in needed:
            needed.add(var)
            stack.extend(relax.analysis.free_vars(bindings[var].value))
    ordered = [binding for var, binding in bindings.items() if var in needed]
    body = relax.SeqExpr([relax.BindingBlock(ordered)], relax.Tuple([c.args[0] for c in known]))
    outcome_ty = relax.TupleType([c.args[0].ty for c in known])
    computing = tvm.IRModule({"main": relax.Function([], body, outcome_ty, is_pure=True)})
    try:
        vm = relax.VirtualMachine(tvm.compile(relax.transform.Normalize()(computing), target="llvm"), tvm.cpu())
        outcomes = vm["main"]()
    except Exception:  # noqa: BLE001 -- TVM cannot compute them alone: the checks stay, as given
        return []
    return [c for c, outcome in zip(known, outcomes) if bool(np.all(outcome.numpy()))]
