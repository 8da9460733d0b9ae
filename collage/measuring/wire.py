"""Measuring tasks and their results as plain data, for a measuring server on another machine.

What crosses the network is never pickled code: a server that unpickled what it was sent
would run whatever a peer on the network wrote. A task travels as one JSON header (the
backend *by name*, the pattern, target, threads, seed, timing, precision) and one ``.npz``
archive of arrays, read back with ``allow_pickle=False``: the sub-graph function as TVM's
JSON text with its weights lifted out as arrays (``runner.weights_out``), the inputs and
the reference outputs. The server looks the backend up among its own registered backends;
one it lacks measures as invalid, with that reason. A result travels the same way: the
cost's fields, and the reference outputs it found.

Every answer of a server names the server: a ``ServerDevice``, its CPU (model and ISA
flags), thread count and library versions. Costs are logged under its ``Device``, and
servers of another kind than the fleet's are refused (``rpc_runner``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm

from ..candidates.backend import default_backends
from .cost import Cost, Device, cpu_info
from .runner import MeasureResult, MeasureTask, weights_in, weights_out
from .timing import Timing
from .transition import TransitionTask

# Bumped when the layout changes: a server and a client of different layouts refuse each other.
WIRE_VERSION = 2


@dataclass(frozen=True)
class ServerDevice:
    """What a measuring server measures on: the ``Device`` name of its CPU (model, family
    and model number, ISA flags), its thread count, its backends' library versions (name ->
    ``Backend.library``), where it listens (for messages), the reduced precisions each
    backend computes in natively there (name -> precisions; only those offering one) and the
    CPU's ISA flags that decide them (``cost.cpu_info``)."""

    name: str
    threads: int
    libraries: dict[str, str]
    address: str
    precisions: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    isa: list[str] = dataclasses.field(default_factory=list)
    wire: int = WIRE_VERSION

    @classmethod
    def here(cls, threads: int, target: str, address: str) -> ServerDevice:
        """This machine measuring on ``threads`` threads for ``target``, as a server reports it."""
        backends = default_backends()
        offered = {b.name: list(p) for b in backends if (p := b.reduced_precisions(target))}
        return cls(Device.this_machine(threads, target).name, threads, {b.name: b.library for b in backends}, address,
                   offered, cpu_info()["isa"] if target == "llvm" else [])  # fmt: skip

    @property
    def device(self) -> Device:
        return Device(self.name, self.threads)

    def differs_from(self, other: ServerDevice, other_is: str = "the fleet") -> str | None:
        """Why costs measured on ``self`` would not hold on ``other`` (called ``other_is``), or None."""
        if self.wire != other.wire:
            return f"it speaks wire version {self.wire}, {other_is} {other.wire}"
        if self.name != other.name:
            return f"its CPU is {self.name}, {other_is}'s {other.name}"
        if self.threads != other.threads:
            return f"it measures on {self.threads} thread(s), {other_is} on {other.threads}"
        changed = sorted(b for b in self.libraries.keys() | other.libraries.keys()
                         if self.libraries.get(b) != other.libraries.get(b))  # fmt: skip
        if changed:
            b = changed[0]
            return f"its {b} is {self.libraries.get(b, 'missing')}, {other_is}'s {other.libraries.get(b, 'missing')}"
        return None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerDevice:
        return cls(**json.loads(text))


def encode(work: MeasureTask | TransitionTask | list[MeasureTask], known: set[str] | None = None) -> bytes:
    """A task, a transition probe or a batch of tasks (``run_batch``) as bytes. With
    ``known``, the digests of the arrays the server holds already (``ArrayStore``), those go
    by digest alone, and the digests of those sent whole are added to it: pass a copy, and
    keep it once the server has answered."""
    arrays: dict[str, np.ndarray] = {}
    if isinstance(work, list):
        header = {"batch": [_task_header(task, f"{k}.", arrays) for k, task in enumerate(work)]}
    elif isinstance(work, TransitionTask):
        header = {"transition": {"backend": work.backend.name, "target": work.target, "tries": work.tries,
                                 "timing": dataclasses.asdict(work.timing)}}  # fmt: skip
        if work.beside is not None:
            header["transition"]["beside"] = {"backend": work.beside.backend.name, "tries": work.beside.tries}
    else:
        header = {"task": _task_header(work, "", arrays)}
    return pack(header, arrays, known)


def decode(data: bytes, backends, threads: int, store: ArrayStore | None = None):
    """What ``encode`` wrote, with backends looked up in ``backends`` (a BackendSet) and
    measured on ``threads`` threads (the server's, whatever the client asked for), arrays
    sent by digest alone taken from ``store`` (those sent whole are kept there). A backend
    the set lacks raises ``KeyError`` naming it; an array the store lacks, ``MissingArrays``."""
    header, arrays = unpack(data, store)
    if "batch" in header:
        return [_task(h, arrays, backends, threads, f"{k}.") for k, h in enumerate(header["batch"])]
    if "transition" in header:
        t = header["transition"]

        def task(backend: str, tries: list, beside=None) -> TransitionTask:
            tries = tuple((k, pattern) for k, pattern in tries)
            return TransitionTask(backends[backend], t["target"], threads, Timing(**t["timing"]), tries, beside)

        other = t.get("beside")
        return task(t["backend"], t["tries"], None if other is None else task(other["backend"], other["tries"]))
    return _task(header["task"], arrays, backends, threads)


def count(data: bytes) -> int | None:
    """How many tasks ``data`` (``encode``'s) holds: None for a single task or transition."""
    try:
        header, _ = _header(data)
    except Exception:  # noqa: BLE001 -- not even the header can be read: one result answers it
        return None
    return len(header["batch"]) if "batch" in header else None


class Answer(NamedTuple):
    """A server's answer: the result (or a batch's), who measured it, and in how many seconds
    (what the client waited beyond them is the dispatch: encoding, the network, decoding).
    ``missing``: the work named arrays by digest that the server no longer holds (none
    measured: send it again whole)."""

    results: MeasureResult | list[MeasureResult] | None
    server: ServerDevice
    seconds: float
    missing: bool = False


def encode_results(answer: Answer) -> bytes:
    if answer.missing:
        return pack({"missing": True, "server": dataclasses.asdict(answer.server), "seconds": answer.seconds}, {})
    arrays: dict[str, np.ndarray] = {}
    many = isinstance(answer.results, list)
    headers = [_result_header(r, f"{k}.", arrays) for k, r in enumerate(answer.results if many else [answer.results])]
    return pack({"results": headers, "batch": many, "server": dataclasses.asdict(answer.server),
                  "seconds": answer.seconds}, arrays)  # fmt: skip


def decode_results(data: bytes) -> Answer:
    header, arrays = unpack(data)
    server = ServerDevice(**header["server"])
    if header.get("missing"):
        return Answer(None, server, header["seconds"], missing=True)
    results = [_result(h, arrays, f"{k}.") for k, h in enumerate(header["results"])]
    return Answer(results if header["batch"] else results[0], server, header["seconds"])


class MissingArrays(Exception):
    """A message named arrays by digest that the server's ``ArrayStore`` does not hold."""


class ArrayStore:
    """The arrays a measuring server's session was sent, by digest, so that a weight many
    candidates share (a convolution's, on every backend and in every fusion) crosses the
    network once per server: TVM's RPC moves about 60 MB/s even on loopback (measured on a
    Zen 5, for bytes and tensors alike), and sent with every candidate, ResNet-50's weights
    and activations took 58.6 s of its 95.6 s of measuring on two servers there. Bounded by ``limit_bytes``, the least
    recently used going first; a client naming one gone is told, and sends its work whole."""

    def __init__(self, limit_bytes: int = 2 << 30):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._arrays: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._arrays)

    def get(self, digest: str) -> np.ndarray | None:
        array = self._arrays.get(digest)
        if array is not None:
            self._arrays.move_to_end(digest)
        return array

    def put(self, digest: str, array: np.ndarray) -> None:
        if digest in self._arrays:
            return
        self._arrays[digest] = array
        self.bytes += array.nbytes
        while self.bytes > self.limit_bytes and len(self._arrays) > 1:
            self.bytes -= self._arrays.popitem(last=False)[1].nbytes


def digest(array: np.ndarray) -> str:
    """What names ``array`` by content: its type, shape and bytes (SHA-256, about 2 GB/s)."""
    array = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(memoryview(array).cast("B"))
    return h.hexdigest()[:32]


# -- the parts


def _task_header(task: MeasureTask, prefix: str, arrays: dict) -> dict:
    lifted, weights = weights_out(task.func)
    _put(arrays, prefix + "weight", weights)
    _put(arrays, prefix + "input", task.inputs)
    _put(arrays, prefix + "reference", task.reference)
    return {
        "backend": task.backend.name, "func": tvm.ir.save_json(lifted), "weights": len(weights),
        "pattern": task.pattern, "target": task.target, "seed": task.seed, "timing": dataclasses.asdict(task.timing),
        "inputs": None if task.inputs is None else len(task.inputs),
        "reference": None if task.reference is None else len(task.reference),
        "meter": task.meter is not None, "precision": task.precision, "rtol": task.rtol,
    }  # fmt: skip


def _task(h: dict, arrays: dict, backends, threads: int, prefix: str = "") -> MeasureTask:
    func = weights_in(tvm.ir.load_json(h["func"]), _get(arrays, prefix + "weight", h["weights"]))
    meter = None
    if h["meter"]:
        from .meters import energy_meter

        meter = energy_meter(h["target"])  # this server's own; NoEnergyMeter says why not
    return MeasureTask(backends[h["backend"]], func, h["pattern"], h["target"], threads, h["seed"], Timing(**h["timing"]),
                       _get(arrays, prefix + "reference", h["reference"]), meter, _get(arrays, prefix + "input", h["inputs"]),
                       h["precision"], h["rtol"])  # fmt: skip


def _result_header(result: MeasureResult, prefix: str, arrays: dict) -> dict:
    _put(arrays, prefix + "reference", result.reference)
    fields = dataclasses.asdict(result.cost)
    return {"cost": fields, "reference": None if result.reference is None else len(result.reference),
            "timed_out": result.timed_out, "compile_s": result.compile_s}  # fmt: skip


def _result(h: dict, arrays: dict, prefix: str = "") -> MeasureResult:
    # A server of an earlier version does not say how long its compiles took.
    return MeasureResult(Cost(**h["cost"]), _get(arrays, prefix + "reference", h["reference"]), h["timed_out"],
                         h.get("compile_s", 0.0))


def _put(arrays: dict, name: str, values) -> None:
    for k, value in enumerate(values or ()):
        arrays[f"{name}{k}"] = np.asarray(value)


def _get(arrays: dict, name: str, count: int | None) -> list[np.ndarray] | None:
    return None if count is None else [arrays[f"{name}{k}"] for k in range(count)]


def pack(header: dict, arrays: dict, known: set[str] | None = None) -> bytes:
    """A JSON ``header`` and named ``arrays`` as one message: the header's length, the header,
    an ``.npz`` archive. With ``known`` (digests the receiver holds), every array's digest
    goes in the header, the known ones are left out of the archive, and the others' digests
    are added to ``known``."""
    if known is not None:
        digests = {name: digest(array) for name, array in arrays.items()}
        header = dict(header, digests=digests)
        first = {key: name for name, key in reversed(digests.items())}  # a value many tasks read goes once
        arrays = {name: array for name, array in arrays.items()
                  if digests[name] not in known and first[digests[name]] == name}  # fmt: skip
        known.update(digests.values())
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + buffer.getvalue()


def _header(data: bytes) -> tuple[dict, int]:
    """A message's JSON header, and its length in bytes."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + size]), size


def unpack(data: bytes, store: ArrayStore | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """What ``pack`` wrote; arrays are read without unpickling anything. Arrays sent by digest
    alone come from ``store``, and those sent whole are kept in it; ``MissingArrays`` when
    the store lacks one."""
    header, size = _header(data)
    with np.load(io.BytesIO(data[8 + size :]), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    digests = header.get("digests", {})
    sent = {name: array for name, array in arrays.items() if name in digests}
    in_message = {digests[name]: array for name, array in sent.items()}
    for name, key in digests.items():
        if name not in arrays:
            arrays[name] = in_message.get(key)
            if arrays[name] is None and store is not None:
                arrays[name] = store.get(key)
            if arrays[name] is None:
                raise MissingArrays(f"array {name} was sent by digest and is not held here")
    for name, array in sent.items() if store is not None else ():  # kept after the others are read: keeping may evict
        store.put(digests[name], array)
    return header, arrays
