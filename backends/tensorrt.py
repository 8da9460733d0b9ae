"""TensorRT (NVIDIA's inference engine), through its Python API, fp32.

A candidate becomes an in-memory ONNX model (``collage.candidates.onnx_convert``), parsed by TensorRT's
ONNX parser and built into an engine; TF32 is turned off so results stay within fp32
tolerance of TVM's. The kernel gives the execution context the device pointers of the
caller's CUDA TVM tensors, enqueues the engine on its own stream and waits for it: no copy
either way. tensorrt is imported only to compile, so this file loads where it is not
installed, and the backend is excluded with that reason.
"""

import ctypes
import weakref

import tvm
from collage.patterns.fusion import anchor_then_elementwise
from tvm import relax

from collage.candidates.backend import GRAPH_LEVEL, Backend, Unsupported, installed_version
from collage.candidates.onnx_convert import convertible, to_onnx
from collage.candidates.pattern import PatternRule


def probe(target: str) -> str | None:
    if not tvm.cuda().exist:
        return "no CUDA device visible to TVM"
    return None


def _engine(model_bytes: bytes):
    """A TensorRT engine for the ONNX model; Unsupported with the parser's or builder's reason."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: always explicit batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise Unsupported(f"TensorRT's ONNX parser rejects this sub-graph: {errors}")
    config = builder.create_builder_config()
    # TensorRT 10 may run fp32 layers in TF32 unless told not to; TensorRT 11 has no such flag.
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise Unsupported("TensorRT could not build an engine for this sub-graph (see its log)")
    return trt.Runtime(logger).deserialize_cuda_engine(serialized)


def _address(handle) -> int:
    """A TVM raw stream handle (ctypes.c_void_p, or an int) as the int TensorRT takes."""
    return (handle.value or 0) if isinstance(handle, ctypes.c_void_p) else int(handle)


class _EngineKernel:
    """A Kernel: one engine run on the caller's CUDA buffers, on a stream of its own."""

    def __init__(self, engine, names: list[str]):
        self.engine = engine  # the execution context needs its engine alive
        self.context = engine.create_execution_context()
        # (argument position, tensor name): ONNX inputs then outputs, without the inputs
        # TensorRT dropped because nothing reads their values.
        kept = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
        self.slots = [(k, name) for k, name in enumerate(names) if name in kept]
        # A stream from cudaStreamCreate waits for work on the legacy default stream, where
        # TVM writes the inputs unless told otherwise, so they are ready when the engine runs.
        self.device = tvm.cuda()
        self.stream = self.device.create_raw_stream()
        weakref.finalize(self, self.device.free_raw_stream, self.stream)

    def __call__(self, *tensors):
        for k, name in self.slots:
            self.context.set_tensor_address(name, tensors[k].data_ptr())
        if not self.context.execute_async_v3(_address(self.stream)):
            raise RuntimeError("TensorRT failed to enqueue the engine (see its log)")
        self.device.sync(self.stream)


def compile(func: relax.Function, pattern: str, target: str, threads: int):
    model = to_onnx(func)
    engine = _engine(model.SerializeToString())
    return _EngineKernel(engine, [v.name for v in (*model.graph.input, *model.graph.output)])


BACKEND = Backend(
    name="tensorrt",
    kind=GRAPH_LEVEL,
    targets=("cuda",),
    compile=compile,
    # Graph-level search over larger partitions comes later; for now, TVM's fusion groups.
    rules=(PatternRule("tensorrt.fused", convertible, anchor_then_elementwise),),
    requires=("tensorrt",),
    probe=probe,
    library=f"TensorRT {installed_version('tensorrt')} (fp32)",
)
