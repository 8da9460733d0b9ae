"""CUDA graphs: a module whose library kernels are all graph-safe is compiled with TVM's
RewriteCUDAGraph switch on, and the kernel it calls through ``call_dps_packed`` lands inside
the captured region; one kernel of a backend that is not graph-safe turns the switch off,
with a reason naming that backend. All but the last test need no GPU: TVM's pass runs on
the CPU, and the full compile needs only nvcc."""

import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from collage.backends import cublas, cudnn, inductor, tensorrt
from collage.backends import tvm as tvm_backend
from collage.candidates.backend import OP_LEVEL, Backend, cuda_graph_blocker
from collage.measuring.build import (USE_CUDA_GRAPH, compile_module, extern_functions, is_cuda, kernel_backends,
                                    module_cuda_graph_blocker)

KERNEL = "collage_test.library_kernel"
# An explicit architecture: this machine may have no GPU to read it from.
SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
TY = relax.TensorType((4, 8), "float32")
W = np.linspace(-1, 1, 64, dtype="float32").reshape(8, 8)


def between_tvm_ops() -> tvm.IRModule:
    """main(x) = x * 0.25 -> relu(@ W) -> the library kernel -> relu(@ W) * 2, three TVM
    kernels once fused, all captured with the library kernel: ``compile_module`` copies main's
    input and result (``staged_at_the_edges``), so only the two copies stay out."""
    x = relax.Var("x", TY)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            v = bb.emit(relax.op.multiply(x, relax.const(0.25, "float32")))
            v = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(v, relax.const(W)))))
            v = bb.emit(relax.call_dps_packed(KERNEL, relax.Tuple([v]), out_ty=TY))
            v = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(v, relax.const(W)))))
            out = bb.emit_output(relax.op.multiply(v, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def graph_safe(name: str = "safe") -> Backend:
    return Backend(name=name, kind=OP_LEVEL, targets=("cuda",), compile=None, graph_safe=True)


def calls(func: relax.Function) -> list[str]:
    """What ``func`` calls, in order: extern functions by symbol (a VM builtin's too, passed
    to ``call_builtin_with_ctx``), module functions by name."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.ExternFunc):
            found.append(str(expr.global_symbol))
        elif isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar):
            found.append(expr.op.name_hint)

    relax.analysis.post_order_visit(func, visit)
    return found


def lowered(mod: tvm.IRModule, kernels, monkeypatch) -> tvm.IRModule:
    """``mod`` through collage's CUDA pipeline (TVM's, ``measuring.pipeline``), up to the VM's code generation, in the
    PassContext ``compile_module`` sets up for it (read off by standing in for
    ``tvm.compile``, which would also need nvcc)."""
    seen = {}

    def compile_stand_in(mod, target, relax_pipeline):
        seen["config"] = dict(tvm.transform.PassContext.current().config)
        with tvm.target.Target(target):
            return relax_pipeline(mod)

    monkeypatch.setattr(tvm, "compile", compile_stand_in)
    result = compile_module(mod, SM90, kernels)
    graphs = bool(seen["config"].get(USE_CUDA_GRAPH, False))
    assert graphs == (module_cuda_graph_blocker(mod, kernels) is None)
    return result


# ------------------------------------------------------------------ the decision


def test_the_gpu_libraries_are_graph_safe_and_tensorrt_is_not():
    assert cuda_graph_blocker([cudnn.BACKEND, cublas.BACKEND, inductor.BACKEND, tvm_backend.BACKEND]) is None
    assert cuda_graph_blocker([cudnn.BACKEND, tensorrt.BACKEND]) == (
        "tensorrt does not declare its kernels graph-safe (on TVM's stream, no host wait)")
    plain = Backend(name="mine", kind=OP_LEVEL, targets=("cuda",), compile=None)
    assert not plain.graph_safe and "mine does not declare" in cuda_graph_blocker([plain])


def test_a_module_is_captured_only_when_every_kernel_it_calls_is_graph_safe():
    mod = between_tvm_ops()
    assert extern_functions(mod) == {KERNEL}
    assert module_cuda_graph_blocker(mod, {KERNEL: cudnn.BACKEND}) is None
    assert module_cuda_graph_blocker(mod, {KERNEL: tensorrt.BACKEND}).startswith("tensorrt does not declare")
    assert module_cuda_graph_blocker(mod) == f"it calls {KERNEL!r}, which no backend declares graph-safe"
    assert is_cuda("cuda") and is_cuda(SM90) and not is_cuda("llvm")


def test_kernel_backends_of_an_assembly():
    class Part:
        backend = "cudnn"

    class Assembly:
        kernels = [(Part(), "collage_0.1.cudnn", None)]

    assert kernel_backends(Assembly(), {"cudnn": cudnn.BACKEND}) == {"collage_0.1.cudnn": cudnn.BACKEND}


def test_finalists_run_as_cuda_graphs_are_not_raced_again_in_fresh_processes():
    """That race guards against the optimizing process's host threads; a GPU finalist run
    as CUDA graphs is timed on the device. One launched kernel by kernel is raced again."""
    from types import SimpleNamespace

    from collage.choosing.confirm import needless

    def finalist(backend):
        part = SimpleNamespace(backend=backend)
        return SimpleNamespace(assembly=SimpleNamespace(module=between_tvm_ops(), kernels=[(part, KERNEL, None)]))

    backends = {"cudnn": cudnn.BACKEND, "tensorrt": tensorrt.BACKEND}
    finalists = {"a": finalist("cudnn"), "b": finalist("cudnn"), "c": finalist("tensorrt")}
    assert needless(finalists, ("a", "b"), SM90, backends).startswith("on the GPU they run as CUDA graphs")
    assert needless(finalists, ("a", "c"), SM90, backends) is None
    assert needless(finalists, ("a", "b"), "llvm", backends) is None


# ------------------------------------------------------------------ TVM's pass, on the CPU


def test_a_graph_safe_kernel_is_captured_between_tvm_ops(monkeypatch):
    mod = lowered(between_tvm_ops(), {KERNEL: graph_safe()}, monkeypatch)
    captures = {gv.name_hint: f for gv, f in mod.functions.items() if gv.name_hint.endswith("_cuda_graph_capture")}
    assert list(captures) == ["main_cuda_graph_capture"]
    inside, main = calls(captures["main_cuda_graph_capture"]), calls(mod["main"])
    assert KERNEL in inside and KERNEL not in main
    assert "fused_matmul_relu" in inside  # with TVM's kernel before it
    assert "vm.builtin.cuda_graph.run_or_capture" in main


def at_the_edges() -> tvm.IRModule:
    """main(x, scale) = (the library kernel on x -> relu(@ W) * scale -> the library kernel,
    x): library kernels read main's input and write its result, returned in a tuple with the
    input itself."""
    x, scale = relax.Var("x", TY), relax.Var("scale", relax.TensorType((), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, scale]):
        with bb.dataflow():
            v = bb.emit(relax.call_dps_packed(KERNEL, relax.Tuple([x]), out_ty=TY))
            v = bb.emit(relax.op.multiply(relax.op.nn.relu(relax.op.matmul(v, relax.const(W))), scale))
            v = bb.emit(relax.call_dps_packed(KERNEL, relax.Tuple([v]), out_ty=TY))
            out = bb.emit_output(relax.Tuple([v, x]))
        bb.emit_func_output(out)
    return bb.get()


def test_kernels_reading_inputs_or_writing_results_are_captured_behind_copies(monkeypatch):
    """TVM's pass captures no kernel touching main's parameters or results (their buffers
    change from call to call): without the copies both library kernels would be launched from
    the host each call."""
    bare = at_the_edges()
    with tvm.transform.PassContext(config={USE_CUDA_GRAPH: True}), SM90:
        plain = relax.get_default_pipeline(SM90)(bare)
    assert calls(plain["main"]).count(KERNEL) == 2  # the problem, in TVM's pass as it is
    mod = lowered(bare, {KERNEL: graph_safe()}, monkeypatch)
    (capture,) = [f for gv, f in mod.functions.items() if gv.name_hint.endswith("_cuda_graph_capture")]
    assert calls(capture).count(KERNEL) == 2 and KERNEL not in calls(mod["main"])
    kernels = {gv.name_hint for gv, f in mod.functions.items() if not isinstance(f, relax.Function)}
    outside = [c for c in calls(mod["main"]) if c in kernels]
    # x and scale in; out, the kernel's result and x (returned as main read it: its copy, whose
    # buffer the next call overwrites, so copied again)
    assert len(outside) == 4 and all(c.startswith("identity") for c in outside)


def test_staged_copies_compute_what_the_module_did():
    """The copies change no value: the module before and after, on the CPU, with a tuple
    result that returns an input as it is."""
    from collage.measuring.build import staged_at_the_edges

    doubled = lambda x, out: out.copyfrom(x.numpy() * 2)  # noqa: E731
    tvm.register_global_func(KERNEL, doubled, override=True)
    try:
        x, scale = np.linspace(-2, 2, 32, dtype="float32").reshape(4, 8), np.array(0.5, "float32")
        results = []
        for mod in (at_the_edges(), staged_at_the_edges(at_the_edges())):
            relax.analysis.well_formed(mod)
            vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
            results.append([t.numpy() for t in vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(scale))])
        (a, a_x), (b, b_x) = results
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a_x, x)
        np.testing.assert_array_equal(b_x, x)
    finally:
        tvm_ffi.remove_global_func(KERNEL)


def test_a_kernel_not_graph_safe_leaves_the_module_without_graphs(monkeypatch):
    mod = lowered(between_tvm_ops(), {KERNEL: tensorrt.BACKEND}, monkeypatch)
    assert not any(gv.name_hint.endswith("_cuda_graph_capture") for gv in mod.functions)
    assert KERNEL in calls(mod["main"]) and "vm.builtin.cuda_graph.run_or_capture" not in calls(mod["main"])


def test_a_cpu_module_is_compiled_as_before():
    assert module_cuda_graph_blocker(between_tvm_ops()) is not None  # and llvm never asks
    ex = compile_module(tvm.IRModule({"main": between_tvm_ops()["main"]}), "llvm", {KERNEL: graph_safe()})
    assert "cuda_graph" not in ex.as_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: TVM cannot build CUDA kernels here")
def test_the_compiled_vm_code_calls_the_kernel_inside_the_graph():
    text = compile_module(between_tvm_ops(), SM90, {KERNEL: cublas.BACKEND}).as_text()
    sections = {part.split(":", 1)[0]: part for part in ("\n" + text).split("\n@")}
    assert f"call  {KERNEL}" in sections["main_cuda_graph_capture"]
    assert KERNEL not in sections["main"] and "vm.builtin.cuda_graph.run_or_capture" in sections["main"]


# ------------------------------------------------------------------ the kernels' stream, with torch's CUDA API stood in for


class FakeStream:
    def __init__(self, raw):
        self.cuda_stream = raw


def test_kernels_follow_tvm_stream_and_take_temporaries_from_the_pool_while_capturing(monkeypatch):
    from collage.patterns import torch_stream

    torch = torch_stream.torch
    raw, log = [0], []
    monkeypatch.setattr(torch_stream.tvm_ffi, "get_raw_stream", lambda device: raw[0])
    monkeypatch.setattr(torch_stream, "_streams", {})
    monkeypatch.setattr(torch_stream, "_capture_pool", [])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda index: FakeStream(0))
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda r, device: FakeStream(r))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: FakeStream(0))
    monkeypatch.setattr(torch.cuda, "MemPool", lambda: "pool")

    class Context:
        def __init__(self, *what):
            self.what = what

        def __enter__(self):
            log.append(self.what)

        def __exit__(self, *exc):
            log.append("exit")

    monkeypatch.setattr(torch.cuda, "stream", lambda s: Context("stream", s.cuda_stream))
    monkeypatch.setattr(torch.cuda, "use_mem_pool", lambda pool, index: Context("pool", pool))
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    kernel = torch_stream.on_tvm_stream(lambda *tensors: log.append("kernel"))
    out = tvm.runtime.tensor(np.zeros(1, "float32"))  # any tensor: only its device index is read

    kernel(out)  # TVM and torch both on the default stream: called as it is
    assert log == ["kernel"]
    raw[0] = 1234  # a stream set by a caller
    kernel(out)
    assert log[1:] == [("stream", 1234), "kernel", "exit"]
    raw[0], capturing[0] = 5678, True  # TVM's capture stream
    kernel(out)
    assert log[4:] == [("stream", 5678), ("pool", "pool"), "kernel", "exit", "exit"]
    assert torch_stream.tvm_stream(0) is torch_stream.tvm_stream(0)  # one torch stream per handle
    assert set(torch_stream._streams) == {(0, 0), (0, 1234), (0, 5678)}


# ------------------------------------------------------------------ on a GPU


def test_captured_library_kernel_replays_on_tvm_stream():
    """On a GPU: a torch kernel on TVM's stream (``patterns.torch_stream``) between TVM ops,
    captured once (two calls: TVM's warm-up and its capture), then replayed right for new
    inputs; torch tensors allocated after the capture are never overwritten by a replay."""
    import torch

    if not (torch.cuda.is_available() and tvm.cuda().exist):
        pytest.skip("needs a CUDA GPU visible to both torch and TVM")
    from collage.patterns.torch_stream import on_tvm_stream

    ran = []

    def kernel(x, out):
        ran.append(torch.cuda.is_current_stream_capturing())
        x, out = torch.from_dlpack(x), torch.from_dlpack(out)
        half = torch.full((8, 8), 0.5, device="cuda")  # a temporary: while capturing, from the capture pool
        torch.mm(x, half, out=out)

    tvm.register_global_func(KERNEL, on_tvm_stream(kernel), override=True)
    try:
        vm = relax.VirtualMachine(compile_module(between_tvm_ops(), "cuda", {KERNEL: cublas.BACKEND}), tvm.cuda())
        rng = np.random.default_rng(0)
        for _ in range(3):
            x = rng.standard_normal((4, 8)).astype("float32")
            kept = [torch.full((8, 8), 7.0, device="cuda") for _ in range(32)]  # the temporary's size
            got = vm["main"](tvm.runtime.tensor(x, tvm.cuda())).numpy()
            torch.cuda.synchronize()
            mid = np.maximum((x * 0.25) @ W, 0.0) @ np.full((8, 8), 0.5, "float32")
            np.testing.assert_allclose(got, np.maximum(mid @ W, 0.0) * 2.0, rtol=1e-5, atol=1e-6)
            assert all(bool((k == 7.0).all()) for k in kept)
        assert ran == [False, True]
    finally:
        tvm_ffi.remove_global_func(KERNEL)


def test_kernels_at_the_edges_replay_right_and_results_stay_the_callers():
    """On a GPU: library kernels reading main's input and writing its result, captured behind
    the copies, are right for new inputs, and a result returned by one call is not
    overwritten by the next (each call's result is a fresh buffer, as without graphs)."""
    import torch

    if not (torch.cuda.is_available() and tvm.cuda().exist):
        pytest.skip("needs a CUDA GPU visible to both torch and TVM")
    from collage.patterns.torch_stream import on_tvm_stream

    ran = []

    def kernel(x, out):
        ran.append(torch.cuda.is_current_stream_capturing())
        torch.mul(torch.from_dlpack(x), 2.0, out=torch.from_dlpack(out))

    tvm.register_global_func(KERNEL, on_tvm_stream(kernel), override=True)
    try:
        vm = relax.VirtualMachine(compile_module(at_the_edges(), "cuda", {KERNEL: cublas.BACKEND}), tvm.cuda())
        rng = np.random.default_rng(0)
        calls_made = []
        for _ in range(3):
            x = rng.standard_normal((4, 8)).astype("float32")
            scale = tvm.runtime.tensor(np.array(0.5, "float32"), tvm.cuda())
            got = vm["main"](tvm.runtime.tensor(x, tvm.cuda()), scale)
            calls_made.append((x, got))
        torch.cuda.synchronize()
        for x, (out, same_x) in calls_made:
            np.testing.assert_allclose(out.numpy(), np.maximum((x * 2) @ W, 0.0) * 0.5 * 2, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(same_x.numpy(), x)
        assert ran == [False, False, True, True]  # TVM's warm-up call, then its capture: both inside the graph
    finally:
        tvm_ffi.remove_global_func(KERNEL)


def test_a_kernel_alone_on_a_gpu_keeps_a_cuda_graph():
    """A main that is one library kernel is called without the VM (``bound_function``); on a
    GPU only where the kernel records its own CUDA graph on bound buffers (``Kernel.bound``),
    else through the VM, which replays TVM's. Needs no GPU: nothing is called."""
    from collage.assembling.assemble import bound_function

    x = relax.Var("x", TY)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.call_dps_packed(KERNEL, relax.Tuple([x]), out_ty=TY))
        bb.emit_func_output(out)
    main = bb.get()["main"]
    def vm_main(*tensors):
        pass

    vm = {"main": vm_main}
    plain = lambda *tensors: None  # noqa: E731
    assert bound_function(main, {KERNEL: plain}, vm, ["x"], tvm.cuda()).func is vm_main
    direct = bound_function(main, {KERNEL: plain}, vm, [tvm.runtime.tensor(np.zeros((4, 8), "float32"))], tvm.cpu())
    assert direct.result is not None  # on the CPU, called directly into buffers made once
