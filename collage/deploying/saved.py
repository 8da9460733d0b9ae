"""Saved placements: what ``optimize`` chose, as a JSON file, and the module rebuilt from it.

``save_placement`` writes which backend runs which operators, with the model's structural
hash and the device it was measured and timed on (this machine, or the device of the fleet
it was optimized through), so the placement can be used again without measuring.
``collage.load_placement`` (in
``collage.api``: the stages of ``optimize`` with the placement fixed) reads it back here:
``read_placement`` (a ``SavedPlacement``: the placement as ``placing.recorded`` records it,
and what it was made on), the check that its backends are here (``check_backends``), and
each partition from its node set with its logged costs (``partitions_of``: any set, since
the graph-level search hands engines regions no generator produced).

The file is plain JSON::

    {"format": "collage-placement", "version": 1,
     "model": {"hash": "fa464a9e5ad929aa", "ops": 5},
     "target": "llvm", "device": "AMD EPYC (family 26 model 2; avx2 fma avx512f ...)", "threads": 2,
     "simplify": true, "seed": 0, "substitutions": [],
     "estimated_ms": 0.005, "measured_ms": 0.006,
     "partitions": [{"backend": "tvm", "pattern": "tvm.fused", "nodes": [0, 1],
                     "ops": ["relax.nn.conv2d", "relax.nn.relu"], "cost_ms": 0.0027}, ...]}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..candidates.backend import REFERENCE_BACKEND, BackendSet, default_backends
from ..candidates.generate import Candidate
from ..errors import PlacementFileError
from ..measuring.cost import Cost
from ..measuring.measure import Measurer
from ..model.graph import DataflowGraph
from ..placing.placement import Partition
from ..placing.recorded import RecordedModel, RecordedPartition, RecordedPlacement, json_ms

if TYPE_CHECKING:
    from .optimized import OptimizedModule

FORMAT = "collage-placement"
VERSION = 1


class PlacementWarning(UserWarning):
    """The placement is rebuilt on another device than the one it was made for."""


@dataclass(frozen=True)
class SavedPlacement:
    """A placement file: the placement (``placing.recorded``) and what it was made on and for:
    the target, the device it was measured and timed on and the threads it should run on
    there, whether the model was simplified first, the search's seed, the accuracy budget
    reduced-precision partitions were held to, the DP's estimate and the measured time."""

    placement: RecordedPlacement
    target: str
    device: str | None
    threads: int
    simplify: bool
    seed: int = 0
    accuracy: float | None = None
    estimated_ms: float | None = None
    measured_ms: float | None = None

    def to_json(self) -> dict:
        recorded = self.placement.to_json()
        return {"format": FORMAT, "version": VERSION, "model": recorded["model"], "target": self.target,
                "device": self.device, "threads": self.threads, "simplify": self.simplify,
                "substitutions": recorded["substitutions"], "seed": self.seed, "accuracy": self.accuracy,
                "estimated_ms": self.estimated_ms, "measured_ms": self.measured_ms,
                "partitions": recorded["partitions"]}  # fmt: skip

    @classmethod
    def from_json(cls, record, path) -> SavedPlacement:
        """The placement file's ``record``; ``PlacementFileError`` if it is not one."""
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise PlacementFileError(f'{path}: not a collage placement file (no "format": "{FORMAT}")')
        if record.get("version") != VERSION:
            raise PlacementFileError(f"{path}: placement format version {record.get('version')}; this collage reads {VERSION}")
        missing = [k for k in ("model", "target", "threads", "simplify", "partitions") if k not in record]
        if missing:
            raise PlacementFileError(f"{path}: placement file lacks {', '.join(missing)}")
        return cls(RecordedPlacement.from_json(record, path), record["target"], record.get("device"), record["threads"],
                   record["simplify"], record.get("seed") or 0, record.get("accuracy"), record.get("estimated_ms"),
                   record.get("measured_ms"))  # fmt: skip

    @property
    def backends(self) -> list[str]:
        """The registered backends it runs on, and TVM, which every fallback needs
        (``check_backends`` names any that is not registered)."""
        named = {REFERENCE_BACKEND} | {p.backend for p in self.placement.partitions}
        return sorted(named & set(default_backends().names()))


# -- saving --


def save_placement(opt: OptimizedModule, path: str | os.PathLike) -> Path:
    """Write ``opt``'s placement to ``path`` as JSON; returns the path."""
    path = Path(path)
    if opt.record.not_imported is not None:
        raise PlacementFileError(f"{path}: a placement file places a Relax module, and TVM cannot import this model "
                                 f"({opt.record.not_imported}); export the optimized module instead (opt.export)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(placement_record(opt).to_json(), indent=1) + "\n")
    return path


def placement_record(opt: OptimizedModule) -> SavedPlacement:
    """``opt``'s placement as its file holds it (see the module docstring)."""
    if opt.placement:
        placement = RecordedPlacement.of(opt.placement, opt.record.substituted)
    else:  # nothing was placeable: the record says why, and rebuilding runs TVM as optimize did
        placement = RecordedPlacement(RecordedModel(opt.record.unplaced_hash, 0, opt.record.unplaced), ())
    return SavedPlacement(placement, opt.target, opt.optimized_for.name, opt.optimized_for.threads,
                          opt.simplified is not None, opt.record.seed, opt.record.accuracy,
                          json_ms(opt.estimated_ms), json_ms(opt.measured.median_ms))  # fmt: skip


# -- loading --


def read_placement(path: str | os.PathLike) -> SavedPlacement:
    """The placement saved at ``path``; ``PlacementFileError`` if it is not one."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlacementFileError(f"{path}: no such placement file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlacementFileError(f"{path}: not a collage placement file ({err})") from None
    return SavedPlacement.from_json(record, path)


class LoggedCosts:
    """Costs as the cost log holds them, keyed as ``measurer`` keys them; nothing is measured."""

    def __init__(self, measurer: Measurer):
        self.measurer = measurer

    def cost(self, candidate: Candidate) -> Cost:
        """The logged cost, or unknown."""
        return self.measurer.log.get(self.measurer.key(candidate)) or Cost.unknown()

    def transition_ms(self, backend: str) -> float:
        """The logged transition cost (none for TVM, none for a backend whose probes all
        failed, as the measurer charges), or NaN when the log lacks it."""
        if backend == REFERENCE_BACKEND:
            return 0.0
        cost = self.measurer.log.get(self.measurer.transition_key(backend))
        if cost is None:
            return math.nan
        return cost.value_ms if cost.is_valid else 0.0


def _partition(graph: DataflowGraph, entry: RecordedPartition, costs: LoggedCosts) -> Partition:
    """One saved partition on ``graph``, its costs from the log, or as the file records them
    where the log lacks the kernel's or the transition's (another machine's process, a new
    log): assembled from them as it was when optimized (``RecordedPartition.partition``)."""
    candidate = entry.candidate(graph)
    cost, transition = costs.cost(candidate), costs.transition_ms(candidate.backend)
    if math.isnan(transition) or cost.is_unknown:
        return entry.partition(graph)
    return Partition(candidate, cost, transition)


def check_backends(placement: RecordedPlacement, backend_set: BackendSet, excluded: dict[str, str], path) -> None:
    for name in sorted({entry.backend for entry in placement.partitions}):
        if name not in backend_set.names():
            raise PlacementFileError(
                f"{path}: the placement uses backend {name!r}; the backends here are {', '.join(backend_set.names())}"
            )
        if name in excluded:
            raise PlacementFileError(
                f"{path}: the placement uses backend {name!r}, which cannot run here: {excluded[name]}"
            )


def partitions_of(graph: DataflowGraph, placement: RecordedPlacement, costs: LoggedCosts, path) -> tuple[Partition, ...]:
    """The saved partitions on ``graph``, costs from the log, checked to cover it in an order
    that runs."""
    partitions = tuple(_partition(graph, entry, costs) for entry in placement.partitions)
    _check_cover(graph, partitions, path)
    return partitions


def _check_cover(graph: DataflowGraph, partitions: tuple[Partition, ...], path) -> None:
    """Every node in exactly one partition, and each partition after those it reads from."""
    placed: set[int] = set()
    for k, p in enumerate(partitions):
        if p.nodes & placed:
            raise PlacementFileError(f"{path}: partition {k} repeats node(s) {sorted(p.nodes & placed)}")
        waiting = p.candidate.subgraph.input_nodes - placed
        if waiting:
            raise PlacementFileError(f"{path}: partition {k} reads node(s) {sorted(waiting)} before they are computed")
        placed |= p.nodes
    if len(placed) != len(graph):
        missing = sorted(set(range(len(graph))) - placed)
        raise PlacementFileError(f"{path}: the placement leaves node(s) {missing[:10]} unplaced")
