"""The documentation's code runs as written."""

import pathlib
import re

import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R

import collage
from collage import runner
from collage.candidates import generate
from collage.graph import DataflowGraph

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
        assert runner.check_candidate(backend, func, cand.pattern) is None


def test_readme_example_optimizes_and_runs(capsys):
    """The README's Python example, as written (the keyword spotter at full size, with every
    backend)."""
    readme = DOCS.parent / "README.md"
    (example,) = python_blocks(readme)
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
