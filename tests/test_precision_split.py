"""An engine alone over the accuracy budget in a reduced precision is split: float32 up to the
earliest cut the forecast finds within the budget, the reduced precision after it."""

import numpy as np
import pytest
import tvm
from tvm import relax

import collage
from collage.candidates.backend import GRAPH_LEVEL, Backend, BackendSet, default_backends
from collage.candidates.fx_convert import convertible, to_fx
from collage.assembling.checked import assemble_and_check
from collage.candidates.generate import Candidate, split_at
from collage.candidates.pattern import PatternRule
from collage.candidates.precision import BFLOAT16, FLOAT32, INT8, TF32
from collage.candidates.subgraph import SubGraph
from collage.choosing.precision_split import Forecast, NoSplit, split_in_precision
from collage.measuring.arrays import Reference, numpy_outputs, relative_error, to_tensors
from collage.measuring.cost import Cost
from collage.measuring.cost_log import CostLog
from collage.measuring.runner import InProcess
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition, Placement
from collage.record import FinalistKind, FinalistName
from tests.test_precision import FAST, _Flat

LAYERS, WIDTH = 12, 64


def deep_chain(layers: int = LAYERS, width: int = WIDTH, seed: int = 0) -> tvm.IRModule:
    """``tanh(h @ W)`` ``layers`` times, with weights of gain 2: each layer stretches what the
    ones before it got wrong, as a deep network's early layers' errors grow through it."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                w = (rng.standard_normal((width, width)) * 2 / np.sqrt(width)).astype("float32")
                h = bb.emit(relax.op.tanh(relax.op.matmul(h, relax.const(w))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def compile_eager(func, pattern, target, threads, precision=FLOAT32):
    """A test engine: collage's conversion of ``func`` run by PyTorch, eager, under autocast
    in a reduced precision; the math the forecast assumes."""
    import torch

    module, inputs = to_fx(func), len(func.params)

    def kernel(*tensors):
        args = [torch.from_dlpack(t) for t in tensors[:inputs]]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == BFLOAT16):
            outputs = module(*args)
        for out, into in zip(outputs, tensors[inputs:]):
            torch.from_dlpack(into).copy_(out)

    return kernel


EAGER = Backend(name="eager", kind=GRAPH_LEVEL, targets=("llvm",), compile=compile_eager,
                rules=(PatternRule("eager.ops", convertible, lambda group, node: True),),
                library="PyTorch eager", precisions=lambda target: (BFLOAT16,))  # fmt: skip


def x_and_reference(mod):
    x = np.random.default_rng(1).standard_normal((4, WIDTH)).astype("float32")
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), tvm.cpu())
    return x, vm["main"](tvm.runtime.tensor(x)).numpy()


def test_the_forecast_errs_less_the_later_the_cut_and_as_much_as_the_engine_split_there():
    mod = deep_chain()
    graph, (x, reference) = DataflowGraph.from_module(mod), x_and_reference(mod)
    region, draw = SubGraph(graph, frozenset(range(len(graph)))), Reference([x], [reference])
    forecast = Forecast(graph, [draw], BFLOAT16, "cpu")
    early, late = forecast.error(region, 1), forecast.error(region, len(graph) - 4)
    assert late < early / 4 and early > 1e-2
    # The engine itself split there: the error forecast.
    sides = zip(split_at(region, 5), (FLOAT32, BFLOAT16))
    partitions = tuple(Partition(Candidate(side, "eager", "eager.part", at), Cost.of(0.01)) for side, at in sides)
    backends = BackendSet([default_backends()["tvm"], EAGER])
    built = assemble_and_check(graph, Placement(graph, partitions), draw, backends, "llvm", 1, 1.0, held_to_budget=True)
    assert [p.candidate.precision for p in built.partitions] == [FLOAT32, BFLOAT16] and not built.fallbacks
    error = relative_error(numpy_outputs(built.vm["main"](*to_tensors([x]))), [reference])
    # The engine's autocast leaves tanh on bfloat16 values, the forecast in float32: 3% apart here.
    assert error == pytest.approx(forecast.error(region, 5), rel=0.1)


def test_tf32_is_forecast_closer_than_bfloat16_and_int8_not_at_all():
    mod = deep_chain()
    graph, (x, reference) = DataflowGraph.from_module(mod), x_and_reference(mod)
    region, draws = SubGraph(graph, frozenset(range(len(graph)))), [Reference([x], [reference])]
    tf32, bf16 = (Forecast(graph, draws, p, "cpu").error(region, 1) for p in (TF32, BFLOAT16))
    assert 0 < tf32 < bf16 / 4  # 10 bits of mantissa against 7
    with pytest.raises(NoSplit, match="no forecast of int8"):
        Forecast(graph, [], INT8, "cpu")


def optimize(mod, tmp_path, accuracy):
    return collage.optimize(mod, backends=BackendSet([default_backends()["tvm"], EAGER]), accuracy=accuracy,
                            cost_log=CostLog(tmp_path / "c.sqlite"), timing=FAST, progress=False, runner=InProcess())  # fmt: skip


def test_an_engine_over_the_budget_computes_its_first_ops_in_float32_and_the_rest_reduced(tmp_path):
    mod = deep_chain()
    opt = optimize(mod, tmp_path, accuracy=2e-2)
    alone, split = (FinalistName(kind, "eager", precision=BFLOAT16) for kind in (FinalistKind.ENGINE_ALONE, FinalistKind.ENGINE_SPLIT))
    # Whole in bfloat16 it misses the budget; split, it is a finalist within it.
    assert "exceeds the accuracy budget 0.02, measured alone" in opt.record.left_out[str(alone)]
    assert "split into float32 up to op" in opt.record.left_out[str(alone)]
    assert split in opt.record.finalists and opt.record.finalists[split].error <= 2e-2
    x, reference = x_and_reference(mod)
    assert relative_error([opt(x)], [reference]) <= 2e-2


def test_where_even_the_last_cut_misses_the_budget_nothing_is_split_and_float32_is_kept(tmp_path):
    opt = optimize(deep_chain(), tmp_path, accuracy=1e-7)
    alone = FinalistName(FinalistKind.ENGINE_ALONE, "eager", precision=BFLOAT16)
    assert "not split: not within the budget even in float32 up to its last cut" in opt.record.left_out[str(alone)]
    assert all(p.candidate.precision == FLOAT32 for p in opt.placement)


def test_a_cut_after_the_last_product_is_never_made(tmp_path):
    """Past the last convolution or matrix product nothing computes reduced: with the budget
    met only with the model's one product in float32, there is nothing to split."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, WIDTH), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((WIDTH, WIDTH)).astype("float32"))))
            for _ in range(4):
                h = bb.emit(relax.op.tanh(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    opt = optimize(bb.get(), tmp_path, accuracy=1e-5)
    alone = FinalistName(FinalistKind.ENGINE_ALONE, "eager", precision=BFLOAT16)
    assert "not split: no cut leaves a convolution or matrix product to compute reduced" in opt.record.left_out[str(alone)]
    assert all(p.candidate.precision == FLOAT32 for p in opt.placement)
    # A model with no product at all has no cut either (refused before anything is forecast).
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.tanh(bb.emit(relax.op.exp(x)))))
        bb.emit_func_output(out)
    graph = DataflowGraph.from_module(bb.get())
    whole = Candidate(SubGraph(graph, frozenset(range(len(graph)))), "eager", "eager.ops", BFLOAT16)
    with pytest.raises(NoSplit, match="no cut leaves a convolution or matrix product"):
        split_in_precision(whole, [], graph, None, None, None, None)


def compile_rough(func, pattern, target, threads, precision=FLOAT32):
    """A test engine that errs twice as much as PyTorch's bfloat16: what the forecast cannot see."""
    exact, reduced = compile_eager(func, pattern, target, threads), compile_eager(func, pattern, target, threads, precision)

    def kernel(*tensors):
        import torch

        reduced(*tensors)
        if precision == FLOAT32:
            return
        inputs = len(func.params)
        outputs = [torch.from_dlpack(t) for t in tensors[inputs:]]
        rounded = [o.clone() for o in outputs]
        exact(*tensors)
        for out, r in zip(outputs, rounded):
            out.add_(2 * (r - out))  # exact + 2 * (bfloat16 - exact)

    return kernel


ROUGH = Backend(name="rough", kind=GRAPH_LEVEL, targets=("llvm",), compile=compile_rough,
                rules=(PatternRule("rough.ops", convertible, lambda group, node: True),),
                library="PyTorch eager, rougher", precisions=lambda target: (BFLOAT16,))  # fmt: skip


def test_an_engine_that_errs_more_than_forecast_is_split_later_by_as_much():
    from collage.choosing.policy import module_error
    from collage.choosing.precision_split import split_in_precision
    from collage.config import Config

    mod = deep_chain()
    graph, (x, reference) = DataflowGraph.from_module(mod), x_and_reference(mod)
    draws, config = [Reference([x], [reference])], Config(threads=1, accuracy=2e-2)
    error_of = lambda f: module_error(f, draws, "llvm")  # noqa: E731
    cuts = {}
    for engine in (EAGER, ROUGH):
        whole = Candidate(SubGraph(graph, frozenset(range(len(graph)))), engine.name, f"{engine.name}.region", BFLOAT16)
        backends = BackendSet([default_backends()["tvm"], engine])
        split = split_in_precision(whole, draws, graph, _Flat(), backends, config, error_of)
        assert split.error <= 2e-2 and [p.candidate.precision for p in split.finalist.partitions] == [FLOAT32, BFLOAT16]
        cuts[engine.name] = split.cut
    assert cuts["rough"] > cuts["eager"]  # its first try, at the forecast's cut, erred twice the forecast
