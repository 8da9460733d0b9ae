"""Substitution rules (collage.placing.substitute): each computes what its source computed, fires where
it should and not on a near miss; and MetaFlow's backtracking search finds what brute force
finds, greedily at alpha = 1."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from collage.placing import substitute
from collage.model.graph import DataflowGraph
from collage.measuring.build import build_vm

RNG = np.random.default_rng(0)


def const(*shape):
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def module(inputs: dict[str, tuple[int, ...]], body) -> tvm.IRModule:
    """A module whose ``main`` takes float32 ``inputs`` and binds what ``body(emit, *vars)``
    emits, in a dataflow block; ``body`` returns the result."""
    params = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in inputs.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb.emit, *params))
        bb.emit_func_output(out)
    return bb.get()


def outputs(mod: tvm.IRModule, arrays) -> list[np.ndarray]:
    result = build_vm(mod, "llvm")["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [r.numpy() for r in result] if isinstance(result, tvm_ffi.Array | tuple | list) else [result.numpy()]


def sites(rule, mod):
    return list(rule.sites(DataflowGraph.from_module(mod)))


X = {"x": (1, 8, 10, 10)}
TOKENS = {"x": (1, 6, 16)}


def two_convs(padding_3x3=1):
    """An Inception branch pair: a 1x1 and a 3x3 convolution of the same input, each with its
    bias and ReLU, concatenated."""

    def branch(emit, x, channels, kernel, padding):
        conv = emit(relax.op.nn.conv2d(x, const(channels, 8, kernel, kernel), padding=padding))
        return emit(relax.op.nn.relu(emit(relax.op.add(conv, const(1, channels, 1, 1)))))

    def body(emit, x):
        branches = [branch(emit, x, 4, 1, 0), branch(emit, x, 6, 3, padding_3x3)]
        # Unpadded, the 3x3 branch is smaller: the two are returned side by side instead.
        return relax.op.concat(branches, axis=1) if padding_3x3 == 1 else relax.Tuple(branches)

    return module(X, body)


def two_3x3_convs(strides=1):
    def body(emit, x):
        a = emit(relax.op.nn.conv2d(x, const(4, 8, 3, 3), padding=1))
        b = emit(relax.op.nn.conv2d(x, const(6, 8, 3, 3), strides=strides, padding=1))
        return relax.Tuple([a, b])

    return module(X, body)


def conv_chain(between):
    def body(emit, x):
        h = emit(relax.op.nn.conv2d(x, const(12, 8, 3, 3), padding=1))
        h = emit(between(h))
        return relax.op.nn.conv2d(h, const(5, 12, 1, 1))

    return module(X, body)


def matmul_chain(second_weight=None):
    inputs = dict(TOKENS, **({"w": (24, 10)} if second_weight == "parameter" else {}))

    def body(emit, x, *w):
        h = emit(relax.op.add(emit(relax.op.matmul(x, const(16, 24))), const(24)))
        return relax.op.matmul(h, w[0] if w else const(24, 10))

    return module(inputs, body)


def qkv(same_input=True):
    inputs = dict(TOKENS, **({} if same_input else {"y": (1, 6, 16)}))

    def body(emit, x, *y):  # a near miss: the key projection reads another input, no value
        q = emit(relax.op.matmul(x, const(16, 8)))
        k = emit(relax.op.matmul(y[0] if y else x, const(16, 8)))
        v = [emit(relax.op.matmul(x, const(16, 12)))] if same_input else []
        return relax.Tuple([q, k, *v])

    return module(inputs, body)


def split_then(first_op, second_op):
    def body(emit, x):
        parts = emit(relax.op.split(x, [3], axis=1))
        a = emit(first_op(emit(relax.TupleGetItem(parts, 0))))
        b = emit(second_op(emit(relax.TupleGetItem(parts, 1))))
        return relax.Tuple([a, b])

    return module(X, body)


def split_of_concat(cut):
    inputs = {"a": (1, 3, 4, 4), "b": (1, 5, 4, 4)}

    def body(emit, a, b):
        joined = emit(relax.op.concat([emit(relax.op.nn.relu(a)), b], axis=1))
        parts = emit(relax.op.split(joined, [cut], axis=1))
        return relax.Tuple([emit(relax.TupleGetItem(parts, 0)), emit(relax.TupleGetItem(parts, 1))])

    return module(inputs, body)


def concat_of_split(order):
    inputs = {"y": (1, 8, 4, 4), "z": (1, 2, 4, 4)}

    def body(emit, y, z):
        parts = emit(relax.op.split(emit(relax.op.nn.relu(y)), [3], axis=1))
        items = [emit(relax.TupleGetItem(parts, k)) for k in order]
        return relax.op.concat([*items, z], axis=1)

    return module(inputs, body)


def relu(x):
    return relax.op.nn.relu(x)


# (rule, a module where it must fire, one where it must not)
CASES = {
    "merge_parallel_conv2d": (substitute.MERGE_PARALLEL_CONV2D, two_3x3_convs(), two_3x3_convs(strides=2)),
    "enlarge_conv_kernel": (substitute.ENLARGE_CONV_KERNEL, two_convs(), two_convs(padding_3x3=0)),
    "merge_parallel_matmul": (substitute.MERGE_PARALLEL_MATMUL, qkv(), qkv(same_input=False)),
    "fold_conv_into_conv1x1": (
        substitute.FOLD_CONV_INTO_CONV1X1,
        conv_chain(lambda h: relax.op.add(h, const(1, 12, 1, 1))),
        conv_chain(relu),
    ),
    "fold_matmul_into_matmul": (substitute.FOLD_MATMUL_INTO_MATMUL, matmul_chain(), matmul_chain("parameter")),
    "elementwise_before_split": (
        substitute.ELEMENTWISE_BEFORE_SPLIT, split_then(relu, relu), split_then(relu, relax.op.sigmoid)
    ),
    "split_of_concat": (substitute.SPLIT_OF_CONCAT, split_of_concat(3), split_of_concat(4)),
    "concat_of_split": (substitute.CONCAT_OF_SPLIT, concat_of_split([0, 1]), concat_of_split([1, 0])),
}


def test_every_default_rule_has_cases():
    assert {rule.name for rule in substitute.DEFAULT_RULES} == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_rule_fires_and_computes_the_same(name):
    rule, fires, _ = CASES[name]
    found = sites(rule, fires)
    assert found and all(site.rule == name for site in found)
    arrays = [RNG.standard_normal(runner_shape(p)).astype("float32") for p in fires["main"].params]
    expected = outputs(fires, arrays)
    for site in found:
        rewritten = substitute.apply(DataflowGraph.from_module(fires), site)
        assert not tvm_ffi.structural_equal(rewritten, fires)
        for got, want in zip(outputs(rewritten, arrays), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_rule_leaves_a_near_miss_alone(name):
    rule, _, near_miss = CASES[name]
    assert sites(rule, near_miss) == []


def runner_shape(param):
    return tuple(int(d) for d in param.ty.shape)


# ---------------------------------------------------------------------------- the search


def price(mod: tvm.IRModule) -> float:
    """A test-only cost: a convolution costs 10 plus its kernel's area, a split 1, a tuple
    access nothing, any other operator 2. Enlarging a 1x1 kernel is then a slower step, and merging
    the enlarged convolution with its sibling a faster one."""
    total = 0.0
    for node in DataflowGraph.from_module(mod):
        if node.op == "relax.nn.conv2d":
            total += 10 + int(np.prod([int(d) for d in node.call.args[1].ty.shape][2:]))
        elif node.op != "tuple_get_item":
            total += 1 if node.op == "relax.split" else 2
    return total


def reachable(mod: tvm.IRModule) -> list[tvm.IRModule]:
    """Every graph the default rules reach from ``mod``, by brute force."""
    found = {substitute.graph_key(mod): mod}
    todo = [mod]
    while todo:
        graph = DataflowGraph.from_module(todo.pop())
        for rule in substitute.DEFAULT_RULES:
            for site in rule.sites(graph):
                new = substitute.apply(graph, site)
                if substitute.graph_key(new) not in found:
                    found[substitute.graph_key(new)] = new
                    todo.append(new)
    return list(found.values())


@pytest.mark.parametrize("make", [two_convs, two_3x3_convs, qkv], ids=["inception", "parallel_3x3", "qkv"])
def test_search_with_a_large_alpha_finds_the_brute_force_optimum(make):
    mod = make()
    optimum = min(price(m) for m in reachable(mod))
    result = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=2.0)
    assert result.best_cost == optimum == price(result.best) < price(mod)
    assert result.stopped_by == "exhausted" and result.initial_cost == price(mod) and not result.failed


def test_alpha_one_is_greedy():
    # The inception pair improves only through a slower step (the 1x1 kernel enlarged):
    # greedily, nothing is kept; relaxed, the merge is found.
    mod = two_convs()
    greedy = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=1.0)
    assert greedy.best_cost == price(mod) and greedy.applied == () and greedy.explored == 1
    assert greedy.pruned == greedy.costed - 1  # every graph it saw was worse, none expanded
    relaxed = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=1.25)
    assert [step.rule for step in relaxed.applied[:2]] == ["enlarge_conv_kernel", "merge_parallel_conv2d"]
    assert relaxed.best_cost < price(mod)
    # Where every step improves, greedy goes all the way.
    direct = two_3x3_convs()
    assert substitute.search(direct, substitute.DEFAULT_RULES, price, alpha=1.0).best_cost == min(
        price(m) for m in reachable(direct)
    )


def test_the_best_graph_computes_what_the_input_did_and_replays():
    mod = two_convs()
    result = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=1.25)
    arrays = [RNG.standard_normal(X["x"]).astype("float32")]
    np.testing.assert_allclose(outputs(result.best, arrays)[0], outputs(mod, arrays)[0], rtol=1e-4, atol=1e-4)
    # The steps found rebuild the same graph (how a saved placement of it is loaded).
    replayed = substitute.replay(mod, result.applied, substitute.DEFAULT_RULES)
    assert substitute.graph_key(replayed) == substitute.graph_key(result.best)
    with pytest.raises(ValueError, match="does not apply at nodes"):
        substitute.replay(mod, [substitute.Step("merge_parallel_conv2d", (0, 1))], substitute.DEFAULT_RULES)


def test_budgets_stop_the_search_with_the_best_so_far():
    mod = two_convs()
    by_graphs = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=2.0, max_graphs=3)
    assert by_graphs.stopped_by == "graph budget" and by_graphs.costed == 3
    by_time = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=2.0, budget_s=0.0)
    assert by_time.stopped_by == "time budget" and by_time.best is mod and by_time.costed == 1
    with pytest.raises(ValueError, match="alpha must be at least 1"):
        substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=0.9)


# ---------------------------------------------------------------------------- the split


def two_modules(kernels=(1, 3)):
    """Two Inception-style modules one after the other: each convolves its input with two
    kernels (bias and ReLU after each) and concatenates the branches."""

    def block(emit, x, channels):
        branches = []
        for out, kernel in zip((4, 6), kernels):
            conv = emit(relax.op.nn.conv2d(x, const(out, channels, kernel, kernel), padding=kernel // 2))
            branches.append(emit(relax.op.nn.relu(emit(relax.op.add(conv, const(1, out, 1, 1))))))
        return relax.op.concat(branches, axis=1)

    return module(X, lambda emit, x: block(emit, emit(block(emit, x, 8)), 10))


def test_the_cut_lies_where_the_fewest_sites_cross():
    # Bindings 0-6 and 7-13 are the two modules; the only sites merge convolutions 0 and 3,
    # and 7 and 10, so points 1-3 and 8-10 each cut one site.
    graph = DataflowGraph.from_module(two_modules(kernels=(3, 3)))
    crossing = substitute.split.crossings(graph, substitute.DEFAULT_RULES)
    assert crossing.tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0]
    # Of the middle third (points 4-10), the uncut points are 4-7: the middle one is taken.
    assert substitute.cut_points(graph, substitute.DEFAULT_RULES, threshold=10) == [6]
    assert substitute.cut_points(graph, substitute.DEFAULT_RULES, threshold=14) == []
    # Pieces of at most 3 bindings: recursively; where every point of a range's middle third
    # cuts a site (range 6-12, points 8-10), one site is given up.
    assert substitute.cut_points(graph, substitute.DEFAULT_RULES, threshold=3) == [2, 4, 6, 9, 12]


def test_searching_in_pieces_finds_what_the_whole_search_finds():
    mod = two_modules()
    whole = substitute.search(mod, substitute.DEFAULT_RULES, price, alpha=1.25)
    pieces = substitute.search_in_pieces(mod, substitute.DEFAULT_RULES, price, alpha=1.25, threshold=10, window=2)
    assert pieces.best_cost == whole.best_cost < price(mod) and not pieces.failed
    # Its steps are in whole-graph indices: replayed, they rebuild the graph it returned.
    replayed = substitute.replay(mod, pieces.applied, substitute.DEFAULT_RULES)
    assert substitute.graph_key(replayed) == substitute.graph_key(pieces.best)
    arrays = [RNG.standard_normal(X["x"]).astype("float32")]
    np.testing.assert_allclose(outputs(pieces.best, arrays)[0], outputs(mod, arrays)[0], rtol=1e-4, atol=1e-4)
