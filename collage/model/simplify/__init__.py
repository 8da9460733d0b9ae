"""Graph simplification before placement: ``simplify(mod)`` and its report.

``pipeline`` wires the steps together; ``attention``, ``batch_norm``, ``branches``, ``identities``,
``transposes``, ``constants``, ``idioms``, ``loops`` and ``safe_softmax`` hold the hand-written
rewrites (the ones TVM has no pass for), each a ``tvm.relax.dpl`` pattern with its replacement
(``pattern_rewrite``).
"""

from .idioms import BOOLEANS_AS_INTEGERS, FINITE_INTEGER_CLIPS, WRAP_NEGATIVE_TAKE_INDICES
from .ops import op_count, op_histogram
from .pipeline import DEFAULT_STEPS, SimplifyReport, StepCount, TvmPass, simplify

__all__ = [
    "BOOLEANS_AS_INTEGERS",
    "DEFAULT_STEPS",
    "FINITE_INTEGER_CLIPS",
    "SimplifyReport",
    "StepCount",
    "TvmPass",
    "WRAP_NEGATIVE_TAKE_INDICES",
    "op_count",
    "op_histogram",
    "simplify",
]
