"""TVM's element-wise kernels on the CPU: one loop nest, on every core, its inner loop whole.

TVM's default CPU pipeline schedules nothing: a fused chain of element-wise operators is a
loop nest per operator, with a buffer between each two, on one thread. DAC's Snake chain
(``x + sin(a x)^2 / a`` over 1 x 32 x 8000 values) took 0.24 ms so on a 2-core Zen 4, where
``torch.compile``'s one loop on both cores took 0.116. The reference's rule
(``parallel_loops.PARALLEL_LOOPS``) fuses every spatial loop of such a block into its
parallel one, leaving LLVM nothing to vectorize: 1.8 ms.

``ELEMENTWISE`` inlines the chain into its last block (dlight's
``try_inline_contiguous_spatial``), runs the leading loops in parallel and leaves the
innermost whole for LLVM to vectorize (where the leading ones are too few, the innermost is
split in a few whole parts first): 0.10 ms. Kernels of fewer than ``MIN_PARALLEL``
values stay on one thread, inlined: waking TVM's pool costs more than they take.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

MIN_PARALLEL = 4096
# Where the leading loops run fewer than this many times, the innermost is split too.
MIN_LEADING = 4
# The innermost loop's whole parts when it is split, the most first, each at least MIN_RUN long.
SPLITS, MIN_RUN = (64, 32, 16, 8, 4), 16


@dlight.ScheduleRule.from_callable("ElementwiseOnEveryCore")
def ELEMENTWISE(func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> s_tir.Schedule | None:
    """``func`` as one parallel loop nest, where it is element-wise (or any chain of
    injective blocks inlining into one) over static shapes; None (left as it is) otherwise."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
        if blocks is None or len(blocks) != 1 or set(blocks[0].dom_kind()) != {"S"}:
            return None
        loops = sch.get_loops(blocks[0].block_rv)
        extents = [sch.get(loop).extent for loop in loops]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        extents = [e.value for e in extents]
        if math.prod(extents) < MIN_PARALLEL:
            return sch
        if math.prod(extents[:-1]) >= MIN_LEADING:
            sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
            return sch
        parts = next((k for k in SPLITS if extents[-1] % k == 0 and extents[-1] // k >= MIN_RUN), None)
        if parts is None:
            return sch
        outer, _ = sch.split(loops[-1], [parts, None])
        sch.parallel(sch.fuse(*loops[:-1], outer) if len(loops) > 1 else outer)
        return sch
    except (tvm.TVMError, ValueError):  # a loop nest the schedule primitives refuse
        return None
