"""The peer-baseline bench on the small MLP: every peer runs and agrees with torch, results land
in the JSON file and the chart, and a peer that fails is recorded without stopping the others."""

import dataclasses
import functools
import json

import pytest

from experiments import bench, peers

# A warm-up of exactly two calls, so that a test peer knows which of its calls opens the rounds.
# Short blocks and no settling pause: these tests check what the bench records, not how well
# it times (tests/test_timing.py does); settling took 19 of the MLP's 47 s with every peer.
QUICK = bench.Settings(threads=2, budget_s=1.0, min_reps=3, max_reps=10, warmup_s=0.0, block_ms=10.0, settle_s=0.0)


def run_mlp(tmp_path, peer_fns):
    out, png = tmp_path / "peers.json", tmp_path / "peers.png"
    entries, table = bench.run(["mlp"], peer_fns, QUICK, small=True, out=out, plot=png)
    return entries["mlp"]["peers"], table, out, png


def test_every_peer_runs_the_mlp(tmp_path):
    records, table, out, png = run_mlp(tmp_path, peers.PEERS)

    assert list(records) == list(peers.PEERS)
    for name, record in records.items():
        assert record["error"] is None, name
        assert record["median_ms"] > 0, name
        assert QUICK.min_reps <= record["samples"] <= QUICK.max_reps, name
        # OpenVINO at its own defaults computes in bf16 where the CPU has it natively.
        assert record["max_rel_err"] < (5e-2 if name == "openvino-default" else 1e-4), name
        assert name in table
    assert json.loads(out.read_text())["mlp"]["peers"] == records
    assert png.stat().st_size > 0
    # Collage records its placement and gets its speed-up over the best other peer.
    assert sum(records["collage"]["backend_shares"].values()) == pytest.approx(1.0)
    assert "collage vs best" in table and "geo-mean speed-up of collage over the best peer" in table


def test_speedup_is_over_the_best_correct_peer():
    def rec(ms, err=0.0):
        return {"median_ms": ms, "error": None, "max_rel_err": err}

    results = {
        "a": {"peers": {"torch": rec(4.0), "onnxruntime": rec(2.0), "collage": rec(1.0)}},
        "b": {"peers": {"torch": rec(1.0, err=1.0), "openvino": rec(8.0), "collage": rec(2.0)}},  # torch is wrong
        "c": {"peers": {"torch": rec(1.0)}},
    }
    assert bench.speedups(results) == {"a": (2.0, "onnxruntime"), "b": (4.0, "openvino")}
    assert bench.geomean(r for r, _ in bench.speedups(results).values()) == pytest.approx(8 ** 0.5)
    # Collage's other columns (its entry points, the substitution search) are never the peer to beat.
    results["a"]["peers"] |= {"collage (torch)": rec(0.5), "collage (substitutions)": rec(0.9)}
    assert bench.speedups(results)["a"] == (2.0, "onnxruntime")
    assert bench.speedups(results, "collage (substitutions)")["a"] == pytest.approx((2.0 / 0.9, "onnxruntime"))


def raises_after_preparing(prepare_fn):
    """A real peer that, once compiled, fails the way an unsupported model would."""

    def prepare(w, threads):
        prepare_fn(w, threads)
        raise RuntimeError("operator not supported: aten::frobnicate")

    return prepare


def breaks_while_timed(prepare_fn, calls_before_failing):
    """A real peer whose runner stops working after some calls."""

    def prepare(w, threads):
        runner = prepare_fn(w, threads)
        calls = 0

        def run():
            nonlocal calls
            calls += 1
            if calls > calls_before_failing:
                raise RuntimeError("device lost")
            return runner.run()

        return peers.Runner(run, runner.to_numpy)

    return prepare


def test_failing_peers_are_recorded_and_the_others_measured(tmp_path):
    peer_fns = {
        "torch": peers.prepare_torch,
        "unsupported": raises_after_preparing(peers.prepare_onnxruntime),
        "flaky": breaks_while_timed(peers.prepare_torch, QUICK.warmup_calls),  # fails in round 1
    }
    records, table, out, png = run_mlp(tmp_path, peer_fns)

    assert records["torch"]["error"] is None and records["torch"]["median_ms"] > 0
    assert records["unsupported"]["error"] == (
        "prepare: RuntimeError: operator not supported: aten::frobnicate"
    )
    assert records["flaky"]["error"] == "run: RuntimeError: device lost"
    assert records["unsupported"]["median_ms"] is None and records["flaky"]["median_ms"] is None
    assert "aten::frobnicate" in table and "device lost" in table
    assert out.exists() and png.exists()


def test_a_second_run_adds_peers_to_the_models_entry(tmp_path):
    run_mlp(tmp_path, {"torch": peers.prepare_torch})
    _, _, out, _ = run_mlp(tmp_path, {"onnxruntime": peers.prepare_onnxruntime})

    assert list(json.loads(out.read_text())["mlp"]["peers"]) == ["torch", "onnxruntime"]


def test_small_results_have_files_of_their_own():
    assert bench.default_results_path(small=True) != bench.default_results_path(small=False)


def test_with_a_budget_every_peer_is_held_to_it_on_a_second_draw_too(tmp_path):
    def skewed(w, threads):  # right on the bench's inputs, 10% off on any other
        runner = peers.prepare_torch(w, threads)
        return peers.Runner(runner.run, runner.to_numpy, outputs_on=lambda a: [o * 1.1 for o in runner.outputs_on(a)])

    names = ("torch", "onnxruntime", "openvino", "openvino-default", "tvm")
    peer_fns = {name: peers.PEERS[name] for name in names} | {
        "skewed": skewed, "collage": functools.partial(peers.prepare_collage, accuracy=5e-2)}
    out = tmp_path / "peers.json"
    entries, _ = bench.run(["mlp"], peer_fns, dataclasses.replace(QUICK, accuracy=5e-2), small=True, out=out,
                           plot=tmp_path / "peers.png")  # fmt: skip
    records = entries["mlp"]["peers"]
    assert all(records[name]["error"] is None and records[name]["max_rel_err"] < 5e-2 for name in (*names, "collage"))
    assert records["skewed"]["max_rel_err"] == pytest.approx(0.1, rel=1e-3)  # counted on the second draw
