"""Finalists: the tie rule, engines at their users' settings, and every engine alone on the
whole model (from collage's conversion and from the user's own ONNX file), built, checked
and timed beside the op-level placement."""

import gc
import math
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tvm import relax

import collage
from collage.assembling.assemble import beside_spinning, runs_alone
from collage.candidates.backend import default_backends
from collage.candidates.generate import Candidate
from collage.measuring.cost import Cost
from collage.choosing.engine_alone import blockers, blockers_text
from collage.choosing.finalists import (ATTEMPTS, MAX_OTHERS_BUSY, MAX_ROUNDS, NOISE_FLOOR, Race, Verdict, choose,
                                       time_finalists, within_noise)  # fmt: skip
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition, Placement
from collage.deploying.report import dominant_tvm_ops
from collage.candidates.subgraph import SubGraph
from collage.measuring.build import build_vm
from collage.measuring.timing import Protocol, Timing
from collage.record import FinalistKind, FinalistName
from tests.helpers import timed_end_to_end
from experiments import models

FAST = Timing(min_samples=3, max_samples=7, min_sample_ms=0.3, budget_s=0.3)
ENGINES = ["tvm", "onnxruntime", "openvino"]

# Races and their rules on real timings: alone on the machine (``make test``).
pytestmark = pytest.mark.timed


# -- the tie rule --


def test_the_fastest_is_kept_when_the_others_are_clearly_slower():
    measured = {"op-level": Cost.of(1.0, 0.01), "onnxruntime alone": Cost.of(1.2, 0.01)}
    simplicity = {"op-level": (3, 40), "onnxruntime alone": (1, 1)}
    assert choose(measured, simplicity) == ("op-level", None)


def test_of_finalists_within_noise_the_simplest_is_kept_and_the_report_says_why():
    measured = {"op-level": Cost.of(1.00, 0.01), "onnxruntime alone": Cost.of(1.01, 0.01), "mix": Cost.of(0.995, 0.0)}
    simplicity = {"op-level": (2, 7), "onnxruntime alone": (1, 1), "mix": (3, 12)}
    chosen, note = choose(measured, simplicity)
    assert chosen == "onnxruntime alone"
    assert "within noise of the fastest, 'mix' (+1.5%)" in note and "1 library, 1 partition(s)" in note


def test_noise_is_the_larger_spread_or_the_floor():
    fastest = Cost.of(10.0, 0.1)
    assert within_noise(Cost.of(10.0 * (1 + NOISE_FLOOR), 0.0), fastest)
    assert not within_noise(Cost.of(10.0 * (1 + NOISE_FLOOR) + 0.01, 0.0), fastest)
    assert within_noise(Cost.of(10.5, 0.6), fastest)  # its own spread covers the gap


def test_equally_simple_finalists_within_noise_go_to_the_faster():
    measured = {"a": Cost.of(1.00, 0.0), "b": Cost.of(1.01, 0.0)}
    assert choose(measured, {"a": (1, 1), "b": (1, 1)}) == ("a", None)


# -- a choice that holds: the spread weighs as well as the median --


def _race(**blocks):
    race = Race()
    race.add({name: list(ms) for name, ms in blocks.items()})
    return race


def test_a_finalist_fast_at_its_median_but_slow_in_a_quarter_of_its_blocks_does_not_lead():
    # OpenVINO's 0.44-0.67 ms between blocks beside ONNX Runtime's steady 0.351, as raced once.
    race = _race(swinging=[0.33, 0.32, 0.60, 0.33, 0.62, 0.31, 0.34, 0.65], steady=[0.351] * 8)
    measured = {name: race.cost(name) for name in ("swinging", "steady")}
    assert measured["swinging"].median_ms < measured["steady"].median_ms
    assert race.leader() == "steady" and race.verdict("swinging", "steady") is Verdict.UNDECIDED
    chosen, note = choose(measured, {"swinging": (1, 1), "steady": (1, 1)}, race=race)
    assert chosen == "steady"
    assert "kept 'steady' over 'swinging'" in note and "slow blocks" in note


def test_paired_rounds_tell_equivalent_from_slower_through_drift():
    # The machine drifts by 20% between rounds; each round moves both alike.
    drift = [1.0, 1.2, 0.9, 1.1, 1.0, 1.25, 0.95]
    race = _race(a=[d * 1.00 for d in drift], b=[d * 1.01 for d in drift], c=[d * 1.05 for d in drift])
    assert race.verdicts() == {"a": Verdict.LEADER, "b": Verdict.EQUIVALENT, "c": Verdict.SLOWER}
    measured = {name: race.cost(name) for name in "abc"}
    chosen, note = choose(measured, {"a": (3, 12), "b": (1, 1), "c": (1, 1)}, race=race)
    assert chosen == "b" and "within noise of the fastest, 'a'" in note


class _Busy:
    """A VM stand-in whose ``main`` keeps a core busy ``ms()`` milliseconds a call."""

    def __init__(self, ms):
        self.ms = ms

    def __getitem__(self, name):
        def main(*inputs):
            end = time.perf_counter() + self.ms() / 1e3
            while time.perf_counter() < end:
                pass

        return main


def _swinging_ms(fast, slow, share_slow, seed=0):
    """``fast`` ms a call, or ``slow`` for a whole block of calls, a ``share_slow`` of the blocks:
    a library whose threads are placed well in some blocks and badly in others."""
    rng, state = np.random.default_rng(seed), {"last": 0.0, "ms": fast}

    def ms():
        now = time.perf_counter()
        if now - state["last"] > 0.05:  # a new block: the protocol settles 0.1 s before each
            state["ms"] = slow if rng.random() < share_slow else fast
        state["last"] = now
        return state["ms"]

    return ms


def test_timing_goes_on_for_undecided_leaders_and_keeps_the_steady_one():
    quick = Protocol(rounds=7, block_ms=6.0, settle_s=0.06, warmup_s=0.01)
    vms = {"swinging": _Busy(_swinging_ms(0.3, 0.6, 0.35)), "steady": _Busy(lambda: 0.36), "slow": _Busy(lambda: 0.9)}
    timed = time_finalists(vms, [], "llvm", quick)
    race = timed.race
    assert len(race.blocks("steady")) > quick.rounds  # the swinging one kept them undecided
    assert len(race.blocks("slow")) == quick.rounds  # known slower at once: never timed again
    assert len(race.rounds) <= MAX_ROUNDS
    chosen, _ = choose(timed.costs, {name: (1, 1) for name in vms}, race=race)
    assert chosen == "steady"


# -- an engine alone keeps its users' settings --


def _partitions(graph, *specs):
    """Partitions from (backend, nodes, cost ms) specs."""
    return [Partition(Candidate(SubGraph(graph, frozenset(nodes)), backend, f"{backend}.x"), Cost.of(ms))
            for backend, nodes, ms in specs]


def test_a_partition_runs_alone_when_nothing_of_another_library_of_weight_runs_beside_it():
    graph = DataflowGraph(models.load("mlp").relax["main"])
    n = len(graph)
    (whole,) = _partitions(graph, ("onnxruntime", range(n), 1.0))
    assert runs_alone(whole, [whole])
    engine, reshape = _partitions(graph, ("onnxruntime", range(n - 1), 1.0), ("tvm", [n - 1], 0.01))
    assert runs_alone(engine, [engine, reshape])  # TVM's share is trivial
    engine, heavy = _partitions(graph, ("onnxruntime", range(n - 1), 1.0), ("tvm", [n - 1], 0.5))
    assert not runs_alone(engine, [engine, heavy])
    a, b = _partitions(graph, ("onnxruntime", range(n - 1), 1.0), ("openvino", [n - 1], 0.01))
    assert not runs_alone(a, [a, b])  # another library's kernel follows


@pytest.fixture(scope="module")
def mlp_optimized(tmp_path_factory):
    w = models.load("mlp")
    log = tmp_path_factory.mktemp("log") / "c.sqlite"
    # Handed over as its users hold it, a torch module: torch.onnx.export's file is then the
    # ONNX file each engine runs whole.
    opt = collage.optimize(w.torch, example_inputs=tuple(w.inputs), backends=ENGINES, cost_log=log, timing=FAST, progress=False)
    return w, opt


def _config(kernel, entry: str) -> str | None:
    """An ONNX Runtime kernel's session setting ``entry``; None where never set (its default)."""
    try:
        return kernel.session.get_session_options().get_session_config_entry(entry)
    except RuntimeError:
        return None


def _spinning_stops(kernel) -> bool:
    return _config(kernel, "session.force_spinning_stop") == "1"  # never set: ONNX Runtime's default, spinning


def test_onnxruntime_alone_keeps_its_threads_spinning_and_among_others_stops_them(tmp_path):
    from collage.backends import onnxruntime

    w = models.load("mlp")
    func = w.relax["main"]
    alone = onnxruntime.compile_onnx(onnxruntime.to_onnx(func), "llvm", 2, alone=True)
    among = onnxruntime.BACKEND.compile(func, "onnxruntime.fused", "llvm", 2)
    assert not _spinning_stops(alone) and _spinning_stops(among)


def test_an_engine_beside_a_library_whose_threads_spin_never_lets_its_own_spin():
    """PyTorch's OpenMP workers keep their cores after MKL's and oneDNN's kernels; an ONNX
    Runtime kernel in the same module waiting on its own workers would stall a scheduler slice."""
    from collage.backends import onnxruntime
    from collage.measuring.build import compile_kernel

    backends = default_backends()
    assert backends["mkl"].spins_after_calls and backends["dnnl"].spins_after_calls
    assert not any(backends[b].spins_after_calls for b in ("tvm", "onnxruntime", "openvino"))
    graph = DataflowGraph(models.load("mlp").relax["main"])
    n = len(graph)
    engine, product = _partitions(graph, ("onnxruntime", range(1, n), 1.0), ("mkl", [0], 0.1))
    assert beside_spinning(engine, [product, engine], backends)
    engine, glue = _partitions(graph, ("onnxruntime", range(1, n), 1.0), ("tvm", [0], 0.1))
    assert not beside_spinning(engine, [glue, engine], backends)
    a, b = _partitions(graph, ("onnxruntime", range(1, n), 1.0), ("openvino", [0], 0.1))
    assert not beside_spinning(a, [b, a], backends)

    func = models.load("mlp").relax["main"]
    beside, reason = compile_kernel(onnxruntime.BACKEND, func, "onnxruntime.fused", "llvm", 2, beside_spinning=True)
    assert reason is None and _config(beside, "session.intra_op.allow_spinning") == "0"
    among = onnxruntime.BACKEND.compile(func, "onnxruntime.fused", "llvm", 2)
    assert _config(among, "session.intra_op.allow_spinning") is None and _spinning_stops(among)


def test_an_engine_kernel_is_compiled_quiet_where_its_placement_has_a_spinning_library():
    from collage.assembling.checked import assemble_and_check
    from collage.measuring.arrays import Reference

    w = models.load("mlp")
    graph = DataflowGraph(w.relax["main"])
    product, rest = _partitions(graph, ("mkl", [0, 1], 0.1), ("onnxruntime", range(2, len(graph)), 1.0))
    product = Partition(Candidate(product.candidate.subgraph, "mkl", "mkl.dense"), product.cost)
    reference = Reference([x.numpy() for x in w.inputs], [np.asarray(y) for y in w.reference()])
    checked = assemble_and_check(graph, Placement(graph, (product, rest)), reference, default_backends(), "llvm", 2)
    assert not checked.fallbacks
    (_, name, kernel), = [k for k in checked.assembly.kernels if k[0].backend == "onnxruntime"]
    assert checked.assembly.sources[name].beside_spinning
    assert _config(kernel, "session.intra_op.allow_spinning") == "0"


def test_every_engine_alone_is_a_finalist_built_checked_and_timed(mlp_optimized):
    w, opt = mlp_optimized
    for name in ("op-level", "onnxruntime alone", "openvino alone",
                 "onnxruntime on the ONNX file", "openvino on the ONNX file"):
        assert timed_end_to_end(opt, name), name
    # The imported main returns its one output in a tuple; so does whichever finalist is kept.
    (got,) = opt(*[x.numpy() for x in w.inputs])
    (expected,) = w.reference()
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    report = opt.report()
    assert "onnxruntime on the ONNX file" in report and "<- kept" in report


class _EngineWholeCheapest:
    """A test-only cost source: ``engine`` on the whole model 1 ms, every other candidate 1 ms
    per op, no transition: the op-level DP's answer is that engine alone."""

    def __init__(self, engine: str, ops: int):
        self.engine, self.ops = engine, ops

    def cost(self, candidate):
        whole = candidate.backend == self.engine and len(candidate.subgraph) == self.ops
        return Cost.of(1.0 if whole else float(len(candidate.subgraph)))

    def transition_ms(self, backend):
        return 0.0


def test_an_engine_alone_that_is_the_op_level_placement_is_assembled_and_timed_once():
    from collage.candidates.generate import generate
    from collage.choosing import policy
    from collage.prepare import dataflow_graph

    graph = dataflow_graph(models.load("mlp").relax)
    usable = [default_backends()[name] for name in ENGINES]
    costs, notes = _EngineWholeCheapest("onnxruntime", len(graph)), {}
    placements, alone = policy.placements(graph, generate(graph, usable), costs, usable, False, {}, notes)
    assert set(map(str, placements)) == {"op-level", "openvino alone"}
    assert alone == {"onnxruntime": FinalistName(FinalistKind.OP_LEVEL), "openvino": FinalistName(FinalistKind.ENGINE_ALONE, "openvino")}
    assert notes == {"onnxruntime alone": "onnxruntime alone is the 'op-level' placement (one partition, the whole model), timed once as it"}


def test_a_kept_onnxruntime_finalist_runs_with_its_users_settings(mlp_optimized):
    _, opt = mlp_optimized
    ort_kernels = [kernel for p, _, kernel in opt._assembly.kernels if p.backend == "onnxruntime"]
    if len(opt.placement) != 1 or not ort_kernels:
        pytest.skip(f"kept '{opt.record.chosen}', not one ONNX Runtime partition")
    assert not _spinning_stops(ort_kernels[0])


def test_an_onnx_file_that_computes_otherwise_is_left_out_with_the_reason(tmp_path):
    w = models.load("mlp")
    other = onnx.ModelProto()
    other.CopyFrom(w.onnx)
    first = other.graph.initializer[0]
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 2, first.name))
    opt = collage.optimize(w.relax, backends=["tvm", "onnxruntime"], cost_log=tmp_path / "c.sqlite",
                           onnx_model=other, timing=FAST, progress=False)
    assert FinalistName(FinalistKind.ENGINE_ON_FILE, "onnxruntime") not in opt.record.finalists
    assert "disagrees with the unoptimized module" in opt.record.left_out["onnxruntime file"]


def test_the_report_names_the_ops_that_keep_an_engine_from_the_whole_model():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            b = bb.emit(relax.op.call_pure_packed("no.such.function", a, ty_args=relax.TensorType((4, 4), "float32")))
            out = bb.emit_output(relax.op.exp(b))
        bb.emit_func_output(out)
    graph = DataflowGraph(bb.get()["main"])
    found = blockers(graph, default_backends()["onnxruntime"])
    assert list(found) == ["relax.call_pure_packed"] and found["relax.call_pure_packed"][0] == 1
    assert blockers_text("onnxruntime", found).startswith("onnxruntime cannot take the whole model: call_pure_packed x1 (")


def test_a_dominant_untuned_tvm_op_is_warned_about(tmp_path):
    graph = DataflowGraph(models.load("mlp").relax["main"])
    n = len(graph)
    parts = _partitions(graph, ("onnxruntime", range(n - 1), 1.0), ("tvm", [n - 1], 9.0))
    (warning,) = dominant_tvm_ops(parts)
    assert warning.startswith("90% of the estimated time") and "left to TVM untuned" in warning
    assert dominant_tvm_ops(_partitions(graph, ("onnxruntime", range(n - 1), 1.0), ("tvm", [n - 1], 0.1))) == []
    assert math.isfinite(sum(p.cost_ms for p in parts))


def test_finalists_are_timed_again_while_another_process_keeps_a_core_busy():
    # A spinning process beside the timing: every attempt sees it, so all are made and the
    # quietest is kept, with what the others used (the report warns about it).
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    vm = build_vm(bb.get(), "llvm")
    arrays = [np.ones((64, 64), "float32")]
    quick = Protocol(rounds=3, block_ms=5.0, settle_s=0.01, warmup_s=0.01)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        timed = time_finalists({"a": vm, "b": vm}, arrays, "llvm", quick)
    finally:
        spinner.kill()
        spinner.wait()
    assert timed.attempts == ATTEMPTS and timed.others_busy_cores > MAX_OTHERS_BUSY
    assert set(timed.costs) == {"a", "b"} and all(c.is_valid for c in timed.costs.values())


def test_a_whole_model_engine_is_called_without_the_vm_and_a_mixed_placement_through_it():
    from collage.assembling.assemble import assemble, bound_main
    from collage.choosing.engine_alone import from_onnx_file
    from collage.measuring.arrays import numpy_outputs, to_tensors

    w = models.load("mlp")
    graph = DataflowGraph(w.relax["main"])
    backends = default_backends()
    (expected,) = w.reference()
    inputs = to_tensors([x.numpy() for x in w.inputs])

    for engine in ("onnxruntime", "openvino"):
        whole, _ = from_onnx_file(w.relax, graph, backends[engine], w.onnx, "llvm")
        # The inputs held by nothing but the call: its binding must keep them alive.
        call = bound_main(whole, build_vm(whole.module, "llvm"), to_tensors([x.numpy() for x in w.inputs]),
                          inputs[0].device)  # fmt: skip
        gc.collect()
        first, second = call(), call()
        assert first is second  # the engine's outputs, bound once, as its own session binds them
        assert np.abs(numpy_outputs(first)[0] - expected).max() <= 1e-4 * np.abs(expected).max(), engine

    split = next(k for k, node in enumerate(graph) if node.op == "relax.nn.relu")
    parts = [Partition(Candidate(SubGraph(graph, frozenset(nodes)), backend, f"{backend}.fused"), Cost.of(1.0))
             for nodes, backend in ((range(split), "onnxruntime"), (range(split, len(graph)), "tvm"))]
    mixed = assemble(graph, parts, backends, "llvm")
    call = bound_main(mixed, build_vm(mixed.module, "llvm"), inputs, inputs[0].device)
    first, second = call(), call()
    assert first is not second  # the VM's fresh outputs
    assert np.abs(numpy_outputs(second)[0] - expected).max() <= 1e-4 * np.abs(expected).max()
