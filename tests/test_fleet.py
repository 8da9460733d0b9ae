"""Measuring on a fleet: a TVM RPC tracker and ``collage serve`` servers, all on loopback."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import tvm_ffi
from tvm import relax

import collage
from collage.cli import main
from collage.measuring.cost import Cost, Device
from collage.measuring.cost_log import CostLog
from collage.measuring.isolation import MeasureResult, MeasureTask
from collage.measuring.rpc_runner import FleetError, RPCRunner
from collage.measuring.server import measure_remote
from collage.measuring.timing import Timing
from collage.measuring.transition import TransitionTask
from collage.measuring.wire import Answer, ServerDevice, decode, decode_results, encode, encode_results
from collage.candidates.backend import default_backends
from experiments import models
from experiments.fleet_bench import HOST, free_port, kill, start_server, start_tracker, wait_registered
from tests.backends_for_tests import NUMPY

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.3, budget_s=0.3)
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
    got, device, seconds = decode_results(encode_results(Answer(results, server, 1.25)))
    assert device == server and seconds == 1.25 and device.device == Device("Some CPU (family 6 model 1; avx2)", 2)
    assert got[0].cost == results[0].cost and got[1].cost == results[1].cost and got[1].timed_out
    np.testing.assert_array_equal(got[0].reference[0], np.ones(3))


def test_a_server_measures_what_it_lacks_as_invalid_with_the_reason():
    data = bytes(measure_remote(1, encode([task(NUMPY)] * 2)))
    results, device, _ = decode_results(data)
    assert len(results) == 2 and all(r.cost.is_invalid for r in results)
    assert "cannot measure it" in results[0].cost.reason and "numpy" in results[0].cost.reason
    assert device.threads == 1 and device.name == Device.this_machine(1).name


def test_a_server_of_another_kind_says_why():
    fleet = ServerDevice("CPU A", 1, {"tvm": "0.27", "onnxruntime": "1.31"}, "a:1")
    assert fleet.differs_from(fleet) is None
    assert "thread" in ServerDevice("CPU A", 2, fleet.libraries, "b:1").differs_from(fleet)
    assert "CPU B" in ServerDevice("CPU B", 1, fleet.libraries, "b:1").differs_from(fleet)
    assert "onnxruntime is 1.30" in ServerDevice("CPU A", 1, {"tvm": "0.27", "onnxruntime": "1.30"}, "b:1").differs_from(fleet)


# -- the fleet


def test_an_unreachable_tracker_is_one_line(tmp_path, capsys):
    port = free_port()  # nothing listens there
    with pytest.raises(FleetError, match=f"cannot reach the RPC tracker at {HOST}:{port}"):
        RPCRunner(f"{HOST}:{port}", "cpu")
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
