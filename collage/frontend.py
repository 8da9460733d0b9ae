"""Importing models: an ONNX file becomes a Relax IRModule with its weights bound.

``collage.optimize`` takes a Relax module; this is how a file on disk gets there, with one
clear sentence for each way it can go wrong (no such file, not ONNX, an operator TVM's
importer lacks), so the command line can show that sentence instead of a traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import tvm

from .runner import first_line


class ModelImportError(Exception):
    """The model file cannot be imported; the message names the file and the reason."""


def load_onnx(path: str | os.PathLike, shapes: Mapping[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """The ONNX model at ``path`` as a Relax IRModule whose ``main`` takes the model's inputs,
    weights bound as constants. ``shapes`` (input name -> shape) fixes inputs the file leaves
    dynamic, such as a batch dimension; collage needs static shapes."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise ModelImportError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        model = onnx.load(path)
    except DecodeError as err:
        raise ModelImportError(f"{path}: not an ONNX model (protobuf: {err})") from None
    if not model.graph.node:
        raise ModelImportError(f"{path}: not an ONNX model (it holds no graph)")
    _check_shapes(path, model, shapes)
    try:
        try:
            return _from_onnx(model, shapes)
        except tvm.error.OpNotImplemented:
            raise
        except Exception as first:  # noqa: BLE001 -- perhaps what a clean-up makes importable
            try:
                return _from_onnx(cleaned_up(model), shapes)
            except Exception:  # noqa: BLE001 -- the clean-up did not help: report the first error
                raise first from None
    except tvm.error.OpNotImplemented as err:
        # TVM's message: "The following operators are not supported for frontend ONNX: A, B"
        ops = str(err).strip().rpartition(": ")[2]
        raise ModelImportError(f"{path}: TVM's ONNX importer does not support operator(s) {ops}") from None
    except Exception as err:  # noqa: BLE001 -- the importer's own errors share no type
        raise ModelImportError(f"{path}: TVM cannot import it: {type(err).__name__}: {first_line(err)}") from None


def _from_onnx(model, shapes):
    from tvm.relax.frontend.onnx import from_onnx

    # The importer turns the ONNX checker's complaints into warnings and prints the inputs of
    # an operator it fails on; load_onnx's error says what went wrong.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return from_onnx(model, shape_dict=dict(shapes) if shapes else None, keep_params_in_input=False)


def cleaned_up(model):
    """``model`` after ONNX Runtime's basic graph optimizations (constant folding, redundant
    nodes removed; they leave standard ONNX operators only) and ONNX's shape inference. Some
    exporters compute from constant shapes what TVM's importer needs as constants ("Dynamic
    pads are not supported yet"), and this makes them importable."""
    import onnx
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.ir_version = min(model.ir_version, 10)  # what ONNX Runtime reads
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "cleaned.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        cleaned = onnx.load(options.optimized_model_filepath)
    return onnx.shape_inference.infer_shapes(cleaned)


def _check_shapes(path: Path, model, shapes) -> None:
    """Each given shape names an input of the model and has that input's rank."""
    if not shapes:
        return
    weights = {init.name for init in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in weights}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise ModelImportError(f"{path}: no input named {', '.join(unknown)} (inputs: {', '.join(inputs)})")
    for name, shape in shapes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if dims and len(dims) != len(shape):
            raise ModelImportError(f"{path}: input {name} has {len(dims)} dimensions, the shape given has {len(shape)}")
