"""Measuring on a fleet: every measuring server registered under one key with a TVM RPC tracker.

TVM's own tuning measures where the model will run: ``rpc_server``s register with an RPC
tracker under a device key, and a runner asks the tracker for a free one. ``RPCRunner`` is
that runner for collage's candidates (``runner.MeasureRunner``), the servers being
``collage serve`` (``server``). The tracker does the scheduling; the runner only keeps one
session open per server it was given and feeds each session the next work as the last
comes back, so N servers measure N works at once.

The fleet is one device kind: the first server to answer sets it (``wire.ServerDevice``: CPU,
threads, library versions), costs are logged under it, and a server of another kind is
refused with the reason (``refused``) and kept out of the run.

Faults lose nothing. A server that dies mid-work (its session's connection breaks) or
overruns the deadline has its work sent to another server (or to the same one when it
returns); a work on which ``MAX_LOSSES`` servers were lost is failed with that reason,
since it may be what kills them. When no server answers for ``wait_s`` seconds, what is
left is failed with that reason. An unreachable tracker, or a key with no server, is one
``FleetError`` line.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass

from ..errors import OptimizeError
from .cost import Cost
from .isolation import TIMEOUT_S
from .runner import MeasureResult, Work
from ..errors import first_line
from .wire import ServerDevice, decode_results, encode

# A work may have been what killed its server; after this many servers lost on it, it fails.
MAX_LOSSES = 2
# Beyond the servers' own deadline per candidate (their worker's): the network, encoding, the
# worker's start-up.
GRACE_S = 120.0


class FleetError(OptimizeError):
    """The fleet cannot be used: the tracker is unreachable, or no server is under the key."""


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` as ``(host, port)``; FleetError when it is not one."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise FleetError(f"a tracker is HOST:PORT (e.g. 127.0.0.1:9190), not {text!r}")
    return host, int(port)


def reachable(address: tuple[str, int], timeout_s: float = 5.0) -> None:
    """FleetError, in one line, when nothing listens at the tracker's ``address``."""
    try:
        socket.create_connection(address, timeout=timeout_s).close()
    except OSError as err:
        # TVM's tracker binds the first free port in [--port, --port-end), 9190-9199 by
        # default: a port past that range needs --port-end too, or the command fails.
        raise FleetError(f"cannot reach the RPC tracker at {address[0]}:{address[1]}: {err.strerror or err} "
                         f"(start one with: python -m tvm.exec.rpc_tracker --host {address[0]} --port {address[1]} "
                         f"--port-end {address[1] + 1})") from None  # fmt: skip


def registered_servers(tracker: tuple[str, int], key: str) -> int:
    """How many servers (of any kind) are registered under ``key`` with the tracker now."""
    from tvm import rpc

    summary = rpc.connect_tracker(*tracker).summary()
    return sum(1 for server in summary["server_info"] if server["key"] == f"server:{key}")


@dataclass
class _Session:
    """One server given to this runner by the tracker, and what it measures on."""

    rpc: object  # tvm.rpc.RPCSession
    device: ServerDevice
    known: set[str] = dataclasses.field(default_factory=set)  # digests of the arrays it holds (wire.ArrayStore)

    def alive(self) -> bool:
        try:
            self.rpc.get_function("collage.device")
            return True
        except Exception:  # noqa: BLE001 -- the connection is gone
            return False

    def send(self, work: Work | RemoteCall) -> tuple[object, float | None]:
        """``work`` done on this server: its result, and the seconds the server spent on it
        (None for a ``RemoteCall``, whose answer is the caller's to read)."""
        if isinstance(work, RemoteCall):
            return bytes(self.rpc.get_function(work.function)(work.data)), None
        measure = self.rpc.get_function("collage.measure")
        known = set(self.known)
        answer = decode_results(bytes(measure(encode(work, known))))
        if answer.missing:  # the server let some go: everything again, whole
            known = set()
            answer = decode_results(bytes(measure(encode(work, known))))
        self.device, self.known = answer.server, known
        return answer.results, answer.seconds


@dataclass(frozen=True)
class RemoteCall:
    """One call on one server of the fleet of a function the servers register besides
    ``collage.measure`` (``collage.time_finalists``): its name, its argument as bytes, and how
    long it may take there (None: the runner's ``timeout_s``). Its answer is bytes."""

    function: str
    data: bytes
    timeout_s: float | None = None


class RPCRunner:
    """Measures on the servers registered under ``key`` with the RPC tracker at ``tracker``
    ("HOST:PORT"), for ``target``. Each work gets ``timeout_s`` seconds on a server before
    it is taken back (a server gives each candidate ``TIMEOUT_S``; the rest is for the
    network and the worker's start); with no server answering for ``wait_s`` seconds, the
    rest fail.

    Made, it has asked one server for its device (``fleet``), so optimizations know where
    costs come from before measuring. ``servers`` counts the servers it holds now, ``lost``
    those that died or overran under it, ``refused`` the servers of another device kind
    (address -> why), ``work_seconds`` what each work measured took: (``run_all`` call,
    seconds from sending it to its answer, seconds the server spent on it). ``close`` gives
    the servers back to the tracker."""

    def __init__(self, tracker: str, key: str, target: str = "llvm", timeout_s: float = TIMEOUT_S + GRACE_S,
                 wait_s: float = TIMEOUT_S):  # fmt: skip
        self.tracker, self.key, self.target = parse_address(tracker), key, target
        self.timeout_s, self.wait_s = timeout_s, wait_s
        self.refused: dict[str, str] = {}
        self.lost = 0
        self.work_seconds: list[tuple[int, float, float]] = []
        self._calls = 0
        self._idle: list[_Session] = []  # held, waiting for work
        self._held_refused: list[_Session] = []  # held so the tracker does not hand them out again
        self._lock = threading.Lock()
        self._busy = 0
        reachable(self.tracker)
        if not self.registered():
            raise FleetError(f"no measuring server is registered under key {key!r} with the tracker at "
                             f"{tracker} (start one with: collage serve --tracker {tracker} --key {key})")  # fmt: skip
        first = self._request(threading.Event(), time.monotonic() + wait_s)
        if first is None:
            raise FleetError(f"no server under key {key!r} at {tracker} was free for {wait_s:g} s")
        self.fleet: ServerDevice = first.device
        self._idle.append(first)

    def __repr__(self):
        return f"RPCRunner({self.tracker[0]}:{self.tracker[1]}, key={self.key!r})"

    @property
    def servers(self) -> int:
        """The servers of the fleet's kind this runner holds now."""
        return len(self._idle) + self._busy

    @property
    def busy(self) -> int:
        """The servers measuring for this runner now."""
        return self._busy

    def registered(self) -> int:
        """How many servers (of any kind) are registered under the key now."""
        return registered_servers(self.tracker, self.key)

    def elsewhere(self, threads: int, target: str) -> str | None:
        """Why the fleet is not this machine measuring on ``threads`` threads (its CPU, thread
        count or a library differ: what it measures would not hold here), or None. Backends
        registered here only (a user's own) are not compared: the fleet cannot measure them."""
        here = ServerDevice.here(threads, target, "here")
        here = dataclasses.replace(here, libraries={b: v for b, v in here.libraries.items() if b in self.fleet.libraries})
        return self.fleet.differs_from(here, "this machine")

    def call(self, function: str, data: bytes, timeout_s: float | None = None) -> bytes:
        """``function(data)`` on one server of the fleet, its answer; a server lost on the way
        hands the call to another, as a lost work is. ``FleetError`` when it cannot be done."""
        found = []
        self.run_all([RemoteCall(function, data, timeout_s)], lambda index, answer: found.append(answer))
        if isinstance(found[0], FleetError):
            raise found[0]
        return found[0]

    # -- MeasureRunner

    def run(self, task) -> MeasureResult:
        return self._run_one(task)

    def run_batch(self, tasks) -> list[MeasureResult]:
        return self._run_one(list(tasks))

    def _run_one(self, work):
        found = []
        self.run_all([work], lambda index, result: found.append(result))
        return found[0]

    def run_all(self, works: list[Work], on_result) -> None:
        """Every work measured on the fleet, as many at once as there are servers."""
        if not works:
            return
        self._calls += 1
        call = self._calls
        pending = collections.deque(range(len(works)))
        losses: collections.Counter[int] = collections.Counter()
        in_flight: dict[int, tuple[int, float]] = {}  # dispatcher id -> (work, started)
        results: queue.Queue = queue.Queue()
        stop = threading.Event()
        abandoned: set[int] = set()  # dispatchers whose server overran: their answer is ignored

        def lose(index: int, why: str) -> None:
            """The server measuring ``index`` is gone: the work goes back to the queue, or fails."""
            self.lost += 1
            losses[index] += 1
            if losses[index] >= MAX_LOSSES:
                results.put((index, _failed(works[index], f"measuring failed: {losses[index]} measuring servers were lost on it ({why})")))
            else:
                pending.appendleft(index)

        def dispatch(me: int) -> None:
            session = None
            while not stop.is_set():
                if session is None:
                    session = self._idle_session() or self._request(stop, None)
                    if session is None:
                        return
                    with self._lock:
                        self._busy += 1
                with self._lock:
                    if not pending or me in abandoned:
                        self._busy -= 1
                        if me not in abandoned:
                            self._idle.append(session)
                        return
                    index = pending.popleft()
                    in_flight[me] = (index, time.monotonic())
                sent = time.perf_counter()
                try:
                    result, server_s = session.send(works[index])
                except Exception as err:  # noqa: BLE001 -- the connection broke: the server is gone
                    with self._lock:
                        self._busy -= 1
                        if me in abandoned:  # taken back already
                            return
                        del in_flight[me]
                        lose(index, f"{session.device.address}: {first_line(err)}")
                    session = None
                    continue
                with self._lock:
                    if me in abandoned:  # taken back already: this server overran; not used again
                        self._busy -= 1
                        return
                    in_flight.pop(me)
                    if server_s is not None:
                        self.work_seconds.append((call, time.perf_counter() - sent, server_s))
                results.put((index, result))

        # One dispatcher per server: those held, and (asking the tracker takes ~90 ms) the
        # others registered under the key when there is work for more.
        held = len(self._idle)
        dispatchers = max(1, min(len(works), held if len(works) <= held else max(held, self.registered())))
        started = [0]

        def start_dispatcher() -> None:
            threading.Thread(target=dispatch, args=(started[0],), daemon=True, name=f"collage-rpc-{started[0]}").start()
            started[0] += 1

        for _ in range(dispatchers):
            start_dispatcher()
        done: set[int] = set()
        last_answer = time.monotonic()
        try:
            while len(done) < len(works):
                try:
                    index, result = results.get(timeout=0.5)
                except queue.Empty:
                    now = time.monotonic()
                    with self._lock:
                        for me, (index, since) in list(in_flight.items()):
                            limit = getattr(works[index], "timeout_s", None) or self.timeout_s
                            if now - since > limit:  # the server hangs: take the work back
                                abandoned.add(me)
                                del in_flight[me]
                                lose(index, f"no answer in {limit:g} s")
                                start_dispatcher()
                        idle_fleet = not in_flight and pending and now - last_answer > self.wait_s
                        if idle_fleet:
                            for index in pending:
                                results.put((index, _failed(works[index], f"measuring failed: no measuring server under key {self.key!r} answered for {self.wait_s:g} s")))
                            pending.clear()
                    continue
                last_answer = time.monotonic()
                if index not in done:
                    done.add(index)
                    on_result(index, result)
        finally:
            stop.set()

    # -- sessions

    def _idle_session(self) -> _Session | None:
        """A held server that still answers (one may have died between two runs: that is
        no work's fault), or None."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                session = self._idle.pop()
            if session.alive():
                return session
            with self._lock:
                self.lost += 1

    def _request(self, stop: threading.Event, deadline: float | None) -> _Session | None:
        """A server of the fleet's kind from the tracker (waiting while all are busy), or None
        once ``stop`` is set or ``deadline`` passed; servers of another kind are refused."""
        while not stop.is_set():
            answer: queue.Queue = queue.Queue()
            threading.Thread(target=self._connect, args=(answer,), daemon=True).start()
            session = None
            while session is None and not stop.is_set():
                try:
                    session = answer.get(timeout=0.5)
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline:
                        return None
            if session is None or isinstance(session, Exception):
                if isinstance(session, Exception):
                    time.sleep(1.0)  # the tracker dropped us: ask again shortly
                continue
            fleet = getattr(self, "fleet", None)
            why = None if fleet is None else session.device.differs_from(fleet)
            if why is None:
                return session
            with self._lock:
                if session.device.address not in self.refused:
                    print(f"collage: refused the measuring server at {session.device.address}: {why}",
                          file=sys.stderr, flush=True)  # fmt: skip
                self.refused[session.device.address] = why
                self._held_refused.append(session)
        return None

    def _connect(self, answer: queue.Queue) -> None:
        """Ask the tracker for a server (blocks while none is free) and for its device."""
        from tvm import rpc

        try:
            sess = rpc.connect_tracker(*self.tracker).request(self.key, session_timeout=0)
            device = ServerDevice.from_json(str(sess.get_function("collage.device")(self.target)))
            answer.put(_Session(sess, device))
        except Exception as err:  # noqa: BLE001 -- a server gone between the tracker's answer and ours
            answer.put(err)

    def close(self) -> None:
        """Give every held server back to the tracker."""
        with self._lock:
            self._idle.clear()
            self._held_refused.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _failed(work: Work | RemoteCall, reason: str) -> MeasureResult | list[MeasureResult] | FleetError:
    if isinstance(work, RemoteCall):
        return FleetError(f"{work.function} failed on the fleet: {reason.removeprefix('measuring failed: ')}")
    failed = MeasureResult(Cost.invalid(reason))
    return [failed] * len(work) if isinstance(work, list) else failed
