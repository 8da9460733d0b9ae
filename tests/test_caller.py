"""The user's call (``collage.assembling.caller``): ``opt(x)`` and ``opt.main`` run the module on
buffers of their own, so an engine binds them once, whatever the caller hands over, and the
outputs stay the caller's."""

import threading
import time

import numpy as np
import pytest
import tvm

from collage.assembling.assemble import assemble
from collage.assembling.caller import Caller, CallPath, preferred_path, signature_of, time_call_paths
from collage.candidates.backend import default_backends
from collage.candidates.generate import Candidate
from collage.candidates.subgraph import SubGraph
from collage.measuring.cost import Cost
from collage.measuring.build import build_vm
from collage.measuring.timing import Protocol
from collage.model.graph import DataflowGraph
from collage.placing.placement import Partition
from experiments import models

ENGINES = ("onnxruntime", "openvino")

# The faster of two call paths, as timed here: alone on the machine (``make test``).
pytestmark = pytest.mark.timed


@pytest.fixture(scope="module")
def mlp():
    """The zoo's MLP as torch.export hands it over: ``main`` returns a tuple of one output."""
    w = models.load("mlp")
    return w, DataflowGraph(w.relax["main"]), w.reference()[0]


def caller_for(graph, parts):
    assembly = assemble(graph, parts, default_backends(), "llvm")
    return Caller(build_vm(assembly.module, "llvm"), signature_of(graph.func.params), tvm.cpu(), assembly.module["main"],
                  assembly.kernel_map()), assembly


def engine_alone(graph, engine):
    whole = Candidate(SubGraph(graph, frozenset(range(len(graph)))), engine, f"{engine}.region")
    return [Partition(whole, Cost.of(1.0))]


def engine_then_tvm(graph, engine):
    split = next(k for k, node in enumerate(graph) if node.op == "relax.nn.relu")
    return [Partition(Candidate(SubGraph(graph, frozenset(nodes)), backend, f"{backend}.fused"), Cost.of(1.0))
            for nodes, backend in ((range(split), engine), (range(split, len(graph)), "tvm"))]


def draws(w, n):
    rng = np.random.default_rng(3)
    return [rng.standard_normal(w.inputs[0].shape).astype("float32") for _ in range(n)]


def reference(w, x):
    import torch

    with torch.no_grad():
        return w.torch(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("placed", [engine_alone, engine_then_tvm])
def test_an_engine_binds_once_whatever_arrays_the_user_hands_over(mlp, engine, placed):
    w, graph, _ = mlp
    caller, assembly = caller_for(graph, placed(graph, engine))
    (kernel,) = [k for _, _, k in assembly.kernels]
    arrays = draws(w, 5)
    results = [caller.numpy(x) for x in arrays]  # new arrays on every call, as a user's are
    # Beside TVM's kernels, the VM's pool hands an engine's buffer one of a few blocks in turn
    # (the module's output takes one of the same size each call, and the pool gives back the
    # last freed first): each block is bound once, and calls after the first few bind none.
    made = kernel.bindings.made
    results += [caller.tensors(tvm.runtime.tensor(x))[0].numpy()[None] for x in arrays]
    assert kernel.bindings.made == made <= kernel.bindings.keep, f"{kernel.bindings.made} bindings for {len(results)} calls"
    if placed is engine_alone:  # called without the VM, on the caller's own buffers
        assert made == 1
    for x, got in zip(arrays + arrays, results):
        expected = reference(w, x)
        assert np.abs(np.asarray(got[0]) - expected).max() <= 1e-4 * np.abs(expected).max()


def test_a_whole_model_engine_is_called_without_the_vm_though_main_returns_a_tuple(mlp):
    w, graph, expected = mlp
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    assert caller._reused_outputs  # bound_main's direct call
    got = caller.numpy(w.inputs[0].numpy())
    assert isinstance(got, tuple) and len(got) == 1
    assert np.abs(got[0] - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("placed", [engine_alone, engine_then_tvm])
def test_outputs_stay_the_callers_after_the_next_call(mlp, placed):
    w, graph, _ = mlp
    caller, _ = caller_for(graph, placed(graph, "openvino"))
    x, y = draws(w, 2)
    first, first_tensor = caller.numpy(x)[0].copy(), caller.tensors(tvm.runtime.tensor(x))[0]
    kept, kept_tensor = caller.numpy(x)[0], caller.tensors(tvm.runtime.tensor(x))[0]
    caller.numpy(y), caller.tensors(tvm.runtime.tensor(y))
    np.testing.assert_array_equal(kept, first)
    np.testing.assert_array_equal(kept_tensor.numpy(), first_tensor.numpy())


def test_calls_from_several_threads_take_turns(mlp):
    w, graph, _ = mlp
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    arrays = draws(w, 8)
    expected = [caller.numpy(x)[0].copy() for x in arrays]
    wrong = []

    def run(k):
        for _ in range(20):
            if not np.array_equal(caller.numpy(arrays[k])[0], expected[k]):
                wrong.append(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(arrays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_inputs_are_checked_before_anything_is_copied(mlp):
    w, graph, _ = mlp
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    with pytest.raises(TypeError, match=r"takes 1 input\(s\)"):
        caller.numpy()
    with pytest.raises(ValueError, match=r"must be float32\[1, 784\], got float64\[1, 784\]"):
        caller.numpy(np.ones((1, 784)))
    with pytest.raises(ValueError, match=r"must be float32\[1, 784\], got float32\[2, 784\]"):
        caller.tensors(tvm.runtime.tensor(np.ones((2, 784), "float32")))
    # A non-contiguous array (a transposed view) and a CPU torch tensor are taken as they are.
    x = np.ascontiguousarray(w.inputs[0].numpy().T).T
    np.testing.assert_array_equal(caller.numpy(x)[0], caller.numpy(w.inputs[0])[0])


def test_a_loaded_export_of_one_engine_calls_it_directly_and_binds_once(mlp, tmp_path):
    import collage

    w, _, _ = mlp
    opt = collage.optimize(w.relax, backends=["tvm", "onnxruntime"], threads=2, progress=False)
    assert [p.backend for p in opt.placement] == ["onnxruntime"]
    # optimize timed opt(x) through both of its paths here and kept the preferred one (the
    # engine's own call unless the buffers beat it by more than the spread); so does the export
    timing = opt.record.call_path
    assert set(timing.costs) == {CallPath.BUFFERS, CallPath.ENGINE} and opt.caller.path is timing.chosen
    assert timing.chosen is preferred_path(timing.costs)
    assert "opt(x) on numpy arrays goes through" in opt.report()
    loaded = collage.load(opt.export(tmp_path / "export"))
    assert loaded.caller.path is timing.chosen
    assert loaded.caller._reused_outputs  # no VM between the user's call and the engine
    arrays = draws(w, 4)
    for x in arrays:
        np.testing.assert_array_equal(loaded(x)[0], opt(x)[0])
    (kernel,) = loaded.kernels.values()
    assert kernel.bindings.made == 1


def test_onnx_runtime_alone_is_handed_the_users_arrays_through_its_own_call(mlp):
    """Its plain ``run`` costs a user less than copying into bound buffers and out; OpenVINO's
    own ``infer`` copies too, and more slowly, so its kernel keeps the bound buffers."""
    w, graph, _ = mlp
    ort, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    ov, _ = caller_for(graph, engine_alone(graph, "openvino"))
    assert ort.path is CallPath.ENGINE and ov.paths == (CallPath.BUFFERS,)
    x = draws(w, 1)[0]
    strided = np.zeros((1, 2 * x.shape[1]), "float32")
    strided[:, ::2] = x  # every other element: not C-contiguous, made so for the engine
    assert not strided[:, ::2].flags.c_contiguous
    got, expected = ort.numpy(strided[:, ::2]), reference(w, x)
    assert isinstance(got, tuple) and len(got) == 1 and got[0] is not ort.numpy(x)[0]
    assert np.abs(got[0] - expected).max() <= 1e-4 * np.abs(expected).max()


def slowed(call, seconds=2e-3):
    def slow(*args):
        time.sleep(seconds)
        return call(*args)

    return slow


def test_the_users_call_takes_the_faster_of_its_two_paths_as_timed_here(mlp):
    """Whether the engine's own call on the user's arrays or the copy into buffers bound once
    costs a user less differs by machine and process (issue 38): ``time_call_paths`` times
    ``opt(x)`` both ways and keeps the faster, here whichever one is made slow on purpose.
    Both paths give the same outputs; a module with one path (OpenVINO's kernel keeps its
    bound buffers) is left as it is."""
    w, graph, _ = mlp
    x = draws(w, 1)[0]
    quick = Protocol(rounds=3, block_ms=10, settle_s=0.0, warmup_s=0.01)
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    assert caller.paths == (CallPath.BUFFERS, CallPath.ENGINE) and caller.path is CallPath.ENGINE
    np.testing.assert_array_equal(caller.through(CallPath.ENGINE)(x)[0], caller.through(CallPath.BUFFERS)(x)[0])
    caller._engine_call = slowed(caller._engine_call)
    timing = time_call_paths(caller, [x], quick)
    assert timing.chosen is CallPath.BUFFERS is caller.path
    assert timing.costs[CallPath.ENGINE].median_ms > timing.costs[CallPath.BUFFERS].median_ms + 1.0
    assert "goes through buffers bound once" in timing.summary()
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    caller._run = slowed(caller._run)
    assert time_call_paths(caller, [x], quick).chosen is CallPath.ENGINE is caller.path
    ov, _ = caller_for(graph, engine_alone(graph, "openvino"))
    assert ov.paths == (CallPath.BUFFERS,) and time_call_paths(ov, [x], quick) is None and ov.path is CallPath.BUFFERS


def test_onnx_runtime_alone_checks_the_users_arrays_in_its_own_call_and_collage_says_what_is_wrong(mlp):
    """On numpy arrays ONNX Runtime's own call checks each dtype and shape (in C++, as for its
    users), so collage's checks cost nothing a call; an array it refuses still gets
    collage's one line naming the input, not the engine's message beneath it."""
    w, graph, _ = mlp
    caller, _ = caller_for(graph, engine_alone(graph, "onnxruntime"))
    handed, plain = [], caller._engine_call
    caller._engine_call = lambda arrays: handed.append(arrays) or plain(arrays)
    caller.path = CallPath.ENGINE  # made again around the engine's call
    x = draws(w, 1)[0]
    assert caller.numpy(x)[0].shape == (1, 10) and handed[-1][0] is x  # the user's array itself
    for wrong, message in ((np.ones((1, 784)), r"got float64\[1, 784\]"), (np.ones((2, 784), "float32"), r"got float32\[2, 784\]")):
        with pytest.raises(ValueError, match=r"input '.*' must be float32\[1, 784\], " + message) as err:
            caller.numpy(wrong)
        assert handed[-1][0] is wrong  # the engine checked it first
        assert err.value.__context__ is None and err.value.__cause__ is None


def test_onnx_runtimes_plain_call_is_its_run_on_arrays_already_checked(mlp):
    """``Kernel.plain`` skips only what ``InferenceSession.run`` checks again in Python (every
    input given, none another session's value): the same outputs as ``run``; and an ONNX
    Runtime without the compiled session it calls falls back to ``run``."""
    import types

    from collage.backends import onnxruntime as engine
    from collage.candidates.onnx_convert import to_onnx

    w, graph, _ = mlp
    model = to_onnx(SubGraph(graph, frozenset(range(len(graph)))).extract())
    kernel = engine.compile_onnx(model, "llvm", 2, alone=True)
    x = draws(w, 1)[0]
    (name,) = [i.name for i in kernel.session.get_inputs()]
    np.testing.assert_array_equal(kernel.plain([x])[0], kernel.session.run(None, {name: x})[0])
    ran = []
    older = types.SimpleNamespace(run=lambda outputs, feeds: ran.append((outputs, feeds)))  # no ``_sess``
    engine._plain_run(older, [name], ["out"])([x])
    assert ran == [(["out"], {name: x})]


def test_finalists_race_as_their_users_call_them(mlp):
    """On the CPU a finalist is raced through ``opt(x)``'s own call on the user's arrays, not
    on buffers bound once: an engine whose call reads the arrays in place (ONNX Runtime's
    ``run``) is not charged for a copy that one which must copy them in was spared."""
    from collage.assembling.checked import Finalist
    from collage.choosing.finalists import users_call

    w, graph, expected = mlp
    parts = engine_alone(graph, "onnxruntime")
    assembly = assemble(graph, parts, default_backends(), "llvm")
    ((_, _, kernel),) = assembly.kernels
    handed, plain = [], kernel.plain
    kernel.plain = lambda arrays: handed.append(arrays) or plain(arrays)
    x = draws(w, 1)[0]
    (got,) = users_call(Finalist(parts, assembly, build_vm(assembly.module, "llvm"), 1.0), [x], "llvm")()
    assert handed[-1][0] is x and got.shape == expected.shape


def test_the_engines_own_call_is_kept_unless_the_buffers_beat_it_beyond_the_spread():
    from collage.assembling.caller import preferred_path

    tied = {CallPath.BUFFERS: Cost.of(3.072, 0.09), CallPath.ENGINE: Cost.of(3.101, 0.15)}
    assert preferred_path(tied) is CallPath.ENGINE
    beaten = {CallPath.BUFFERS: Cost.of(2.0, 0.05), CallPath.ENGINE: Cost.of(3.0, 0.1)}
    assert preferred_path(beaten) is CallPath.BUFFERS
    assert preferred_path({CallPath.BUFFERS: Cost.of(3.2), CallPath.ENGINE: Cost.of(3.0)}) is CallPath.ENGINE
