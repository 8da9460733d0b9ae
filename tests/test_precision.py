"""Precision as a placement dimension: with an accuracy budget, backends offer candidates in
the reduced precisions they compute in natively; the module returned stays within the budget
end to end; without one, nothing changes."""

import json
import re
import sqlite3

import numpy as np
import pytest

import collage
from collage import cli
from tvm.script import ir as I
from tvm.script import relax as R
from collage.candidates.backend import BackendSet, default_backends
from collage.assembling.checked import assemble_and_check
from collage.candidates.generate import Candidate
from collage.candidates.subgraph import SubGraph
from collage.config import Config
from collage.deploying.saved import placement_record
from collage.measuring.cost import Cost
from collage.measuring.arrays import Reference, numpy_outputs, to_tensors
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition, Placement, tvm_op
from collage.candidates.precision import BFLOAT16, FLOAT16, FLOAT32, bf16_unavailable
from collage.measuring.cost import cpu_info
from collage.measuring.cost_log import CostLog
from collage.measuring.measure import Measurer
from collage.candidates.generate import generate, in_precisions
from collage.measuring.runner import InProcess
from collage.measuring.arrays import relative_error
from collage.measuring.timing import Timing
from collage.record import FinalistKind, FinalistName
from experiments import models
from tests.backends_for_tests import FINE, TOO_COARSE, coarse
from tests.helpers import kernel_rows
from tests.test_optimize import Unary, inputs, run_unoptimized

FAST = Timing(min_samples=3, max_samples=7, min_sample_ms=0.3, budget_s=0.3)


def optimize(backend, log, mod=Unary, **kw):
    return collage.optimize(mod, backends=BackendSet([default_backends()["tvm"], backend]), cost_log=log,
                            timing=FAST, progress=False, runner=InProcess(), **kw)  # fmt: skip


def test_without_a_budget_every_candidate_is_float32(tmp_path):
    log = CostLog(tmp_path / "c.sqlite")
    opt = optimize(FINE, log)
    assert opt.record.accuracy is None and all(p.candidate.precision == FLOAT32 for p in opt.placement)
    assert {r.precision for r in log.rows("fine")} == {FLOAT32}
    assert "accuracy budget" not in opt.report()


def test_reduced_candidates_are_measured_logged_by_precision_and_checked_within_the_budget(tmp_path):
    log = CostLog(tmp_path / "c.sqlite")
    opt = optimize(FINE, log, accuracy=1e-2)
    rows = {r.precision: r for r in log.rows("fine") if r.key == log.rows("fine")[0].key}
    assert set(rows) == {FLOAT32, BFLOAT16} and rows[BFLOAT16].failure is None  # 1e-3 of the output is within 1e-2
    # Its own error is logged with its cost; float32's is noise, not kept.
    assert 1e-4 < rows[BFLOAT16].error <= 1e-2 and rows[FLOAT32].error is None
    x, w = inputs()
    assert relative_error([opt(x, w)], [run_unoptimized(Unary, x, w)]) <= 1e-2
    kept = opt.record.finalists[opt.record.chosen]
    assert kept.error is not None and kept.error <= 1e-2 and "accuracy budget 0.01" in opt.report()
    assert "(largest over the seeded inputs and a second draw)" in opt.report()


def test_a_reduced_precision_too_coarse_for_the_budget_is_rejected_with_its_measured_error(tmp_path):
    log = CostLog(tmp_path / "c.sqlite")
    opt = optimize(TOO_COARSE, log, accuracy=1e-2)
    # The log keeps the measurement and its error (0.3); the budget is this run's verdict.
    reduced = [r for r in log.rows("too_coarse") if r.precision == BFLOAT16]
    assert reduced and all(r.failure is None and r.median_ms > 0 and r.error == pytest.approx(0.3, rel=0.05)
                           for r in reduced)  # fmt: skip
    assert all(p.candidate.precision == FLOAT32 for p in opt.placement)
    assert "no placement in a reduced precision stayed within the budget: float32 kept" in opt.report()
    x, w = inputs()
    np.testing.assert_allclose(opt(x, w), run_unoptimized(Unary, x, w), rtol=1e-5, atol=1e-6)


def test_a_cost_logged_under_one_budget_is_held_to_another_without_measuring_again(tmp_path, capsys):
    """A reduced precision's cost is logged with its error, not with a verdict on the budget it
    was measured under: a later run with a tighter budget holds it out, one with a looser
    budget takes it, neither measuring anything. A verdict logged by earlier versions (a failure
    with its error, nothing timed) is measured again where this run's budget accepts it."""
    log = CostLog(tmp_path / "c.sqlite")
    graph = DataflowGraph(Unary["main"])

    def measured(backend, accuracy) -> tuple[list[Cost], int]:
        """The costs of ``backend``'s bfloat16 candidates in a run with ``accuracy``, and how many it measured."""
        backends = BackendSet([default_backends()["tvm"], backend])
        measurer = Measurer(backends, Config(threads=2, timing=FAST, runner=InProcess(), accuracy=accuracy), log)
        offered = in_precisions(generate(graph, backends), {backend.name: (BFLOAT16,)})
        reduced = list({measurer.key(c): c for c in offered if c.precision == BFLOAT16}.values())  # distinct
        measurer.measure_all(reduced, progress=False)
        return [measurer.cost(c) for c in reduced], measurer.measured

    costs, count = measured(FINE, 1e-2)  # bfloat16 errs 1e-3
    assert count == len(costs) > 0 and all(c.is_valid and c.error == pytest.approx(1e-3, rel=0.05) for c in costs)
    costs, count = measured(FINE, 1e-4)
    assert count == 0 and all(c.is_invalid and "exceeds the accuracy budget 0.0001" in c.reason for c in costs)
    costs, count = measured(TOO_COARSE, 1e-2)  # bfloat16 errs 0.3: timed all the same
    assert count == len(costs) and all(c.is_invalid and c.error == pytest.approx(0.3, rel=0.05) for c in costs)
    rows = [r for r in log.rows("too_coarse") if r.precision == BFLOAT16]
    assert rows and all(r.failure is None and r.median_ms > 0 for r in rows)
    costs, count = measured(TOO_COARSE, 0.5)
    assert count == 0 and all(c.is_valid for c in costs)
    capsys.readouterr()
    assert cli.main(["log", "show", "--log", str(log.path), "--backend", "too_coarse"]) == 0
    assert "(bf16, error 0.3)" in capsys.readouterr().out  # what each run's budget holds it against

    with sqlite3.connect(log.path) as conn:  # as a log written before stop 68 holds it
        conn.execute("UPDATE costs SET failure = 'wrong result: output 0: max |diff| 0.003 exceeds 0.0001 x max "
                     "|expected| 3', median_ms = NULL, spread_ms = NULL, samples = NULL WHERE precision = ?", (BFLOAT16,))
    costs, count = measured(FINE, 1e-2)
    assert count == len(costs) and all(c.is_valid for c in costs)
    rows = [r for r in log.rows("fine") if r.precision == BFLOAT16]
    assert len(rows) == len(costs) and all(r.failure is None and r.median_ms > 0 for r in rows)


# fmt: off
@I.ir_module
class Chain:  # the test libraries run it whole, as an engine runs a whole model
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.sigmoid(x)
            b = R.exp(a)
            c = R.nn.relu(b)
            R.output(c)
        return c
# fmt: on


def test_bfloat16_is_measured_only_where_float16_misses_the_budget(tmp_path):
    """bfloat16 runs at float16's speed with three fewer bits of mantissa: a backend offering
    both has a candidate measured in bfloat16 only where its float16 twin missed the budget
    (as where float16's range is too small)."""
    log = CostLog(tmp_path / "c.sqlite")
    enough = optimize(coarse("halves", {FLOAT16: 1e-3, BFLOAT16: 4e-3}), log, accuracy=1e-2, mod=Chain)
    rows = kernel_rows(log, "halves")
    assert {r.precision for r in rows} == {FLOAT32, FLOAT16} and all(r.failure is None for r in rows)
    skipped = enough.record.skipped["a more precise format at the same speed is within the accuracy budget"]
    assert skipped == sum(r.precision == FLOAT16 for r in rows) and f"{skipped} not measured" in enough.report()
    again = optimize(coarse("halves", {FLOAT16: 1e-3, BFLOAT16: 4e-3}), log, accuracy=1e-2, mod=Chain)  # from the log
    assert again.record.measured == 0 and len(kernel_rows(log, "halves")) == len(rows)

    out_of_range = optimize(coarse("out_of_range", {FLOAT16: 0.3, BFLOAT16: 4e-3}), log, accuracy=1e-2, mod=Chain)
    rows = kernel_rows(log, "out_of_range")
    by_precision = {p: [r for r in rows if r.precision == p] for p in (FLOAT16, BFLOAT16)}
    assert len(by_precision[BFLOAT16]) == len(by_precision[FLOAT16]) > 0
    assert all(r.error > 1e-2 for r in by_precision[FLOAT16])  # measured, and over the budget
    assert all(r.error <= 1e-2 for r in by_precision[BFLOAT16]) and not out_of_range.record.skipped


def test_a_budget_outside_zero_to_one_is_refused(tmp_path):
    with pytest.raises(collage.OptimizeError, match="accuracy is the largest error accepted"):
        optimize(FINE, tmp_path / "c.sqlite", accuracy=2.0)


@pytest.mark.skipif(bf16_unavailable(cpu_info()["isa"]) is not None, reason=str(bf16_unavailable(cpu_info()["isa"])))
def test_openvino_in_bfloat16_is_a_finalist_and_held_to_the_budget(tmp_path):
    w = models.load("mlp")
    log = tmp_path / "c.sqlite"
    tight = collage.optimize(w.relax, backends=["tvm", "openvino"], cost_log=log, onnx_model=w.onnx, timing=FAST,
                             progress=False, accuracy=1e-6)  # fmt: skip
    # bfloat16 keeps 8 bits of mantissa: no placement using it stays within a millionth.
    assert all(p.candidate.precision == FLOAT32 for p in tight.placement)
    assert any("exceeds" in why for why in tight.record.left_out.values()) or not any(
        n.precision == BFLOAT16 for n in tight.record.finalists)
    loose = collage.optimize(w.relax, backends=["tvm", "openvino"], cost_log=log, onnx_model=w.onnx, timing=FAST,
                             progress=False, accuracy=5e-2)  # fmt: skip
    assert FinalistName(FinalistKind.ENGINE_ON_FILE, "openvino", precision=BFLOAT16) in loose.record.finalists
    got = loose(*[x.numpy() for x in w.inputs])
    assert relative_error(list(got) if isinstance(got, tuple) else [got], w.reference()) <= 5e-2


def test_precision_round_trips_through_saved_placements_and_exports(tmp_path):
    log = CostLog(tmp_path / "c.sqlite")
    record = placement_record(optimize(FINE, log, accuracy=1e-2)).to_json()
    # The last exp in the reduced precision on the test library, the rest on TVM: a placement to
    # rebuild. (On the first exp its error, through the matmul, would exceed the budget.)
    ops = ["relax.exp", "relax.nn.relu", "relax.matmul", "relax.sigmoid", "relax.exp"]
    record["partitions"] = [{"backend": "tvm", "pattern": "tvm.fused", "nodes": [k], "ops": [op]} for k, op in enumerate(ops[:4])]
    record["partitions"] += [{"backend": "fine", "pattern": "fine.chain", "nodes": [4], "ops": ops[4:], "precision": BFLOAT16}]
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(record))
    backends = BackendSet([default_backends()["tvm"], FINE])
    rebuilt = collage.load_placement(Unary, path, backends=backends, cost_log=log)
    assert [p.candidate.precision for p in rebuilt.placement] == [FLOAT32] * 4 + [BFLOAT16] and not rebuilt.fallbacks
    assert placement_record(rebuilt).placement.partitions[4].precision == BFLOAT16 and placement_record(rebuilt).accuracy == 1e-2
    x, w = inputs()
    expected = run_unoptimized(Unary, x, w)
    assert 0 < relative_error([rebuilt(x, w)], [expected]) <= 1e-2  # exp ran in the reduced precision
    loaded = collage.load(rebuilt.export(tmp_path / "exported"), backends=backends)
    assert [k["precision"] for k in loaded.manifest["kernels"]] == [BFLOAT16]
    np.testing.assert_array_equal(loaded(x, w), rebuilt(x, w))


def test_errors_compound_so_the_whole_module_is_held_to_the_budget(tmp_path):
    log = CostLog(tmp_path / "c.sqlite")
    record = placement_record(optimize(FINE, log, accuracy=1e-2)).to_json()
    # The first exp off by 1e-3 of its largest output, within the budget alone; through relu
    # and the matmul that becomes several percent of the model's output.
    ops = ["relax.exp", "relax.nn.relu", "relax.matmul", "relax.sigmoid", "relax.exp"]
    record["partitions"] = [{"backend": "fine", "pattern": "fine.chain", "nodes": [0], "ops": ops[:1], "precision": BFLOAT16}]
    record["partitions"] += [{"backend": "tvm", "pattern": "tvm.fused", "nodes": [k], "ops": [op]} for k, op in enumerate(ops) if k]
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(record))
    rebuilt = collage.load_placement(Unary, path, backends=BackendSet([default_backends()["tvm"], FINE]), cost_log=log)
    (failed, why), = rebuilt.fallbacks
    assert failed.candidate.precision == BFLOAT16 and "exceeds 0.01 x max |expected|" in why
    assert [p.backend for p in rebuilt.placement] == ["tvm"] * 5


class _Flat:
    """A test-only cost source: every kernel 0.01 ms, no transition."""

    def cost(self, candidate):
        return Cost.of(0.01)

    def transition_ms(self, backend):
        return 0.0


def test_a_mixed_placement_over_the_budget_is_repaired_earliest_partition_first():
    from collage.choosing.policy import repaired

    graph = DataflowGraph.from_module(Unary)
    backends = BackendSet([default_backends()["tvm"], FINE])
    fine = [Partition(Candidate(SubGraph(graph, frozenset({k})), "fine", "fine.chain", BFLOAT16), Cost.of(0.01)) for k in (0, 4)]
    tvm = [tvm_op(graph, k, "tvm.fused") for k in (1, 2, 3)]
    mixed = [fine[0], *tvm, fine[1]]
    x, w = inputs()
    draws = [Reference([x, w], [run_unoptimized(Unary, x, w)])]
    config = Config(threads=2, accuracy=1e-2)
    over = assemble_and_check(graph, Placement(graph, tuple(mixed)), draws[0], backends, "llvm", 2, 1.0)
    assert relative_error(numpy_outputs(over.vm["main"](*to_tensors([x, w]))), draws[0].outputs) > 1e-2  # the first exp's error, compounded
    finalist, error, back = repaired(over.partitions, draws, graph, _Flat(), backends, config)
    assert back == 1 and error <= 1e-2
    assert [p.candidate.precision for p in finalist.partitions] == [FLOAT32] * 4 + [BFLOAT16]


def test_compounded_errors_are_left_to_the_budget_where_the_caller_holds_the_module_to_it():
    """Each reduced kernel within the budget alone, the module over it: the check sends every
    kernel to TVM, unless the caller holds the module to the budget itself (``optimize``
    does, and repairs it), which then has the placement as it was to repair."""
    graph = DataflowGraph.from_module(Unary)
    backends = BackendSet([default_backends()["tvm"], FINE])
    fine = [Partition(Candidate(SubGraph(graph, frozenset({k})), "fine", "fine.chain", BFLOAT16), Cost.of(0.01)) for k in (0, 4)]
    mixed = Placement(graph, (fine[0], *[tvm_op(graph, k, "tvm.fused") for k in (1, 2, 3)], fine[1]))
    x, w = inputs()
    reference = Reference([x, w], [run_unoptimized(Unary, x, w)])
    held = assemble_and_check(graph, mixed, reference, backends, "llvm", 2, 1e-2, held_to_budget=True)
    assert [p.candidate.precision for p in held.partitions] == [BFLOAT16, *[FLOAT32] * 3, BFLOAT16] and not held.fallbacks
    checked = assemble_and_check(graph, mixed, reference, backends, "llvm", 2, 1e-2)
    assert [p.backend for p in checked.partitions] == ["tvm"] * 5 and len(checked.fallbacks) == 2


def test_the_report_shows_a_reduced_partitions_own_error():
    from collage.deploying.report import precision_text

    graph = DataflowGraph.from_module(Unary)
    candidate = Candidate(SubGraph(graph, frozenset({0})), "fine", "fine.chain", BFLOAT16)
    assert precision_text(Partition(candidate, Cost.of(0.01, error=1.2e-3))) == "bf16, error 1.2e-03"
    assert precision_text(Partition(candidate, Cost.of(0.01))) == "bf16"  # from a log written before errors were kept


def test_calibration_sets_replace_the_second_draw_and_bad_ones_are_named(tmp_path):
    from collage.prepare import prepare_model

    x, w = inputs(seed=5)
    config = Config(threads=1, accuracy=1e-2)
    model = prepare_model(config, Unary, ["tvm"], tmp_path / "c.sqlite", calibration=[{"w": w, "x": x}, (x * 2, w)])
    draws = model.budget_draws
    assert len(draws) == 3 and draws[0] == (model.arrays, model.expected)  # the seeded inputs, then the user's
    for (arrays, expected), given in zip(draws[1:], ([x, w], [x * 2, w])):
        assert all(a is b or np.array_equal(a, b) for a, b in zip(arrays, given))
        np.testing.assert_allclose(expected[0], run_unoptimized(Unary, *given), rtol=1e-5)
    opt = optimize(FINE, tmp_path / "c.sqlite", accuracy=1e-2, calibration=[(x, w)])
    assert relative_error([opt(x, w)], [run_unoptimized(Unary, x, w)]) <= 1e-2
    assert "(largest over the seeded inputs and 1 calibration set)" in opt.report()
    for bad, words in (([(x,)], "calibration set 0: 1 arrays, but main takes 2 inputs"),
                       ([{"x": x}], "calibration set 0: inputs are x, w; missing: w"),
                       ([(x, w), {"x": x, "v": w}], "calibration set 1: inputs are x, w; unknown: v"),
                       ([(x.astype("float64"), w)], "calibration set 0, input 'x': float64[64, 64], but the model takes float32[64, 64]")):  # fmt: skip
        with pytest.raises(collage.OptimizeError, match=re.escape(words)):
            optimize(FINE, tmp_path / "c.sqlite", accuracy=1e-2, calibration=bad)
    with pytest.raises(collage.OptimizeError, match="calibration inputs serve an accuracy budget"):
        optimize(FINE, tmp_path / "c.sqlite", calibration=[(x, w)])


def test_where_the_cpu_has_no_bfloat16_the_report_says_so_and_what_is_offered(tmp_path, monkeypatch):
    import collage.choosing.policy

    monkeypatch.setattr(collage.choosing.policy, "cpu_info", lambda: {"isa": ["avx2", "fma"]})  # a Zen 3's
    opt = collage.optimize(Unary, backends=["tvm", "onnxruntime"], cost_log=tmp_path / "c.sqlite", timing=FAST,
                           progress=False, accuracy=1e-2)  # fmt: skip
    offered = "onnxruntime in int8" if default_backends()["onnxruntime"].reduced_precisions("llvm") else None
    if offered:
        assert f"no bfloat16: this CPU has neither AVX512_BF16 nor AMX (flags: avx2 fma); offered: {offered}" in opt.report()
    else:
        assert "no backend here computes in a reduced precision: this CPU has neither AVX512_BF16" in opt.report()
    x, w = inputs()
    assert relative_error([opt(x, w)], [run_unoptimized(Unary, x, w)]) <= 1e-2
