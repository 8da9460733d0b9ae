"""A model TVM cannot import, as a Relax module of one call that runs it as given.

An ONNX file with an operator TVM's importer lacks, or a PyTorch module that neither
``torch.export`` nor torch's ONNX export brings into TVM, still runs whole on the engines
that read it: ONNX Runtime and OpenVINO on the file, inductor on the module. Optimizing it is
then choosing among them, and never an error. The stand-in's ``main`` has the model's
signature and one ``call_dps_packed`` of the model as given, the PyTorch module run by
PyTorch or the file by ONNX Runtime with its graph optimizations off: the unoptimized model
every engine is checked against, and the finalist that keeps the model running where no
engine can.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

# The stand-in's kernels are registered under this prefix, which ``stand_in_of`` recognises.
PREFIX = "collage.as_given."


class NoStandIn(Exception):
    """The model's signature is not static: nothing can stand in for it."""


def of_onnx(model, shapes: Mapping[str, Sequence[int]] | None) -> tvm.IRModule:
    """The stand-in for ``model`` (an ``onnx.ModelProto``, its dynamic inputs fixed by
    ``shapes``), run by ONNX Runtime with its graph optimizations off."""
    import onnx
    import onnxruntime as ort

    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    params = []
    for value in inputs:
        given = (shapes or {}).get(value.name)
        dims = value.type.tensor_type.shape.dim
        shape = tuple(given) if given is not None else tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
        if any(size < 0 for size in shape):
            raise NoStandIn(f"input {value.name} has a dynamic shape; fix it with shapes=")
        params.append((value.name, shape, str(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return session.run(None, dict(zip(names, arrays)))

    digest = hashlib.sha256(model.SerializeToString()).hexdigest()[:16]
    return _stand_in(f"{PREFIX}onnx_{digest}", _numpy_kernel(run, len(params)), params, run)


def of_torch(module, inputs: tuple) -> tvm.IRModule:
    """The stand-in for the PyTorch ``module`` (in eval mode) called on tensors of
    ``inputs``' shapes, run by PyTorch."""
    import torch
    from torch.utils._pytree import tree_leaves

    params = [(f"input_{k}", tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in enumerate(inputs)]

    def outputs(tensors) -> list:
        with torch.no_grad():
            return [t for t in tree_leaves(module(*tensors)) if isinstance(t, torch.Tensor)]

    def kernel(*tensors):
        values = outputs([torch.from_dlpack(t) for t in tensors[: len(params)]])
        for out, value in zip(tensors[len(params):], values):
            torch.from_dlpack(out).copy_(value)

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [t.numpy() for t in outputs([torch.from_numpy(a) for a in arrays])]

    # A module has no cheap digest: a name of its own, so no log entry of another is read as its.
    return _stand_in(f"{PREFIX}torch_{uuid.uuid4().hex[:16]}", kernel, params, run)


def stand_in_of(mod: tvm.IRModule) -> str | None:
    """The kernel name of ``mod``'s stand-in call where ``mod`` is a stand-in, else None."""
    main = mod["main"] if any(gv.name_hint == "main" for gv in mod.get_global_vars()) else None
    if not isinstance(main, relax.Function):
        return None
    names = []
    relax.analysis.post_order_visit(main, lambda e: names.append(e.global_symbol) if isinstance(e, relax.ExternFunc) else None)
    return next((n for n in names if n.startswith(PREFIX)), None)


def _numpy_kernel(run: Callable[[list[np.ndarray]], list[np.ndarray]], count: int):
    """``run`` (numpy arrays in, out) as a kernel writing the caller's buffers."""

    def kernel(*tensors):
        for out, value in zip(tensors[count:], run([t.numpy() for t in tensors[:count]])):
            out.copyfrom(np.ascontiguousarray(value))

    return kernel


def _stand_in(name: str, kernel, params: list[tuple[str, tuple, str]], run) -> tvm.IRModule:
    """``main(params) = call_dps_packed(name, params)``, ``kernel`` registered as ``name``,
    its outputs' types those ``run`` returns on zeros of the inputs."""
    outputs = run([np.zeros(shape, dtype) for _, shape, dtype in params])
    if not outputs:
        raise NoStandIn("the model returns no tensor")
    tvm.register_global_func(name, kernel, override=True)
    bb = relax.BlockBuilder()
    variables = [relax.Var(label, relax.TensorType(shape, dtype)) for label, shape, dtype in params]
    types = [relax.TensorType(o.shape, str(o.dtype)) for o in outputs]
    with bb.function("main", variables):
        with bb.dataflow():
            out = bb.emit_output(relax.call_dps_packed(name, relax.Tuple(variables),
                                                       out_ty=types if len(types) > 1 else types[0]))  # fmt: skip
        bb.emit_func_output(out)
    return bb.get()
