"""Finalists timed on the machine the model is optimized for, when that is not this one.

With a fleet of another device kind (``measuring.rpc_runner.RPCRunner``), the candidates'
costs are the fleet's, and so must be the race between the finalists: which placement is
fastest differs by machine. So the race runs on one server of the fleet. Each finalist
travels as its saved placement would (``placing.recorded``: the model's hash, each
partition's backend by name, pattern, nodes and precision, the substitutions of its graph),
never as compiled code; with it go the model (TVM's JSON, weights as arrays, ``wire``), the
user's ONNX file where an engine runs it whole, the inputs and the unoptimized outputs.

The server assembles and checks each finalist again, as ``collage.load_placement`` does
(a partition its libraries cannot compile, or compute right, falls back to TVM there, and
the answer says what it ran), and times them against each other with the project's
protocol (``finalists.time_finalists``). The rounds come back, and the client chooses among
them as it would among its own (``finalists.choose``). A finalist the server cannot build
at all is left out with the server's reason.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import onnx
import tvm

from ..assembling.checked import Finalist, assemble_and_check
from ..assembling.assemble import Assembly
from ..candidates.backend import BackendSet, default_backends
from ..errors import OptimizeError, PlacementFileError
from ..measuring.cost import Cost
from ..measuring.runner import weights_in, weights_out
from ..measuring.arrays import Reference
from ..measuring.build import build_vm
from ..errors import first_line
from ..measuring.wire import ServerDevice, pack, unpack
from ..prepare import dataflow_graph
from .engine_alone import EngineAloneFailed, checked_on_file
from .finalists import Race, Timed, time_finalists
from ..placing.placement import Partition, Placement
from ..placing.recorded import RecordedPartition, RecordedPlacement, check_model, replay_substitutions

# What the race is given on the server beyond the per-candidate deadline: assembling every
# finalist (an engine compiling a whole model takes seconds) and up to 21 rounds of each.
RACE_TIMEOUT_S = 900.0
FUNCTION = "collage.time_finalists"


@dataclass
class RaceAnswer:
    """What the server answered: the finalists' timing (``Timed``, its ``race`` the rounds),
    those it could not build (label -> why), the partitions each built one ran where they
    differ from what was sent (label -> ``RecordedPartition.to_json`` entries: fallbacks to TVM there), the
    server that raced them, and how many seconds the race took there."""

    timed: Timed
    left_out: dict[str, str]
    ran: dict[str, list[dict]]
    server: ServerDevice
    seconds: float

    def keyed(self, names: dict) -> Timed:
        """``timed`` with each label replaced by ``names[label]`` (the caller's finalist names)."""
        race = self.timed.race
        if race is not None:
            race = Race([{names[label]: ms for label, ms in r.items()} for r in race.rounds])
        return self.timed._replace(costs={names[label]: cost for label, cost in self.timed.costs.items()}, race=race)


def request(finalists: dict[str, Finalist], module: tvm.IRModule, substitutions: dict[str, list],
            onnx_model: onnx.ModelProto | None, reference: Reference, target: str,
            accuracy: float | None, metered: bool) -> bytes:  # fmt: skip
    """The race of ``finalists`` (label -> finalist) as bytes: each as its placement over
    ``module`` (the prepared model) with its graph's ``substitutions`` (label -> steps), a
    finalist with no partition as ``module`` itself run by TVM; ``metered``: the server meters
    energy too."""
    lifted, weights = _lifted(module)
    arrays_out = {f"weight{k}": w for k, w in enumerate(weights)}
    arrays_out |= {f"input{k}": a for k, a in enumerate(reference.inputs)}
    arrays_out |= {f"expected{k}": e for k, e in enumerate(reference.outputs)}
    placements = {label: RecordedPlacement.of(finalist.partitions, substitutions.get(label) or ()).to_json()
                  for label, finalist in finalists.items()}  # fmt: skip
    header = {"module": tvm.ir.save_json(lifted), "weights": len(weights), "inputs": len(reference.inputs),
              "expected": len(reference.outputs), "onnx": onnx_model is not None, "target": target, "accuracy": accuracy,
              "metered": metered, "finalists": placements}  # fmt: skip
    if onnx_model is not None:
        arrays_out["onnx"] = np.frombuffer(onnx_model.SerializeToString(), dtype=np.uint8)
    return pack(header, arrays_out)


def run(data: bytes, threads: int, address: str, backends: BackendSet | None = None) -> bytes:
    """On the server (in its measuring worker): the race ``request`` wrote, built, checked and
    timed here on ``threads`` threads with ``backends`` (default: those registered here);
    never raises (a race that cannot run at all answers why)."""
    started, target = time.perf_counter(), "llvm"
    try:
        header, arrays = unpack(data)
        target = header["target"]
        answer = _race(header, arrays, backends or default_backends(), threads)
    except Exception as err:  # noqa: BLE001 -- the client gets one line, and the server serves on
        answer = {"error": f"{type(err).__name__}: {first_line(err)}"}
    return _answered(answer, threads, target, address, started)


def failed(why: str, threads: int, address: str) -> bytes:
    """The answer of a race that ended before it answered (its worker died or overran)."""
    return _answered({"error": why}, threads, "llvm", address, time.perf_counter())


def _answered(answer: dict, threads: int, target: str, address: str, started: float) -> bytes:
    server = ServerDevice.here(threads, target, address)
    return pack(answer | {"server": dataclasses.asdict(server), "seconds": time.perf_counter() - started}, {})


def answer_of(data: bytes) -> RaceAnswer:
    """What ``run`` answered; ``OptimizeError`` when the race could not run there."""
    header, _ = unpack(data)
    server = ServerDevice(**header["server"])
    if "error" in header:
        raise OptimizeError(f"the finalists could not be timed on {server.name} at {server.address}: {header['error']}")
    race = Race([dict(r) for r in header["rounds"]]) if header["rounds"] is not None else None
    costs = {label: Cost(**fields) for label, fields in header["costs"].items()}
    timed = Timed(costs, header["others_busy_cores"], header["attempts"], race)
    return RaceAnswer(timed, header["left_out"], header["ran"], server, header["seconds"])


def as_ran_there(finalist: Finalist, entries: list[dict], device: str, check: Reference, backends: BackendSet,
                 target: str, threads: int, accuracy: float | None) -> Finalist:  # fmt: skip
    """``finalist`` rebuilt here with the partitions it ran on ``device`` (``RaceAnswer.ran``:
    some fell back to TVM there, where a library could not compile them or computed
    otherwise), checked on ``check``, so that the module
    kept is the one that was timed."""
    graph = finalist.partitions[0].candidate.subgraph.graph
    sent = {RecordedPartition.of(p).identity: p for p in finalist.partitions}
    ran = map(RecordedPartition.from_json, entries)
    partitions = tuple(sent.get(entry.identity) or Partition(entry.candidate(graph), Cost.unknown()) for entry in ran)
    rebuilt = assemble_and_check(graph, Placement(graph, partitions), check, backends, target, threads, accuracy)
    back = [p for p in finalist.partitions if p not in partitions]
    rebuilt.fallbacks = [*rebuilt.fallbacks, *((p, f"it fell back to tvm on {device}") for p in back)]
    rebuilt.estimated_ms = finalist.estimated_ms
    return rebuilt


# -- on the server


def _race(header: dict, arrays: dict, backends: BackendSet, threads: int) -> dict:
    sent = built_here(header, arrays, backends, threads)
    if not sent.built:
        return {"rounds": None, "costs": {}, "others_busy_cores": None, "attempts": 0, "left_out": sent.left_out,
                "ran": sent.ran}  # fmt: skip
    meter = None
    if header["metered"]:
        from ..measuring.meters import energy_meter

        meter = energy_meter(header["target"])  # NoEnergyMeter: the race cannot run here, and says why
    timed = time_finalists(sent.built, sent.inputs, header["target"], meter=meter)
    return {
        "rounds": timed.race.rounds if timed.race is not None else None,
        "costs": {label: dataclasses.asdict(cost) for label, cost in timed.costs.items()},
        "others_busy_cores": timed.others_busy_cores, "attempts": timed.attempts, "left_out": sent.left_out,
        "ran": sent.ran,
    }  # fmt: skip


@dataclass
class Built:
    """The finalists of a request, built and checked where it is read: ``built`` (label ->
    finalist), those that could not be (label -> why), those that ran other partitions than
    were sent (label -> entries), and the inputs to time them on."""

    built: dict[str, Finalist]
    left_out: dict[str, str]
    ran: dict[str, list[dict]]
    inputs: list[np.ndarray]


def built_here(header: dict, arrays: dict, backends: BackendSet, threads: int) -> Built:
    """Each finalist of an unpacked ``request``, assembled and checked here as
    ``collage.load_placement`` would."""
    module = _unlifted(tvm.ir.load_json(header["module"]), [arrays[f"weight{k}"] for k in range(header["weights"])])
    reference = Reference([arrays[f"input{k}"] for k in range(header["inputs"])],
                          [arrays[f"expected{k}"] for k in range(header["expected"])])
    onnx_model = onnx.load_from_string(arrays["onnx"].tobytes()) if header["onnx"] else None
    target, accuracy = header["target"], header["accuracy"]
    built, left_out, ran = {}, {}, {}
    for label, sent in header["finalists"].items():
        try:
            placement = RecordedPlacement.from_json(sent, label)
            if not placement.partitions:  # nothing placed: the module as TVM runs it
                built[label] = Finalist([], Assembly(module), build_vm(module, target), float("nan"))
                continue
            graph = dataflow_graph(replay_substitutions(module, placement, label))
            check_model(graph, placement, label)
            partitions = [entry.partition(graph) for entry in placement.partitions]
            if placement.runs_file:
                if onnx_model is None:
                    raise OptimizeError("it runs the model's ONNX file, which was not sent")
                built[label] = checked_on_file(module, graph, backends[partitions[0].backend], onnx_model,
                                               reference, target, threads, partitions[0].candidate.precision,
                                               accuracy)  # fmt: skip
            else:
                built[label] = assemble_and_check(graph, Placement(graph, tuple(partitions)), reference, backends,
                                                  target, threads, accuracy)  # fmt: skip
        except (OptimizeError, PlacementFileError, EngineAloneFailed, KeyError) as err:
            left_out[label] = first_line(err)
            continue
        there = [RecordedPartition.of(p) for p in built[label].partitions]
        if [p.identity for p in there] != [p.identity for p in placement.partitions]:
            ran[label] = [p.to_json() for p in there]
    return Built(built, left_out, ran, reference.inputs)


def _lifted(module: tvm.IRModule) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """``module`` with ``main``'s weights lifted out as arrays (``runner.weights_out``)."""
    main, weights = weights_out(module["main"])
    lifted = tvm.IRModule(dict(module.functions.items()), attrs=module.attrs)
    lifted["main"] = main
    return lifted, weights


def _unlifted(lifted: tvm.IRModule, weights: list[np.ndarray]) -> tvm.IRModule:
    module = tvm.IRModule(dict(lifted.functions.items()), attrs=lifted.attrs)
    module["main"] = weights_in(lifted["main"], weights)
    return module
