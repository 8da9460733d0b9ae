"""The simplification pipeline: TVM passes and hand-written rewrites, repeated to a fixed point.

Like TensorFlow Grappler's meta-optimizer, one iteration runs every step in order, and
iterations repeat until one changes nothing (or ``max_iterations`` is reached), because a
step can expose work for an earlier one: ``matmul_of_transposes`` emits a transpose that
``compose_permute_dims`` may merge with the next.

Step names in CamelCase are TVM passes; snake_case names are the hand-written rewrites.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, overload

import tvm
import tvm_ffi
from tvm.relax import transform

from .attention import ATTENTION_AS_MATMULS
from .batch_norm import (BATCH_NORM_TO_AFFINE, FOLD_SCALE_INTO_CONV, FOLD_SCALE_INTO_MATMUL, MERGE_CONSTANT_ADDS,
                         SCALE_BEFORE_BIAS)
from .branches import MERGE_SUMMED_CONVOLUTIONS, MERGE_SUMMED_MATMULS
from .constants import FOLD_ARANGE, FOLD_BFLOAT16_CASTS, FOLD_INDEX_TENSOR, FOLD_PERMUTE_DIMS
from .identities import ADD_ZERO, BROADCAST_TO_SAME_SHAPE, MULTIPLY_ONE, PAD_OF_NOTHING
from .idioms import (CLIP_FROM_MAX_MIN, ELEMENTWISE_BROADCASTS_ITSELF, LINEAR_ON_ALL_AXES, MATMUL_BROADCASTS_ITSELF,
                     MATMUL_ON_ALL_AXES, MATRIX_WEIGHT, MERGE_CLIPS, STACKED_REDUCTIONS_PAIRWISE, TE_CALLS_AS_OPS,
                     WRAP_NEGATIVE_TAKE_INDICES)  # fmt: skip
from .loops import CONSECUTIVE_SLICES_JOINED, LINEAR_RECURRENCE_AS_SCAN, STACKED_STEPS_BATCHED, WRITTEN_SLICES_STACKED
from .recurrences import ELEMENTWISE_RECURRENCE_AS_SCAN
from .ops import binding_count, op_count
from .safe_softmax import SAFE_SOFTMAX_OF_FINITE
from .transposes import COMPOSE_PERMUTE_DIMS, IDENTITY_PERMUTE_DIMS, MATMUL_OF_TRANSPOSES, PERMUTE_DIMS_OF_UNIT_AXES


class Step(Protocol):
    name: str

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        """The rewritten module and how many times the step applied."""


def ops_removed(before: tvm.IRModule, after: tvm.IRModule) -> int:
    return op_count(before) - op_count(after)


def bindings_removed(before: tvm.IRModule, after: tvm.IRModule) -> int:
    return binding_count(before) - binding_count(after)


@dataclass(frozen=True)
class TvmPass:
    """A TVM pass as a step. TVM does not say how often a pass matched, so the count is
    measured: ``count(before, after)``, by default the operators it removed."""

    name: str
    make_pass: Callable[[], tvm.transform.Pass]
    count: Callable[[tvm.IRModule, tvm.IRModule], int] = ops_removed

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        rewritten = self.make_pass()(mod)
        return rewritten, self.count(mod, rewritten)


DEFAULT_STEPS: tuple[Step, ...] = (
    # Inlines tuples and aliases (TupleGetItem of a known tuple), so patterns see the values.
    TvmPass("CanonicalizeBindings", transform.CanonicalizeBindings, count=bindings_removed),
    # Clean-up runs before the rewrites: a rewrite drops the dead bindings of a function it
    # changes (``PatternRewrite``), which would credit this work to whichever came first.
    TvmPass("EliminateCommonSubexpr", transform.EliminateCommonSubexpr),
    TvmPass("DeadCodeElimination", transform.DeadCodeElimination),
    ATTENTION_AS_MATMULS,  # first: the permutes, scale and masks it writes are for the later steps
    TE_CALLS_AS_OPS,  # before FoldConstant, which then folds what guarded them (Clip's isnan/where)
    WRAP_NEGATIVE_TAKE_INDICES,  # before FoldConstant, which would fold a take of constants wrong
    FOLD_ARANGE,
    FOLD_INDEX_TENSOR,
    FOLD_PERMUTE_DIMS,  # a constant matmul operand's transpose, before FoldConstant folds the rest
    FOLD_BFLOAT16_CASTS,
    MATMUL_BROADCASTS_ITSELF,  # before FoldConstant, which would write a broadcast weight out
    ELEMENTWISE_BROADCASTS_ITSELF,  # likewise
    TvmPass("FoldConstant", transform.FoldConstant),
    *STACKED_REDUCTIONS_PAIRWISE,  # before the recurrences, whose steps they are in an ONNX file
    LINEAR_RECURRENCE_AS_SCAN,  # first: its scan's states are the slices the stacked steps then read
    ELEMENTWISE_RECURRENCE_AS_SCAN,  # the recurrences the linear one is not
    WRITTEN_SLICES_STACKED,  # after them: a loop's outputs written in turn, the kernel's slices
    CONSECUTIVE_SLICES_JOINED,
    STACKED_STEPS_BATCHED,
    SAFE_SOFTMAX_OF_FINITE,
    CLIP_FROM_MAX_MIN,
    MERGE_CLIPS,
    BATCH_NORM_TO_AFFINE,
    SCALE_BEFORE_BIAS,
    FOLD_SCALE_INTO_CONV,
    FOLD_SCALE_INTO_MATMUL,
    MERGE_SUMMED_CONVOLUTIONS,  # after the BatchNorms became scales and biases: its branches' terms
    MERGE_SUMMED_MATMULS,  # after a LoRA's scale went into its up-projection
    MERGE_CONSTANT_ADDS,
    ADD_ZERO,
    MULTIPLY_ONE,
    BROADCAST_TO_SAME_SHAPE,
    PAD_OF_NOTHING,
    TvmPass("RemoveRedundantReshape", transform.RemoveRedundantReshape),
    LINEAR_ON_ALL_AXES,
    MATMUL_ON_ALL_AXES,
    MATRIX_WEIGHT,
    IDENTITY_PERMUTE_DIMS,
    COMPOSE_PERMUTE_DIMS,
    MATMUL_OF_TRANSPOSES,
    PERMUTE_DIMS_OF_UNIT_AXES,  # last: two transposes that meet compose first, unit axes and all
)


@dataclass(frozen=True)
class StepCount:
    name: str
    applied: int  # matches replaced; for a TvmPass, what its ``count`` measures
    ops_removed: int  # net: negative when the step splits one op into several


@dataclass(frozen=True)
class SimplifyReport:
    """What ``simplify`` did: per step, totals over all iterations."""

    steps: tuple[StepCount, ...]
    iterations: int  # at a fixed point, the last one is the iteration that changed nothing
    converged: bool  # False when ``max_iterations`` stopped it before a fixed point
    ops_before: int
    ops_after: int

    def applied(self, name: str) -> int:
        """How often the step called ``name`` applied; KeyError if there is no such step."""
        return {step.name: step.applied for step in self.steps}[name]

    def __str__(self) -> str:
        width = max(len(step.name) for step in self.steps)
        lines = [f"{'rewrite':<{width}}  applied  ops removed"]
        lines += [f"{s.name:<{width}}  {s.applied:>7}  {s.ops_removed:>11}" for s in self.steps]
        state = "fixed point" if self.converged else "stopped at the iteration cap"
        lines.append(
            f"ops {self.ops_before} -> {self.ops_after}, {self.iterations} iterations ({state})"
        )
        return "\n".join(lines)


def _run(
    mod: tvm.IRModule, steps: tuple[Step, ...], max_iterations: int
) -> tuple[tvm.IRModule, SimplifyReport]:
    applied = {step.name: 0 for step in steps}
    removed = {step.name: 0 for step in steps}
    ops_before = op_count(mod)
    iterations, converged = 0, False
    while iterations < max_iterations and not converged:
        start = mod
        for step in steps:
            rewritten, count = step.apply(mod)
            applied[step.name] += count
            removed[step.name] += ops_removed(mod, rewritten)
            mod = rewritten
        iterations += 1
        converged = tvm_ffi.structural_equal(start, mod)
    counts = tuple(StepCount(step.name, applied[step.name], removed[step.name]) for step in steps)
    return mod, SimplifyReport(counts, iterations, converged, ops_before, op_count(mod))


@overload
def simplify(
    mod: tvm.IRModule, *, report: Literal[False] = False, max_iterations: int = ..., steps=...
) -> tvm.IRModule: ...


@overload
def simplify(
    mod: tvm.IRModule, *, report: Literal[True], max_iterations: int = ..., steps=...
) -> tuple[tvm.IRModule, SimplifyReport]: ...


def simplify(mod, *, report=False, max_iterations=8, steps=DEFAULT_STEPS):
    """Semantics-preserving graph simplification of a Relax module, run to a fixed point.

    Folds BatchNorm into the preceding convolution (or into a per-channel multiply-add),
    folds constants, removes common subexpressions, dead code, identity operations and
    transposes that cancel. ``report=True`` returns ``(module, SimplifyReport)`` instead of
    the module; the report's op counts are of ``main``.
    """
    simplified, what_fired = _run(mod, steps, max_iterations)
    return (simplified, what_fired) if report else simplified
