"""ONNX Runtime (Microsoft's inference engine): CPU execution provider, all graph optimizations.

A candidate becomes an in-memory ONNX model (``collage.candidates.onnx_convert``) and one
InferenceSession. The kernel binds the caller's TVM tensors by pointer with IOBinding, so
ONNX Runtime reads the inputs and writes the outputs in place: no copy either way.

Settings: those of its users (all graph optimizations, one inter-op thread), except that a
kernel among other libraries' kernels stops its threads spinning after each run; the
engine alone (``alone``: the whole model, or all but trivial ops) keeps them spinning.
Threads: ``compile``'s ``threads`` sets the session's intra-op threads (0 leaves ONNX
Runtime's default, one per physical core).
onnxruntime is imported only to compile, so this file loads where it is not installed and
the backend is excluded with that reason (``Backend.unavailable_reason``).
"""

import onnx
from collage.patterns.fusion import anchor_then_elementwise
from onnx import helper
from tvm import relax

from collage.candidates.backend import GRAPH_LEVEL, Backend, BoundBuffers, Unsupported, installed_version
from collage.candidates.onnx_convert import convertible, to_onnx
from collage.candidates.pattern import PatternRule


def _session(model_bytes: bytes, threads: int, alone: bool):
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not alone:
        # Among other libraries' kernels, its threads stop spinning when a run ends: spinning
        # threads take the cores from the next kernel. ResNet-50 placed over tvm and
        # onnxruntime (2 threads): 1113 ms spinning, 31.9 ms stopping after each run. Alone
        # (its users' setting) they spin, which keeps a whole model fast: ResNet 1.09 ms
        # spinning against 1.52 stopping, ViT 0.72 against 1.05 (small configs, Zen 3).
        options.add_session_config_entry("session.force_spinning_stop", "1")
    # Not one thread pool shared by all sessions (set_global_thread_pool_sizes): op by op over
    # tvm and onnxruntime it ran SqueezeNet faster (4.7 ms, against 6.4), but OpenVINO, timed
    # in alternation with it, then ran ResNet-50 in 40.6 ms instead of 21.
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except (ort_errors.NotImplemented, ort_errors.InvalidGraph) as error:
        # No kernel for an operator at this dtype, or an ONNX type constraint it breaks.
        raise Unsupported(f"ONNX Runtime cannot run this sub-graph: {error}") from None


def _slots(values) -> list[tuple[str, object]]:
    """(name, numpy dtype) of ONNX graph inputs or outputs."""
    return [(v.name, helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in values]


def compile_onnx(model: onnx.ModelProto, target: str, threads: int, alone: bool = False):
    session = _session(model.SerializeToString(), threads, alone)
    initializers = {t.name for t in model.graph.initializer}
    slots = [(True, *slot) for slot in _slots(v for v in model.graph.input if v.name not in initializers)]
    slots += [(False, *slot) for slot in _slots(model.graph.output)]
    bindings = BoundBuffers(lambda tensors: _bind(session, slots, tensors))

    def kernel(*tensors):
        session.run_with_iobinding(bindings.get(tensors))

    kernel.session = session  # its settings are what tests and reports read
    return kernel


def _bind(session, slots, tensors):
    """An IOBinding of ``tensors`` (inputs, then outputs) by pointer: read and written in place."""
    binding = session.io_binding()
    for (is_input, name, dtype), t in zip(slots, tensors):
        bind = binding.bind_input if is_input else binding.bind_output
        bind(name, "cpu", 0, dtype, t.shape, t.data_ptr())
    return binding


def compile(func: relax.Function, pattern: str, target: str, threads: int):
    return compile_onnx(to_onnx(func), target, threads)


BACKEND = Backend(
    name="onnxruntime",
    kind=GRAPH_LEVEL,
    targets=("llvm",),
    compile=compile,
    compile_onnx=compile_onnx,
    # Kernel-sized groups as TVM fuses them; the engine's largest regions are candidates too
    # (candidates.regions), and the graph-level search hands it more (collage.placing.refine).
    rules=(PatternRule("onnxruntime.fused", convertible, anchor_then_elementwise),),
    requires=("onnxruntime", "onnx"),
    library=f"ONNX Runtime {installed_version('onnxruntime')} (CPU execution provider)",
)
