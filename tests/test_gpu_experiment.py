"""``experiments.gpu``'s parts that need no GPU: the speed-up within an accuracy budget over
the best float32 peer, through collage's float32 module timed in both races; the stacks
sampled to say where a run's seconds went."""

import time

import pytest

from experiments.gpu import _stacks_into, over_best_float32_peer


def test_the_speedup_within_a_budget_is_over_the_best_float32_peer_through_collage_float32():
    # float32 race: torch.compile 2.5 ms, collage 2.0; budget race: collage float32 2.1, collage 1.0.
    row = {"best_peer": "torch.compile", "ms": {"collage": 2.0, "torch.compile": 2.5, "torch": 5.0},
           "accuracy": {"ms": {"collage": 1.0, "collage float32": 2.1, "torch.compile (default)": 1.2}}}
    assert over_best_float32_peer(row) == {"best_float32_peer": "torch.compile", "speedup_over_best_float32_peer": 2.625}


def test_without_both_races_there_is_no_such_speedup():
    assert over_best_float32_peer({"accuracy": {"ms": {"collage": 1.0}}}) == {}
    no_float32_module = {"best_peer": "torch", "ms": {"collage": 2.0, "torch": 5.0}, "accuracy": {"ms": {"collage": 1.0}}}
    assert over_best_float32_peer(no_float32_module) == {}


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
