"""Assembly with its check: a placement becomes a module that computes what the unoptimized
one does. Partitions that fail to compile, or whose kernels disagree with TVM inside the
model, fall back to TVM, op by op, and the check repeats. What comes out is a ``Finalist``:
the placement assembled and checked, which the finalists' stage (``collage.choosing``) times
against the others."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tvm import relax

from ..candidates.backend import BackendSet
from ..candidates.precision import FLOAT32, reduced
from ..errors import OptimizeError
from ..measuring.build import build_vm, device_for, kernel_backends, run_kernel
from ..measuring.arrays import END_TO_END_RTOL, Reference, mismatch, numpy_outputs, to_tensors
from ..placing.placement import Partition, Placement, tvm_op
from .assemble import Assembly, PartitionFailed, assemble

MAX_CHECK_ROUNDS = 3


@dataclass
class Finalist:
    """One complete placement, assembled, checked against the unoptimized model, and ready to
    time: its partitions, the DP's estimate (NaN where a kernel was never measured alone), the
    partitions that fell back to TVM and why."""

    partitions: list[Partition]
    assembly: Assembly
    vm: relax.VirtualMachine
    estimated_ms: float
    fallbacks: list[tuple[Partition, str]] = field(default_factory=list)

    @property
    def simplicity(self) -> tuple[int, int, int]:
        """(libraries, partitions, partitions in a reduced precision): the fewer, the simpler;
        of two placements as fast, the one computing more in float32 is the more accurate."""
        reduced = sum(p.candidate.precision != FLOAT32 for p in self.partitions)
        return len({p.backend for p in self.partitions}), len(self.partitions), reduced


def wrong_result(vm: relax.VirtualMachine, reference: Reference, target: str, rtol: float | None = None) -> str | None:
    """How the module's outputs on ``reference``'s inputs miss its outputs by more than ``rtol``
    (default ``END_TO_END_RTOL``; an accuracy budget for reduced precisions), or None."""
    outputs = vm["main"](*to_tensors(reference.inputs, device_for(target)))
    return mismatch(numpy_outputs(outputs), reference.outputs, rtol=rtol or END_TO_END_RTOL)


def as_tvm_runs_it(original, prepared, reference: Reference, target) -> Finalist:
    """A model with nothing to place (``prepare.Unplaceable``) as TVM alone runs it, as a
    finalist with no partition: the simplified module when it computes ``reference``'s outputs
    on its inputs as the unoptimized one does, else the unoptimized one."""
    module, vm = prepared, build_vm(prepared, target)
    if prepared is not original and wrong_result(vm, reference, target) is not None:
        module, vm = original, build_vm(original, target)
    return Finalist([], Assembly(module), vm, math.nan)


def assemble_and_check(graph, placement: Placement, reference: Reference, backends, target, threads: int = 0,
                       budget: float | None = None, held_to_budget: bool = False) -> Finalist:
    """Assemble, compile and compare with the unoptimized module's outputs on the inputs of
    ``reference``, each library on ``threads`` threads, within float32's end-to-end tolerance,
    or within the accuracy ``budget`` where partitions compute in a reduced precision (which
    then also bounds each such kernel's own error). Partitions that fail to compile, or whose
    kernels disagree with TVM inside the model, fall back to TVM, and the check repeats.
    Where every kernel is right alone and the module is not, its reduced kernels' errors
    compound: then every kernel falls back, unless the caller holds the module to the budget
    itself (``held_to_budget``: ``policy.within_budget``, which brings reduced partitions back
    to float32 fewest first, keeping the float32 library kernels). Returns the assembly with
    its VM, the partitions it runs and the fallbacks with their reasons."""
    rtol = budget if reduced(placement.partitions) else None
    partitions = list(placement.partitions)
    fallbacks: list[tuple[Partition, str]] = []
    checks = 0
    while True:
        try:
            assembly = assemble(graph, partitions, backends, target, threads=threads)
        except PartitionFailed as failed:
            # Not a check round: each failure sends one more partition to TVM, so this ends.
            fallbacks.append((failed.partition, failed.reason))
            partitions = _fall_back(graph, partitions, [failed.partition])
            continue
        vm = build_vm(assembly.module, target, kernel_backends(assembly, backends))
        problem = wrong_result(vm, reference, target, rtol)
        if problem is None:
            return Finalist(partitions, assembly, vm, placement.estimated_ms, fallbacks)
        checks += 1
        if checks == MAX_CHECK_ROUNDS:
            raise OptimizeError(f"the assembled module still disagrees with the unoptimized one: {problem}")
        culprits = _culprits(graph, assembly, reference.inputs, target, rtol)
        if not culprits and held_to_budget and rtol is not None:
            return Finalist(partitions, assembly, vm, placement.estimated_ms, fallbacks)
        culprits = culprits or [p for p, _, _ in assembly.kernels]
        fallbacks += [(p, f"wrong inside the assembled model ({problem})") for p in culprits]
        partitions = _fall_back(graph, partitions, culprits)


def _fall_back(graph, partitions, failing) -> list[Partition]:
    """``failing`` partitions replaced by their ops, one by one on TVM (inline, so TVM's own
    fusion regroups them)."""
    out = []
    for p in partitions:
        if any(p is f for f in failing):
            out += [tvm_op(graph, i, "tvm.fallback") for i in sorted(p.nodes)]
        else:
            out.append(p)
    return out


def _culprits(graph, assembly, arrays, target, rtol: float | None = None) -> list[Partition]:
    """The partitions outside TVM whose kernels, fed TVM's values for their inputs, disagree
    with TVM's values for their outputs."""
    needed = sorted({i for p, _, _ in assembly.kernels for i in (*p.candidate.subgraph.input_nodes, *p.candidate.subgraph.outputs)})
    on_tvm = [tvm_op(graph, i, "tvm.reference") for i in range(len(graph))]
    probe = assemble(graph, on_tvm, BackendSet(), target, returns=needed).module
    values = dict(zip(needed, numpy_outputs(build_vm(probe, target)["main"](*to_tensors(arrays, device_for(target))))))
    params = {p: a for p, a in zip(graph.func.params, arrays)}
    culprits = []
    for part, _, kernel in assembly.kernels:
        sub = part.candidate.subgraph
        feed = [params[v] if v in params else values[graph.index_of_var[v]] for v in sub.arguments()]
        try:
            got = run_kernel(kernel, sub.extract(), feed, device_for(target))
        except Exception:  # a kernel that raises inside the model is as wrong as a wrong one
            culprits.append(part)
            continue
        reduced = part.candidate.precision != FLOAT32
        if mismatch(got, [values[i] for i in sub.outputs], rtol if reduced else None, ops=sub.depth) is not None:
            culprits.append(part)
    return culprits
