"""An inference engine alone on the whole model, as its users run it.

A user who has an ONNX file can hand it to ONNX Runtime or OpenVINO directly; collage must
never be slower than that. So when the model came as an ONNX file, each engine that reads
ONNX (``Backend.compile_onnx``) runs that very file, with its users' settings, as one more
finalist: ``main`` becomes one ``call_dps_packed`` of the engine's kernel on the caller's
buffers. When it did not, the engine's largest region is the whole model as long as every op
converts to ONNX, and ``blockers`` names the ops that keep it from being so. Likewise, when
the model came as a PyTorch module, an engine that compiles PyTorch programs
(``Backend.compile_program``: inductor) compiles the user's own module whole, as
``torch.compile`` of it would.
"""

from __future__ import annotations

import collections
import itertools
import math

import onnx
import tvm
from tvm import relax

from ..assembling.assemble import Assembly, KernelSource
from ..candidates.backend import Backend
from ..candidates.generate import FILE_SUFFIX, PROGRAM_SUFFIX, Candidate
from ..candidates.onnx_convert import supports
from ..model.frontend import IR_VERSION
from ..candidates.precision import FLOAT32, precision_argument, short
from ..candidates.subgraph import SubGraph
from ..measuring.cost import Cost
from ..measuring.build import build_vm
from ..errors import first_line
from ..measuring.arrays import Reference, output_types, static_shape
from ..model.graph import DataflowGraph
from ..assembling.checked import Finalist, wrong_result
from ..placing.placement import Partition


_ids = itertools.count()


class EngineAloneFailed(Exception):
    """The engine cannot run the user's file (or program) in place of ``main``; the message says why."""


def blockers(graph: DataflowGraph, backend: Backend) -> dict[str, tuple[int, str]]:
    """The operators no rule of ``backend`` takes, each with its count and why (the first
    such node's reason): what keeps the engine from the whole model."""
    found: dict[str, list] = collections.OrderedDict()
    for node in graph:
        if not any(rule.valid_op(graph, node) for rule in backend.rules):
            entry = found.setdefault(node.op, [0, None])
            entry[0] += 1
            entry[1] = entry[1] or supports(graph, node) or f"no rule of {backend.name} takes it"
    return {op: (count, reason) for op, (count, reason) in found.items()}


def blockers_text(engine: str, found: dict[str, tuple[int, str]]) -> str:
    ops = ", ".join(f"{op.removeprefix('relax.')} x{count} ({reason})" for op, (count, reason) in found.items())
    return f"{engine} cannot take the whole model: {ops}"


def from_onnx_file(
    original: tvm.IRModule, graph: DataflowGraph, backend: Backend, model: onnx.ModelProto, target: str,
    threads: int = 0, precision: str = FLOAT32,
) -> tuple[Assembly, Partition]:
    """``original``'s ``main`` as one call of ``backend`` running ``model`` (the file it was
    imported from) on ``threads`` threads (0: the engine's default), and that call as a
    partition of ``graph``. Raises ``EngineAloneFailed``."""
    main = original["main"]
    model = _with_static_inputs(model, main)
    outputs = output_types(main)
    if len(model.graph.output) != len(outputs) or not all(isinstance(t, relax.TensorType) for t in outputs):
        raise EngineAloneFailed(
            f"the ONNX file has {len(model.graph.output)} output(s); main returns {main.ret_ty}"
        )
    try:
        kernel = backend.compile_onnx(model, target, threads, alone=True, **precision_argument(precision))
    except Exception as err:  # the engine's own refusal: this finalist is left out with it
        raise EngineAloneFailed(f"{backend.name} cannot run the ONNX file: {type(err).__name__}: {err}") from None
    source = KernelSource(backend.name, f"{backend.name}{FILE_SUFFIX}", alone=True, onnx_model=model, precision=precision)
    return _in_place_of_main(original, graph, kernel, source)


def from_program(
    original: tvm.IRModule, graph: DataflowGraph, backend: Backend, program, target: str, threads: int = 0,
    precision: str = FLOAT32, module=None,
) -> tuple[Assembly, Partition]:
    """``original``'s ``main`` as one call of ``backend`` running the user's ``module`` (or
    where there is none, ``program``: the ``torch.export`` program ``main`` was imported
    from), and that call as a partition of ``graph``. Raises ``EngineAloneFailed``."""
    try:
        kernel = backend.compile_program(program, original["main"], target, threads, module=module,
                                         **precision_argument(precision))  # fmt: skip
    except Exception as err:  # the engine's own refusal: this finalist is left out with it
        raise EngineAloneFailed(f"{backend.name} cannot compile the PyTorch module: {type(err).__name__}: "
                                f"{first_line(err)}") from None  # fmt: skip
    source = KernelSource(backend.name, f"{backend.name}{PROGRAM_SUFFIX}", alone=True, program=program,
                          module=module, precision=precision)  # fmt: skip
    return _in_place_of_main(original, graph, kernel, source)


def _in_place_of_main(original: tvm.IRModule, graph: DataflowGraph, kernel, source: KernelSource) -> tuple[Assembly, Partition]:
    """``main`` as one ``call_dps_packed`` of ``kernel`` on the caller's buffers, and that
    call as a partition of ``graph`` (cost unknown: nothing of it was measured)."""
    main = original["main"]
    outputs = output_types(main)
    if not all(isinstance(t, relax.TensorType) for t in outputs):
        raise EngineAloneFailed(f"main returns {main.ret_ty}, not tensors only")
    name = f"collage_alone_{next(_ids)}.{source.backend}"
    tvm.register_global_func(name, kernel, override=True)
    bb = relax.BlockBuilder()
    with bb.function("main", list(main.params), dict(main.attrs) if main.attrs else None):
        with bb.dataflow():
            out_ty = list(outputs) if isinstance(main.ret_ty, relax.TupleType) else outputs[0]
            out = relax.call_dps_packed(name, relax.Tuple(list(main.params)), out_ty=out_ty)
            if isinstance(main.ret_ty, relax.TupleType) and len(outputs) == 1:
                # A call of one output is that tensor; ``main`` returned it in a tuple (as
                # ``torch.export``'s import returns even one output), and ``opt(x)`` must too,
                # whichever finalist is kept.
                out = relax.Tuple([bb.emit(out)])
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    whole = Candidate(SubGraph(graph, frozenset(range(len(graph)))), source.backend, source.pattern, source.precision)
    partition = Partition(whole, Cost.unknown())
    return Assembly(bb.get(), [(partition, name, kernel)], {name: source}), partition


def checked_on_file(original: tvm.IRModule, graph: DataflowGraph, backend: Backend, model: onnx.ModelProto,
                    check: Reference, target: str, threads: int, precision: str = FLOAT32,
                    budget: float | None = None) -> Finalist:
    """``from_onnx_file``'s module, built and checked on ``check`` (within the accuracy
    ``budget`` for a reduced ``precision``), as a finalist. Raises ``EngineAloneFailed`` saying why not: the
    engine refuses the file, fails running it, or computes otherwise."""
    return _checked(lambda: from_onnx_file(original, graph, backend, model, target, threads, precision), "the ONNX file",
                    backend, check, target, precision, budget)  # fmt: skip


def checked_on_program(original: tvm.IRModule, graph: DataflowGraph, backend: Backend, program,
                       check: Reference, target: str, threads: int, precision: str = FLOAT32,
                       budget: float | None = None, module=None) -> Finalist:  # fmt: skip
    """``from_program``'s module, built and checked as ``checked_on_file`` checks the file's."""
    return _checked(lambda: from_program(original, graph, backend, program, target, threads, precision, module),
                    "the PyTorch module", backend, check, target, precision, budget)  # fmt: skip


def _checked(assembled, what: str, backend: Backend, check: Reference, target: str, precision: str,
             budget: float | None) -> Finalist:  # fmt: skip
    try:
        assembly, partition = assembled()
        vm = build_vm(assembly.module, target, {name: backend for _, name, _ in assembly.kernels})
        problem = wrong_result(vm, check, target, None if precision == FLOAT32 else budget)
    except EngineAloneFailed:
        raise
    except Exception as err:  # a library raising at build or run time: this finalist cannot be
        raise EngineAloneFailed(f"{backend.name} failed running {what}: {type(err).__name__}: {first_line(err)}") from None
    if problem is not None:
        at = "" if precision == FLOAT32 else f" in {short(precision)}"
        raise EngineAloneFailed(f"{backend.name}{at} on {what} disagrees with the unoptimized module: {problem}")
    return Finalist([partition], assembly, vm, math.nan)


def _with_static_inputs(model: onnx.ModelProto, main: relax.Function) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs have ``main``'s static shapes (a dynamic batch fixed by
    the user), loadable by the engines here (IR version at most 10)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    if len(inputs) != len(main.params):
        raise EngineAloneFailed(f"the ONNX file has {len(inputs)} input(s); main takes {len(main.params)}")
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.ir_version = min(fixed.ir_version, IR_VERSION)  # ONNX Runtime 1.31 loads IR <= 13
    for value, param in zip((v for v in fixed.graph.input if v.name not in initializers), main.params):
        shape = static_shape(param.ty)
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise EngineAloneFailed(f"ONNX input {value.name!r} has rank {len(dims)}; main's {param.name_hint!r} has {len(shape)}")
        for dim, size in zip(dims, shape):
            dim.Clear()
            dim.dim_value = size
    return fixed
