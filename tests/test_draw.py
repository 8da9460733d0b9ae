"""Placement pictures: the DOT text, and rendering with Graphviz when it is installed."""

from __future__ import annotations

import dataclasses
import re
import shutil
import time

import pytest
from tvm import relax

from collage.deploying import draw as drawing
from collage.deploying.optimized import OptimizedModule
from collage.candidates.generate import Candidate
from collage.measuring.cost import Cost
from collage.deploying.draw import BACKEND_COLOURS, GraphvizMissing, backend_colour, draw, to_dot
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition
from collage.candidates.subgraph import SubGraph

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's `dot` is not installed (apt-get install graphviz)"
)


def placed(graph: DataflowGraph, groups) -> OptimizedModule:
    """An OptimizedModule holding only a placement: ``groups`` of (backend, pattern, nodes, ms)."""
    partitions = [
        Partition(Candidate(SubGraph(graph, frozenset(nodes)), backend, pattern), Cost.of(ms) if ms else Cost.unknown())
        for backend, pattern, nodes, ms in groups
    ]
    estimated = sum(ms or 0.0 for *_, ms in groups)
    return OptimizedModule(None, partitions, "llvm", 2, estimated, Cost.of(estimated * 1.1), None)


@pytest.fixture
def block():
    """relu, add (reading the input too), multiply, tanh: three partitions, one never measured."""
    groups = [("mkl", "mkl.relu_add", {0, 1}, 0.25), ("tvm", "tvm.fused", {2}, 0.5), ("tvm", "tvm.fallback", {3}, None)]
    return placed(residual_chain(1), groups)


def test_dot_has_every_op_in_its_partitions_cluster(block):
    dot = to_dot(block)
    clusters = re.findall(r"subgraph (cluster_\d+) \{(.*?)\n  \}", dot, re.DOTALL)
    assert [name for name, _ in clusters] == ["cluster_0", "cluster_1", "cluster_2"]
    members = [re.findall(r"^\s+(n\d+) \[", body, re.MULTILINE) for _, body in clusters]
    assert members == [["n0", "n1"], ["n2"], ["n3"]]
    assert 'n0 [label="relu"' in dot and 'n1 [label="add"' in dot
    assert f'fillcolor="{BACKEND_COLOURS["mkl"]}"' in clusters[0][1]
    assert f'fillcolor="{BACKEND_COLOURS["tvm"]}"' in clusters[1][1]
    assert 'label="mkl.relu_add\\n0.25 ms"' in clusters[0][1]
    assert 'label="tvm.fallback\\nnot measured"' in clusters[2][1]


def test_dot_has_the_data_flow_with_hand_overs_marked(block):
    dot = to_dot(block)
    edges = dict(re.findall(r"^  (\w+ -> \w+)(.*);$", dot, re.MULTILINE))
    assert set(edges) == {"p0 -> n0", "p0 -> n1", "n0 -> n1", "n0 -> n2", "n1 -> n2", "n2 -> n3", "n3 -> out3"}
    assert all("penwidth" in edges[e] for e in ("n0 -> n2", "n1 -> n2", "n2 -> n3"))  # between partitions
    assert edges["n0 -> n1"] == ""  # inside one
    assert 'p0 [label="x\\nfloat32[1x16]"' in dot and 'out3 [label="output\\nfloat32[1x16]"' in dot


def test_dot_has_a_legend_with_each_backends_share(block):
    legend = to_dot(block).split("subgraph cluster_legend {")[1]
    assert "mkl: 1 partition(s), 2 ops, 33% of the estimated time" in legend
    assert "tvm: 2 partition(s), 2 ops, 67% of the estimated time" in legend


def test_dot_quotes_what_it_labels():
    dot = to_dot(placed(residual_chain(1), [("my", 'my."odd"\\pattern', {0, 1, 2, 3}, 1.0)]))
    assert 'label="my.\\"odd\\"\\\\pattern\\n1 ms"' in dot


def test_a_registered_backend_gets_a_stable_colour():
    assert backend_colour("mine") == backend_colour("mine") and backend_colour("mine").startswith("#")
    assert backend_colour("openvino") == BACKEND_COLOURS["openvino"]


def test_draw_writes_dot(block, tmp_path):
    assert draw(block, tmp_path / "p.dot") == tmp_path / "p.dot"
    assert (tmp_path / "p.dot").read_text() == to_dot(block)


def test_draw_refuses_an_unknown_format(block, tmp_path):
    with pytest.raises(ValueError, match="must end in one of"):
        draw(block, tmp_path / "p.jpeg")


def test_without_graphviz_the_dot_file_is_written_and_the_error_says_so(block, tmp_path, monkeypatch):
    monkeypatch.setattr(drawing.shutil, "which", lambda name: None)
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        draw(block, tmp_path / "p.svg")
    assert (tmp_path / "p.dot").read_text() == to_dot(block) and not (tmp_path / "p.svg").exists()


@needs_dot
@pytest.mark.parametrize("suffix, start", [(".svg", b"<?xml"), (".png", b"\x89PNG")])
def test_draw_renders_with_graphviz(block, tmp_path, suffix, start):
    path = block.draw(tmp_path / f"p{suffix}")
    assert path.read_bytes().startswith(start)
    assert (tmp_path / "p.dot").exists()


def residual_chain(blocks: int) -> DataflowGraph:
    """A graph of ``blocks`` x 4 ops, each block adding the output of the block before last,
    as residual networks do."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            before, h = x, x
            for k in range(blocks):
                a = bb.emit(relax.op.nn.relu(h))
                b = bb.emit(relax.op.add(a, before))
                c = bb.emit(relax.op.multiply(b, a))
                emit = bb.emit_output if k == blocks - 1 else bb.emit
                before, h = h, emit(relax.op.tanh(c))
        bb.emit_func_output(h)
    return DataflowGraph.from_module(bb.get())


def many_partitions(graph: DataflowGraph) -> OptimizedModule:
    """Partitions of one to five ops, on three backends in turn."""
    backends = ["tvm", "dnnl", "onnxruntime"]
    groups, start = [], 0
    while start < len(graph):
        backend, size = backends[len(groups) % 3], 1 + len(groups) % 5
        groups.append((backend, f"{backend}.x", set(range(start, min(start + size, len(graph)))), 0.1))
        start += size
    return placed(graph, groups)


def test_past_the_box_limit_each_op_is_filled_instead(monkeypatch):
    monkeypatch.setattr(drawing, "MAX_BOXED_OPS", 10)
    opt = many_partitions(residual_chain(5))
    dot = to_dot(opt)
    assert "subgraph cluster_0" not in dot and "subgraph cluster_legend" in dot
    assert (
        f'n1 [label="add", tooltip="node 1: relax.add -> float32[1x16]; partition 1: dnnl.x\\n0.1 ms", fillcolor="{BACKEND_COLOURS["dnnl"]}"];'
        in dot
    )
    assert "subgraph cluster_0" in to_dot(opt, boxed=True)


@needs_dot
def test_a_large_placement_renders_in_seconds(tmp_path):
    """1000 ops in 333 boxed partitions (simplified ResNet-50 has 176 ops, BERT-base 499)."""
    opt = many_partitions(residual_chain(250))
    assert len(opt.placement[0].candidate.subgraph.graph) <= drawing.MAX_BOXED_OPS
    began = time.perf_counter()
    draw(opt, tmp_path / "large.svg")
    assert time.perf_counter() - began < 30
    assert (tmp_path / "large.svg").stat().st_size > 100_000


def test_a_partition_in_a_reduced_precision_says_so():
    opt = placed(residual_chain(1), [("openvino", "openvino.region", {0, 1, 2, 3}, 0.2)])
    reduced = dataclasses.replace(opt.placement[0], candidate=dataclasses.replace(opt.placement[0].candidate, precision="bfloat16"))
    opt.placement = [reduced]
    assert "openvino.region [bf16]" in to_dot(opt) and "openvino.region [bf16]" in opt.report()
