"""``experiments.gpu``'s parts that need no GPU: the speed-up within an accuracy budget over
the best float32 peer, through collage's float32 module timed in both races; which models a
lend's ``--accuracy-only`` measures; the stacks sampled to say where a run's seconds went."""

import argparse
import time

import pytest

import experiments.gpu
from experiments.gpu import _one_model, _stacks_into, over_best_float32_peer


def test_the_speedup_within_a_budget_is_over_the_best_float32_peer_through_collage_float32():
    # float32 race: torch.compile 2.5 ms, collage 2.0; budget race: collage float32 2.1, collage 1.0.
    row = {"best_peer": "torch.compile", "ms": {"collage": 2.0, "torch.compile": 2.5, "torch": 5.0},
           "accuracy": {"ms": {"collage": 1.0, "collage float32": 2.1, "torch.compile (default)": 1.2}}}
    assert over_best_float32_peer(row) == {"best_float32_peer": "torch.compile", "speedup_over_best_float32_peer": 2.625}


def test_without_both_races_there_is_no_such_speedup():
    assert over_best_float32_peer({"accuracy": {"ms": {"collage": 1.0}}}) == {}
    no_float32_module = {"best_peer": "torch", "ms": {"collage": 2.0, "torch": 5.0}, "accuracy": {"ms": {"collage": 1.0}}}
    assert over_best_float32_peer(no_float32_module) == {}


def test_accuracy_only_measures_the_whole_row_on_a_gpu_of_another_kind_and_skips_what_is_there(monkeypatch, capsys):
    # A lend may be an H200 where the float32 rows came from an H100: the budget's speed-up is
    # over the best float32 peer on the same GPU, so that row is measured first.
    done = []
    monkeypatch.setattr(experiments.gpu, "accuracy_only", lambda name, row, *_: done.append((name, "accuracy only")) or row.setdefault("accuracy", {}))
    monkeypatch.setattr(experiments.gpu, "run_model", lambda name, row, save, log, energy, accuracy, torch_entry:
                        done.append((name, "whole row", accuracy)))  # fmt: skip
    h100 = "NVIDIA H100 80GB HBM3"
    results = {"machine": {"gpu": "NVIDIA H200"},
               "resnet50": {"gpu": h100, "ms": {}, "accuracy": {"budget": 0.01, "ms": {}}}}  # fmt: skip
    args = argparse.Namespace(accuracy_only=True, accuracy=0.01, cost_log="c", energy=[], no_torch_entry=True, out="gpu.json")
    _one_model("resnet50", results, lambda: None, args)
    assert done == [("resnet50", "whole row", 0.01)] and results["resnet50"]["gpu"] == "NVIDIA H200"
    done.clear()
    results["machine"]["gpu"] = h100
    results["resnet50"] = {"gpu": h100, "ms": {}, "accuracy": {"budget": 0.01, "ms": {}}}
    results["bert"] = {"gpu": h100, "ms": {}}
    for name in ("resnet50", "bert"):
        _one_model(name, results, lambda: None, args)
    assert done == [("bert", "accuracy only")]
    assert "resnet50: its accuracy entry from this GPU" in capsys.readouterr().out


def test_the_stacks_sampled_say_where_a_calls_seconds_went(tmp_path):
    """A lent GPU's run says where its seconds went, also when the call's limit cuts it off."""

    def waiting():
        time.sleep(0.6)

    def spinning():
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass

    with pytest.raises(SystemExit), _stacks_into(tmp_path, "model"):
        waiting()
        spinning()
        raise SystemExit(143)  # as SIGTERM from the call's limit ends it
    lines = (tmp_path / "model.txt").read_text().splitlines()
    seconds = {line.split()[-1]: float(line.split()[0]) for line in lines[1:]}
    assert seconds["waiting"] > seconds["spinning"] > 0.1, lines


def test_the_processes_a_sampled_call_starts_are_sampled_each_into_a_file_of_its_own(tmp_path):
    """The measuring worker and each compile ahead are processes of their own, whose seconds the
    calling process's stacks show only as waiting."""
    import subprocess
    import sys

    napping = "import time\ndef napping():\n    time.sleep(1.5)\nnapping()\n"
    with _stacks_into(tmp_path, "model"):
        subprocess.run([sys.executable, "-c", napping], check=True)
    subprocess.run([sys.executable, "-c", napping], check=True)  # after the block: not sampled
    (written,) = (tmp_path / "model").glob("*.txt")
    lines = written.read_text().splitlines()
    assert lines[0].startswith("pid ") and "napping" in lines[0]
    assert any(line.endswith(" napping") and float(line.split()[0]) > 1.0 for line in lines[2:]), lines
