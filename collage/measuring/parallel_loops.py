"""The reference's loops on every core: TVM's CPU lowering with one schedule rule added.

Every module built here is checked against the unoptimized model's outputs, computed by TVM
on the CPU (``build.reference_vm``): for the whole model once, and for each candidate's
inputs and outputs (``build.intermediate_values``). TVM's default CPU pipeline schedules
nothing: each operator is one thread's loop nest, the innermost loop a matrix product's
reduction striding down a column. ViT-B/16 took 88 s a run so on a 2-core Xeon, about as
long on a GPU host's CPU, twice per optimization from an empty cost log.

``PARALLEL_LOOPS`` (a DLight schedule rule) changes only the order of each block's loops:
its spatial loops but the innermost fused and run in parallel, then its reduction loops,
then the innermost spatial loop, which LLVM vectorizes. Each output element is still
reduced in the same order, so the values are bit-identical to the serial ones. On the
2-core Xeon, the zoo's outputs all bit-identical: ViT-B 88 -> 1.5 s a run, BERT-base
60 -> 6 s with its compile, Inception-v3 3.0 -> 0.5 s, ResNet-50 2.2 -> 0.36 s; NASNet-A's
many small operators 0.4 s more to compile than they save. A function the rule cannot
reorder keeps TVM's serial loops. Light models (``build.values_target``: under
``OPTIMIZED_VALUES_MACS``) keep them all: scheduling would cost more than it saves.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight


@dlight.ScheduleRule.from_callable("ParallelLoops")
def PARALLEL_LOOPS(func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> s_tir.Schedule | None:
    """``func``'s blocks with their outer spatial loops in parallel and the innermost one
    innermost; None (left as it is) where a block's loops cannot be so ordered."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks = dlight.normalize_prim_func(sch)
        if blocks is None:
            return None
        for block in blocks:
            _order(sch, block)
        return sch
    except (s_tir.ScheduleError, ValueError):  # a loop nest the schedule primitives refuse
        return None


def _order(sch: s_tir.Schedule, block: dlight.SBlockInfo) -> None:
    loops = sch.get_loops(block.block_rv)
    kinds = block.dom_kind()
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
    rest = [loop for loop, kind in zip(loops, kinds) if kind != "S"]
    if not spatial:
        return
    if "O" in kinds:  # an opaque iteration (a scan, a sort): only the spatial loops before any other
        leading = loops[: len(kinds) - len(kinds.lstrip("S"))]
        if leading:
            sch.parallel(sch.fuse(*leading))
        return
    if rest and len(spatial) > 1:
        sch.reorder(*spatial[:-1], *rest, spatial[-1])
        sch.parallel(sch.fuse(*spatial[:-1]))
    else:
        sch.reorder(*spatial, *rest)
        sch.parallel(sch.fuse(*spatial))


def with_parallel_loops(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` lowered as ``tvm.compile``'s default pipeline lowers it for the CPU (sampling,
    sort and scan dispatched, then every operator legalized, unfused) with each function's
    loops ordered by ``PARALLEL_LOOPS``; ``tvm.compile`` does the rest as it would have."""
    with target:
        return tvm.transform.Sequential([
            relax.backend.DispatchSampling(),
            relax.backend.DispatchSortScan(),
            relax.transform.LegalizeOps(),
            dlight.ApplyDefaultSchedule(PARALLEL_LOOPS),
        ])(mod)  # fmt: skip
