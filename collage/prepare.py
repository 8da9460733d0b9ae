"""The model as every stage takes it: ``main`` with its weights bound and static tensor
inputs, simplified, the backends asked for, the graph to place, and the unoptimized outputs
that every assembled module is checked against. ``optimize`` and ``load_placement`` both
start here (``prepare_model``)."""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax

from .candidates.backend import REFERENCE_BACKEND, Backend, BackendSet, default_backends
from .config import Config
from .errors import OptimizeError
from .measuring.cost_log import CostLog
from .measuring.build import REFERENCE_TARGET, reference_vm, values_target
from .errors import first_line
from .measuring.arrays import Reference, mismatch, numpy_outputs, random_inputs, static_shape, to_tensors
from .model.graph import DataflowGraph
from .model.asserts import without_asserts, without_asserts_that_hold
from .model.simplify import (
    BOOLEANS_AS_INTEGERS, FINITE_INTEGER_CLIPS, WRAP_NEGATIVE_TAKE_INDICES, SimplifyReport, simplify,
)  # fmt: skip


@dataclass
class Model:
    """The model as every stage takes it."""

    original: tvm.IRModule  # bound, unoptimized, as TVM computes it (``defined``): what every module is checked against
    prepared: tvm.IRModule  # simplified (unless the config says not to, or simplifying failed)
    simplified: SimplifyReport | None
    simplify_failed: str | None  # why it is placed as given
    rewritten: list[str]  # what of the model was written otherwise before placing, and why (``defined``, asserts)
    backends: BackendSet  # those asked for
    usable: list[Backend]  # those of them that run here
    excluded: dict[str, str]  # the others, with why
    log: CostLog
    onnx_model: onnx.ModelProto | None  # the file the model came from, for the engines to run whole
    config: Config
    arrays: list[np.ndarray]  # seeded inputs
    calibration: list[list[np.ndarray]]  # the user's input sets for the accuracy budget (or none)
    program: object | None = None  # the PyTorch module's torch.export program, for an engine to compile whole
    module: object | None = None  # the user's torch.nn.Module it exports, which such an engine compiles first
    warnings: list[str] = field(default_factory=list)  # what the model as given computes, likely unmeant

    @functools.cached_property
    def expected(self) -> list[np.ndarray]:
        """The unoptimized module's outputs on ``arrays`` (from the log, else run once), asked
        for when the first module is checked: a model TVM cannot run gets the placement's own
        error first, which names the operator."""
        return reference_outputs(self.original, self.arrays, self.log, _seeded(self.config.seed))

    @property
    def reference(self) -> Reference:
        """The seeded inputs with ``expected``: what every module built here is checked against."""
        return Reference(self.arrays, self.expected)

    @functools.cached_property
    def budget_draws(self) -> list[Reference]:
        """The input sets, each with the unoptimized outputs on it, on which the whole module is
        held to an accuracy budget: the seeded inputs, then the user's calibration sets, or
        without them a second, independent draw."""
        seed = self.config.seed
        if self.calibration:
            others = [Reference(arrays, reference_outputs(self.original, arrays, self.log, _given(arrays)))
                      for arrays in self.calibration]  # fmt: skip
        else:
            second = random_inputs(self.original["main"], seed + 1)
            others = [Reference(second, reference_outputs(self.original, second, self.log, _seeded(seed + 1)))]
        return [self.reference, *others]


def prepare_model(
    config: Config,
    mod: tvm.IRModule,
    backends: BackendSet | Iterable[Backend | str] | None,
    cost_log: CostLog | str | os.PathLike | None,
    params: Mapping | None = None,
    onnx_model: onnx.ModelProto | str | os.PathLike | None = None,
    calibration: Iterable | None = None,
    program=None,
    module=None,
) -> Model:
    """Bind, check and simplify ``mod``; gather the backends and the log; draw the seeded
    inputs; check the ``calibration`` sets (``checked_calibration``). ``OptimizeError`` for
    input it cannot take."""
    original, rewritten = defined(with_params_bound(mod, params))
    original, dropped = without_asserts_that_hold(original)
    if dropped:
        rewritten.append(f"{dropped} run-time check(s) of values computed from constants alone, which hold, dropped: "
                         "a check splits the dataflow collage places")  # fmt: skip
    calibration = checked_calibration(original["main"], calibration)
    asked = backend_set(backends)
    usable, excluded = asked.usable(config.target)
    if not any(b.name == REFERENCE_BACKEND for b in usable):
        raise OptimizeError("the 'tvm' backend must be among the backends: it is the fallback for every operator")
    log = cost_log if isinstance(cost_log, CostLog) else CostLog(cost_log)
    onnx_model = None if onnx_model is None else onnx_proto(onnx_model)
    prepared, checks = without_asserts(original)
    if checks:
        rewritten.append(f"{len(checks)} run-time check(s) of the inputs (the first: {checks[0]!r}) not made by the "
                         "placed module, as in torch's ONNX export: it computes the same on inputs that pass them, "
                         "and refuses none")  # fmt: skip
    report, failed = None, None
    if config.simplify:
        try:
            prepared, report = simplify(prepared, report=True)
        except Exception as err:  # noqa: BLE001 -- a TVM pass failing on this model: place it as given
            failed = f"simplification failed, the model is placed as given: {type(err).__name__}: {first_line(err)}"
    arrays = random_inputs(original["main"], config.seed)
    return Model(original, prepared, report, failed, rewritten, asked, usable, excluded, log, onnx_model, config,
                 arrays, calibration, program, module, batch_statistics(original))  # fmt: skip


def batch_statistics(mod: tvm.IRModule) -> list[str]:
    """A warning where the model normalizes with each batch's statistics: ``relax.nn.batch_norm``
    does unless told ``training=False``, and TVM's FX importer (``from_fx``) does not tell it
    for a BatchNorm of a module in eval mode, so the module it writes computes other numbers
    than torch (a keyword spotter: 3.7e-2 of its output). Collage keeps the meaning it is given."""
    def is_training(expr) -> bool:
        return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.batch_norm"
                and bool(expr.attrs.training))  # fmt: skip

    training = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: training.append(e) if is_training(e) else None)
    if not training:
        return []
    return [f"{len(training)} BatchNorm(s) normalize with each batch's own statistics (relax.nn.batch_norm with "
            "training=True, the op's default, which TVM's from_fx writes even for a module in eval mode), and so does "
            "the optimized module; for inference, import with tvm.relax.frontend.torch.from_exported_program"]


def defined(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """``mod`` as TVM can compute it with the meaning torch and ONNX give it, and a line per
    kind of change (none: nothing changed); the unoptimized model every placement is checked
    against is this one.

    - PyTorch's importer writes ``x[..., -2, :]`` as a fast take at index -2, which TVM reads
      out of bounds: the reference would be whatever lies in memory there, and the
      placements, which count the index from the end, were all rejected (Falcon's unoptimized
      outputs were NaN in one run and wrong by 100% in the next).
    - TVM cannot compile comparisons and arithmetic of booleans, which the importers write
      as torch and ONNX have them: it could not run LongT5's unoptimized model at all.
    - TVM cannot compile a clip of integers to an infinite bound, which PyTorch's importer
      writes for a one-sided clamp: it could not run SAM's image encoder at all."""
    changes = []
    mod, count = WRAP_NEGATIVE_TAKE_INDICES.apply(mod)
    if count:
        changes.append(f"{count} take(s) at negative indices, which TVM's fast take reads out of bounds, count them "
                       "from the end, as torch and ONNX do, in the unoptimized model too")  # fmt: skip
    mod, count = BOOLEANS_AS_INTEGERS.apply(mod)
    if count:
        changes.append(f"{count} comparison(s) or arithmetic operator(s) on booleans, which TVM cannot compile, "
                       "compute on their 0/1 integers, in the unoptimized model too")  # fmt: skip
    mod, count = FINITE_INTEGER_CLIPS.apply(mod)
    if count:
        changes.append(f"{count} clip(s) of integers to an infinite bound, which TVM cannot compile, are bounded "
                       "by the integer type's extreme instead, in the unoptimized model too")  # fmt: skip
    return mod, changes


def simplification_changed(model: Model, rtol: float) -> str | None:
    """How the simplified model's outputs on the seeded inputs miss the unoptimized model's by
    more than ``rtol`` of their largest magnitude, both run by TVM on the CPU; None where they
    do not, or nothing was simplified."""
    if model.prepared is model.original:
        return None
    try:
        outputs = reference_outputs(model.prepared, model.arrays, model.log, _seeded(model.config.seed))
    except OptimizeError as err:
        return str(err)
    return mismatch(outputs, model.expected, rtol)


def checked_calibration(main: relax.Function, sets: Iterable | None) -> list[list[np.ndarray]]:
    """The user's calibration ``sets`` as lists of arrays in ``main``'s parameter order: each
    set a sequence of arrays in that order or a mapping from input name to array, each array
    of the input's shape and dtype. ``OptimizeError`` names the first set and input that is
    not."""
    params = list(main.params)
    checked = []
    for k, given in enumerate(sets or ()):
        if isinstance(given, Mapping):
            names = [p.name for p in params]
            extra = sorted(set(given) - set(names))
            if extra or len(given) != len(names):
                missing = [n for n in names if n not in given]
                raise OptimizeError(f"calibration set {k}: inputs are {', '.join(names)}; "
                                    + (f"unknown: {', '.join(extra)}" if extra else f"missing: {', '.join(missing)}"))  # fmt: skip
            given = [given[n] for n in names]
        given = [np.asarray(a) for a in given]
        if len(given) != len(params):
            raise OptimizeError(f"calibration set {k}: {len(given)} arrays, but main takes {len(params)} inputs")
        for p, a in zip(params, given):
            shape, dtype = static_shape(p.ty), p.ty.dtype
            if a.shape != shape or str(a.dtype) != dtype:
                raise OptimizeError(f"calibration set {k}, input {p.name!r}: {a.dtype}{list(a.shape)}, "
                                    f"but the model takes {dtype}{list(shape)}")  # fmt: skip
        checked.append(given)
    return checked


def onnx_proto(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """An ONNX model given as itself or as its file."""
    return model if isinstance(model, onnx.ModelProto) else onnx.load(model)


def with_params_bound(mod, params: Mapping | None) -> tvm.IRModule:
    """``mod`` with ``params`` bound into ``main`` (``named_weights``), checked to take static
    tensor inputs only."""
    if not isinstance(mod, tvm.IRModule):
        raise OptimizeError(
            f"collage.optimize takes a Relax tvm.IRModule, not {type(mod).__name__}; import ONNX models "
            "with tvm.relax.frontend.onnx.from_onnx and PyTorch ones with tvm.relax.frontend.torch"
        )
    mod, entry = with_entry_as_main(mod)
    weights = named_weights(mod["main"], params, entry)
    if weights:
        mod = relax.transform.BindParams("main", {k: tvm.runtime.tensor(v) for k, v in weights.items()})(mod)
    if "params" in mod["main"].attrs:  # bound now, or the user's values replace them
        mod = mod.clone()
        mod["main"] = mod["main"].without_attr("params")
    for p in mod["main"].params:
        if not isinstance(p.ty, relax.TensorType):
            raise OptimizeError(f"input {p.name!r} is a {p.ty}, not a tensor; collage takes tensor inputs")
        try:
            static_shape(p.ty)
        except ValueError as err:
            if p.ty.shape is not None:  # symbolic extents, which shapes= fixes
                err = f"symbolic shape {p.ty.shape}: give its sizes as shapes={{{p.name!r}: [...]}}"
            raise OptimizeError(f"input {p.name!r}: {err}") from None
    return mod


def named_weights(main: relax.Function, params: Mapping | None, entry: str) -> dict[str, np.ndarray]:
    """The weights to bind into ``main`` (once called ``entry``), by input name: ``params`` as
    given, input name to array; or in TVM's own forms for weights its importers keep as inputs
    (``keep_params_as_input``), main's inputs after its first ``num_input``, in order: the
    arrays ``relax.frontend.detach_params`` gives (``{entry: [arrays]}``) or, given no params,
    those the importer left in main's ``params`` attribute. ``OptimizeError`` names what does
    not fit."""
    inputs = [p.name for p in main.params]
    if not params:
        left = "params" in main.attrs
        return _weights_in_order(main, list(main.attrs["params"]), "main's 'params' attribute") if left else {}
    if set(params) == {entry} and not isinstance(params[entry], np.ndarray) and entry not in inputs:
        return _weights_in_order(main, list(params[entry]), f"params[{entry!r}]")
    unknown = sorted(set(params) - set(inputs))
    if unknown:
        raise OptimizeError(f"params name no input of main: {', '.join(unknown)} (inputs: {', '.join(sorted(inputs))})")
    return {name: _array(value) for name, value in params.items()}


def _weights_in_order(main: relax.Function, arrays: list, given: str) -> dict[str, np.ndarray]:
    """``arrays`` as the values of ``main``'s inputs after its first ``num_input``."""
    weights = main.params[int(main.attrs["num_input"]):] if "num_input" in main.attrs else None
    if weights is None or len(weights) != len(arrays):
        takes = "no num_input attribute to say which inputs are weights" if weights is None else (
            f"{len(weights)} weight(s) after its {int(main.attrs['num_input'])} input(s) (num_input)")
        raise OptimizeError(f"{given} holds {len(arrays)} array(s), but main takes {takes}")
    return {p.name: _array(a) for p, a in zip(weights, arrays)}


def _array(value) -> np.ndarray:
    return value.numpy() if isinstance(value, tvm.runtime.Tensor) else np.asarray(value)


def with_entry_as_main(mod: tvm.IRModule) -> tuple[tvm.IRModule, str]:
    """``mod`` with the function to optimize named ``main``, and the name it had: its ``main``,
    or else its one public Relax function, as ``relax.frontend.nn``'s ``export_tvm`` names it
    after the method exported (``forward``); the functions it calls keep their names.
    ``OptimizeError`` where there is neither, or several to choose from."""
    if any(gv.name_hint == "main" and isinstance(func, relax.Function) for gv, func in mod.functions_items()):
        return mod, "main"
    public = [gv for gv, func in mod.functions_items()
              if isinstance(func, relax.Function) and "global_symbol" in func.attrs]  # fmt: skip
    if len(public) != 1:
        found = f"; it has {', '.join(sorted(gv.name_hint for gv in public))}" if public else ""
        raise OptimizeError(f"the module has no Relax function named 'main' to optimize{found}: name the one to "
                            "optimize 'main'")  # fmt: skip
    renamed = {}
    for gv, func in mod.functions_items():
        if gv.same_as(public[0]):
            gv, func = relax.GlobalVar("main"), func.with_attr("global_symbol", "main")
        renamed[gv] = func
    return tvm.IRModule(renamed, attrs=mod.attrs, global_infos=mod.global_infos), public[0].name_hint


def backend_set(backends: BackendSet | Iterable[Backend | str] | None) -> BackendSet:
    """The backends asked for (records or names of registered ones); None: every registered one."""
    if backends is None:
        return default_backends()
    if isinstance(backends, BackendSet):
        return backends
    defaults = default_backends()
    chosen = []
    for b in backends:
        if isinstance(b, Backend):
            chosen.append(b)
        else:
            try:
                chosen.append(defaults[b])
            except KeyError as err:
                raise OptimizeError(err.args[0]) from None
    return BackendSet(chosen)


class Unplaceable(Exception):
    """``main`` holds nothing collage can place; the message says why. TVM still runs it."""


def dataflow_graph(mod: tvm.IRModule) -> DataflowGraph:
    """The graph of ``main``'s operators, its bindings put in one dataflow block if need be.
    Raises ``Unplaceable`` when there is no operator, or a binding the graph cannot hold (a
    ``match_cast`` to shapes known only at run time, as ONNX's Range imports)."""
    main = mod["main"]
    if not any(block.bindings for block in main.body.blocks):
        raise Unplaceable("main holds no operator (it returns its inputs or constants)")
    try:
        return DataflowGraph.from_module(mod)
    except ValueError:
        pass
    try:
        return DataflowGraph.from_module(relax.transform.ConvertToDataflow(min_size=1)(mod))
    except ValueError as err:
        raise Unplaceable(f"main cannot be placed: {err}") from None


def _seeded(seed: int) -> str:
    # "inputs 2": drawn inside each operator's domain since (arrays.random_inputs).
    return f"seed {seed} inputs 2"


def _given(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(np.ascontiguousarray(a).tobytes())
    return f"given {digest.hexdigest()[:32]}"


def reference_outputs(original, arrays, log: CostLog, inputs: str) -> list[np.ndarray]:
    """The unoptimized module's outputs on ``arrays`` (which ``inputs`` names: ``_seeded``,
    ``_given``): from the log, else run by TVM on the CPU and saved.

    On the CPU whatever the target, as the candidates' references (``intermediate_values``):
    a reference must not share the target's flaws. TVM builds CUDA with nvcc's fast math,
    whose ``powf`` is NaN for a negative base; GPT-2's reference on the GPU was NaN, and every
    correct placement of it was then rejected as wrong."""
    key = f"{tvm_ffi.structural_hash(original):x} {inputs} cpu"
    saved = log.get_reference(key)
    if saved is None:
        try:
            vm = reference_vm(original, _values_target(original))
            saved = numpy_outputs(vm["main"](*to_tensors(arrays)))
        except Exception as err:  # noqa: BLE001 -- TVM's own failure on this model
            raise OptimizeError(
                f"TVM cannot run the unoptimized model, which every placement is checked against: "
                f"{type(err).__name__}: {first_line(err)}"
            ) from None
        log.put_reference(key, saved)
    return saved


def _values_target(original: tvm.IRModule):
    """``values_target`` of ``original``'s graph; unoptimized LLVM where it has no graph to
    count (the error that says why comes from placing it)."""
    try:
        return values_target(DataflowGraph(original["main"]))
    except ValueError:  # a binding the placer cannot take
        return REFERENCE_TARGET
