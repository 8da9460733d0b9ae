"""Measuring on a fleet: a TVM RPC tracker and ``collage serve`` servers, all on loopback."""

import dataclasses
import json
import math
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import collage
from collage.cli import main
from collage.measuring.cost import Cost, Device, cpu_info
from collage.measuring.cost_log import CostLog
from collage.measuring.runner import MeasureResult, MeasureTask
from collage.measuring.rpc_runner import FleetError, RPCRunner
from collage.server import measure_remote
from collage.measuring.timing import Timing
from collage.measuring.transition import TransitionTask
from collage.measuring.wire import (Answer, ArrayStore, MissingArrays, ServerDevice, decode, decode_results, digest, encode,
                                    encode_results)
from collage.assembling.assemble import Assembly
from collage.assembling.checked import assemble_and_check
from collage.candidates.backend import BackendSet, default_backends
from collage.candidates.generate import Candidate
from collage.candidates.subgraph import SubGraph
from collage.deploying.saved import PlacementWarning
from collage.errors import OptimizeError
from collage.model.graph import DataflowGraph
from collage.measuring.build import build_vm
from collage.choosing import elsewhere
from collage.assembling.checked import Finalist
from collage.placing.placement import Partition, Placement, tvm_op
from collage.measuring.arrays import Reference
from experiments import fleet_bench, models
from experiments.fleet_bench import HOST, free_port, kill, start_tracker, wait_registered
from tests.backends_for_tests import CANNOT_COMPILE, NUMPY
from tests.helpers import subprocess_env

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.3, budget_s=0.3)


def start_server(tracker: str, key: str, threads: int):
    """``collage serve`` as ``experiments.fleet_bench`` starts it, with the suite's quick
    settings (``tests/subprocesses/sitecustomize.py``), as the command-line tests' processes
    have them: a race sent to a server was timed there with the product's full protocol
    (blocks of 60 ms after 0.1 s of idle, up to 21 rounds) and raced again while other
    processes were busy. What the tests check of the race (it travels, comes back as rounds,
    names the device) does not depend on how long its blocks are."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
        return fleet_bench.start_server(tracker, key, threads)


@pytest.fixture(scope="module")
def tracker():
    address, proc = start_tracker()
    yield address
    kill(proc)


@pytest.fixture
def fleet(tracker, request):
    """Two one-thread servers under a key of this test's own."""
    key = request.node.name.replace("[", "-").replace("]", "")
    servers = [start_server(tracker, key, threads=1) for _ in range(2)]
    wait_registered(tracker, key, 2)
    yield key, servers
    for s in servers:
        kill(s)


def add_one() -> relax.Function:
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.full((64, 64), 0.5, "float32"))
            out = bb.emit_output(relax.op.add(x, w))
        bb.emit_func_output(out)
    return bb.get()["main"]


def task(backend="tvm", seed=0, **kw) -> MeasureTask:
    backend = default_backends()[backend] if isinstance(backend, str) else backend
    return MeasureTask(backend, add_one(), f"{backend.name}.add", "llvm", 1, seed, FAST, **kw)


# -- what travels


def test_a_task_travels_as_json_and_arrays_with_its_backend_by_name():
    x = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    sent = task(inputs=[x], reference=[x + 0.5], precision="bfloat16", rtol=1e-2)
    got = decode(encode(sent), default_backends(), threads=3)
    assert got.backend is default_backends()["tvm"] and got.threads == 3  # the server's threads
    assert tvm_ffi.structural_equal(got.func, sent.func)
    np.testing.assert_array_equal(got.inputs[0], x)
    np.testing.assert_array_equal(got.reference[0], x + 0.5)
    assert (got.pattern, got.timing, got.precision, got.rtol) == (sent.pattern, FAST, "bfloat16", 1e-2)
    batch = decode(encode([task(), task(seed=4)]), default_backends(), threads=1)
    assert [t.seed for t in batch] == [0, 4] and batch[0].inputs is None
    transition = TransitionTask.of(default_backends()["onnxruntime"], "llvm", 1, FAST)
    assert decode(encode(transition), default_backends(), threads=1) == transition


def test_results_travel_with_the_device_that_measured_them():
    server = ServerDevice("Some CPU (family 6 model 1; avx2)", 2, {"tvm": "Apache TVM 0.27"}, "10.0.0.1:9091")
    results = [MeasureResult(Cost.of(1.5, 0.1, 5), [np.ones(3, "float32")]), MeasureResult(Cost.invalid("no"), timed_out=True)]
    got, device, seconds, _ = decode_results(encode_results(Answer(results, server, 1.25)))
    assert device == server and seconds == 1.25 and device.device == Device("Some CPU (family 6 model 1; avx2)", 2)
    assert got[0].cost == results[0].cost and got[1].cost == results[1].cost and got[1].timed_out
    np.testing.assert_array_equal(got[0].reference[0], np.ones(3))


def test_an_array_crosses_once_per_server_and_again_when_the_server_let_it_go(monkeypatch):
    from collage import server

    x = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    sent = task(inputs=[x], reference=[x + 0.5])
    known = set()
    first = encode(sent, known)
    assert len(known) == 3  # the weight, the input, the reference
    again = encode(sent, set(known))
    assert len(again) < len(first) - 3 * x.nbytes  # by digest alone
    store = ArrayStore()
    decode(first, default_backends(), 1, store)
    got = decode(again, default_backends(), 1, store)
    np.testing.assert_array_equal(got.reference[0], x + 0.5)
    assert tvm_ffi.structural_equal(got.func, sent.func)
    with pytest.raises(MissingArrays):
        decode(again, default_backends(), 1, ArrayStore())
    # Within one message too, a value several tasks read goes once.
    twice = encode([sent, sent], set())
    assert len(twice) < len(first) + x.nbytes
    assert [np.array_equal(t.inputs[0], x) for t in decode(twice, default_backends(), 1, ArrayStore())] == [True, True]
    # A server that no longer holds them says so, and measures nothing.
    monkeypatch.setattr(server, "_store", ArrayStore())
    answer = decode_results(bytes(measure_remote(1, again)))
    assert answer.missing and answer.results is None
    assert not decode_results(bytes(measure_remote(1, first))).missing


def test_the_array_store_lets_the_least_recently_used_go_past_its_bound():
    store = ArrayStore(limit_bytes=3 * 400)
    arrays = [np.full(100, k, "float32") for k in range(4)]  # 400 bytes each
    for k, a in enumerate(arrays[:3]):
        store.put(digest(a), a)
    assert store.get(digest(arrays[0])) is not None  # used: kept over the second
    store.put(digest(arrays[3]), arrays[3])
    assert store.get(digest(arrays[1])) is None and len(store) == 3 and store.bytes == 1200
    assert digest(arrays[0]) != digest(arrays[0].astype("float64")) != digest(arrays[0].reshape(10, 10))


def test_a_server_measures_what_it_lacks_as_invalid_with_the_reason():
    data = bytes(measure_remote(1, encode([task(NUMPY)] * 2)))
    results, device, _, _ = decode_results(data)
    assert len(results) == 2 and all(r.cost.is_invalid for r in results)
    assert "cannot measure it" in results[0].cost.reason and "numpy" in results[0].cost.reason
    assert device.threads == 1 and device.name == Device.this_machine(1).name and device.isa == cpu_info()["isa"]
    assert device.precisions == {b.name: list(p) for b in default_backends() if (p := b.reduced_precisions("llvm"))}


def test_a_server_of_another_kind_says_why():
    fleet = ServerDevice("CPU A", 1, {"tvm": "0.27", "onnxruntime": "1.31"}, "a:1")
    assert fleet.differs_from(fleet) is None
    assert "thread" in ServerDevice("CPU A", 2, fleet.libraries, "b:1").differs_from(fleet)
    assert "CPU B" in ServerDevice("CPU B", 1, fleet.libraries, "b:1").differs_from(fleet)
    assert "onnxruntime is 1.30" in ServerDevice("CPU A", 1, {"tvm": "0.27", "onnxruntime": "1.30"}, "b:1").differs_from(fleet)


# -- the fleet


def test_an_unreachable_tracker_is_one_line(tmp_path, capsys):
    port = free_port()  # nothing listens there
    with pytest.raises(FleetError, match=f"cannot reach the RPC tracker at {HOST}:{port}") as refused:
        RPCRunner(f"{HOST}:{port}", "cpu")
    # The command it suggests starts a tracker on that very port, past TVM's default range too.
    assert f"--port {port} --port-end {port + 1})" in str(refused.value)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    assert main(["optimize", str(model), "--tracker", f"{HOST}:{port}", "--key", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"collage: error: cannot reach the RPC tracker at {HOST}:{port}")
    assert main(["optimize", str(model), "--tracker", f"{HOST}:{port}"]) == 2  # --key too


def test_a_key_with_no_server_is_one_line(tracker):
    with pytest.raises(FleetError, match="no measuring server is registered under key 'nobody'"):
        RPCRunner(tracker, "nobody")


def test_servers_of_another_device_kind_are_refused(tracker, fleet):
    key, _ = fleet
    runner = RPCRunner(tracker, key)
    assert runner.fleet.threads == 1
    other = start_server(tracker, key, threads=2)  # another device kind: two threads
    try:
        wait_registered(tracker, key, 3)
        found = {}
        runner.run_all([task(seed=k) for k in range(6)], found.__setitem__)
        assert sorted(found) == list(range(6)) and all(r.cost.is_valid for r in found.values())
        (why,) = runner.refused.values()
        assert "2 thread(s), the fleet on 1" in why
    finally:
        runner.close()
        kill(other)


def test_a_server_killed_mid_run_loses_nothing(tmp_path, tracker, fleet):
    """Two servers, one killed (with everything it started) while candidates are measured:
    the run still ends with a correct module and every candidate in the log."""
    key, servers = fleet
    log = CostLog(tmp_path / "costs.sqlite")
    runner = RPCRunner(tracker, key)
    device = runner.fleet.name

    def kill_while_both_measure():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and runner.busy < 2:
            time.sleep(0.002)
        kill(servers[0])

    killer = threading.Thread(target=kill_while_both_measure)
    killer.start()
    w = models.load("mlp", small=True)
    opt = collage.optimize(w.relax, cost_log=log, runner=runner, timing=FAST, progress=False, threads=1)
    killer.join()
    assert runner.lost >= 1
    got = opt(*[x.numpy() for x in w.inputs])
    for g, r in zip(got if isinstance(got, tuple) else (got,), w.reference()):
        assert np.abs(g - r).max() <= 1e-3 * np.abs(r).max()
    assert opt.record.measured > 0 and {r.device for r in log.rows()} == {device}
    # Every candidate was measured (or failed with its reason) and logged: nothing is left to measure.
    again = collage.optimize(w.relax, cost_log=log, runner=runner, timing=FAST, progress=False, threads=1)
    assert again.record.measured == 0
    runner.close()


def test_a_server_that_hangs_mid_work_has_its_work_taken_back(tracker, fleet):
    key, servers = fleet
    runner = RPCRunner(tracker, key, timeout_s=10)
    stopped = threading.Event()

    def stop_while_both_measure():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and runner.busy < 2:
            time.sleep(0.002)
        os.killpg(servers[0].pid, signal.SIGSTOP)
        stopped.set()

    stopper = threading.Thread(target=stop_while_both_measure)
    stopper.start()
    found = {}
    works = [task(seed=k) for k in range(8)]
    runner.run_all(works, found.__setitem__)
    stopper.join()
    assert stopped.is_set() and runner.lost == 1
    assert sorted(found) == list(range(8)) and all(r.cost.is_valid for r in found.values())
    runner.close()


# -- optimizing for another device


def elementwise_model() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.exp(relax.op.nn.relu(x)))
            out = bb.emit_output(relax.op.add(y, relax.const(np.full((16, 16), 0.5, "float32"))))
        bb.emit_func_output(out)
    return bb.get()


def test_a_race_travels_as_placements_and_comes_back_as_rounds():
    """The finalists go as their placements; the server builds each with its own libraries:
    one that falls back to TVM there says what it ran, one it has no backend for is left out."""
    mod = elementwise_model()
    graph = DataflowGraph.from_module(mod)
    x = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    expected = [np.exp(np.maximum(x, 0)) + 0.5]
    here = BackendSet([default_backends()["tvm"], NUMPY])
    on_numpy = Placement(graph, (Partition(Candidate(SubGraph(graph, frozenset({0, 1})), "numpy", "numpy.chain"), Cost.of(0.01)),
                                 tvm_op(graph, 2, "tvm.op")))  # fmt: skip
    on_tvm = Placement(graph, tuple(tvm_op(graph, i, "tvm.op") for i in range(len(graph))))
    finalists = {name: assemble_and_check(graph, p, Reference([x], expected), here, "llvm", 1)
                 for name, p in (("numpy", on_numpy), ("tvm", on_tvm))}  # fmt: skip
    finalists["unplaced"] = Finalist([], Assembly(mod), build_vm(mod), math.nan)  # the module as TVM runs it
    data = elsewhere.request(finalists, mod, {}, None, Reference([x], expected), "llvm", None, metered=False)

    cannot = dataclasses.replace(CANNOT_COMPILE, name="numpy")  # this server's numpy cannot compile it
    answer = elsewhere.answer_of(elsewhere.run(data, 1, "10.0.0.2:9091", BackendSet([default_backends()["tvm"], cannot])))
    assert answer.server.address == "10.0.0.2:9091" and answer.server.threads == 1 and not answer.left_out
    assert [e["backend"] for e in answer.ran["numpy"]] == ["tvm"] * 3 and "tvm" not in answer.ran
    race = answer.keyed({"numpy": "N", "tvm": "T", "unplaced": "U"}).race
    assert len(race.rounds) >= 7 and set(race.rounds[0]) == {"N", "T", "U"}
    # Rebuilt here as it ran there: what is kept is what was timed.
    ran = elsewhere.as_ran_there(finalists["numpy"], answer.ran["numpy"], "CPU B", Reference([x], expected), here, "llvm", 1, None)
    assert {p.backend for p in ran.partitions} == {"tvm"} and ran.fallbacks[0][1] == "it fell back to tvm on CPU B"
    np.testing.assert_allclose(ran.vm["main"](tvm.runtime.tensor(x)).numpy(), expected[0], rtol=1e-5)

    lacking = elsewhere.answer_of(elsewhere.run(data, 1, "b:1", BackendSet([default_backends()["tvm"]])))
    assert "numpy" in lacking.left_out["numpy"] and set(lacking.timed.costs) == {"tvm", "unplaced"}
    garbled = elsewhere.run(b"\0" * 8 + b"{}", 1, "c:1")
    with pytest.raises(OptimizeError, match="could not be timed on .* at c:1: JSONDecodeError"):
        elsewhere.answer_of(garbled)


def test_optimizing_for_another_device_times_the_finalists_there_and_saves_the_placement_for_it(tmp_path, tracker):
    """A fleet of one two-thread server, optimized from a one-thread process: another device.
    The finalists race there; the placement and the export name that device and its threads,
    and load on it (this machine at two threads) without a warning."""
    key = "two-threads"
    server = start_server(tracker, key, threads=2)
    try:
        wait_registered(tracker, key, 1)
        with RPCRunner(tracker, key) as runner:
            assert runner.elsewhere(1, "llvm") == "it measures on 2 thread(s), this machine on 1"
            assert runner.elsewhere(2, "llvm") is None
            w = models.load("mlp", small=True)
            opt = collage.optimize(w.relax, cost_log=tmp_path / "c.sqlite", runner=runner, timing=FAST, progress=False,
                                   threads=1)  # fmt: skip
            fleet = runner.fleet
    finally:
        kill(server)
    assert opt.optimized_for == Device(fleet.name, 2) and opt.threads == 1
    assert opt.record.timed_on == f"{fleet.device} at {fleet.address}"
    assert f"optimized for {fleet.device}" in opt.report()
    got = opt(*[x.numpy() for x in w.inputs])
    for g, r in zip(got if isinstance(got, tuple) else (got,), w.reference()):
        assert np.abs(g - r).max() <= 1e-3 * np.abs(r).max()

    saved = json.loads(opt.save_placement(tmp_path / "placement.json").read_text())
    assert (saved["device"], saved["threads"]) == (fleet.name, 2)
    opt.export(tmp_path / "export")
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert (manifest["device"], manifest["threads"]) == (fleet.name, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # on the device it was made for: nothing to warn about
        loaded = collage.load(tmp_path / "export")
        rebuilt = collage.load_placement(w.relax, tmp_path / "placement.json", cost_log=tmp_path / "c.sqlite")
    assert rebuilt.threads == 2 and loaded.manifest["threads"] == 2
    with pytest.warns(PlacementWarning, match="placed for .* rebuilt on"):
        collage.load_placement(w.relax, tmp_path / "placement.json", cost_log=tmp_path / "c.sqlite", threads=1)
