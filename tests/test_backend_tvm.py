"""The tvm backend: its fusion rule's groups compile and match TVM's default pipeline."""

import random

import pytest

from collage import runner
from collage.backends import tvm as tvm_backend
from collage.candidates import generate
from collage.graph import DataflowGraph
from experiments import models


def one_per_op_sequence(candidates, limit=None):
    """A sample holding each distinct op sequence the rule produced (a seeded ``limit`` of
    them for BERT, whose ~150 sequences take minutes to compile twice each)."""
    sample = list({tuple(c.subgraph.ops): c for c in candidates}.values())
    return sample if limit is None else random.Random(0).sample(sample, min(limit, len(sample)))


@pytest.mark.parametrize("model, limit", [("mlp", None), ("squeezenet", None), ("bert", 30)])
def test_rule_groups_compile_and_match(model, limit):
    graph = DataflowGraph.from_module(models.load(model, small=True).relax)
    cands = generate(graph, [tvm_backend.BACKEND])
    assert set().union(*(c.subgraph.nodes for c in cands)) == set(range(len(graph)))  # all placeable
    sample = one_per_op_sequence(cands, limit)
    failures = {
        "+".join(c.subgraph.ops): reason
        for c in sample
        if (reason := runner.check_candidate(tvm_backend.BACKEND, c.subgraph.extract(), c.pattern)) is not None
    }
    assert failures == {}


def test_cuda_target():
    reason = tvm_backend.BACKEND.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"tvm on cuda: {reason}")
    graph = DataflowGraph.from_module(models.load("mlp", small=True).relax)
    for c in generate(graph, [tvm_backend.BACKEND]):
        assert runner.check_candidate(tvm_backend.BACKEND, c.subgraph.extract(), c.pattern, "cuda") is None
