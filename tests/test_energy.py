"""Energy: meters read around timed calls, energy logged beside time, and the substitution
search's objectives (time, energy, power, weighted). No development machine exposes an energy
counter, so the path is tested with a test-only meter through the same interface."""

import numpy as np
import pytest
from tvm import relax

import collage
from collage.measuring.cost import Cost
from collage.measuring.cost_log import CostLog
from collage.measuring.meters import NoEnergyMeter, energy_meter
from collage.placing.objective import Objective
from collage.measuring.timing import Timing, time_call
from tests.backends_for_tests import ClockMeter

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.3, budget_s=0.3)


def per_call_power_w(cost: Cost) -> float:
    """Energy per call (mJ) over the median call (ms): the meter's watts, about. The energy is
    over every timed call, their mean, and the time their median: a stall on a shared 2-core
    host (a neighbour's burst) raises the first only (a fresh clone's suite once read 150 W)."""
    return cost.energy_mj / cost.median_ms


@pytest.mark.timed  # a clock meter's mean against the median: a neighbour's burst parts them
def test_a_metered_call_has_the_energy_its_meter_read():
    cost = time_call(lambda: sum(range(2000)), FAST, meter=ClockMeter(watts=100.0))
    assert 50.0 <= per_call_power_w(cost) <= 300.0  # in mJ per ms: W
    assert time_call(lambda: None, FAST).energy_mj is None


@pytest.mark.timed
def test_contenders_timed_with_a_meter_have_each_their_energy():
    from collage.measuring.timing import Protocol, time_contenders

    calls = {"short": lambda: sum(range(2000)), "long": lambda: sum(range(20000))}
    costs = time_contenders(calls, Protocol(rounds=3, block_ms=5.0, settle_s=0.0, warmup_s=0.01), ClockMeter(watts=100.0))
    for cost in costs.values():
        assert 50.0 <= per_call_power_w(cost) <= 300.0
    assert costs["long"].energy_mj > costs["short"].energy_mj


def test_finalists_are_chosen_by_the_objective():
    from collage.choosing.finalists import choose

    # A slower placement that draws less power: the best for energy, not for time.
    measured = {"fast": Cost.of(1.0, 0.01, energy_mj=60.0), "frugal": Cost.of(1.3, 0.01, energy_mj=40.0)}
    simplicity = {"fast": (2, 5), "frugal": (2, 5)}
    assert choose(measured, simplicity) == ("fast", None)
    assert choose(measured, simplicity, Objective.parse("energy")) == ("frugal", None)
    # Weighted half and half: fast 0.5 + 0.5 = 1.0 against frugal 0.65 + 0.33 = 0.98, a tie
    # within noise (2%) that goes to the simpler one.
    chosen, note = choose(measured, {"fast": (1, 1), "frugal": (2, 5)}, Objective.parse("0.5*time+0.5*energy"))
    assert chosen == "fast" and "within noise of the best for 0.5*time+0.5*energy, 'frugal'" in note
    with pytest.raises(ValueError, match="not metered: fast"):
        choose({**measured, "fast": Cost.of(1.0, 0.01)}, simplicity, Objective.parse("energy"))


def test_energy_is_logged_beside_time_and_filled_in_later(tmp_path):
    from collage.measuring.cost_log import LogKey

    log = CostLog(tmp_path / "c.sqlite")
    key = LogKey("tvm", "TVM 0.27", "k", "cpu", 2, "float32", "tvm.fused")
    assert log.put(key, Cost.of(1.0, 0.1, 5)).energy_mj is None
    assert log.add_energy(key, 40.0).energy_mj == 40.0
    assert log.add_energy(key, 99.0).energy_mj == 40.0  # the first figure stays
    other = LogKey("tvm", "TVM 0.27", "k2", "cpu", 2, "float32", "tvm.fused")
    assert log.put(other, Cost.of(2.0, 0.1, 5, energy_mj=80.0)) == Cost.of(2.0, 0.1, 5, energy_mj=80.0)


@pytest.mark.parametrize(
    "spec, weights",
    [("time", (1, 0, 0)), ("energy", (0, 1, 0)), ("power", (0, 0, 1)), ("0.7*time + 0.3*energy", (0.7, 0.3, 0))],
)
def test_objectives_parse(spec, weights):
    objective = Objective.parse(spec)
    assert (objective.time, objective.energy, objective.power) == weights
    assert Objective.parse(str(objective)) == objective


def test_a_bad_objective_says_how_to_write_one():
    with pytest.raises(ValueError, match="weighted sum like 0.5"):
        Objective.parse("speed")
    with pytest.raises(ValueError, match="not all zero"):
        Objective(time=0.0)


def test_objective_values_are_relative_to_the_graph_as_given():
    reference = (10.0, 500.0)  # 10 ms, 500 mJ: 50 W
    assert Objective().value(10.0, 500.0, reference) == 1.0
    assert Objective.parse("energy").value(10.0, 250.0, reference) == 0.5
    assert Objective.parse("power").value(20.0, 500.0, reference) == 0.5  # same energy over twice the time
    assert Objective.parse("0.5*time+0.5*energy").value(5.0, 500.0, reference) == 0.75


def _bottleneck():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((64, 1024)).astype("float32") / 8)))
            out = bb.emit_output(relax.op.matmul(h, relax.const(rng.standard_normal((1024, 16)).astype("float32") / 8)))
        bb.emit_func_output(out)
    return bb.get()


def test_optimize_for_energy_measures_energy_and_searches_with_it(tmp_path):
    from collage.measuring.runner import InProcess

    mod = _bottleneck()
    opt = collage.optimize(mod, backends=["tvm"], cost_log=tmp_path / "c.sqlite", timing=FAST, progress=False,
                           substitutions=True, objective="energy", meter=ClockMeter(), runner=InProcess())  # fmt: skip
    found = opt.record.substitution_search
    assert found["objective"] == "energy" and found["initial_cost"] == pytest.approx(1.0)
    assert found["rules_applied"] == {"fold_matmul_into_matmul": 1} and found["best_cost"] < 1.0
    assert "objective energy" in opt.report()
    # The finalists were metered too, and compared by energy.
    assert str(opt.record.objective) == "energy"
    assert all(f.measured.energy_mj > 0 for f in opt.record.finalists.values())
    assert opt.measured.energy_mj > 0
    # Every kernel measured while searching has its energy in the log, beside its time.
    valid = [row for row in CostLog(tmp_path / "c.sqlite").rows() if row.failure is None]
    assert valid and all(row.energy_mj is not None and row.energy_mj > 0 for row in valid)


def test_energy_without_a_meter_is_one_clear_error(tmp_path):
    try:
        energy_meter("llvm")
        pytest.skip("this machine has an energy meter")
    except NoEnergyMeter as err:
        why = str(err)
    with pytest.raises(collage.OptimizeError, match="needs an energy meter, and this machine has none") as raised:
        collage.optimize(_bottleneck(), backends=["tvm"], cost_log=tmp_path / "c.sqlite", substitutions=True,
                         objective="energy", progress=False)  # fmt: skip
    assert why in str(raised.value)
    with pytest.raises(collage.OptimizeError, match="pass substitutions=True"):
        collage.optimize(_bottleneck(), backends=["tvm"], cost_log=tmp_path / "c.sqlite", objective="energy", meter=ClockMeter())
