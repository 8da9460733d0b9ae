"""End-to-end latency of whole placements: assembled, checked, timed and logged.

The graph-level search prices a placement by running it, since what an engine gains across
kernels is invisible to per-candidate costs. Each placement is assembled into one module,
checked against the unoptimized module's outputs, and timed; a placement that fails to
build, raises or computes wrong values gets an invalid cost with the reason. Latencies are
kept in memory and in the cost log (``placement_latency``), so no placement is measured twice,
and kernels are kept between placements, so a partition shared by many is compiled once.
"""

from __future__ import annotations

import functools
import gc
from collections import OrderedDict
from collections.abc import Sequence

from tvm import relax

from ..assembling.assemble import Assembly, PartitionFailed, assemble
from ..assembling.checked import wrong_result
from ..candidates.backend import BackendSet
from ..candidates.precision import FLOAT32
from ..measuring.cost import Cost, Device
from ..measuring.cost_log import CostLog, PlacementKey
from ..measuring.build import build_vm, device_for, kernel_backends, synchronized
from ..errors import first_line
from ..measuring.arrays import Reference, to_tensors
from ..measuring.timing import Timing, time_call
from ..model.graph import DataflowGraph
from ..placing.placement import Partition

# A search times many placements: samples of at least 5 ms, stopping at 3% spread or 1.5 s.
SEARCH_TIMING = Timing(warmup=2, warmup_s=0.2, min_samples=5, max_samples=15, rel_spread=0.03,
                       min_sample_ms=5.0, budget_s=1.5)
# Compiled kernels kept between placements cover at most this many times the model's ops.
KEPT_KERNELS_PER_OP = 4


def placement_name(partitions: Sequence[Partition]) -> str:
    """A placement as text, the same whatever the partitions' order: what the log keys it by."""
    return ";".join(sorted(f"{p.backend}:{p.pattern}:{','.join(map(str, sorted(p.nodes)))}"
                           + ("" if p.candidate.precision == FLOAT32 else f":{p.candidate.precision}") for p in partitions))


class EndToEnd:
    """Measures placements of ``graph`` on the inputs of ``reference``, checked against its outputs.

    ``model`` names the model and target in the log (the caller's structural hash).
    ``measured`` counts the placements measured here, not read from the log.
    """

    def __init__(
        self,
        graph: DataflowGraph,
        backends: BackendSet,
        target: str,
        reference: Reference,
        log: CostLog,
        model: str,
        threads: int,
        timing: Timing | None = None,
    ):
        self.graph, self.backends, self.target = graph, backends, target
        self.reference = reference
        self.log, self.model = log, model
        self.device = Device.this_machine(threads, target)
        self.timing = timing or SEARCH_TIMING
        self.measured = 0
        self._latencies: dict[str, Cost] = {}
        self._compiled = _LeastRecentlyUsed(KEPT_KERNELS_PER_OP * len(graph))

    def latency(self, partitions: Sequence[Partition]) -> Cost:
        """The placement's measured end-to-end latency (from memory or the log if known)."""
        key = self.key(partitions)
        cost = self._latencies.get(key.placement) or self.log.get_latency(key)
        if cost is None:
            cost = self.log.put_latency(key, self.measure(partitions))
            self.measured += 1
        self._latencies[key.placement] = cost
        return cost

    def release(self) -> None:
        """Drop the kept kernels: each holds its library's session, threads and weights, and
        nothing after the search needs them."""
        self._compiled.clear()
        gc.collect()

    def key(self, partitions: Sequence[Partition]) -> PlacementKey:
        used = sorted({p.backend for p in partitions})
        libraries = ";".join(f"{b}={self.backends[b].library}" for b in used)
        return PlacementKey(self.model, placement_name(partitions), self.device.logged_as, self.device.threads, libraries)

    def build(self, partitions: Sequence[Partition], fresh: bool = False) -> tuple[Assembly, relax.VirtualMachine]:
        """The assembled module and its VM; raises ``PartitionFailed`` as ``assemble`` does.
        ``fresh`` compiles its own kernels: modules timed against each other must not share
        one, since a kernel re-binds its buffers whenever another module calls it."""
        compiled = None if fresh else self._compiled
        assembly = assemble(self.graph, list(partitions), self.backends, self.target, compiled=compiled,
                            threads=self.device.threads)
        return assembly, build_vm(assembly.module, self.target, kernel_backends(assembly, self.backends))

    def measure(self, partitions: Sequence[Partition]) -> Cost:
        """Build, check and time one placement; never raises."""
        try:
            _, vm = self.build(partitions)
            problem = wrong_result(vm, self.reference, self.target)
        except PartitionFailed as failed:
            return Cost.invalid(f"{failed.partition.backend} could not compile {failed.partition.pattern}: {failed.reason}")
        except Exception as err:  # a library raising at build or run time disqualifies the placement
            return Cost.invalid(f"{type(err).__name__}: {first_line(err)}")
        if problem is not None:
            return Cost.invalid(f"wrong result: {problem}")
        inputs = to_tensors(self.reference.inputs, device_for(self.target))
        return time_call(synchronized(functools.partial(vm["main"], *inputs), self.target), self.timing)


class _LeastRecentlyUsed(OrderedDict):
    """Kernels by (backend, pattern, nodes, alone, precision, beside spinning), forgetting the least recently used ones once
    they cover more than ``capacity`` nodes in all: an engine's kernel holds its partition's
    weights, so a bound in nodes is a bound in memory (a few copies of the model)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def __getitem__(self, key):
        self.move_to_end(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > 1 and sum(len(key[2]) for key in self) > self.capacity:  # key[2]: the nodes
            self.popitem(last=False)
