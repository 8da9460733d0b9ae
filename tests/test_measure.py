"""The measurer: timing statistics, failures as invalid costs with reasons, and the cost log."""

import functools
import os
import time

import pytest

from tvm.script import ir as I
from tvm.script import relax as R

from collage.candidates.backend import BackendSet, default_backends
from collage.candidates.generate import generate
from collage.measuring.cost import Cost
from collage.config import Config
from collage.measuring.cost_log import CostLog
from collage.model.graph import DataflowGraph
from collage.measuring.runner import InProcess, MeasureTask
from collage.measuring.isolation import WorkerProcess
from collage.measuring import measure
from collage.measuring.measure import Measurer
from collage.measuring.timing import Protocol, Timing, time_call, time_contenders
from collage.measuring.transition import measure_transition
from tests import backends_for_tests
from tests.backends_for_tests import (BATCH_ABORTS, BATCH_REJECTED, CANNOT_COMPILE, NUMPY, RAISES_WHEN_RUN,
                                       TOGETHER, WRONG)
from tests.helpers import kernel_rows

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.2, budget_s=0.2)


# fmt: off
@I.ir_module
class Unary:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.sigmoid(b)
            R.output(c)
        return c
# fmt: on


def test_time_call_reports_median_spread_and_samples():
    cost = time_call(lambda: time.sleep(0.002), Timing(min_samples=5, max_samples=9, budget_s=1.0))
    assert cost.is_valid and 5 <= cost.samples <= 9
    assert 2.0 <= cost.median_ms < 20.0
    assert 0.0 <= cost.spread_ms < cost.median_ms


def test_a_first_call_far_above_the_ceiling_is_the_whole_timing():
    """A candidate twice as slow as the cheapest whole-model candidate (``Timing.ceiling_ms``)
    by its first call is timed by that call: no placement using it could win."""
    from collage.measuring.timing import over_ceiling

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    cost = time_call(slow, Timing(min_samples=5, ceiling_ms=5.0))
    assert len(calls) == 1 and cost.samples == 1 and cost.median_ms >= 20.0
    assert time_call(slow, Timing(min_samples=5, max_samples=5, ceiling_ms=15.0)).samples == 5  # under twice: as usual
    assert over_ceiling(30.0, Timing(ceiling_ms=10.0)).median_ms == 30.0 and over_ceiling(30.0, Timing()) is None
    assert over_ceiling(5.0, Timing(ceiling_ms=0.1)) is None  # under CEILING_FLOOR_MS: timed as usual
    assert over_ceiling(30.0, Timing(ceiling_ms=10.0), meter=object()) is None  # energy needs the samples


def test_time_call_stops_at_its_budget():
    start = time.perf_counter()
    cost = time_call(lambda: time.sleep(0.01), Timing(min_samples=3, max_samples=1000, rel_spread=0.0, budget_s=0.1))
    assert cost.samples >= 3 and time.perf_counter() - start < 1.0


@pytest.mark.timed
def test_warm_up_lasts_while_calls_still_get_faster_and_no_longer():
    calls = []

    def slow_at_first():  # an engine's first runs: 20 ms, then 1 ms
        calls.append(None)
        time.sleep(0.02 if len(calls) <= 3 else 0.001)

    cost = time_call(slow_at_first, Timing(min_samples=5, max_samples=9, budget_s=1.0))
    assert cost.median_ms < 5.0  # the slow first runs were warm-up, not samples

    def steady_timing_s() -> float:
        start, steady = time.perf_counter(), []
        time_call(lambda: steady.append(time.perf_counter()), Timing(min_samples=5, max_samples=9, budget_s=1.0))
        return steady[-1] - start

    # A steady kernel: two short warm-up rounds, then its samples (24 ms here; a fixed warm-up
    # took 0.1 s). The least of three: a busy moment on a 2-core host once made one 70 ms.
    assert min(steady_timing_s() for _ in range(3)) < 0.06


@pytest.fixture(autouse=True)
def nothing_measured_here_yet(monkeypatch):
    """Each test of measuring transitions measures them: none taken from an earlier test's."""
    monkeypatch.setattr(measure, "MEASURED_HERE", {})


def measurer(tmp_path, *backends, runner=None):
    bs = BackendSet([default_backends()["tvm"], *backends])
    return Measurer(bs, Config(threads=2, timing=FAST, runner=runner), CostLog(tmp_path / "costs.sqlite"))


def test_compiling_ahead_takes_the_transition_probe_and_the_graphs_values_are_computed_meanwhile(tmp_path, monkeypatch):
    """Where a backend's compiles leave a cache (inductor's packages), its transition probe is
    compiled ahead with its candidates (inductor's took 16 s of an H100 host's measuring
    worker), and the graph's values, which measuring needs and compiling does not, are
    computed while the pool compiles (ResNet-50's 12 s had held the pool back), as is the
    backend's set-up that each compile would wait for (``Backend.prepare``)."""
    import dataclasses
    import threading

    from collage.candidates.pattern import PatternRule
    from collage.measuring import measure
    from collage.measuring.warm import Warmed
    from collage.patterns.fusion import anchor_then_elementwise

    any_op = PatternRule("cached.any", lambda graph, node: True, anchor_then_elementwise)
    compiling, compiled, overlapped, prepared = threading.Event(), [], [], []

    def prepare(target):  # beside the pool
        prepared.append((target, compiling.wait(timeout=2)))

    cached = dataclasses.replace(NUMPY, name="cached", compile_cache=True, rules=(any_op,), prepare=prepare)
    m = measurer(tmp_path, cached, runner=InProcess())
    values = m._graph_values

    def graph_values():  # first called once the pool compiles, not before
        overlapped.append(compiling.wait(timeout=2))
        return values()

    def warm(tasks, sizes, processes, cores=None):
        compiling.set()
        compiled.extend((task.backend.name, task.reference) for task in tasks)
        return Warmed(len(tasks), processes)

    monkeypatch.setattr(m, "_graph_values", graph_values)
    monkeypatch.setattr(measure, "warm", warm)
    monkeypatch.setattr(measure, "processes_here", lambda: 2)
    candidates = generate(DataflowGraph.from_module(Unary), m.backends)
    m.measure_all(candidates, progress=False)
    ahead = [c for c in candidates if c.backend == "cached"]
    assert overlapped[0] and m.warmed.compiled == len(ahead) + 1 and prepared == [("llvm", True)]
    assert len(compiled) == len(ahead) + 1 and {backend for backend, _ in compiled} == {"cached"}
    assert all(reference is None for _, reference in compiled)  # compiling needs no values
    assert all(m.cost(c).is_valid for c in candidates if c.backend == "cached")


@pytest.mark.parametrize("off_the_host", [True, False])
def test_on_the_gpu_tvms_candidates_are_measured_while_the_pool_compiles(tmp_path, monkeypatch, off_the_host):
    """Where the device's clock times TVM's kernels (the GPU), its batches are measured while
    the pool compiles, which then keeps off one core, left to the measuring worker (ResNet-50's
    took 50 s of an H100 host's measuring, after the pool's 45 s); on the CPU, where the pool
    would share the measured kernel's cores, they wait for it."""
    import dataclasses
    import threading

    from collage.candidates.pattern import PatternRule
    from collage.measuring import measure
    from collage.measuring.warm import Warmed
    from collage.patterns.fusion import anchor_then_elementwise

    any_op = PatternRule("cached.any", lambda graph, node: True, anchor_then_elementwise)
    cached = dataclasses.replace(NUMPY, name="cached", compile_cache=True, rules=(any_op,))
    batch_measured, seen = threading.Event(), []

    class Runner(InProcess):
        def run_batch(self, tasks):
            batch_measured.set()
            return super().run_batch(tasks)

    def warm(tasks, sizes, processes, cores=None):
        seen.append((batch_measured.wait(timeout=30 if off_the_host else 0), cores))
        return Warmed(len(tasks), processes)

    m = measurer(tmp_path, cached, runner=Runner())
    monkeypatch.setattr(measure, "warm", warm)
    monkeypatch.setattr(measure, "processes_here", lambda: 2)
    monkeypatch.setattr(measure, "timed_off_the_host", lambda target: off_the_host)
    monkeypatch.setattr(measure, "spare_one_core", lambda: frozenset({0}))
    candidates = generate(DataflowGraph.from_module(Unary), m.backends)
    m.measure_all(candidates, progress=False)
    assert seen == [(True, frozenset({0}))] if off_the_host else seen == [(False, None)]
    assert batch_measured.is_set() and all(m.cost(c).is_valid for c in candidates)


def test_compiles_beside_a_measuring_worker_keep_off_its_core():
    """``spare_one_core``: the compiles' processes run on every core but one, and only there
    (their libraries' threads too)."""
    from collage.measuring.warm import spare_one_core

    cores = spare_one_core()
    if cores is None:
        pytest.skip("one core: nothing to spare")
    assert len(cores) == len(os.sched_getaffinity(0)) - 1
    worker = WorkerProcess(threads=1, cores=cores)
    try:
        assert worker.call(functools.partial(os.sched_getaffinity, 0), 60) == cores
    finally:
        worker.close()


def test_every_candidate_gets_a_cost_and_failures_say_why(tmp_path):
    graph = DataflowGraph.from_module(Unary)
    m = measurer(tmp_path, NUMPY, CANNOT_COMPILE, RAISES_WHEN_RUN, WRONG)
    candidates = generate(graph, m.backends)
    m.measure_all(candidates, progress=False)
    by_backend = {}
    for c in candidates:
        by_backend.setdefault(c.backend, []).append(m.cost(c))
    assert all(c.is_valid and c.median_ms > 0 for c in by_backend["tvm"] + by_backend["numpy"])
    assert {c.reason for c in by_backend["cannot_compile"]} == {
        "compile failed: RuntimeError: the library crashed while compiling"
    }
    assert {c.reason for c in by_backend["raises_when_run"]} == {"run failed: MemoryError: out of scratch space"}
    assert all(c.reason.startswith("wrong result: output 0: max |diff|") for c in by_backend["wrong"])


def test_a_second_run_measures_nothing(tmp_path):
    graph = DataflowGraph.from_module(Unary)
    first = measurer(tmp_path, NUMPY)
    candidates = generate(graph, first.backends)
    first.measure_all(candidates, progress=False)
    assert first.measured == len({first.key(c) for c in candidates}) > 0
    again = measurer(tmp_path, NUMPY)
    again.measure_all(candidates, progress=False)
    assert again.measured == 0
    assert [again.cost(c) for c in candidates] == [first.cost(c) for c in candidates]
    assert again.measured == 0


def test_a_library_that_compiles_several_at_once_gets_its_candidates_in_batches(tmp_path, monkeypatch):
    from collage.measuring import measure

    monkeypatch.setattr(measure, "BATCH", 4)
    backends_for_tests.BATCHES.clear()
    graph = DataflowGraph.from_module(Unary)
    m = measurer(tmp_path, TOGETHER, runner=InProcess())
    candidates = generate(graph, m.backends)
    m.measure_all(candidates, progress=False)
    together = [c for c in candidates if c.backend == "together"]
    assert backends_for_tests.BATCHES == [3, 3] and len(together) == 6  # six chains, in even batches of at most 4
    assert all(m.cost(c).is_valid for c in candidates) and m.measured == len(candidates)
    # TVM compiles its own candidates in one module; a kernel from it is the same kernel.
    whole = next(c for c in candidates if c.backend == "tvm" and len(c.subgraph) == 3)
    assert 1 / 3 < m.cost(whole).median_ms / m.measure(whole).median_ms < 3


def test_a_batch_that_does_not_compile_or_kills_its_worker_is_measured_one_by_one(tmp_path):
    graph = DataflowGraph.from_module(Unary)
    runner = WorkerProcess(threads=2, timeout_s=30)
    try:
        m = measurer(tmp_path, BATCH_REJECTED, BATCH_ABORTS, runner=runner)
        candidates = generate(graph, m.backends)
        m.measure_all(candidates, progress=False)
    finally:
        runner.close()
    # Each compiled alone by NumPy: every cost is a real one, nothing is lost to the batch.
    assert all(m.cost(c).is_valid for c in candidates)
    assert runner.started == 2  # the worker that aborted on the batch, and a fresh one


@pytest.mark.timed
def test_jobs_submitted_to_two_workers_run_at_once_and_an_overrun_says_its_own_time():
    workers = [WorkerProcess(threads=1) for _ in range(2)]
    try:
        pids = {worker.call(os.getpid, 60) for worker in workers}  # started and ready
        assert len(pids) == 2
        started = time.monotonic()
        for worker in workers:
            worker.submit(functools.partial(time.sleep, 1.0), 60)
        assert [worker.result() for worker in workers] == [None, None]
        assert time.monotonic() - started < 1.8  # one after the other would take 2 s
        with pytest.raises(RuntimeError, match=r"timed out after 0\.2 s"):
            workers[0].call(functools.partial(time.sleep, 5.0), 0.2)
    finally:
        for worker in workers:
            worker.close()


def test_candidates_no_winning_placement_would_use_are_not_measured_nor_logged(tmp_path, monkeypatch):
    # Entering NumPy priced at 1 ms: TVM runs every sub-graph NumPy has a candidate for in
    # microseconds, so none is worth measuring (measure.SearchBound) but the whole model's,
    # a finalist of its own.
    from collage.measuring.measure import TVM_CHEAPER, WHOLE_MODEL_FASTER

    monkeypatch.setattr(Measurer, "transition_ms", lambda self, backend: 1.0 if backend == "numpy" else 0.0)
    graph = DataflowGraph.from_module(Unary)
    m = measurer(tmp_path, NUMPY, runner=InProcess())
    candidates = generate(graph, m.backends)
    m.measure_all(candidates, progress=False)
    numpy = [c for c in candidates if c.backend == "numpy" and len(c.subgraph) < 3]
    assert len(m.skipped) == len(numpy) == 5 and set(m.skipped.values()) <= {TVM_CHEAPER, WHOLE_MODEL_FASTER}
    assert all(m.cost(c).reason.startswith("not measured: TVM runs these ops in ") for c in numpy)
    assert len(kernel_rows(m.log, "numpy")) == 1 and m.measured == len(candidates) - len(numpy)
    # Again with that log: the skipped ones are still missing from it, but none is measured,
    # so the model's values (a whole run of it by TVM) are not computed.
    from collage.measuring import measure

    runs = []
    monkeypatch.setattr(measure, "intermediate_values", lambda *args: runs.append(args))
    again = measurer(tmp_path, NUMPY, runner=InProcess())
    again.measure_all(candidates, progress=False)
    assert again.measured == 0 and len(again.skipped) == 5 and runs == []


def test_tvm_candidates_are_timed_under_the_cheapest_whole_model_candidates_ceiling(tmp_path, monkeypatch):
    """Whole-model candidates are measured first; TVM's batches then carry the cheapest one's
    cost as their timing's ceiling (``Timing.ceiling_ms``)."""

    class Recording(InProcess):
        def __init__(self):
            self.sent = []

        def run(self, task):
            self.sent.append((task.backend.name, getattr(task, "timing", Timing()).ceiling_ms))
            return super().run(task)

        def run_batch(self, tasks):
            self.sent += [(task.backend.name, task.timing.ceiling_ms) for task in tasks]
            return super().run_batch(tasks)

    graph = DataflowGraph.from_module(Unary)
    runner = Recording()
    m = measurer(tmp_path, NUMPY, runner=runner)
    candidates = generate(graph, m.backends)
    m.measure_all(candidates, progress=False)
    (whole,) = [c for c in candidates if c.backend == "numpy" and len(c.subgraph) == len(graph)]
    assert runner.sent[0] == ("numpy", None) and m.ceiling_ms == m.cost(whole).median_ms
    assert {ceiling for backend, ceiling in runner.sent if backend == "tvm"} == {m.ceiling_ms}
    # Under a ceiling of a nanosecond every candidate measured after the whole-model one is
    # timed by one call, and counted so.
    from collage.measuring import timing

    monkeypatch.setattr(timing, "CEILING_FLOOR_MS", 0.0)  # these kernels take microseconds
    again = measurer(tmp_path / "again", NUMPY, runner=InProcess())
    again._cheapest_whole_ms = lambda candidates: 1e-6
    again.measure_all(candidates, progress=False)
    after = [c for c in candidates if c is not whole]
    assert again.timed_once == len(after) and all(again.cost(c).samples == 1 for c in after)


def test_a_runner_of_several_servers_gets_a_batch_for_each(tmp_path):
    class FourServers(InProcess):
        servers = 4  # as RPCRunner says how many it holds

    backends_for_tests.BATCHES.clear()
    m = measurer(tmp_path, TOGETHER, runner=FourServers())
    m.measure_all(generate(DataflowGraph.from_module(Unary), m.backends), progress=False)
    assert backends_for_tests.BATCHES == [2, 2, 2]  # six chains for four servers: even batches, one each but one


class Recording(InProcess):
    """Measures in this process, keeping every task it was given."""

    def __init__(self):
        self.tasks = []

    def run(self, task):
        self.tasks.append(task)
        return super().run(task)

    def run_batch(self, tasks):
        self.tasks += tasks
        return super().run_batch(tasks)


def test_candidates_run_on_the_values_the_model_computes_with_no_reference_compiled_each(tmp_path, monkeypatch):
    import numpy as np
    import tvm_ffi

    from collage.measuring import runner
    from collage.measuring.arrays import random_inputs

    def no_reference(*args):
        raise AssertionError("a sub-graph's reference was compiled on its own")

    monkeypatch.setattr(runner, "run_reference", no_reference)
    graph = DataflowGraph.from_module(Unary)
    recording = Recording()
    m = measurer(tmp_path, NUMPY, WRONG, runner=recording)
    candidates = generate(graph, m.backends)
    m.measure_all(candidates, progress=False)
    (x,) = random_inputs(graph.func, m.seed)
    relu = next(c for c in candidates if c.backend == "numpy" and c.subgraph.nodes == {1}).subgraph.extract()
    relu = next(t for t in recording.tasks if isinstance(t, MeasureTask) and t.backend == NUMPY and tvm_ffi.structural_equal(t.func, relu, map_free_vars=True))
    np.testing.assert_allclose(relu.inputs[0], np.exp(x), rtol=1e-6)  # exp's output, as in the model
    np.testing.assert_allclose(relu.reference[0], np.exp(x), rtol=1e-6)  # relu of positive values
    assert all(t.reference is None for t in recording.tasks if isinstance(t, MeasureTask) and t.backend.name == "tvm")  # TVM is the reference
    assert all(m.cost(c).is_valid for c in candidates if c.backend != "wrong")
    assert all(m.cost(c).reason.startswith("wrong result") for c in candidates if c.backend == "wrong")


def test_log_rows_carry_device_threads_and_library(tmp_path):
    graph = DataflowGraph.from_module(Unary)
    m = measurer(tmp_path, NUMPY)
    c = next(c for c in generate(graph, m.backends) if c.backend == "numpy")
    m.cost(c)
    key = m.key(c)
    assert key.threads == 2 and key.device == m.device.name and key.library.startswith("NumPy")
    assert CostLog(tmp_path / "costs.sqlite").get(key) == m.cost(c)


def test_where_a_models_weights_exceed_the_gpus_cache_its_candidates_are_timed_cold_and_logged_apart(tmp_path, monkeypatch):
    """Inside a model whose weights exceed a GPU's cache, a kernel finds its own evicted by the
    kernels before it; back to back it finds them cached (ResNet-50's convolutions ran 17-50%
    over such costs on an H200). Such candidates are timed with the cache flushed before each
    call, twice its size written, and logged under that: a warm cost of the same sub-graph
    from a smaller model is another measurement. The cache's size is set here as a GPU's would
    be; the flushed timer itself is tested on a GPU (test_backend_gpu_libs)."""
    graph = DataflowGraph.from_module(Unary)
    recording = Recording()
    m = measurer(tmp_path, NUMPY, runner=recording)
    assert m.cache_bytes == 0  # the CPU's: timed back to back
    candidates = [c for c in generate(graph, m.backends) if c.backend == "numpy"]
    warm = {m.key(c) for c in candidates}
    monkeypatch.setattr(m, "cache_bytes", graph.input_bytes // 2)
    m.measure_all(candidates, progress=False)
    tasks = [t for t in recording.tasks if isinstance(t, MeasureTask) and t.backend == NUMPY]
    assert tasks and all(t.timing.cache_flush_bytes == 2 * m.cache_bytes for t in tasks)
    cold = {m.key(c) for c in candidates}
    assert all(k.device == f"{m.device.name}, cache flushed before each call" for k in cold) and not cold & warm
    assert all(m.log.get(k) is not None for k in cold)
    monkeypatch.setattr(m, "cache_bytes", graph.input_bytes)  # a cache the model fits in
    assert {m.key(c) for c in candidates} == warm


def test_unavailable_backend_is_invalid_not_an_error(tmp_path):
    graph = DataflowGraph.from_module(Unary)
    missing = NUMPY.__class__(**{**NUMPY.__dict__, "name": "absent", "requires": ("no_such_module_xyz",)})
    m = measurer(tmp_path, missing)
    c = next(c for c in generate(graph, [missing]))
    assert m.cost(c) == Cost.invalid("missing Python module(s): no_such_module_xyz")


class Refusing(InProcess):
    def run(self, work, timeout_s=None):
        raise AssertionError(f"measured {type(work).__name__} again")


def test_transition_cost_is_measured_per_backend_and_logged(tmp_path):
    dnnl = default_backends()["dnnl"]
    m = measurer(tmp_path, NUMPY, dnnl)
    t = m.transition_ms("dnnl")
    assert 0.0 <= t < 5.0 and m.transition_ms("tvm") == 0.0
    assert measurer(tmp_path, NUMPY, dnnl).transition_ms("dnnl") == t  # read from the log
    # Another log opened in this process takes it from here, measuring nothing, and keeps it.
    other = measurer(tmp_path / "other", NUMPY, dnnl, runner=Refusing())
    assert other.transition_ms("dnnl") == t and other.log.get(other.transition_key("dnnl")).value_ms == t
    # NumPy's element-wise chain runs neither probe: invalid with a reason, no transition.
    assert measure_transition(NUMPY, "llvm", 1, FAST).reason == "numpy runs none of the transition probes"
    assert m.transition_ms("numpy") == 0.0


def test_the_transition_probe_enters_a_kernel_of_its_own_each_round(monkeypatch):
    """As a model's partitions are distinct compiles (their own weights, their own ONNX Runtime
    session), each round of the probe's chain calls a kernel of its own: one kernel called
    round after round found its weights and threads as it had left them, and priced entering
    a library under what a model pays for it."""
    from collage.measuring import transition

    calls: dict[int, int] = {}

    def counted(*args, **kwargs):
        kernel, reason = compile_kernel(*args, **kwargs)
        if kernel is None:
            return kernel, reason
        calls[len(calls)] = 0

        def call(*tensors, k=len(calls) - 1):
            calls[k] += 1
            kernel(*tensors)

        return call, None

    compile_kernel = transition.compile_kernel
    monkeypatch.setattr(transition, "compile_kernel", counted)
    cost = measure_transition(default_backends()["mkl"], "llvm", 1, FAST)
    assert cost.is_valid and len(calls) == transition.CALLS
    assert all(calls[k] > 0 and calls[k] == calls[1] for k in range(1, transition.CALLS)), calls  # the first is also timed alone


def test_two_libraries_interplay_is_measured_once_per_pair_and_logged(tmp_path):
    """MKL's products and ONNX Runtime's convolutions, each eight kernels, in one module (in the
    measuring worker, as the candidates are): a cost per pair of calls, logged under the pair."""
    backends = default_backends()
    m = measurer(tmp_path, backends["mkl"], backends["onnxruntime"])
    ms = m.interplay_ms("onnxruntime", "mkl")
    assert 0.0 <= ms < 5.0 and m.interplay_ms("mkl", "onnxruntime") == ms  # one pair, either order
    logged = m.log.get(m.interplay_key("mkl", "onnxruntime"))
    assert logged.is_valid and logged.samples == FAST.min_samples
    assert measurer(tmp_path, backends["mkl"], backends["onnxruntime"]).interplay_ms("mkl", "onnxruntime") == ms
    assert m.interplay_ms("tvm", "mkl") == 0.0 and m.interplay_ms("mkl", "mkl") == 0.0
    # NumPy's element-wise chain runs neither probe: invalid with a reason, none charged.
    numpy = measurer(tmp_path, NUMPY, backends["mkl"])
    assert numpy.interplay_ms("numpy", "mkl") == 0.0
    assert numpy.log.get(numpy.interplay_key("mkl", "numpy")).reason == "numpy runs none of the transition probes"


FAST_PROTOCOL = Protocol(rounds=5, block_ms=4.0, settle_s=0.0, warmup_s=0.01)


def test_contenders_get_one_block_each_round():
    calls = {"short": lambda: time.sleep(0.001), "long": lambda: time.sleep(0.004)}
    costs = time_contenders(calls, FAST_PROTOCOL)
    assert costs["short"].samples == costs["long"].samples == 5
    assert 1.0 <= costs["short"].median_ms < costs["long"].median_ms


def test_a_block_is_timed_call_by_call_and_its_median_kept():
    # Every third call stalls: a block's mean would carry the stalls, its median does not.
    count = [0]

    def stalls():
        count[0] += 1
        time.sleep(0.008 if count[0] % 3 == 0 else 0.001)

    cost = time_contenders({"stalls": stalls}, Protocol(rounds=3, block_ms=20.0, warmup_s=0.0))["stalls"]
    assert 1.0 <= cost.median_ms < 2.5


@pytest.mark.timed
def test_the_settling_pause_lets_a_neighbours_spinning_threads_stop():
    # "noisy" slows whatever runs within 20 ms of it, as ONNX Runtime's spinning workers do.
    last_noisy = [0.0]

    def noisy():
        last_noisy[0] = time.perf_counter()

    def victim():
        time.sleep(0.004 if time.perf_counter() - last_noisy[0] < 0.02 else 0.001)

    calls = {"noisy": noisy, "victim": victim}
    # One call per block, so every victim block may start right after a noisy one.
    disturbed = time_contenders(calls, Protocol(rounds=6, block_ms=0.0, settle_s=0.0, warmup_s=0.01))
    quiet = time_contenders(calls, Protocol(rounds=6, block_ms=0.0, settle_s=0.03, warmup_s=0.01))
    assert disturbed["victim"].median_ms > 3.0
    assert quiet["victim"].median_ms < 2.0


def test_a_slow_contender_leaves_the_rounds_when_its_budget_share_is_spent():
    calls = {"slow": lambda: time.sleep(0.02), "fast": lambda: time.sleep(0.001)}
    costs = time_contenders(calls, Protocol(rounds=8, block_ms=0.0, settle_s=0.0, warmup_s=0.0,
                                            budget_s=0.1, min_rounds=3))
    assert costs["slow"].samples == 3 and costs["fast"].samples == 8


def test_a_paired_ratio_cancels_drift_between_rounds():
    import pytest

    from collage.measuring.timing import paired_ratio

    drift = [1.0, 1.5, 0.8, 1.2]  # the machine's speed, round by round
    ratio, spread = paired_ratio([2.0 * d for d in drift], [1.0 * d for d in drift])
    assert ratio == pytest.approx(2.0) and spread == pytest.approx(0.0)
    assert paired_ratio([1.0, 2.0], [1.0]) == (1.0, 0.0)  # a contender that left after one round


def test_a_task_travels_as_text_and_arrays_and_arrives_whole():
    import pickle

    import numpy as np
    import tvm_ffi

    from collage.measuring.runner import MeasureTask, weights_out

    w = np.arange(64 * 64, dtype="float32").reshape(64, 64)

    rows = np.array([3, 1, 2], dtype="int64")  # TVM narrows an int64 array bound as numpy to int32

    @R.function
    def f(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.const(w)), R.const(0.5, "float32"))
            z = R.take(y, R.const(rows, "int64"), axis=0)
            R.output(z)
        return z

    lifted, arrays = weights_out(f)
    assert len(arrays) == 2 and (arrays[0] == w).all()  # the scalar stays in the text
    assert len(lifted.params) == 3
    task = MeasureTask(NUMPY, f, "numpy.chain", "llvm", 1, 0, FAST)
    arrived = pickle.loads(pickle.dumps(task))
    assert tvm_ffi.structural_equal(arrived.func, f, map_free_vars=True)
    assert arrived.backend == NUMPY and arrived.timing == FAST


def test_the_worker_starts_before_the_models_values_are_computed_and_only_when_there_is_something_to_measure(
        tmp_path, monkeypatch):  # fmt: skip
    # Its start-up (importing every library, seconds) overlaps them: MobileNetV1's measuring
    # took 11.1-11.3 s instead of 13.5-13.8 on a 2-core Xeon.
    import collage.measuring.measure as measure

    events = []

    class Starting(InProcess):
        def start(self):
            events.append("worker started")

    values = measure.intermediate_values
    monkeypatch.setattr(measure, "intermediate_values", lambda *a: events.append("values") or values(*a))
    m = measurer(tmp_path, NUMPY, runner=Starting())
    candidates = generate(DataflowGraph.from_module(Unary), m.backends)
    m.measure_all(candidates, progress=False)
    assert events == ["worker started", "values"]
    again = measurer(tmp_path, NUMPY, runner=Starting())
    again.measure_all(candidates, progress=False)
    assert events == ["worker started", "values"]  # all logged: no worker, no values


def test_transitions_are_measured_beside_the_whole_model_candidates(tmp_path):
    # On a fleet they then take servers of their own, instead of one after another later.
    class Recording(InProcess):
        def __init__(self):
            self.calls = []

        def run_all(self, works, on_result):
            self.calls.append([type(w).__name__ if not isinstance(w, list) else "batch" for w in works])
            super().run_all(works, on_result)

    runner = Recording()
    m = measurer(tmp_path, NUMPY, runner=runner)
    m.measure_all(generate(DataflowGraph.from_module(Unary), m.backends), progress=False)
    assert "TransitionTask" in runner.calls[0] and not any("TransitionTask" in call for call in runner.calls[1:])
    assert m.log.get(m.transition_key("numpy")) is not None and m.transition_ms("numpy") >= 0
