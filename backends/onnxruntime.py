"""ONNX Runtime (Microsoft's inference engine): CPU execution provider, all graph optimizations.

A candidate becomes an in-memory ONNX model (``collage.candidates.onnx_convert``) and one
InferenceSession. The kernel binds the caller's TVM tensors by pointer with IOBinding, so
ONNX Runtime reads the inputs and writes the outputs in place: no copy either way.

Settings: those of its users (all graph optimizations, one inter-op thread), except that a
kernel among other libraries' kernels stops its threads spinning after each run (the
engine alone, ``alone``: the whole model, or all but trivial ops, keeps them spinning), and
never lets them spin where a neighbour's threads spin after their calls (``beside_spinning``),
and that a rewrite which would change what the model computes is left out
(``collage.model.frontend.unsound_ort_rewrites``: a zero Pad folded into a MaxPool).
Threads: ``compile``'s ``threads`` sets the session's intra-op threads (0 leaves ONNX
Runtime's default, one per physical core).
Precision: with an accuracy budget, int8 too, where the CPU has AVX2: ONNX Runtime's dynamic
quantization (``onnxruntime.quantization.quantize_dynamic``) stores the constant weights of
matmuls in int8 and quantizes their inputs at run time (its integer GEMMs use VNNI where the
CPU has it). Convolutions stay float32: quantized (ConvInteger) they ran the corpus's ResNet 6.5x slower
here (3.77 against 0.58 ms, 2 threads, Xeon with AMX), and 13.6% off. ELECTRA ran 1.45x
faster in int8 (0.75 against 1.08 ms), 1.4% off: a budget decides, by measurement.
onnxruntime is imported only to compile, so this file loads where it is not installed and
the backend is excluded with that reason (``Backend.unavailable_reason``).
"""

import contextlib
import functools
import logging
import tempfile
from pathlib import Path

import onnx
from collage.patterns.fusion import anchor_then_elementwise
from onnx import helper
from tvm import relax

from collage.candidates.backend import GRAPH_LEVEL, Backend, BoundBuffers, Unsupported, installed_version
from collage.candidates.onnx_convert import convertible, to_onnx
from collage.candidates.pattern import PatternRule
from collage.candidates.precision import FLOAT32, INT8, int8_unavailable
from collage.measuring.cost import cpu_info
from collage.model.frontend import unsound_ort_rewrites

# What dynamic quantization rewrites; convolutions are left in float32 (see above).
QUANTIZED_OPS = ("MatMul", "Gemm")


def _session(model_bytes: bytes, threads: int, alone: bool, disabled: list[str], beside_spinning: bool = False):
    """A session of ``model_bytes`` with its users' settings, less the ``disabled`` rewrites
    (``unsound_ort_rewrites``: ones that would change what it computes)."""
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
    if beside_spinning:
        # Nor while it runs: its caller would spin waiting for its workers, and they wait for
        # a core, which the neighbour's spinning threads (PyTorch's OpenMP pool, after a
        # product) keep until the scheduler's slice ends. SwiftFormer's op-level placement over
        # TVM, 24 ONNX Runtime kernels and 17 of MKL (2-core Zen 4): 12-24 ms a call, its ONNX
        # Runtime kernels 0.07-0.1 ms each measured and 0.4-4 ms in the module; never spinning,
        # 6.3-7.1 ms. Where no neighbour spins they may: OPT's ONNX Runtime region beside TVM
        # took 3.4 ms never spinning against 1.8.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Not one thread pool shared by all sessions (set_global_thread_pool_sizes): op by op over
    # tvm and onnxruntime it ran SqueezeNet faster (4.7 ms, against 6.4), but OpenVINO, timed
    # in alternation with it, then ran ResNet-50 in 40.6 ms instead of 21.
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    except (ort_errors.NotImplemented, ort_errors.InvalidGraph) as error:
        # No kernel for an operator at this dtype, or an ONNX type constraint it breaks.
        raise Unsupported(f"ONNX Runtime cannot run this sub-graph: {error}") from None


def _slots(values) -> list[tuple[str, object]]:
    """(name, numpy dtype) of ONNX graph inputs or outputs."""
    return [(v.name, helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in values]


def compile_onnx(model: onnx.ModelProto, target: str, threads: int, alone: bool = False, precision: str = FLOAT32,
                 beside_spinning: bool = False):
    run = model if precision == FLOAT32 else quantized(model)
    session = _session(run.SerializeToString(), threads, alone, unsound_ort_rewrites(model), beside_spinning)
    initializers = {t.name for t in model.graph.initializer}
    slots = [(True, *slot) for slot in _slots(v for v in model.graph.input if v.name not in initializers)]
    slots += [(False, *slot) for slot in _slots(model.graph.output)]
    bindings = BoundBuffers(lambda tensors: _bind(session, slots, tensors))

    def kernel(*tensors):
        session.run_with_iobinding(bindings.get(tensors))

    kernel.bound = lambda tensors: functools.partial(session.run_with_iobinding, bindings.get(tensors))
    # Its users' own call, numpy arrays in, new arrays out, one C++ call: what a user's opt(x)
    # runs where the whole model is this kernel. After a run has emptied the caches, Python
    # copying the arrays into bound buffers and out again cost 2-7% more (RegNet, 2 threads).
    kernel.plain = _plain_run(session, [name for is_input, name, _ in slots if is_input],
                              [name for is_input, name, _ in slots if not is_input])  # fmt: skip

    kernel.session = session  # its settings are what tests and reports read
    kernel.bindings = bindings
    return kernel


def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its matmuls' constant weights in int8 and their inputs quantized at run
    time; ``Unsupported`` when it has no matmul with a constant weight."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weights = {t.name for t in model.graph.initializer}
    if not any(n.op_type in QUANTIZED_OPS and any(i in weights for i in n.input) for n in model.graph.node):
        raise Unsupported("int8: no matmul with a constant weight to quantize")
    with tempfile.TemporaryDirectory() as folder, _quiet_root_logger():
        path = Path(folder) / "int8.onnx"
        quantize_dynamic(model, path, op_types_to_quantize=list(QUANTIZED_OPS), weight_type=QuantType.QInt8)
        return onnx.load(path)


@contextlib.contextmanager
def _quiet_root_logger():
    """The quantizer's advice to pre-process the model goes to the root logger on every call."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _plain_run(session, input_names: list[str], output_names: list[str]):
    """``InferenceSession.run`` on numpy arrays, one per input (``assembling.caller`` counts
    them), without what ``run`` checks in Python: that no input is missing, that no input is
    another session's OrtValue, no graph capture. Its C++ run checks each array's dtype and
    shape and takes any layout.
    Those checks cost 1.3-1.5 us a call, as much as collage's own checks of the same inputs:
    a 21 us MLP ran 7% faster, a 57 us keyword spotter 2% (2-core Xeon, family 6 model 167).
    Its C++ run (``_sess``) is what ``run`` calls after them; where a version lacks it,
    ``run`` itself."""
    compiled = getattr(session, "_sess", None)
    if compiled is None or not callable(getattr(compiled, "run", None)):
        return lambda arrays: session.run(output_names, dict(zip(input_names, arrays)))
    if len(input_names) == 1:  # the feed written out: dict(zip()) cost 0.2 us of a 19 us MLP
        (name,) = input_names
        return lambda arrays: compiled.run(output_names, {name: arrays[0]}, None)
    return lambda arrays: compiled.run(output_names, dict(zip(input_names, arrays)), None)


def _bind(session, slots, tensors):
    """An IOBinding of ``tensors`` (inputs, then outputs) by pointer: read and written in place."""
    binding = session.io_binding()
    for (is_input, name, dtype), t in zip(slots, tensors):
        bind = binding.bind_input if is_input else binding.bind_output
        bind(name, "cpu", 0, dtype, t.shape, t.data_ptr())
    return binding


def compile(func: relax.Function, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    return compile_onnx(to_onnx(func), target, threads, precision=precision)


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
    precisions=lambda target: () if int8_unavailable(cpu_info()["isa"]) else (INT8,),
)
