"""Importing models: an ONNX model (a file or an ``onnx.ModelProto``) or a PyTorch module
becomes a Relax IRModule with its weights bound.

``collage.optimize`` places a Relax module; ``import_model`` is how the other kinds of model a
user hands it get there, through TVM's own importers, with one clear sentence for each way it
can go wrong (no such file, not ONNX, an operator an importer lacks, a module in training
mode), so the command line and ``optimize`` can show that sentence instead of a traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import tvm

from ..errors import first_line
from . import as_given

# The ONNX opset and IR version collage writes, its own conversion and a torch module's export
# alike, which every engine here loads: onnx writes IR 14 by default, ONNX Runtime 1.31 loads at
# most 13; the TorchScript exporter writes opset 17 natively (the dynamo exporter starts at 18).
OPSET = 17
IR_VERSION = 10


class ModelImportError(Exception):
    """The model file cannot be imported; the message names the file and the reason."""


class ImporterError(ModelImportError):
    """TVM's importer cannot import a well-formed model: the engines may still run it whole
    (``collage.model.as_given``)."""


class ProgramImportError(ModelImportError):
    """``torch.export`` cannot export a PyTorch module, or TVM's importer cannot import the
    program: a module torch's ONNX exporter may still write faithfully."""


class Imported(NamedTuple):
    mod: tvm.IRModule
    onnx_model: object | None  # the ONNX model it came from, or torch's export of it, for the engines to run whole
    onnx_note: str | None = None  # why a PyTorch module has no ONNX export beside it
    program: object | None = None  # a PyTorch module's torch.export program, for an engine that compiles it whole
    program_note: str | None = None  # why a PyTorch module was imported from its ONNX export instead of that program
    module: object | None = None  # the user's torch.nn.Module that program exports, for an engine to compile as its users do
    not_imported: str | None = None  # why TVM cannot import the model, which ``mod`` then stands in for (``as_given``)


def import_model(model, example_inputs=None, shapes: Mapping[str, Sequence[int]] | None = None) -> Imported:
    """``model`` as a Relax IRModule: a Relax module as it is, or its symbolic inputs fixed by
    ``shapes`` (``with_shapes``); an ONNX model (a file, or an ``onnx.ModelProto``), its
    dynamic inputs fixed by ``shapes``; a ``torch.nn.Module`` or
    ``torch.export.ExportedProgram``, exported for ``example_inputs``, or imported from torch's
    ONNX export where that agrees with the module and ``torch.export`` cannot export it, TVM's
    importer cannot import the program, or the program computes otherwise."""
    if isinstance(model, tvm.IRModule):
        if example_inputs is not None:
            raise ModelImportError("example_inputs are for a PyTorch module; a Relax module's symbolic inputs take shapes=")
        return Imported(with_shapes(model, shapes) if shapes else model, None)
    import onnx

    if isinstance(model, (str, os.PathLike, onnx.ModelProto)):
        if example_inputs is not None:
            raise ModelImportError("example_inputs are for a PyTorch module; an ONNX model's dynamic inputs take shapes=")
        label, proto = _read_onnx(model)  # read once: the engines run the same model whole
        try:
            return Imported(_import_onnx(label, proto, shapes), proto)
        except ImporterError as err:
            return Imported(_standing_in(err, as_given.of_onnx, proto, shapes), proto, not_imported=str(err))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        if shapes:
            raise ModelImportError("shapes are for an ONNX model; a PyTorch module takes example_inputs of its shapes")
        inputs = _as_tuple(example_inputs)
        try:
            program = export_program(model, example_inputs)
            exported, note = export_onnx(model, example_inputs)
            wrong = _program_disagrees(model, program, inputs)
            if wrong is None:
                module = model if isinstance(model, torch.nn.Module) else None
                return Imported(relax_of(program), exported, note, program, module=module)
            why, expected = wrong
        except ProgramImportError as err:  # EnCodec's padding guards on its input's values; torch's ONNX exporter traces it
            exported, note = export_onnx(model, example_inputs)
            why, expected = str(err), _outputs(_callable(model), inputs)
        module = model if isinstance(model, torch.nn.Module) else None  # inductor compiles it whole all the same
        try:
            mod = _from_agreeing_export(exported, note, inputs, why, expected)
        except ImporterError as err:  # the export agrees, and the engines run it: only TVM cannot
            return Imported(_standing_in(err, as_given.of_torch, _callable(model), inputs), exported, note, None,
                            why, module, not_imported=str(err))  # fmt: skip
        except ModelImportError as err:  # no faithful export: inductor may still compile the module
            return Imported(_standing_in(err, as_given.of_torch, _callable(model), inputs), None, note, None,
                            why, module, not_imported=str(err))  # fmt: skip
        return Imported(mod, exported, note, None, f"{why}; imported from torch's ONNX export, which agrees with the module",
                        module)  # fmt: skip
    raise ModelImportError(
        f"cannot optimize a {type(model).__name__}: collage takes a Relax tvm.IRModule, an ONNX model (a file "
        "or an onnx.ModelProto) or a PyTorch module (torch.nn.Module with example_inputs)"
    )


def _standing_in(err: ModelImportError, stand_in, *args) -> tvm.IRModule:
    """``stand_in(*args)``: the model as given (``as_given``), or ``err`` where its signature
    is not static."""
    try:
        return stand_in(*args)
    except as_given.NoStandIn as why:
        raise ModelImportError(f"{err}; nor can the model run as given: {why}") from None


def with_shapes(mod: tvm.IRModule, shapes: Mapping[str, Sequence[int]]) -> tvm.IRModule:
    """``mod`` with the symbolic extents of the inputs ``shapes`` names fixed to the sizes given
    (input name -> shape), in every function that takes such an input (``BindSymbolicVars``):
    ``relax.frontend.nn`` writes a sequence length as ``nn.spec.Tensor((1, "seq"), ...)``.
    ``ModelImportError`` names an input no function takes, a shape of another rank, a static
    extent given another size, and an extent given two sizes."""
    from tvm import relax

    sizes: dict[str, int] = {}
    taken = set()
    for func in mod.functions.values():
        for param in func.params if isinstance(func, relax.Function) else ():
            if param.name not in shapes or not isinstance(param.ty, relax.TensorType) or param.ty.shape is None:
                continue
            taken.add(param.name)
            dims, given = list(param.ty.shape.values), [int(d) for d in shapes[param.name]]
            if len(dims) != len(given):
                raise ModelImportError(f"input {param.name} has {len(dims)} dimensions, the shape given has {len(given)}")
            for dim, size in zip(dims, given):
                if isinstance(dim, tvm.tirx.IntImm) and int(dim) != size:
                    raise ModelImportError(f"input {param.name} is {param.ty.shape}, the shape given {given}")
                if isinstance(dim, tvm.tirx.Var) and sizes.setdefault(dim.name, size) != size:
                    raise ModelImportError(f"{dim.name} is given two sizes, {sizes[dim.name]} and {size}")
    unknown = sorted(set(shapes) - taken)
    if unknown:
        raise ModelImportError(f"shapes name no tensor input of the module: {', '.join(unknown)}")
    return relax.transform.BindSymbolicVars(sizes)(mod) if sizes else mod


def load_torch(module, example_inputs) -> tvm.IRModule:
    """A PyTorch module (or exported program) as a Relax IRModule, by ``torch.export`` on
    ``example_inputs`` (a tensor or a tuple of them: the shapes it will be called with) and
    TVM's importer, weights bound as constants."""
    return relax_of(export_program(module, example_inputs))


def export_program(module, example_inputs):
    """``module`` as ``torch.export`` exports it for ``example_inputs`` (an exported program
    as it is). Inference only: a module in training mode is refused, since its batch norms
    and dropouts would compute something else."""
    import torch

    if isinstance(module, torch.nn.Module) and module.training:
        raise ModelImportError("the PyTorch module is in training mode; collage optimizes inference: call .eval() first")
    if isinstance(module, torch.export.ExportedProgram):
        return module
    if example_inputs is None:
        raise ModelImportError("a PyTorch module needs example_inputs: a tensor, or a tuple of them, of the shapes it takes")
    try:
        return torch.export.export(module, _as_tuple(example_inputs))
    except Exception as err:  # noqa: BLE001 -- torch.export's errors share no type
        raise ProgramImportError(f"torch.export cannot export the module: {type(err).__name__}: {first_line(err)}") from None


# How far an export may be from the module it exports, relative to each output's largest
# magnitude: the reordered sums of decomposed operators, never a different computation.
EXPORT_RTOL = 1e-3


def _program_disagrees(module, program, inputs: tuple) -> tuple[str, list] | None:
    """Where ``torch.export``'s ``program`` computes otherwise than ``module`` on the example
    ``inputs``: a line saying by how much, and the module's outputs; else None. Exporting
    traces with ``is_torchdynamo_compiling()`` true, and libraries branch on it: transformers'
    LongT5 then leaves its attention mask unset and its transient-global attention computes
    something else (1.22 off outputs of 4.2). Collage would have been faithful to the program,
    not the module."""
    import torch

    if isinstance(module, torch.export.ExportedProgram):
        return None  # the user's own program: nothing else to agree with
    expected, got = _outputs(module, inputs), _outputs(program.module(), inputs)
    error = _largest_error(got, expected)
    if error is None or _largest_error(_outputs(module, inputs), expected) is not None:
        return None  # they agree, or the module does not agree with itself (it draws what the seed does not fix)
    return f"torch.export's program computes otherwise than the module ({error})", expected


def _callable(model):
    """A PyTorch module, or an exported program's module, to call."""
    import torch

    return model.module() if isinstance(model, torch.export.ExportedProgram) else model


def _outputs(module, inputs: tuple) -> list:
    """``module``'s output tensors on ``inputs``, its random draws (if any) from one seed, the
    caller's random state left as it was."""
    import torch

    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        return _tensors(module(*inputs))


def _from_agreeing_export(exported, note: str | None, inputs: tuple, wrong: str, expected: list) -> tvm.IRModule:
    """The Relax module of torch's ONNX export (``exported``) where it agrees with the
    module's outputs on ``inputs`` (``expected``), run by ONNX Runtime; ``ModelImportError``
    where there is none."""
    import onnxruntime as ort
    import torch

    if exported is None:
        raise ModelImportError(f"{wrong}, and there is no ONNX export to import instead ({note})")
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    error = "it takes other inputs"
    if len(names) == len(inputs):
        outputs = session.run(None, {name: t.numpy() for name, t in zip(names, inputs)})
        error = _largest_error([torch.from_numpy(o) for o in outputs], expected)
    if error is not None:
        raise ModelImportError(f"{wrong}, and so does its ONNX export ({error}): collage cannot import it faithfully")
    return _import_onnx(Path("torch's ONNX export"), exported, None)


def _largest_error(got: list, expected: list) -> str | None:
    """None where each of ``got`` is within ``EXPORT_RTOL`` of ``expected``; else what is off."""
    import torch

    if len(got) != len(expected):
        return f"{len(got)} outputs where the module returns {len(expected)}"
    for k, (a, b) in enumerate(zip(got, expected)):
        if a.shape != b.shape:
            return f"output {k} of shape {tuple(a.shape)}, the module's {tuple(b.shape)}"
        a, b = a.double(), b.double()
        scale = float(b.abs().nan_to_num(posinf=0, neginf=0).max()) if b.numel() else 0.0
        off = float((a - b).abs().nan_to_num(nan=0).max()) if b.numel() else 0.0
        if off > EXPORT_RTOL * scale + 1e-6 or not torch.equal(a.isnan(), b.isnan()):
            return f"output {k}: max |diff| {off:.3g} of max |expected| {scale:.3g}"
    return None


def _tensors(outputs) -> list:
    """The tensors of a module's outputs (a tensor, tuple, dict or ``ModelOutput``), in order."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t.detach() for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def _as_tuple(example_inputs) -> tuple:
    """Example inputs as given (a tensor, or a tuple or list of them) as a tuple."""
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def relax_of(program) -> tvm.IRModule:
    """An exported program as a Relax IRModule, by TVM's importer, weights bound as constants."""
    from tvm.relax.frontend.torch import from_exported_program

    from . import decompositions

    program = decompositions.with_aranges_counting_up(decompositions.with_result_dtypes(program))
    try:
        try:
            return from_exported_program(program, keep_params_as_input=False)
        except Exception as first:  # noqa: BLE001 -- perhaps what decomposing makes importable
            try:
                return from_exported_program(decompositions.decomposed(program), keep_params_as_input=False)
            except Exception:  # noqa: BLE001 -- it did not help: report the first error
                raise first from None
    except Exception as err:  # noqa: BLE001 -- "Unsupported function types [...]" is an AssertionError
        raise ProgramImportError(f"TVM's PyTorch importer cannot import it: {first_line(err)}") from None


def export_onnx(module, example_inputs) -> tuple[object | None, str | None]:
    """(the ONNX model ``torch.onnx.export`` writes of ``module``, None), as its users export
    it for an inference engine, or (None, why not). The engines' graph optimizers recognise
    what that exporter writes (GELU, LayerNorm, attention), so each engine runs this file whole
    among the finalists, beside collage's own conversion."""
    import onnx
    import torch

    module = _callable(module)
    inputs = _as_tuple(example_inputs)
    buffer = io.BytesIO()
    try:
        # With gradients on, as users export: under no_grad, nn.TransformerEncoderLayer and
        # nn.MultiheadAttention take their fused fast paths, which no ONNX opset has.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.enable_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            # PRESERVE: the exporter would switch the module to eval mode itself, which an
            # exported program's module refuses (a module in training mode never gets here).
            torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=OPSET,
                              training=torch.onnx.TrainingMode.PRESERVE)
        model = onnx.load_from_string(buffer.getvalue())
    except Exception as err:  # noqa: BLE001 -- the exporter's errors share no type
        return None, f"torch.onnx.export cannot export the module: {type(err).__name__}: {first_line(err)}"
    model.ir_version = IR_VERSION
    return model, None


def load_onnx(source, shapes: Mapping[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """The ONNX model at ``source`` (a path, or an ``onnx.ModelProto``) as a Relax IRModule
    whose ``main`` takes the model's inputs, weights bound as constants. ``shapes`` (input
    name -> shape) fixes inputs the file leaves dynamic, such as a batch dimension; collage
    needs static shapes."""
    return _import_onnx(*_read_onnx(source), shapes)


def _read_onnx(source):
    """(what error lines call it, the ModelProto) of a path or a ModelProto."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return Path("the ONNX model"), source
    path = Path(source)
    if not path.is_file():
        raise ModelImportError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        return path, onnx.load(path)
    except DecodeError as err:
        raise ModelImportError(f"{path}: not an ONNX model (protobuf: {err})") from None


def _import_onnx(path: Path, model, shapes) -> tvm.IRModule:
    if not model.graph.node:
        raise ModelImportError(f"{path}: not an ONNX model (it holds no graph)")
    _check_shapes(path, model, shapes)
    try:
        try:
            return _from_onnx(model, shapes)
        except Exception as first:  # noqa: BLE001 -- perhaps what a clean-up makes importable
            # An operator the importer lacks too: a recurrent layer is written out only with
            # static shapes, and EnCodec's LSTMs read a length computed from its input's shape,
            # which the clean-up's constant folding makes static.
            try:
                return _from_onnx(cleaned_up(model), shapes)
            except Exception:  # noqa: BLE001 -- the clean-up did not help: report the first error
                raise first from None
    except tvm.error.OpNotImplemented as err:
        # TVM's message: "The following operators are not supported for frontend ONNX: A, B"
        ops = str(err).strip().rpartition(": ")[2]
        raise ImporterError(f"{path}: TVM's ONNX importer does not support operator(s) {ops}") from None
    except Exception as err:  # noqa: BLE001 -- the importer's own errors share no type
        raise ImporterError(f"{path}: TVM cannot import it: {type(err).__name__}: {first_line(err)}") from None


def _from_onnx(model, shapes):
    from tvm.relax.frontend.onnx import from_onnx

    from .unroll import unrolled

    # The importer turns the ONNX checker's complaints into warnings and prints the inputs of
    # an operator it fails on; load_onnx's error says what went wrong.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        # The importer has no GRU or LSTM: their steps written out, it imports them.
        return from_onnx(unrolled(model, shapes), shape_dict=dict(shapes) if shapes else None, keep_params_in_input=False)


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
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=unsound_ort_rewrites(model))  # fmt: skip
        cleaned = onnx.load(options.optimized_model_filepath)
    return onnx.shape_inference.infer_shapes(cleaned)


# ONNX Runtime's graph rewrites that change what a model computes, by the name its
# ``disabled_optimizers`` takes, each with the operators it must not be let near: Pad_Fusion
# moves a Pad into the MaxPool reading it, as the pool's own padding, which MaxPool fills with
# -inf whatever value the Pad wrote. BiT's stem pads its convolution's output with zeros before
# a max-pool: fused, a border window of negative values gave their maximum instead of the 0 the
# Pad put there (ONNX Runtime 1.31: 3e-3 off torch's output, and the clean-up above, which
# makes the Pad's widths constants for it, passed the error on to TVM's import).
UNSOUND_ORT_REWRITES = {"Pad_Fusion": ("Pad", "MaxPool")}


def unsound_ort_rewrites(model) -> list[str]:
    """The rewrites of ``UNSOUND_ORT_REWRITES`` that could change what ``model`` (an
    ``onnx.ModelProto``) computes: those whose first operator feeds the second somewhere in
    it, its sub-graphs included. An ONNX Runtime session of ``model`` disables them."""
    import onnx

    fed: set[tuple[str, str]] = set()  # (producer op, consumer op) pairs along an edge

    def visit(graph) -> None:
        producer = {name: node.op_type for node in graph.node for name in node.output}
        for node in graph.node:
            fed.update((producer[name], node.op_type) for name in node.input if name in producer)
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                    visit(sub)

    visit(model.graph)
    return [rewrite for rewrite, edge in UNSOUND_ORT_REWRITES.items() if edge in fed]


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
