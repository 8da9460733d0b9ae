"""TVM's element-wise kernels on the CPU: one loop nest, on every core, its inner loop whole.

TVM's default CPU pipeline schedules nothing: a fused chain of element-wise operators is a
loop nest per operator, with a buffer between each two, on one thread. DAC's Snake chain
(``x + sin(a x)^2 / a`` over 1 x 32 x 8000 values) took 0.24 ms so on a 2-core Zen 4, where
``torch.compile``'s one loop on both cores took 0.116. The reference's rule
(``parallel_loops.PARALLEL_LOOPS``) fuses every spatial loop of such a block into its
parallel one, leaving LLVM nothing to vectorize: 1.8 ms.

``ELEMENTWISE`` inlines the chain into its last block, runs the leading loops in parallel
and leaves the innermost whole for LLVM to vectorize (where the leading ones are too few, the
innermost is split in a few whole parts first): 0.10 ms. Inlining copies a block's
expression into each place its consumer reads it: ``s * s`` reads ``sin`` twice, and
``fast_math``'s tanh reads its argument eight times, so four tanh in a row inlined were an
expression of thousands of terms, 12 s for LLVM to build. A block is inlined only while the
kernel's operations (TVM's estimate) stay within ``MAX_GROWTH`` times its own; the blocks
left are computed row by row inside the last one's parallel loop (their buffers a row long,
in cache), or where that cannot be, in parallel loops of their own. Kernels of fewer than
``MIN_PARALLEL`` values stay on one thread, inlined all the same: waking TVM's pool costs
more than they take, and LLVM builds one loop nest faster than several.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.analysis import estimate_tir_flops

MIN_PARALLEL = 4096
# Where the leading loops run fewer than this many times, the innermost is split too.
MIN_LEADING = 4
# The innermost loop's whole parts when it is split, the most first, each at least MIN_RUN long.
SPLITS, MIN_RUN = (64, 32, 16, 8, 4), 16


# A kernel's operations may grow by this factor at most as its blocks are inlined.
MAX_GROWTH = 4.0


@dlight.ScheduleRule.from_callable("ElementwiseOnEveryCore")
def ELEMENTWISE(func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> s_tir.Schedule | None:
    """``func``, where every block is element-wise (injective, over static shapes), as few
    loop nests as inlining within ``MAX_GROWTH`` leaves, each parallel; None (left as it is)
    otherwise."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks or not all(b.is_injective() and set(b.dom_kind()) == {"S"} for b in blocks):
            return None
        sch, blocks = _inlined(sch, blocks)
        outer = _parallel(sch, blocks[-1].block_rv)
        for block in reversed(blocks[:-1]):  # each computed where its consumer is, row by row
            if outer is None or not _computed_at(sch, block.block_rv, outer):
                _parallel(sch, block.block_rv)
        return sch
    except (s_tir.ScheduleError, ValueError):  # a loop nest the schedule primitives refuse
        return None


def _inlined(sch: s_tir.Schedule, blocks: list) -> tuple[s_tir.Schedule, list]:
    """``sch`` with each block but the last inlined into its consumers where the kernel's
    operations stay within ``MAX_GROWTH`` times their count before, and the blocks left."""
    budget = MAX_GROWTH * max(estimate_tir_flops(sch.mod), 1.0)
    left = []
    for block in blocks[:-1]:
        trial = sch.copy()
        try:
            trial.compute_inline(block.block_rv)
        except s_tir.ScheduleError:
            left.append(block)
            continue
        if estimate_tir_flops(trial.mod) <= budget:
            sch = trial
        else:
            left.append(block)
    return sch, [*left, blocks[-1]]


def _parallel(sch: s_tir.Schedule, block):
    """``block``'s leading loops on every core, its innermost whole, and that parallel loop;
    None for fewer than ``MIN_PARALLEL`` values or a dynamic extent."""
    loops = sch.get_loops(block)
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    extents = [e.value for e in extents]
    if math.prod(extents) < MIN_PARALLEL:
        return None
    if math.prod(extents[:-1]) >= MIN_LEADING:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    else:
        parts = next((k for k in SPLITS if extents[-1] % k == 0 and extents[-1] // k >= MIN_RUN), None)
        if parts is None:
            return None
        outer, _ = sch.split(loops[-1], [parts, None])
        outer = sch.fuse(*loops[:-1], outer) if len(loops) > 1 else outer
    sch.parallel(outer)
    return outer


def _computed_at(sch: s_tir.Schedule, block, loop) -> bool:
    """Whether ``block`` could be computed inside ``loop``, part by part as its consumer
    there reads it: its buffer then holds one part (cache-sized), not the whole tensor."""
    try:
        sch.compute_at(block, loop, preserve_unit_loops=True)
        return True
    except s_tir.ScheduleError:
        return False
