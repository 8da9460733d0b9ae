"""The graph-level search space: units, and what a bit string decodes to."""

from tvm.script import ir as I
from tvm.script import relax as R

from collage.candidates.backend import GRAPH_LEVEL, Backend
from collage.candidates.generate import Candidate
from collage.measuring.cost import Cost
from collage.model.graph import DataflowGraph
from collage.placing.offload import OffloadSpace, convex_pieces, in_running_order
from collage.candidates.pattern import PatternRule
from collage.placing.placement import Partition
from collage.candidates.subgraph import SubGraph
from tests.test_placement import Diamond  # exp -> (relu, sigmoid) -> add


def engine_running(*ops: str) -> Backend:
    """A test engine that can run exactly ``ops`` (it is never compiled here)."""
    return Backend(
        name="engine",
        kind=GRAPH_LEVEL,
        targets=("llvm",),
        compile=lambda func, pattern, target, threads: None,
        rules=(PatternRule("engine.any", lambda graph, node: node.op in ops, lambda group, node: True),),
    )


ENGINE = engine_running("relax.exp", "relax.nn.relu", "relax.sigmoid", "relax.add")


def part(graph, backend, *nodes, ms=1.0) -> Partition:
    return Partition(Candidate(SubGraph(graph, frozenset(nodes)), backend, f"{backend}.test"), Cost.of(ms))


def placed(partitions):
    return [(p.backend, sorted(p.nodes)) for p in partitions]


# fmt: off
@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)        # 0
            b = R.nn.relu(a)    # 1
            c = R.tanh(b)       # 2: the engine cannot run tanh
            d = R.exp(c)        # 3
            e = R.nn.relu(d)    # 4
            R.output(e)
        return e

# fmt: on


def chain_placement():
    g = DataflowGraph.from_module(Chain)
    return g, [part(g, "tvm", 0, 1), part(g, "dnnl", 2, 3), part(g, "engine", 4)]


def test_units_are_partitions_the_engine_runs_whole_else_its_ops():
    g, partitions = chain_placement()
    space = OffloadSpace.of(g, partitions, ENGINE)
    # {0, 1} whole; {2, 3} holds tanh, so only 3 is offered; {4} is the engine's already.
    assert space.units == (frozenset({0, 1}), frozenset({3}), frozenset({4}))


def test_zeros_decode_to_the_op_level_placement_and_ones_hand_over_what_the_engine_runs():
    g, partitions = chain_placement()
    space = OffloadSpace.of(g, partitions, ENGINE)
    assert space.decode([0, 0, 0]) == tuple(partitions)
    ones = space.decode(space.all_ones())
    # tanh stays, alone on TVM; 3 and 4 touch and form one engine partition.
    assert placed(ones) == [("engine", [0, 1]), ("tvm", [2]), ("engine", [3, 4])]
    assert ones[1].pattern == "tvm.remainder" and ones[0].pattern == "engine.offload"
    assert ones[0].cost.is_unknown  # a new partition: its cost is what the search measures


def test_an_engine_partition_left_at_zero_keeps_its_own_cost():
    g, partitions = chain_placement()
    space = OffloadSpace.of(g, partitions, ENGINE)
    decoded = space.decode([1, 0, 0])
    assert placed(decoded) == [("engine", [0, 1]), ("dnnl", [2, 3]), ("engine", [4])]
    assert decoded[2] is partitions[2]


def test_offloaded_units_that_touch_merge_into_one_partition():
    g = DataflowGraph.from_module(Diamond)
    partitions = [part(g, "tvm", 0), part(g, "dnnl", 1), part(g, "tvm", 2), part(g, "dnnl", 3)]
    space = OffloadSpace.of(g, partitions, ENGINE)
    assert placed(space.decode([1, 1, 1, 1])) == [("engine", [0, 1, 2, 3])]
    # Offloading 0 and 3 but not the branches: {0, 3} would not be convex, so they stay apart.
    assert placed(space.decode([1, 0, 0, 1])) == [("engine", [0]), ("dnnl", [1]), ("tvm", [2]), ("engine", [3])]


def test_convex_pieces_split_only_where_a_path_leaves_and_comes_back():
    g = DataflowGraph.from_module(Diamond)
    assert convex_pieces(g, frozenset({0, 1, 2, 3})) == [frozenset({0, 1, 2, 3})]
    assert convex_pieces(g, frozenset({0, 1, 3})) == [frozenset({0, 1}), frozenset({3})]


def test_partitions_that_wait_for_each_other_have_no_running_order():
    g = DataflowGraph.from_module(Diamond)
    # {0, 3} on one side and {1, 2} on the other: each needs the other's value first.
    assert in_running_order([part(g, "a", 0, 3), part(g, "b", 1, 2)]) is None
    ordered = in_running_order([part(g, "b", 3), part(g, "a", 1, 2), part(g, "a", 0)])
    assert [sorted(p.nodes) for p in ordered] == [[0], [1, 2], [3]]
