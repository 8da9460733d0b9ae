"""A measuring server: measures the candidates of optimizations running on other machines.

``collage serve --tracker HOST:PORT --key KEY`` is TVM's RPC server (``tvm.rpc``) with two
functions of collage's own, registered with TVM's RPC tracker under KEY as any TVM device
is, so the tracker hands it to one client at a time (``rpc_runner.RPCRunner``):

- ``collage.device(target)``: what it measures on, a ``wire.ServerDevice`` as JSON;
- ``collage.measure(data)``: a task, transition or batch (``wire.encode``) measured as the
  local runner measures it, in a worker process (``isolation.WorkerProcess``), so a library
  that crashes or hangs costs one candidate; the results and the device, as bytes.

TVM's server forks a process per client session; the session's worker is started at the
client's first call (``collage.device``), so that it imports every library (seconds) while
the client prepares, and is kept for the session. Nothing the
server is sent is unpickled or run as code, but TVM's RPC protocol itself has no
authentication and lets a client call any function registered in the server: run
servers and the tracker inside a trusted network only (docs/fleet.md).
"""

from __future__ import annotations

import functools
import sys
import time

import tvm

from .candidates.backend import default_backends
from .measuring.cost import Cost
from .measuring.runner import MeasureResult
from .measuring.isolation import WorkerProcess
from .errors import first_line
from .measuring.wire import Answer, ArrayStore, MissingArrays, ServerDevice, count, decode, encode_results

_worker: WorkerProcess | None = None  # this session's (each session is a process of its own)
_store = ArrayStore()  # the arrays this session was sent, by digest (weights cross the network once)
_address = "?"  # where this server listens, once it does (for its reports)


def measure_remote(threads: int, data: bytes) -> bytes:
    """``collage.measure``: never raises; a task it cannot read is measured as invalid."""
    address, started = _address, time.perf_counter()
    try:
        work = decode(bytes(data), default_backends(), threads, _store)
    except MissingArrays:  # evicted since the client sent them: it sends the work whole
        return encode_results(Answer(None, ServerDevice.here(threads, "llvm", address), 0.0, missing=True))
    except Exception as err:  # noqa: BLE001 -- an unknown backend, no energy meter here: the candidate's cost
        failed = MeasureResult(Cost.invalid(f"the measuring server at {address} cannot measure it: {first_line(err)}"))
        n = count(data)
        results, target = ([failed] * n if n is not None else failed), "llvm"
    else:
        worker = session_worker(threads)
        results = worker.run_batch(work) if isinstance(work, list) else worker.run(work)
        target = (work[0] if isinstance(work, list) else work).target
    return encode_results(Answer(results, ServerDevice.here(threads, target, address), time.perf_counter() - started))


def device_json(threads: int, target: str) -> str:
    """``collage.device``: a client's first call in its session, so the session's worker is
    started here, to start up while the client prepares the model."""
    session_worker(threads).start()
    return ServerDevice.here(threads, target, _address).to_json()


def session_worker(threads: int) -> WorkerProcess:
    global _worker
    if _worker is None:
        _worker = WorkerProcess(threads)
    return _worker


def serve_race(threads: int, data: bytes) -> bytes:
    """``collage.time_finalists``: the finalists of an optimization for this device, built,
    checked and timed against each other in the session's worker (``choosing.elsewhere``), so
    that they run on the server's threads and a library that crashes costs the race only;
    never raises."""
    from .choosing import elsewhere

    job = functools.partial(elsewhere.run, bytes(data), threads, _address)
    try:
        return session_worker(threads).call(job, elsewhere.RACE_TIMEOUT_S)
    except RuntimeError as err:
        return elsewhere.failed(str(err), threads, _address)


def register(threads: int) -> None:
    """Registers ``collage.device``, ``collage.measure`` and ``collage.time_finalists`` in this
    process (and so in every session TVM's server forks from it)."""
    tvm.register_global_func("collage.device", functools.partial(device_json, threads), override=True)
    tvm.register_global_func("collage.measure", functools.partial(measure_remote, threads), override=True)
    tvm.register_global_func("collage.time_finalists", functools.partial(serve_race, threads), override=True)


# How many ports above the first one a server tries, as TVM's own rpc_server does.
PORTS = 100


def serve(tracker: tuple[str, int], key: str, threads: int, host: str = "127.0.0.1", port: int = 9091,
          target: str = "llvm") -> None:
    """Serve until killed: TVM's RPC server on ``host`` (the first free port of ``PORTS`` from
    ``port``), registered with the tracker at ``tracker`` under ``key``, measuring on
    ``threads`` threads."""
    from tvm.rpc.server import PopenRPCServerState

    from .measuring.rpc_runner import FleetError, reachable

    global _address
    reachable(tracker)  # one line now, rather than TVM's minute of retries
    register(threads)
    # The server runs in this very process (not in a child, as ``tvm.rpc.Server`` does), so that
    # stopping this process stops the server and what it measures.
    try:
        state = PopenRPCServerState(host, port, port + PORTS, tracker_addr=tracker, key=key, silent=True)
    except (OSError, ValueError) as err:  # no free port, or not an address of this machine
        raise FleetError(f"cannot listen on {host}, ports {port}-{port + PORTS - 1}: {err}") from None
    _address = address = f"{host}:{state.port}"
    report = ServerDevice.here(threads, target, address)
    print(f"collage: measuring on {report.device} at {address}, registered under key {key!r} with the tracker at "
          f"{tracker[0]}:{tracker[1]}", file=sys.stderr, flush=True)  # fmt: skip
    state.thread.join()
