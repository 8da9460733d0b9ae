"""The ``collage`` command on a tiny ONNX model: run in subprocesses as a user runs it where
the process matters (what it prints while libraries load, what it measures and writes), and
through ``collage.cli.main`` in this process where it does not (the cost log's commands, most
argument mistakes).

One ``collage optimize`` (module fixture) feeds the tests of its output, of ``collage run``
and of ``collage log``; every process uses a cost log of this module's own.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import subprocess_env
from tests.tiny_onnx import INPUT_SHAPE, write_tiny_model

BACKENDS = "tvm,onnxruntime"  # two quick ones: an op-level library and an inference engine


def collage(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collage", *map(str, args)],
        check=False, capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip


def logged_costs(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM costs").fetchone()[0]


def assert_one_error_line(done: subprocess.CompletedProcess, *words: str) -> str:
    """A user's mistake: non-zero status, one line on stderr naming it, no traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("collage: error: "), done.stderr
    for word in words:
        assert word in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli")
    write_tiny_model(path / "tiny.onnx")
    return path


@pytest.fixture(scope="module")
def env(workdir) -> dict:
    return subprocess_env(COLLAGE_COST_LOG=str(workdir / "costs.sqlite"))


@pytest.fixture(scope="module")
def optimized(workdir, env) -> subprocess.CompletedProcess:
    return collage(
        "optimize", "tiny.onnx", "--backends", BACKENDS, "--threads", 2, "--quiet", "--graph-level", "--budget", 30,
        "--out", "placement.json", "--draw", "placement.svg", env=env, cwd=workdir,
    )  # fmt: skip


def test_the_command_is_installed_as_a_console_script():
    (script,) = entry_points(group="console_scripts", name="collage")
    assert script.value == "collage.cli:main"


def test_optimize_prints_the_report_and_writes_the_placement(optimized, workdir):
    assert optimized.returncode == 0, optimized.stderr
    assert "Traceback" not in optimized.stderr
    assert "collage placement:" in optimized.stdout and "end to end: estimated" in optimized.stdout
    assert "graph-level refinement (onnxruntime)" in optimized.stdout
    assert "placement written to placement.json" in optimized.stdout
    saved = json.loads((workdir / "placement.json").read_text())
    assert saved["format"] == "collage-placement" and saved["target"] == "llvm" and saved["threads"] == 2
    assert sorted(i for p in saved["partitions"] for i in p["nodes"]) == list(range(saved["model"]["ops"]))
    assert {p["backend"] for p in saved["partitions"]} <= set(BACKENDS.split(","))


def test_optimize_draws_the_placement_as_dot(optimized, workdir):
    dot = (workdir / "placement.dot").read_text()  # written beside the picture, Graphviz or not
    assert dot.startswith("digraph placement {") and "subgraph cluster_0 {" in dot
    assert "conv2d" in dot and "matmul" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` is not installed (apt-get install graphviz)")
def test_optimize_draws_the_placement_as_svg(optimized, workdir):
    assert "picture written to placement.svg" in optimized.stdout
    assert "<svg" in (workdir / "placement.svg").read_text()


# Mistakes run as the user runs them, in a process of their own: what the libraries print
# while they load (TVM's C++ log included) must stay off the terminal too. The other commands
# run the same ``main`` in this process (``here``), 4 s less each: a command's start-up is
# loading TVM and torch.
IN_A_PROCESS_OF_ITS_OWN = {"missing file"}


@pytest.fixture
def here(workdir, monkeypatch, capfd):
    """``collage ARGS`` through ``collage.cli.main`` in this process, in ``workdir`` with this
    module's cost log, its fd-level output captured: what a subprocess would return."""
    from collage import cli

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("COLLAGE_COST_LOG", str(workdir / "costs.sqlite"))

    def run(*args) -> subprocess.CompletedProcess:
        capfd.readouterr()
        status = cli.main([str(a) for a in args])
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(args, status, out, err)

    return run


def test_run_rebuilds_from_the_placement_without_measuring(optimized, workdir, env):
    before = logged_costs(workdir / "costs.sqlite")
    done = collage("run", "tiny.onnx", "--placement", "placement.json", env=env, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "collage placement:" in done.stdout and "measured 0 candidates" in done.stdout
    assert logged_costs(workdir / "costs.sqlite") == before


def test_run_refuses_a_placement_made_for_another_model(optimized, workdir, here):
    write_tiny_model(workdir / "other.onnx", seed=1)  # the same layers, other weights
    done = here("run", "other.onnx", "--placement", "placement.json")
    assert_one_error_line(done, "placement was made for another model")


def test_backends_lists_each_backend_with_its_library_and_whether_it_runs_here(here):
    done = here("backends")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.strip().splitlines()
    assert header.split() == ["backend", "kind", "targets", "library", "usable", "here"]
    names = [row.split()[0] for row in rows]
    assert {"tvm", "dnnl", "mkl", "onnxruntime", "openvino", "cudnn", "cublas", "inductor", "tensorrt"} <= set(names)
    tvm = rows[names.index("tvm")]
    assert "op-level" in tvm and "Apache TVM" in tvm and "llvm: yes" in tvm
    assert all(": yes" in row or ": no, " in row for row in rows)


def test_log_stats_and_show(optimized, here):
    stats = here("log", "stats")
    assert stats.returncode == 0, stats.stderr
    rows = {
        line.split()[0]: line.split()
        for line in stats.stdout.splitlines()[2:]
        if line.startswith(("tvm ", "onnxruntime "))
    }
    assert set(rows) == {"tvm", "onnxruntime"}
    assert int(rows["tvm"][-3]) >= 1  # rows, then valid and failed

    show = here("log", "show", "--backend", "tvm", "--limit", 2)
    assert show.returncode == 0, show.stderr
    lines = show.stdout.strip().splitlines()
    assert lines[0].startswith("cost log ") and "2 of" in lines[0]
    assert len(lines) == 4 and all(line.split()[1] == "tvm" for line in lines[2:])


def test_log_clear_wants_yes(optimized, workdir, here):
    copy = workdir / "copy.sqlite"
    with sqlite3.connect(workdir / "costs.sqlite") as source, sqlite3.connect(copy) as target:
        source.backup(target)
    held = logged_costs(copy)
    assert held > 0

    asked = here("log", "clear", "--log", copy)
    assert asked.returncode == 1 and f"{held} measured costs" in asked.stdout and "--yes" in asked.stdout
    assert logged_costs(copy) == held

    cleared = here("log", "clear", "--log", copy, "--yes")
    assert cleared.returncode == 0, cleared.stderr
    assert logged_costs(copy) == 0


def test_log_commands_create_no_log(workdir, here):
    done = here("log", "stats", "--log", "nowhere.sqlite")
    assert done.returncode == 0 and "no cost log at nowhere.sqlite" in done.stdout
    assert not (workdir / "nowhere.sqlite").exists()


def _input_set(path: Path, shape=None) -> Path:
    """An input set for tiny.onnx in a .npz file (of ``shape`` instead of the model's), and tiny.onnx itself."""
    np.savez(path, x=np.ones(shape or INPUT_SHAPE, "float32"))
    return path.parent / "tiny.onnx"


def _junk(path: Path) -> Path:
    path.write_bytes(b"\x08\x0a\x12\xff\xff not ONNX, only bytes \x00\x01\x02")
    return path


MISTAKES = {
    "missing file": (lambda d: d / "missing.onnx", [], ["missing.onnx", "no such file"]),
    "malformed ONNX": (lambda d: _junk(d / "junk.onnx"), [], ["junk.onnx", "not an ONNX model"]),
    "unknown backend": (lambda d: d / "tiny.onnx", ["--backends", "tvm,nosuch"], ["unknown backend", "nosuch"]),
    "alpha without substitutions": (lambda d: d / "tiny.onnx", ["--alpha", "1.2"], ["--alpha", "--substitutions"]),
    "alpha below 1": (lambda d: d / "tiny.onnx", ["--substitutions", "--alpha", "0.5"], ["--alpha", "at least 1"]),
    "objective without substitutions": (lambda d: d / "tiny.onnx", ["--objective", "energy"], ["--objective", "--substitutions"]),
    "unknown objective": (lambda d: d / "tiny.onnx", ["--substitutions", "--objective", "speed"], ["objective 'speed'"]),
    "calibration not npz": (lambda d: d / "tiny.onnx", ["--accuracy", "1e-2", "--calibration", "tiny.onnx"],
                            ["--calibration tiny.onnx", "not a NumPy .npz file"]),
    "calibration of another shape": (lambda d: _input_set(d / "small.npz", (1, 1)), ["--accuracy", "1e-2", "--calibration", "small.npz"],
                                     ["calibration set 0, input 'x'", "float32[1, 1]", "the model takes"]),
    "calibration without accuracy": (lambda d: _input_set(d / "cal.npz"), ["--calibration", "cal.npz"],
                                     ["calibration inputs serve an accuracy budget"]),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_users_mistake_is_one_line_without_traceback(mistake, workdir, env, here):
    model, options, words = MISTAKES[mistake]
    args = ("optimize", model(workdir), *options, "--quiet")
    done = collage(*args, env=env, cwd=workdir) if mistake in IN_A_PROCESS_OF_ITS_OWN else here(*args)
    assert_one_error_line(done, *words)


def test_a_model_with_nothing_to_place_optimizes_runs_and_says_why(workdir, env):
    """ONNX's Range imports with a match_cast (its length is known only at run time)."""
    import onnx
    from onnx import TensorProto, helper

    scalars = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in "sld"]
    graph = helper.make_graph([helper.make_node("Range", ["s", "l", "d"], ["y"])], "range", scalars,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), workdir / "range.onnx")
    done = collage("optimize", "range.onnx", "--backends", BACKENDS, "--quiet", "--out", "range.json",
                   "--draw", "range.dot", env=env, cwd=workdir)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "nothing placed" in done.stdout and "no picture: nothing was placed" in done.stderr
    again = collage("run", "range.onnx", "--placement", "range.json", env=env, cwd=workdir)
    assert again.returncode == 0 and "0 of 0 partition" in again.stdout, again.stderr


def test_a_model_tvm_cannot_import_runs_on_the_engines_and_exports(workdir, here):
    write_tiny_model(workdir / "celu.onnx", "Celu")  # an operator TVM's ONNX importer lacks
    done = here("optimize", "celu.onnx", "--backends", BACKENDS, "--quiet", "--export", "celu")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "TVM cannot import the model (celu.onnx: TVM's ONNX importer does not support operator(s) Celu)" in done.stdout
    assert "no placement written" in done.stdout
    again = here("run", "celu")
    assert again.returncode == 0, again.stderr
