"""Models written by others, through the paths users take, checked against torch.

An MBConv net with squeeze-excitation, SiLU and hard-swish, and transformers' GPT-2 (random
weights, a tiny config: ``experiments.models``, ``small=True``) go one path each:
- ``torch.export`` to Relax, then ``collage.optimize``;
- ONNX export to a file, then ``collage optimize`` and ``collage run`` on the command line,
  and the saved placement rebuilt in Python to compare its outputs with torch's.

Two quick backends (TVM, an op-level library, and ONNX Runtime, an inference engine) keep the
suite short; ``experiments/bench.py`` runs every backend on the full configs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import collage
from collage.model.frontend import load_onnx
from collage.measuring.timing import Timing
from tests.helpers import assert_close, zoo

# Each path of each model takes a minute or more (about 400 distinct candidates, mostly TVM
# compiling each), so the suite runs one path per model: GPT-2 (its causal mask holds -inf)
# from its ONNX file on the command line, the MBConv net (squeeze-excitation, SiLU,
# hard-swish) through torch.export. ``python -m experiments.real_models`` runs all seven
# models of experiments.models written that way both ways, and commits the table
# (experiments/results/real_models.json).
TORCH_EXPORT = ["mbconv"]
ONNX_FILE = ["gpt2"]
BACKENDS = ["tvm", "onnxruntime"]
FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.2, budget_s=0.2)
@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    # One cost log for both paths: what the first measured, the second reuses.
    return tmp_path_factory.mktemp("real") / "costs.sqlite"


@pytest.mark.parametrize("name", TORCH_EXPORT)
def test_torch_export_path_matches_torch(name, log):
    w = zoo(name)
    opt = collage.optimize(w.relax, backends=BACKENDS, cost_log=log, timing=FAST, progress=False)
    out = opt(*[x.numpy() for x in w.inputs])
    outs = list(out) if isinstance(out, tuple) else [out]
    for o, r in zip(outs, w.reference()):
        assert_close(o, r, f"{name}, torch.export path")


@pytest.mark.parametrize("name", ONNX_FILE)
def test_onnx_file_path_optimizes_and_runs_from_the_command_line(name, log, tmp_path, monkeypatch, capfd):
    import onnx

    from collage import cli

    w = zoo(name)
    onnx.save(w.onnx, tmp_path / "model.onnx")
    # The command line's own main, in this process (a process of its own only adds 4 s of
    # loading TVM and torch; tests/test_cli.py runs one so), its output read at the descriptors.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLLAGE_COST_LOG", str(log))
    for args in (["optimize", "model.onnx", "--quiet"], ["run", "model.onnx"]):
        capfd.readouterr()
        status = cli.main([*args, "--backends", ",".join(BACKENDS), "--threads", "2"])
        out, err = capfd.readouterr()
        assert status == 0, err
        assert "collage placement:" in out
        # TVM's C++ log and the libraries' warnings stay off the terminal without --verbose.
        assert all(line.startswith("collage:") for line in err.splitlines()), err
    rebuilt = collage.load_placement(load_onnx(tmp_path / "model.onnx"), tmp_path / "placement.json",
                                     cost_log=log, onnx_model=tmp_path / "model.onnx")  # fmt: skip
    out = rebuilt(*[x.numpy() for x in w.inputs])
    outs = list(out) if isinstance(out, tuple) else [out]
    for o, r in zip(outs, w.reference()):
        assert_close(o, r, f"{name}, ONNX path")
    # Every partition has a cost, an engine running the file whole too (its time here).
    assert all(p.cost_ms > 0 for p in rebuilt.placement) and sum(rebuilt.backend_shares().values()) > 0.99
