"""ONNX Runtime (Microsoft's inference engine): CPU execution provider, all graph optimizations.

A candidate becomes an in-memory ONNX model (``collage.onnx_convert``) and one
InferenceSession. The kernel binds the caller's TVM tensors by pointer with IOBinding, so
ONNX Runtime reads the inputs and writes the outputs in place: no copy either way.

Threads: ``COLLAGE_NUM_THREADS``, read when a candidate is compiled, sets the session's
intra-op threads; unset or 0 leaves ONNX Runtime's default (one per physical core).
onnxruntime is imported only to compile, so this file loads where it is not installed and
the backend is excluded with that reason (``Backend.unavailable_reason``).
"""

import os

from collage.patterns.fusion import anchor_then_elementwise
from onnx import helper
from tvm import relax

from collage.backend import GRAPH_LEVEL, Backend, Unsupported, installed_version
from collage.onnx_convert import convertible, to_onnx
from collage.pattern import PatternRule


def _session(model_bytes: bytes):
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = int(os.environ.get("COLLAGE_NUM_THREADS", "0"))
    # Spin while running (its threads hand work to each other fast), but stop when a run ends:
    # threads that keep spinning take the cores from the next kernel of another library.
    # Not one thread pool shared by all sessions (set_global_thread_pool_sizes): op by op over
    # tvm and onnxruntime it ran SqueezeNet faster (4.7 ms, against 6.4), but OpenVINO, timed
    # in alternation with it, then ran ResNet-50 in 40.6 ms instead of 21.
    # Measured on ResNet-50 placed over tvm and onnxruntime (2 threads): 1113 ms with spinning
    # left on, 49.5 ms with it off, 31.9 ms stopping after each run.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except (ort_errors.NotImplemented, ort_errors.InvalidGraph) as error:
        # No kernel for an operator at this dtype, or an ONNX type constraint it breaks.
        raise Unsupported(f"ONNX Runtime cannot run this sub-graph: {error}") from None


def _slots(values) -> list[tuple[str, object]]:
    """(name, numpy dtype) of ONNX graph inputs or outputs."""
    return [(v.name, helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in values]


def compile(func: relax.Function, pattern: str, target: str):
    model = to_onnx(func)
    session = _session(model.SerializeToString())
    binding = session.io_binding()
    slots = [(binding.bind_input, *slot) for slot in _slots(model.graph.input)]
    slots += [(binding.bind_output, *slot) for slot in _slots(model.graph.output)]
    bound = [None] * len(slots)  # (pointer, shape) each slot is bound to

    def kernel(*tensors):
        # Binding costs more than running a small op, so a slot is rebound only when the
        # caller passes another buffer. ONNX Runtime rejects a shape the model does not have.
        for k, ((bind, name, dtype), t) in enumerate(zip(slots, tensors)):
            where = (t.data_ptr(), t.shape)
            if bound[k] != where:
                bind(name, "cpu", 0, dtype, t.shape, where[0])
                bound[k] = where
        session.run_with_iobinding(binding)

    return kernel


BACKEND = Backend(
    name="onnxruntime",
    kind=GRAPH_LEVEL,
    targets=("llvm",),
    compile=compile,
    # Kernel-sized groups as TVM fuses them; the engine's largest regions are candidates too
    # (candidates.regions), and the graph-level search hands it more (collage.refine).
    rules=(PatternRule("onnxruntime.fused", convertible, anchor_then_elementwise),),
    requires=("onnxruntime", "onnx"),
    library=f"ONNX Runtime {installed_version('onnxruntime')} (CPU execution provider, spinning stops after each run)",
)
