"""The tvm backend: its fusion rule's groups compile and match TVM's default pipeline."""


import pytest

from collage.measuring.build import check_candidate
from collage.backends import tvm as tvm_backend
from collage.candidates.generate import generate
from collage.model.graph import DataflowGraph
from experiments import models
from tests.helpers import failures, sample, zoo_candidates, zoo_graph


# Every distinct group of the MLP; a sample (covering every op) of BERT's, each compiled twice.
# (tests/test_zoo_candidates.py checks every candidate of every CPU backend on squeezenet.)
@pytest.mark.parametrize("model, limit", [("mlp", None), ("bert", 30)])
def test_rule_groups_compile_and_match(model, limit):
    cands = zoo_candidates(model, tvm_backend.BACKEND)
    assert set().union(*(c.subgraph.nodes for c in cands)) == set(range(len(zoo_graph(model))))  # all placeable
    assert failures(tvm_backend.BACKEND, sample(cands, limit)) == {}


def test_cuda_target():
    reason = tvm_backend.BACKEND.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"tvm on cuda: {reason}")
    graph = DataflowGraph.from_module(models.load("mlp", small=True).relax)
    for c in generate(graph, [tvm_backend.BACKEND]):
        assert check_candidate(tvm_backend.BACKEND, c.subgraph.extract(), c.pattern, "cuda") is None
