"""The documentation's code runs as written."""

import pathlib
import re

import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R

import collage
from collage.measuring.build import check_candidate
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph

from .helpers import assert_close

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


# fmt: off
@I.ir_module
class Mlp:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 8), "float32")):
        with R.dataflow():
            h = R.matmul(x, w)
            y = R.nn.relu(h)
            z = R.matmul(y, R.const(np.ones((8, 2), "float32")))
            r = R.nn.relu(z)
            R.output(r)
        return r
# fmt: on


def test_backend_example_registers_matches_and_runs():
    example = python_blocks(DOCS / "backends.md")[0]
    assert len(example.splitlines()) < 70
    namespace = {}
    exec(compile(example, "docs/backends.md", "exec"), namespace)
    backend = namespace["BACKEND"]
    assert backend in collage.list_backends()

    graph = DataflowGraph.from_module(Mlp)
    cands = generate(graph, [backend])
    assert [sorted(c.subgraph.nodes) for c in cands] == [[0, 1], [2, 3]]
    for cand in cands:  # one with the weight as an input, one with it as a constant
        func = cand.subgraph.extract()
        assert check_candidate(backend, func, cand.pattern) is None


def test_readme_examples_optimize_export_load_and_compile(capsys, tmp_path, monkeypatch):
    """The README's Python examples, as written, one after the other: the keyword spotter
    optimized at full size with every backend, exported and loaded, and compiled by
    torch.compile with collage as its backend."""
    readme = DOCS.parent / "README.md"
    example, export, torch_compile = python_blocks(readme)
    monkeypatch.chdir(tmp_path)  # the export's directory
    namespace = {}
    exec(compile(example, str(readme), "exec"), namespace)
    opt, scores = namespace["opt"], namespace["scores"]
    assert scores.shape == (1, 12) and np.isfinite(scores).all()
    w = namespace["w"]
    (out,), (ref,) = opt(*[x.numpy() for x in w.inputs]), w.reference()
    assert_close(out, ref, "the README's model against torch")
    printed = capsys.readouterr().out
    assert "collage placement:" in printed and "end to end: estimated" in printed
    assert all(p.backend in printed for p in opt.placement)

    exec(compile(export, str(readme), "exec"), namespace)
    x = w.inputs[0].numpy()
    assert_close(namespace["loaded"](x)[0], opt(x)[0], "the README's exported module against the optimized one")

    exec(compile(torch_compile, str(readme), "exec"), namespace)
    with namespace["torch"].no_grad():
        compiled = namespace["fast"](w.inputs[0]).numpy()
    assert_close(compiled, ref, "the README's torch.compile against torch")
