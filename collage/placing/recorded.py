"""A placement as data: which backend runs which operators of which model, in the form a saved
placement file holds it (``deploying.saved``) and a fleet's race request carries each
finalist (``choosing.elsewhere``), and read back onto a model's graph.

``RecordedPlacement.to_json`` writes the dict JSON holds, ``RecordedPlacement.from_json``
reads one back and names what is wrong with it in one line (``PlacementFileError``).
Partitions are named by backend, pattern, node indices and precision, never as compiled
code; the model by the structural hash of the (bound, simplified) ``main`` the indices
point into, with the operator at each index checked again when it is read back
(``check_model``)::

    {"model": {"hash": "fa464a9e5ad929aa", "ops": 5}, "substitutions": [],
     "partitions": [{"backend": "tvm", "pattern": "tvm.fused", "nodes": [0, 1],
                     "ops": ["relax.nn.conv2d", "relax.nn.relu"], "cost_ms": 0.0027,
                     "precision": "float32"}, ...]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import tvm
import tvm_ffi

from ..candidates.generate import FILE_SUFFIX, PROGRAM_SUFFIX, Candidate
from ..candidates.precision import FLOAT32
from ..candidates.subgraph import SubGraph
from ..errors import PlacementFileError
from ..measuring.cost import Cost
from ..model.graph import DataflowGraph, called_functions
from .placement import Partition
from .substitute import DEFAULT_RULES as SUBSTITUTIONS
from .substitute import Step, replay


@dataclass(frozen=True)
class RecordedPartition:
    """One partition: its backend and pattern, the nodes it covers (and their operators, to
    check it is read onto the same model), its measured cost (None: never measured alone)
    and the precision it computes in."""

    backend: str
    pattern: str
    nodes: tuple[int, ...]
    ops: tuple[str, ...]
    cost_ms: float | None = None
    precision: str = FLOAT32

    @classmethod
    def of(cls, p: Partition) -> RecordedPartition:
        return cls(p.backend, p.pattern, tuple(sorted(p.nodes)), tuple(p.ops), json_ms(p.cost_ms),
                   p.candidate.precision)  # fmt: skip

    def candidate(self, graph: DataflowGraph) -> Candidate:
        """The candidate it names on ``graph``."""
        return Candidate(SubGraph(graph, frozenset(self.nodes)), self.backend, self.pattern, self.precision)

    def partition(self, graph: DataflowGraph) -> Partition:
        """The partition it names on ``graph``, at its recorded cost (kernel and transition
        together; unknown where never measured). Assembly decides from the costs whether an
        engine's kernel runs alone and keeps its threads spinning (``assemble.runs_alone``):
        rebuilt with unknown costs, BLOOM's op-level placement (ONNX Runtime, 98% of it,
        beside trivial TVM ops) ran 3-7 ms in a fresh process against 2.3 where it was raced."""
        cost = Cost.unknown() if self.cost_ms is None else Cost.of(self.cost_ms)
        return Partition(self.candidate(graph), cost)

    @property
    def identity(self) -> tuple:
        """What identifies it, its cost aside."""
        return self.backend, self.pattern, self.nodes, self.precision

    def to_json(self) -> dict:
        return {"backend": self.backend, "pattern": self.pattern, "nodes": list(self.nodes), "ops": list(self.ops),
                "cost_ms": self.cost_ms, "precision": self.precision}  # fmt: skip

    @classmethod
    def from_json(cls, entry) -> RecordedPartition:
        """``ValueError`` when ``entry`` is not {backend, pattern, nodes, ops}."""
        if not (isinstance(entry, dict) and isinstance(entry.get("backend"), str) and isinstance(entry.get("pattern"), str)
                and isinstance(entry.get("nodes"), list) and entry["nodes"] and all(isinstance(i, int) for i in entry["nodes"])
                and isinstance(entry.get("ops"), list)):  # fmt: skip
            raise ValueError(f"not {{backend, pattern, nodes, ops}}: {entry}")
        return cls(entry["backend"], entry["pattern"], tuple(entry["nodes"]), tuple(entry["ops"]), entry.get("cost_ms"),
                   entry.get("precision", FLOAT32))  # fmt: skip


@dataclass(frozen=True)
class RecordedModel:
    """The model a placement indexes: the structural hash of its ``main`` and its operator
    count; where nothing was placeable, why (and the hash of the module TVM then runs)."""

    hash: str | None = None
    ops: int = 0
    unplaced: str | None = None

    def to_json(self) -> dict:
        if self.hash is None:
            return {}
        return {"hash": self.hash, "ops": self.ops} | ({"unplaced": self.unplaced} if self.unplaced is not None else {})


@dataclass(frozen=True)
class RecordedPlacement:
    """A placement of a model: its partitions, in an order that runs, and the graph
    substitutions of the graph they index, as (rule, nodes, k) steps in order."""

    model: RecordedModel
    partitions: tuple[RecordedPartition, ...]
    substitutions: tuple[tuple, ...] = ()

    @classmethod
    def of(cls, partitions, substitutions=()) -> RecordedPlacement:
        """``partitions`` (``Partition``s over one graph) as recorded."""
        graph = partitions[0].candidate.subgraph.graph if partitions else None
        model = RecordedModel(graph_hash(graph), len(graph)) if graph is not None else RecordedModel()
        return cls(model, tuple(map(RecordedPartition.of, partitions)), tuple(map(tuple, substitutions)))

    @property
    def runs_file(self) -> bool:
        """Whether it runs the user's ONNX file whole on one engine."""
        return self._whole_on(FILE_SUFFIX)

    @property
    def runs_program(self) -> bool:
        """Whether one engine compiles the user's PyTorch module whole."""
        return self._whole_on(PROGRAM_SUFFIX)

    def _whole_on(self, suffix: str) -> bool:
        return len(self.partitions) == 1 and self.partitions[0].pattern == f"{self.partitions[0].backend}{suffix}"

    def to_json(self) -> dict:
        return {"model": self.model.to_json(), "substitutions": [list(s) for s in self.substitutions],
                "partitions": [p.to_json() for p in self.partitions]}  # fmt: skip

    @classmethod
    def from_json(cls, record: dict, where) -> RecordedPlacement:
        """The placement ``record`` holds; ``PlacementFileError`` (naming ``where``) if it is not one."""
        model, partitions = record.get("model"), record.get("partitions")
        if not isinstance(model, dict) or not isinstance(partitions, list):
            raise PlacementFileError(f"{where}: placement file's model is not an object or its partitions not a list")
        parts = []
        for k, entry in enumerate(partitions):
            try:
                parts.append(RecordedPartition.from_json(entry))
            except ValueError as err:
                raise PlacementFileError(f"{where}: partition {k} is {err}") from None
        recorded = RecordedModel(model.get("hash"), model.get("ops", 0), model.get("unplaced"))
        return cls(recorded, tuple(parts), tuple(map(tuple, record.get("substitutions") or ())))


def model_hash(main: tvm.relax.Function, callees: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc] | None = None) -> str:
    """The structural hash of the (bound, simplified) ``main`` a placement indexes, with the
    functions it calls (``callees``: TVM's importers write some operators as ``call_tir`` of
    a PrimFunc of their own, such as the ONNX importer's Pad). To the hash a GlobalVar is a
    free variable, hashed by identity unless mapped: each import of the same file then hashed
    differently (BiT's ONNX file, whose finalists could not be raced again in a fresh
    process). So with callees, GlobalVars count by where they appear and each callee by its
    contents, in order of name; without, the hash is ``main``'s alone, as saved placements have it."""
    if not callees:
        return f"{tvm_ffi.structural_hash(main):016x}"
    ordered = [callees[gv] for gv in sorted(callees, key=lambda gv: gv.name_hint)]
    return f"{tvm_ffi.structural_hash([main, *ordered], map_free_vars=True):016x}"


def graph_hash(graph: DataflowGraph) -> str:
    """``model_hash`` of the model ``graph`` is."""
    return model_hash(graph.func, graph.callees)


def module_hash(mod: tvm.IRModule) -> str:
    """``model_hash`` of ``mod``'s ``main`` and the functions it calls."""
    return model_hash(mod["main"], called_functions(mod, mod["main"]))


def check_model(graph: DataflowGraph, placement: RecordedPlacement, where) -> None:
    """The model is the one the placement was made for: same hash, same op at every node."""
    saved, here = placement.model, graph_hash(graph)
    if saved.hash != here or saved.ops != len(graph):
        raise PlacementFileError(
            f"{where}: placement was made for another model (saved: {saved.ops} ops, hash {saved.hash}; "
            f"this model: {len(graph)} ops, hash {here})"
        )
    for k, entry in enumerate(placement.partitions):
        if any(not 0 <= i < len(graph) for i in entry.nodes):
            raise PlacementFileError(f"{where}: partition {k} names nodes outside the model: {list(entry.nodes)}")
        ops = [graph[i].op for i in sorted(entry.nodes)]
        if list(entry.ops) != ops:
            raise PlacementFileError(
                f"{where}: placement was made for another model (partition {k}: ops {list(entry.ops)}, model has {ops})"
            )


def replay_substitutions(prepared: tvm.IRModule, placement: RecordedPlacement, where) -> tvm.IRModule:
    """``prepared`` with the graph substitutions the placement was made over, replayed."""
    if not placement.substitutions:
        return prepared
    try:
        return replay(prepared, [Step(rule, tuple(nodes), k) for rule, nodes, k in placement.substitutions], SUBSTITUTIONS)
    except (ValueError, TypeError) as err:
        raise PlacementFileError(f"{where}: its graph substitutions do not fit this model: {err}") from None


def json_ms(ms: float) -> float | None:
    """Milliseconds for JSON, which has no NaN: None for a cost never measured."""
    return None if math.isnan(ms) else round(ms, 6)
