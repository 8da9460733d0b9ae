"""OpenVINO (Intel's inference engine): CPU plugin, f32 unless asked otherwise.

A candidate becomes an in-memory ONNX model (``collage.candidates.onnx_convert``), read by OpenVINO's
ONNX frontend and compiled for the CPU plugin. The kernel wraps the caller's TVM tensors as
shared-memory ``ov.Tensor`` s over DLPack views, so OpenVINO reads the inputs and writes the
outputs in place: no copy either way.

Precision: the CPU plugin picks bf16 on CPUs that have it natively, which misses TVM's f32
results by far more than the float32 tolerance, so kernels are compiled in float32 unless
asked for another precision (``precision=``: bfloat16, offered where the CPU has it natively
and the user gave an accuracy budget, or ``ENGINE_DEFAULT``, the plugin's own choice).
Threads: ``compile``'s ``threads`` (0 leaves OpenVINO's default). openvino is imported only
to compile.
"""

import numpy as np
import onnx
from collage.patterns.fusion import anchor_then_elementwise
from tvm import relax

from collage.candidates.backend import GRAPH_LEVEL, Backend, BoundBuffers, installed_version
from collage.candidates.onnx_convert import convertible, to_onnx
from collage.candidates.pattern import PatternRule
from collage.candidates.precision import BFLOAT16, FLOAT32, bf16_unavailable
from collage.measuring.cost import cpu_info

HINTS = {FLOAT32: "f32", BFLOAT16: "bf16"}  # collage's precisions as INFERENCE_PRECISION_HINT spells them
ENGINE_DEFAULT = "default"  # no hint: the plugin's own choice, as its users run it


def _config(precision: str, threads: int) -> dict:
    config = {"PERFORMANCE_HINT": "LATENCY"}
    if precision != ENGINE_DEFAULT:
        config["INFERENCE_PRECISION_HINT"] = HINTS[precision]
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    return config


def compile_onnx(model: onnx.ModelProto, target: str, threads: int, alone: bool = False, precision: str = FLOAT32,
                 beside_spinning: bool = False):
    import openvino as ov

    core = ov.Core()
    # Alone, among other libraries' kernels or beside spinning threads alike: its users'
    # settings (PERFORMANCE_HINT LATENCY), under which the CPU plugin's threads sleep between runs.
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU", _config(precision, threads))
    initializers = {t.name for t in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers] + list(model.graph.output)
    # OpenVINO drops inputs whose values are never read (zeros_like reads only the shape).
    ports = {name for port in (*compiled.inputs, *compiled.outputs) for name in port.get_names()}
    slots = [(k, v.name) for k, v in enumerate(values) if v.name in ports]

    def bind(tensors):
        # One infer request per set of buffers, each wrapping them as shared-memory tensors
        # over DLPack views (the views keep the buffers alive).
        request = compiled.create_infer_request()
        for k, name in slots:
            request.set_tensor(name, ov.Tensor(np.from_dlpack(tensors[k]), shared_memory=True))
        return request

    requests = BoundBuffers(bind)

    def kernel(*tensors):
        requests.get(tensors).infer()

    kernel.bound = lambda tensors: requests.get(tensors).infer
    kernel.bindings = requests
    return kernel


def compile(func: relax.Function, pattern: str, target: str, threads: int, precision: str = FLOAT32):
    return compile_onnx(to_onnx(func), target, threads, precision=precision)


BACKEND = Backend(
    name="openvino",
    kind=GRAPH_LEVEL,
    targets=("llvm",),
    compile=compile,
    compile_onnx=compile_onnx,
    # Kernel-sized groups as TVM fuses them; the engine's largest regions are candidates too
    # (candidates.regions), and the graph-level search hands it more (collage.placing.refine).
    rules=(PatternRule("openvino.fused", convertible, anchor_then_elementwise),),
    requires=("openvino", "onnx"),
    library=f"OpenVINO {installed_version('openvino')} (CPU plugin)",
    precisions=lambda target: () if bf16_unavailable(cpu_info()["isa"]) else (BFLOAT16,),
)
