"""The pattern generator on small hand-built graphs: exact candidate sets."""

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R

from collage.candidates.backend import GRAPH_LEVEL, OP_LEVEL, Backend, BackendSet, default_backends
from collage.candidates.generate import MAX_GROUPS_PER_SEED, generate, grow_rule, match_pattern, region_parts, regions
from collage.model.graph import DataflowGraph
from collage.candidates.pattern import Pattern, PatternRule
from collage.candidates.subgraph import SubGraph
from collage.patterns.fusion import anchor_then_elementwise
from collage.patterns.op_kinds import OpKind, op_kind


def any_op(graph, node):
    return True


TVM_RULE = PatternRule("test.fused", any_op, anchor_then_elementwise)


def sets(subgraphs):
    return {frozenset(s.nodes) for s in subgraphs}


def S(*nodes):
    return frozenset(nodes)


# fmt: off
@I.ir_module
class Diamond:
    @R.function
    def main(x: R.Tensor((1, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)   # 0 anchor
            b = R.nn.relu(a)     # 1
            c = R.exp(a)         # 2
            d = R.add(b, c)      # 3
            R.output(d)
        return d


@I.ir_module
class TwoMatmuls:
    @R.function
    def main(x: R.Tensor((1, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)   # 0
            b = R.nn.relu(a)     # 1
            c = R.matmul(b, w)   # 2: a second anchor, fusion must stop before it
            d = R.nn.relu(c)     # 3
            R.output(d)
        return d


@I.ir_module
class SplitJoin:
    @R.function
    def main(x: R.Tensor((1, 8), "float32")):
        with R.dataflow():
            s = R.split(x, 2, axis=1)   # 0: a tuple value
            s0 = s[0]                   # 1
            s1 = s[1]                   # 2
            t = R.add(s0, s1)           # 3
            u = R.nn.relu(t)            # 4
            out = (t, u)                # packs the results: not a node
            R.output(out)
        return out


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.negative(b)
            d = R.sigmoid(c)
            e = R.tanh(d)
            R.output(e)
        return e


@I.ir_module
class ConvBlocks:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w1: R.Tensor((4, 4, 3, 3), "float32"),
             w2: R.Tensor((4, 1, 3, 3), "float32"), b: R.Tensor((1, 4, 1, 1), "float32")):
        with R.dataflow():
            c1 = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])            # 0
            a1 = R.add(c1, b)                                       # 1
            r1 = R.nn.relu(a1)                                      # 2
            c2 = R.nn.conv2d(r1, w2, padding=[1, 1, 1, 1], groups=4)  # 3: depthwise
            a2 = R.add(c2, b)                                       # 4
            r2 = R.nn.relu(a2)                                      # 5
            c3 = R.nn.conv2d(r2, w1, padding=[1, 1, 1, 1])          # 6
            a3 = R.add(c3, b)                                       # 7
            r3 = R.nn.relu(a3)                                      # 8
            y = R.add(r3, a3)                                       # 9: a3 has a second consumer
            R.output(y)
        return y
# fmt: on


def conv_bias_relu(name, check=None):
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    pat = is_op("relax.nn.relu")(is_op("relax.add")(conv, wildcard()))
    return Pattern(name, pat, {"conv": conv}, check)


# ------------------------------------------------------------------ graph and sub-graph


def test_graph_indexes_bindings_in_order():
    g = DataflowGraph.from_module(Diamond)
    assert g.ops() == ["relax.matmul", "relax.nn.relu", "relax.exp", "relax.add"]
    assert g[3].inputs == (1, 2)
    assert g.consumers[0] == (1, 2)
    assert g.outputs == {3}


def test_a_graphs_input_bytes_are_its_parameters_and_constants_once_each():
    """What one call reads at the least (a GPU candidate's timing flushes the cache where a
    model's exceed it): weights count the same as parameters or bound as constants, and a
    weight read twice counts once."""
    as_parameters = DataflowGraph.from_module(TwoMatmuls)
    assert as_parameters.input_bytes == (1 * 8 + 8 * 8) * 4
    w = np.ones((8, 8), "float32")
    bound = DataflowGraph.from_module(relax.transform.BindParams("main", {"w": w})(TwoMatmuls))
    assert bound.input_bytes == as_parameters.input_bytes


def test_convexity():
    g = DataflowGraph.from_module(Diamond)
    assert not SubGraph(g, S(0, 3)).is_convex()  # 0 -> 1 -> 3 leaves and comes back
    assert not SubGraph(g, S(0, 1, 3)).is_convex()  # through 2
    assert SubGraph(g, S(0, 1, 2)).is_convex()
    assert not SubGraph(g, S(1, 2)).is_connected()


def test_depth_counts_the_operators_on_the_longest_path():
    g = DataflowGraph.from_module(Diamond)  # 0 -> 1 -> 3 and 0 -> 2 -> 3
    assert [SubGraph(g, S(*nodes)).depth for nodes in ((0,), (1, 2), (0, 1, 2), (0, 1, 2, 3))] == [1, 1, 2, 3]


def test_convexity_is_the_definition_on_every_node_set_of_a_branching_graph():
    # No path from a member through a non-member back to a member, checked by walking every
    # path: what the descendants' masks answer in a few operations.
    g = DataflowGraph.from_module(Diamond)
    extended = [(i, j) for i in range(len(g)) for j in g.consumers[i]]

    def paths_from(i):
        return [[i]] + [[i, *rest] for a, b in extended if a == i for rest in paths_from(b)]

    for size in range(1, len(g) + 1):
        for nodes in itertools.combinations(range(len(g)), size):
            leaves_and_returns = any(
                p[0] in nodes and p[-1] in nodes and any(k not in nodes for k in p[1:-1])
                for i in nodes for p in paths_from(i))  # fmt: skip
            assert SubGraph(g, frozenset(nodes)).is_convex() == (not leaves_and_returns), nodes


def test_sub_graph_boundary_and_extraction_runs():
    g = DataflowGraph.from_module(Diamond)
    sub = SubGraph(g, S(0, 1, 2))
    assert sub.outputs == (1, 2)  # both feed node 3: a tuple-returning function
    assert [v.name for v in sub.inputs] == ["x", "w"]
    mod = tvm.IRModule({"main": sub.extract()})
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 8), dtype="float32"), rng.standard_normal((8, 8), dtype="float32")
    relu, exp = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w))
    np.testing.assert_allclose(relu.numpy(), np.maximum(x @ w, 0), rtol=1e-5)
    np.testing.assert_allclose(exp.numpy(), np.exp(x @ w), rtol=1e-5)


def test_structural_key_ignores_weights_and_place_but_not_shape():
    g = DataflowGraph.from_module(ConvBlocks)
    first, third = SubGraph(g, S(0, 1)), SubGraph(g, S(6, 7))  # conv + bias, one output each
    depthwise = SubGraph(g, S(3, 4))
    assert first.structural_key == third.structural_key
    assert first.structural_key != depthwise.structural_key
    # The same ops with one more output (a3 is also read by node 9) compile differently.
    assert SubGraph(g, S(0, 1, 2)).structural_key != SubGraph(g, S(6, 7, 8)).structural_key


def test_structural_key_reads_any_element_of_an_axis_alike():
    # An unrolled loop reads one step per element (Mamba's scan: x[:, :, i]); which element a
    # kernel reads changes neither its code's shape nor its cost, the axis does.
    x = relax.Var("x", relax.TensorType((2, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            reads = [relax.op.take(x, relax.const(i, "int64"), axis) for i, axis in ((0, 1), (5, 1), (3, 2))]
            out = bb.emit_output(relax.Tuple([bb.emit(relax.op.exp(bb.emit(r))) for r in reads]))
        bb.emit_func_output(out)
    g = DataflowGraph.from_module(bb.get())
    step0, step5, across = (SubGraph(g, S(i, i + 1)).structural_key for i in (0, 2, 4))
    assert step0 == step5 and step0 != across
    # The kernels compiled still read their own element: only the key forgets it.
    assert "R.const(5" in SubGraph(g, S(2, 3)).extract().script(show_meta=False)


def test_op_kinds_come_from_tvm():
    g = DataflowGraph.from_module(SplitJoin)
    kinds = [op_kind(g, n) for n in g]
    assert kinds[3] == OpKind.BROADCAST or kinds[3] == OpKind.ELEMWISE  # add
    assert kinds[0] == OpKind.INJECTIVE  # split
    assert op_kind(DataflowGraph.from_module(Diamond), DataflowGraph.from_module(Diamond)[0]) == OpKind.OUT_ELEMWISE_FUSABLE


# ------------------------------------------------------------------ pattern rules


def test_rule_on_diamond():
    g = DataflowGraph.from_module(Diamond)
    assert sets(grow_rule(g, TVM_RULE)) == {
        S(0), S(0, 1), S(0, 2), S(0, 1, 2), S(0, 1, 2, 3),  # matmul and its post-ops
        S(1), S(2), S(3), S(1, 3), S(2, 3), S(1, 2, 3),  # element-wise groups
    }  # fmt: skip


def test_rule_does_not_fuse_across_an_anchor():
    g = DataflowGraph.from_module(TwoMatmuls)
    assert sets(grow_rule(g, TVM_RULE)) == {S(0), S(0, 1), S(1), S(2), S(2, 3), S(3)}


def test_rule_keeps_max_size():
    g = DataflowGraph.from_module(Chain)
    rule = PatternRule("test.pairs", any_op, anchor_then_elementwise, max_size=2)
    assert sets(grow_rule(g, rule)) == {S(i) for i in range(5)} | {S(i, i + 1) for i in range(4)}


def test_rule_with_tuples_and_tuple_output():
    g = DataflowGraph.from_module(SplitJoin)
    assert len(g) == 5 and g.outputs == {3, 4}
    found = sets(grow_rule(g, TVM_RULE))
    assert S(0, 1, 2, 3, 4) in found  # split, both items, add, relu: one injective group
    assert S(0, 1, 2) in found and S(1, 2) not in found  # not connected without the split
    assert S(0, 1) not in found  # the split's tuple would cross the boundary
    assert S(0) not in found  # nor can a group end in a tuple
    assert SubGraph(g, S(3, 4)).outputs == (3, 4)  # both are function outputs


def test_densely_connected_element_wise_ops_grow_a_bounded_number_of_groups():
    # Each op reads the two before it (an unrolled LSTM's gates are as dense): the connected
    # groups of up to 8 are countless, and growing them all never finished.
    from collage.candidates.generate import GROUPS_PER_NODE, GROUPS_PER_SEED_PAST_BUDGET

    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            values = [bb.emit(relax.op.sigmoid(x)), bb.emit(relax.op.tanh(x))]
            for k in range(120):
                op = (relax.op.add, relax.op.multiply)[k % 2]
                values.append(bb.emit(op(values[-1], values[-2])))
            out = bb.emit_output(values[-1])
        bb.emit_func_output(out)
    graph = DataflowGraph.from_module(bb.get())
    grown = sets(grow_rule(graph, TVM_RULE))
    assert len(grown) <= (GROUPS_PER_NODE + GROUPS_PER_SEED_PAST_BUDGET) * len(graph)
    assert {S(i) for i in range(len(graph))} <= grown  # every op keeps its own kernel
    assert sum(len(g) == 2 for g in grown) >= len(graph) - 2  # and its fusions with a neighbour
    assert max(len(g) for g in grown) == TVM_RULE.max_size  # early seeds still grow large groups


def test_seeds_stopped_at_the_cap_are_counted_for_the_report():
    # One value read by 24 element-wise ops: its groups of up to 8 number C(24, 7) and more.
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.exp(x))
            out = bb.emit_output(relax.Tuple([bb.emit(relax.op.multiply(y, relax.const(float(k)))) for k in range(24)]))
        bb.emit_func_output(out)
    capped: dict[str, int] = {}
    grow_rule(DataflowGraph.from_module(bb.get()), TVM_RULE, capped)
    assert capped == {}  # nothing grown yet: grow_rule is a generator
    grown = sets(grow_rule(DataflowGraph.from_module(bb.get()), TVM_RULE, capped))
    assert capped == {TVM_RULE.name: 1} and len(grown) >= MAX_GROUPS_PER_SEED  # the shared producer's seed
    within: dict[str, int] = {}
    generate(DataflowGraph.from_module(Diamond), default_backends(), within)
    assert within == {}


def test_a_wide_join_is_grown_with_none_of_its_producers_or_all():
    # torch.stack over 64 steps of a scan: taken one at a time, the stack's producers' subsets
    # were 40,000 candidates of one model. As Collage's tuple combiner does, a group holding
    # the join holds none of its producers or all of them.
    from collage.candidates.generate import WIDE_JOIN

    n = WIDE_JOIN + 4
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            steps = [bb.emit(relax.op.multiply(x, relax.const(float(k)))) for k in range(n)]
            joined = bb.emit(relax.op.concat(steps, axis=0))
            out = bb.emit_output(relax.op.nn.relu(joined))
        bb.emit_func_output(out)
    g = DataflowGraph.from_module(bb.get())
    producers, join = set(range(n)), n
    grown = sets(grow_rule(g, TVM_RULE))
    assert all(len(group & producers) in (0, n) for group in grown if join in group)
    assert {S(join), S(join, join + 1), S(*producers, join), S(*producers, join, join + 1)} <= grown
    assert {S(k) for k in producers} | {S(join + 1)} <= grown  # each op keeps its own kernel
    assert len(grown) == n + 5


def test_valid_op_limits_the_rule():
    g = DataflowGraph.from_module(Diamond)
    no_exp = PatternRule("test.no_exp", lambda graph, n: n.op != "relax.exp", anchor_then_elementwise)
    assert sets(grow_rule(g, no_exp)) == {S(0), S(0, 1), S(1), S(3), S(1, 3)}


def test_engine_regions_are_the_largest_groups_it_accepts():
    g = DataflowGraph.from_module(Chain)  # exp, relu, negative, sigmoid, tanh
    pairs = PatternRule("test.pairs", lambda graph, n: n.op != "relax.sigmoid", anchor_then_elementwise, max_size=2)
    # Sigmoid (3) splits the chain: {0, 1, 2} is larger than the rule grows; {4} is not.
    assert sets(regions(g, pairs)) == {S(0, 1, 2)}
    engine = Backend("engine", GRAPH_LEVEL, ("llvm",), compile=None, rules=(pairs,))
    library = Backend("library", OP_LEVEL, ("llvm",), compile=None, rules=(pairs,))
    found = {(c.backend, c.pattern, c.subgraph.nodes) for c in generate(g, [engine, library])}
    assert ("engine", "engine.region", S(0, 1, 2)) in found
    assert not any(pattern.endswith(".region") for backend, pattern, _ in found if backend == "library")


def test_a_region_an_op_it_refuses_splits_around_a_residual_path_is_cut_on_either_side():
    # exp, relu, sigmoid (refused), add(relu, sigmoid), tanh: the ops the rule takes are
    # connected through the add, but not convex (relu -> sigmoid -> add leaves and comes back).
    # Before this cut, the engine had no region at all: Mamba's scan kernel sits so.
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.exp(x))))
            b = bb.emit(relax.op.sigmoid(a))
            out = bb.emit_output(relax.op.tanh(bb.emit(relax.op.add(a, b))))
        bb.emit_func_output(out)
    g = DataflowGraph.from_module(bb.get())
    no_sigmoid = PatternRule("test.no_sigmoid", lambda graph, n: n.op != "relax.sigmoid", anchor_then_elementwise,
                             max_size=1)
    assert sets(regions(g, no_sigmoid)) == {S(0, 1), S(3, 4)}
    assert all(SubGraph(g, piece).is_convex() for piece in sets(regions(g, no_sigmoid)))


def test_region_parts_are_cut_where_one_tensor_crosses():
    chain = DataflowGraph.from_module(Chain)
    whole = SubGraph(chain, S(0, 1, 2, 3, 4))
    assert [p.nodes for p in region_parts(whole, cuts=1)] == [S(0, 1), S(2, 3, 4)]
    assert len(list(region_parts(whole, cuts=4))) == 8  # in a chain every place is a cut
    # After the matmul only `a` crosses; after relu, or exp, two tensors do.
    diamond = DataflowGraph.from_module(Diamond)
    assert [p.nodes for p in region_parts(SubGraph(diamond, S(0, 1, 2, 3)), cuts=3)] == [S(0), S(1, 2, 3)]


def test_an_engine_gets_the_parts_of_its_regions_larger_than_its_rule_grows():
    g = DataflowGraph.from_module(Chain)
    pairs = PatternRule("test.pairs", any_op, anchor_then_elementwise, max_size=2)
    engine = Backend("engine", GRAPH_LEVEL, ("llvm",), compile=None, rules=(pairs,))
    parts = {c.subgraph.nodes for c in generate(g, [engine]) if c.pattern == "engine.part"}
    assert parts == {S(0, 1, 2), S(0, 1, 2, 3), S(1, 2, 3, 4), S(2, 3, 4)}


# ------------------------------------------------------------------ explicit patterns


def test_pattern_matches_every_place():
    g = DataflowGraph.from_module(ConvBlocks)
    assert sets(match_pattern(g, conv_bias_relu("test.cbr"))) == {S(0, 1, 2), S(3, 4, 5)}
    # (6, 7, 8) is not a match: a3 (7) is also read by 9, and a fused kernel cannot emit it.


def test_pattern_check_rejects():
    g = DataflowGraph.from_module(ConvBlocks)
    dense_only = conv_bias_relu("test.cbr", check=lambda m: int(m["conv"].attrs.groups) == 1)
    assert sets(match_pattern(g, dense_only)) == {S(0, 1, 2)}


def test_generate_names_backend_and_pattern():
    g = DataflowGraph.from_module(ConvBlocks)
    lib = Backend("lib", OP_LEVEL, ("llvm",), compile=None, patterns=(conv_bias_relu("lib.cbr"),))
    cands = generate(g, [lib])
    assert [(c.backend, c.pattern, sorted(c.subgraph.nodes)) for c in cands] == [
        ("lib", "lib.cbr", [0, 1, 2]),
        ("lib", "lib.cbr", [3, 4, 5]),
    ]
    assert cands[0].key != cands[1].key  # depthwise vs dense convolution


# ------------------------------------------------------------------ backend records


def test_backend_record_validates():
    with pytest.raises(ValueError, match="kind"):
        Backend("x", "fast", ("llvm",), compile=None)
    with pytest.raises(ValueError, match="target"):
        Backend("x", OP_LEVEL, ("tpu",), compile=None)
    with pytest.raises(ValueError, match="x.<what>"):
        Backend("x", OP_LEVEL, ("llvm",), compile=None, patterns=(conv_bias_relu("y.cbr"),))


def test_backend_set_excludes_with_reasons():
    ok = Backend("ok", OP_LEVEL, ("llvm",), compile=None)
    gpu = Backend("gpu", OP_LEVEL, ("cuda",), compile=None)
    missing = Backend("missing", GRAPH_LEVEL, ("llvm",), compile=None, requires=("no_such_library_xyz",))
    usable, excluded = BackendSet([ok, gpu, missing]).usable("llvm")
    assert [b.name for b in usable] == ["ok"]
    assert excluded == {
        "gpu": "does not serve target 'llvm'",
        "missing": "missing Python module(s): no_such_library_xyz",
    }
    with pytest.raises(KeyError, match="registered: ok"):
        BackendSet([ok])["nope"]
