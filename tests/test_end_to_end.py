"""Whole placements measured end to end: checked, timed once, logged, failures as reasons."""

import numpy as np

from collage.candidates.backend import BackendSet, default_backends
from collage.candidates.generate import Candidate
from collage.measuring.cost import Cost
from collage.measuring.cost_log import CostLog
from collage.choosing.end_to_end import EndToEnd, placement_name
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition
from collage.measuring.arrays import Reference, random_inputs
from collage.measuring.build import run_reference
from collage.candidates.subgraph import SubGraph
from collage.measuring.timing import Timing
from tests.backends_for_tests import CANNOT_COMPILE, NUMPY, RAISES_WHEN_RUN, WRONG, CompilesOnlyOnce
from tests.test_optimize import Unary

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.3, budget_s=0.3)
BACKENDS = [default_backends()["tvm"], NUMPY, CANNOT_COMPILE, RAISES_WHEN_RUN, WRONG]


def setup(tmp_path, backends=BACKENDS):
    graph = DataflowGraph.from_module(Unary)  # exp, relu, matmul, sigmoid, exp
    arrays = random_inputs(graph.func, seed=0)
    expected = run_reference(graph.func, arrays)
    log = CostLog(tmp_path / "c.sqlite")
    return EndToEnd(graph, BackendSet(backends), "llvm", Reference(arrays, expected), log, "unary", threads=1, timing=FAST)


def placement(graph, first_backend="numpy"):
    """exp+relu on ``first_backend``, the rest op by op on TVM."""
    head = Partition(Candidate(SubGraph(graph, frozenset({0, 1})), first_backend, f"{first_backend}.chain"), Cost.unknown())
    rest = [Partition(Candidate(SubGraph(graph, frozenset({i})), "tvm", "tvm.op"), Cost.unknown()) for i in (2, 3, 4)]
    return [head, *rest]


def test_a_placement_is_measured_once_then_read_from_memory_and_the_log(tmp_path):
    e2e = setup(tmp_path)
    parts = placement(e2e.graph)
    first = e2e.latency(parts)
    assert first.is_valid and first.median_ms > 0 and e2e.measured == 1
    assert e2e.latency(list(reversed(parts))) == first and e2e.measured == 1  # order does not matter
    again = EndToEnd(e2e.graph, e2e.backends, "llvm", e2e.reference, e2e.log, "unary", 1, FAST)
    assert again.latency(parts) == first and again.measured == 0
    assert e2e.log.get_latency(e2e.key(parts)) == first


def test_failing_placements_get_invalid_costs_with_reasons(tmp_path):
    e2e = setup(tmp_path)
    reasons = {b: e2e.latency(placement(e2e.graph, b)).reason for b in ("cannot_compile", "raises_when_run", "wrong")}
    assert "could not compile cannot_compile.chain" in reasons["cannot_compile"]
    assert "MemoryError: out of scratch space" in reasons["raises_when_run"]
    assert reasons["wrong"].startswith("wrong result")


def test_kernels_are_compiled_once_across_placements(tmp_path):
    once = CompilesOnlyOnce()
    e2e = setup(tmp_path, [default_backends()["tvm"], once.backend])
    parts = placement(e2e.graph, "once")
    assert e2e.latency(parts).is_valid
    # Another placement sharing the kernel: built from the kept kernel, not compiled again.
    other = parts[:1] + [Partition(Candidate(SubGraph(e2e.graph, frozenset({2, 3, 4})), "tvm", "tvm.op"), Cost.unknown())]
    assert e2e.latency(other).is_valid
    assert placement_name(other) != placement_name(parts)
    _, vm = e2e.build(parts)
    assert np.allclose(vm["main"](*[np.asarray(a) for a in e2e.reference.inputs]).numpy(), e2e.reference.outputs[0], rtol=1e-5)
