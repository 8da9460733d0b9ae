"""Saved placements: what ``optimize`` chose, as a JSON file, and the module rebuilt from it.

``save_placement`` writes which backend runs which operators, with the model's structural
hash and the device it was measured and timed on (this machine, or the device of the fleet
it was optimized through), so the placement can be used again without measuring.
``collage.load_placement`` (in
``collage.api``: the stages of ``optimize`` with the placement fixed) reads it back here:
``read_placement``, the substitutions to replay (``replay_substitutions``), the checks that
it is the model the placement was made for (``check_model``, ``check_backends``), and each
partition from its node set with its logged costs (``partitions_of``: any set, since the
graph-level search hands engines regions no generator produced).

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
from pathlib import Path
from typing import TYPE_CHECKING

import tvm
import tvm_ffi

from ..candidates.backend import REFERENCE_BACKEND, BackendSet, default_backends
from ..candidates.generate import Candidate
from ..candidates.precision import FLOAT32
from ..candidates.subgraph import SubGraph
from ..errors import OptimizeError
from ..measuring.cost import Cost
from ..measuring.measure import Measurer
from ..model.graph import DataflowGraph
from ..placing.engine_alone import FILE_SUFFIX
from ..placing.placement import Partition
from ..placing.substitute import DEFAULT_RULES as SUBSTITUTIONS
from ..placing.substitute import Step, replay

if TYPE_CHECKING:
    from .optimized import OptimizedModule

FORMAT = "collage-placement"
VERSION = 1


class PlacementFileError(OptimizeError):
    """The placement file cannot be read, or was made for another model."""


class PlacementWarning(UserWarning):
    """The placement is rebuilt on another device than the one it was made for."""


# -- saving --


def save_placement(opt: OptimizedModule, path: str | os.PathLike) -> Path:
    """Write ``opt``'s placement to ``path`` as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(placement_record(opt), indent=1) + "\n")
    return path


def placement_record(opt: OptimizedModule) -> dict:
    """The JSON-ready record of ``opt``'s placement (see the module docstring)."""
    if opt.placement:
        graph = opt.placement[0].candidate.subgraph.graph
        model = {"hash": model_hash(graph.func), "ops": len(graph)}
    else:  # nothing was placeable: the record says why, and rebuilding runs TVM as optimize did
        model = {"hash": opt.record.unplaced_hash, "ops": 0, "unplaced": opt.record.unplaced}
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "target": opt.target,
        # The device it was measured and timed on, and the threads it should run on there.
        "device": opt.optimized_for.name,
        "threads": opt.optimized_for.threads,
        "simplify": opt.simplified is not None,
        # The substitutions of the graph the partitions index, as (rule, nodes) steps in order.
        "substitutions": opt.record.substituted,
        "seed": opt.record.seed,
        "accuracy": opt.record.accuracy,  # the budget reduced-precision partitions were held to
        "estimated_ms": _json_number(opt.estimated_ms),
        "measured_ms": _json_number(opt.measured.median_ms),
        "partitions": [partition_entry(p) for p in opt.placement],
    }


def partition_entry(p: Partition) -> dict:
    """One partition as the file holds it (``candidate_of`` reads it back)."""
    return {"backend": p.backend, "pattern": p.pattern, "nodes": sorted(p.nodes), "ops": p.ops,
            "cost_ms": _json_number(p.cost_ms), "precision": p.candidate.precision}  # fmt: skip


def model_hash(main: tvm.relax.Function) -> str:
    """The structural hash of the (bound, simplified) ``main`` the placement indexes."""
    return f"{tvm_ffi.structural_hash(main):016x}"


def _json_number(ms: float) -> float | None:
    """Milliseconds for JSON, which has no NaN: None for a cost never measured."""
    return None if math.isnan(ms) else round(ms, 6)


# -- loading --


def read_placement(path: str | os.PathLike) -> dict:
    """The record saved at ``path``; ``PlacementFileError`` if it is not one."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlacementFileError(f"{path}: no such placement file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlacementFileError(f"{path}: not a collage placement file ({err})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise PlacementFileError(f'{path}: not a collage placement file (no "format": "{FORMAT}")')
    if record.get("version") != VERSION:
        raise PlacementFileError(
            f"{path}: placement format version {record.get('version')}; this collage reads {VERSION}"
        )
    missing = [k for k in ("model", "target", "threads", "simplify", "partitions") if k not in record]
    if missing:
        raise PlacementFileError(f"{path}: placement file lacks {', '.join(missing)}")
    if not isinstance(record["model"], dict) or not isinstance(record["partitions"], list):
        raise PlacementFileError(f"{path}: placement file's model is not an object or its partitions not a list")
    for k, entry in enumerate(record["partitions"]):
        if not _is_partition(entry):
            raise PlacementFileError(f"{path}: partition {k} is not {{backend, pattern, nodes, ops}}: {entry}")
    return record


def _is_partition(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("backend"), str)
        and isinstance(entry.get("pattern"), str)
        and isinstance(entry.get("nodes"), list)
        and len(entry["nodes"]) > 0
        and all(isinstance(i, int) for i in entry["nodes"])
        and isinstance(entry.get("ops"), list)
    )


def runs_file(record: dict) -> bool:
    """Whether the placement runs the user's ONNX file whole on one engine."""
    parts = record["partitions"]
    return len(parts) == 1 and parts[0]["pattern"] == f"{parts[0]['backend']}{FILE_SUFFIX}"


def placement_backends(record: dict) -> list[str]:
    """The registered backends the placement runs on, and TVM, which every fallback needs
    (``check_backends`` names any that is not registered)."""
    named = {REFERENCE_BACKEND} | {entry["backend"] for entry in record["partitions"]}
    return sorted(named & set(default_backends().names()))


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


def candidate_of(graph: DataflowGraph, entry: dict) -> Candidate:
    """The candidate a saved partition (``partition_entry``) names on ``graph``."""
    return Candidate(SubGraph(graph, frozenset(entry["nodes"])), entry["backend"], entry["pattern"],
                     entry.get("precision", FLOAT32))  # fmt: skip


def _partition(graph: DataflowGraph, entry: dict, costs: LoggedCosts) -> Partition:
    """One saved partition on ``graph``, its costs from the log (unknown when either the
    kernel's or the transition's is missing)."""
    candidate = candidate_of(graph, entry)
    cost, transition = costs.cost(candidate), costs.transition_ms(candidate.backend)
    if math.isnan(transition):
        return Partition(candidate, Cost.unknown())
    return Partition(candidate, cost, 0.0 if cost.is_unknown else transition)


def check_model(graph: DataflowGraph, record: dict, path) -> None:
    """The model is the one the placement was made for: same hash, same op at every node."""
    saved = record["model"]
    if saved.get("hash") != model_hash(graph.func) or saved.get("ops") != len(graph):
        raise PlacementFileError(
            f"{path}: placement was made for another model (saved: {saved.get('ops')} ops, hash {saved.get('hash')}; "
            f"this model: {len(graph)} ops, hash {model_hash(graph.func)})"
        )
    for k, entry in enumerate(record["partitions"]):
        nodes = entry["nodes"]
        if any(not 0 <= i < len(graph) for i in nodes):
            raise PlacementFileError(f"{path}: partition {k} names nodes outside the model: {nodes}")
        ops = [graph[i].op for i in sorted(nodes)]
        if entry["ops"] != ops:
            raise PlacementFileError(
                f"{path}: placement was made for another model (partition {k}: ops {entry['ops']}, model has {ops})"
            )


def check_backends(record: dict, backend_set: BackendSet, excluded: dict[str, str], path) -> None:
    for name in sorted({entry["backend"] for entry in record["partitions"]}):
        if name not in backend_set.names():
            raise PlacementFileError(
                f"{path}: the placement uses backend {name!r}; the backends here are {', '.join(backend_set.names())}"
            )
        if name in excluded:
            raise PlacementFileError(
                f"{path}: the placement uses backend {name!r}, which cannot run here: {excluded[name]}"
            )


def partitions_of(graph: DataflowGraph, record: dict, costs: LoggedCosts, path) -> tuple[Partition, ...]:
    """The saved partitions on ``graph``, costs from the log, checked to cover it in an order
    that runs."""
    partitions = tuple(_partition(graph, entry, costs) for entry in record["partitions"])
    _check_cover(graph, partitions, path)
    return partitions


def replay_substitutions(prepared: tvm.IRModule, record: dict, path) -> tvm.IRModule:
    """``prepared`` with the graph substitutions the placement was made over, replayed."""
    if not record.get("substitutions"):
        return prepared
    try:
        return replay(prepared, [Step(rule, tuple(nodes), k) for rule, nodes, k in record["substitutions"]], SUBSTITUTIONS)
    except (ValueError, TypeError) as err:
        raise PlacementFileError(f"{path}: its graph substitutions do not fit this model: {err}") from None


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
