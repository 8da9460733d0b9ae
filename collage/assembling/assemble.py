"""Assembly: a placement becomes one Relax module that the Relax VM runs.

Each partition becomes one call in a new ``main``, in the placement's order:

- a ``tvm`` partition of several ops becomes a private function marked ``Primitive``, which
  collage's pipeline (``measuring.pipeline``, TVM's own for the target) legalizes and fuses
  into one kernel (FuseTIR), exactly the group the placement chose; a single op stays inline,
  where TVM's own FuseOps may still fuse it;
- a partition of any other backend is compiled by that backend (with its own weights) into a
  kernel, registered as a global function, and called with ``call_dps_packed``: the VM
  allocates the outputs and passes every tensor to the kernel by DLPack, without a copy.

``assemble`` returns the module and the kernels it calls; the kernels stay registered while
the returned ``Assembly`` lives. It also keeps what each kernel was compiled from
(``KernelSource``), so that an exported module (``collage.deploying.exported``) can compile it again.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import weakref
from dataclasses import dataclass, field
from typing import Callable

import tvm
import tvm_ffi
from tvm import relax

from ..candidates.backend import REFERENCE_BACKEND, BackendSet
from ..candidates.precision import FLOAT32
from ..candidates.subgraph import Remap, SubGraph
from ..measuring.build import compile_kernel
from ..measuring.arrays import static_shape
from ..model.graph import CALLEES_ATTR, DataflowGraph
from ..placing.placement import Partition

_assembly_ids = itertools.count()


@dataclass(frozen=True)
class KernelSource:
    """What one kernel outside TVM was compiled from: a sub-graph of the model (compiled by
    ``build.compile_kernel``), an ONNX model an engine runs whole (``onnx_model``, by
    ``Backend.compile_onnx``), or the user's PyTorch module an engine compiles whole
    (``module``, and the ``program`` exported from it, by ``Backend.compile_program``). ``alone``: compiled with the engine's users'
    own settings; ``beside_spinning``: compiled for a module where another library's threads
    spin after its calls (``beside_spinning``); ``precision``: the number format it computes in."""

    backend: str
    pattern: str
    alone: bool
    subgraph: SubGraph | None = None
    onnx_model: object | None = None  # onnx.ModelProto
    precision: str = FLOAT32
    program: object | None = None  # torch.export.ExportedProgram
    module: object | None = None  # the torch.nn.Module it was exported from
    beside_spinning: bool = False


@dataclass
class Assembly:
    """The assembled module and, for each partition outside TVM, the name its kernel is
    registered under and what it was compiled from (``sources``, by name). The names are
    unregistered when the Assembly is collected, so the libraries' sessions do not outlive
    their module."""

    module: tvm.IRModule
    kernels: list[tuple[Partition, str, object]] = field(default_factory=list)  # (partition, name, kernel)
    sources: dict[str, KernelSource] = field(default_factory=dict)

    def __post_init__(self):
        weakref.finalize(self, _unregister, [name for _, name, _ in self.kernels])

    def kernel_map(self) -> dict:
        """Each library kernel by the name ``main`` calls it."""
        return {name: kernel for _, name, kernel in self.kernels}


def bound_main(assembly: Assembly, vm: relax.VirtualMachine, inputs: list, device) -> Callable[[], object]:
    """``main`` on ``inputs``, bound once for a caller that runs the same buffers again and
    again (a serving loop, a benchmark, the finalists' race): a call with no arguments that
    returns ``main``'s outputs (``bound_function``)."""
    return bound_function(assembly.module["main"], assembly.kernel_map(), vm, inputs, device)


def bound_function(main: relax.Function, kernels: dict, vm: relax.VirtualMachine, inputs: list,
                   device) -> Callable[[], object]:  # fmt: skip
    """``main`` (calling the library ``kernels``, by registered name) on ``inputs``, bound
    once: a call with no arguments that returns its outputs.

    When ``main`` is nothing but one library kernel on its parameters (an engine running the
    whole model), the call goes to that kernel directly, into output tensors allocated here
    once and overwritten by each call, as an engine's own infer request does; a kernel that
    binds its buffers is bound to them here (``Kernel.bound``), not looked up per call. Through the VM,
    the same call cost 10-20 us more than the engine's own (DeiT-tiny on OpenVINO, 2-core
    Xeon: 662 us against 643): the VM's and the FFI's call path, evicted from the caches by the
    engine's run, is cold on every call (a VM call of a Python no-op took 1.3 us warm, 13.8
    us after 8 MB of other work). Otherwise each call runs ``main`` on the VM."""
    direct = sole_kernel(main, kernels)
    if direct is None or (device.dlpack_device_type() == tvm.cuda().dlpack_device_type() and not hasattr(direct[0], "bound")):
        # On a GPU the VM replays its CUDA graphs; a kernel called directly is launched from
        # Python each time, unless it binds its buffers (its own graph, ``Kernel.bound``).
        return functools.partial(vm["main"], *inputs)
    kernel, out_ty, layout = direct
    out_types = list(out_ty.fields) if isinstance(out_ty, relax.TupleType) else [out_ty]
    outputs = [tvm.runtime.empty(static_shape(t), str(t.dtype), device) for t in out_types]
    arrange = arranger(layout)
    result = arrange(outputs)
    tensors = [*inputs, *outputs]
    bound = getattr(kernel, "bound", None)
    run = bound(tensors) if bound is not None else functools.partial(kernel, *tensors)

    def call():
        run()
        return result

    call.buffers = tensors  # what run() reads and writes: a library's binding does not keep them alive
    call.result = result  # what every call returns, its outputs overwritten
    plain = getattr(kernel, "plain", None)
    if plain is not None:  # the engine's own call on numpy arrays (``Kernel.plain``)
        call.plain = lambda arrays: arrange(plain(arrays))
    return call


def sole_kernel(main: relax.Function, kernels: dict):
    """(kernel, its output type, layout) when ``main`` is one ``call_dps_packed`` of a
    library kernel (one of ``kernels``, by name) on all of its parameters in order, its
    outputs returned as they are or regrouped (a tuple of them, as a model imported from
    ``torch.export`` returns even one output): ``layout`` is ``main``'s result with each
    kernel output as its index (``arranger``). Else None."""
    bindings = [b for block in main.body.blocks for b in block.bindings]
    if not bindings:
        return None
    call = bindings[0].value
    if not (isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_dps_packed"))):
        return None
    callee, args = call.args[0], call.args[1]
    if not isinstance(callee, relax.ExternFunc) or len(args.fields) != len(main.params):
        return None
    if not all(a.same_as(p) for a, p in zip(args.fields, main.params)):
        return None
    if callee.global_symbol not in kernels:
        return None
    regrouped = bindings[1:]
    if not all(isinstance(b.value, (relax.Tuple, relax.TupleGetItem, relax.Var)) for b in regrouped):
        return None
    outputs = tuple(range(len(call.ty.fields))) if isinstance(call.ty, relax.TupleType) else 0
    known = {bindings[0].var: outputs}
    try:  # every name it reads is the kernel's or a regrouping's
        for b in regrouped:
            known[b.var] = _regrouped(b.value, known)
        layout = _regrouped(main.body.body, known)
    except KeyError:
        return None
    return kernels[callee.global_symbol], call.ty, layout


def _regrouped(expr, known: dict):
    """``expr``'s layout when it only regroups values in ``known`` (var -> layout)."""
    if isinstance(expr, relax.Var):
        return known[expr]
    if isinstance(expr, relax.Tuple):
        return tuple(_regrouped(f, known) for f in expr.fields)
    if isinstance(expr, relax.TupleGetItem):
        return _regrouped(expr.tuple_value, known)[expr.index]
    raise KeyError(expr)


def arranger(layout) -> Callable:
    """A function from a kernel's outputs (a sequence) to ``main``'s result as ``layout`` says
    (an output's index, or tuples of layouts), prepared once: a call reads no IR."""
    if isinstance(layout, int):
        return operator.itemgetter(layout)
    parts = [arranger(part) for part in layout]
    if len(parts) == 1:
        (only,) = parts
        return lambda outputs: (only(outputs),)
    return lambda outputs: tuple(part(outputs) for part in parts)


def _unregister(names: list[str]) -> None:
    for name in names:
        tvm_ffi.remove_global_func(name)


class PartitionFailed(Exception):
    """A backend could not compile one partition of the placement."""

    def __init__(self, partition: Partition, reason: str):
        super().__init__(f"{partition}: {reason}")
        self.partition, self.reason = partition, reason


def assemble(
    graph: DataflowGraph,
    partitions: list[Partition] | tuple[Partition, ...],
    backends: BackendSet,
    target: str = "llvm",
    returns: list[int] | None = None,
    compiled: dict | None = None,
    *,
    threads: int = 0,
) -> Assembly:
    """The module running ``partitions`` (which cover ``graph`` and are in an order that
    runs), each library's kernel compiled for ``threads`` threads (0: its default). ``returns`` makes ``main`` return those nodes' values instead of the graph's result
    (to read intermediate values). ``compiled`` maps (backend, pattern, nodes) to kernels
    compiled before, and gains the new ones: a search assembling many placements compiles each
    partition once. Raises ``PartitionFailed`` when a backend cannot compile its partition."""
    func = graph.func
    prefix = f"collage_{next(_assembly_ids)}"
    bb = relax.BlockBuilder()
    remap = Remap({})  # old var -> new expr
    kernels, sources = [], {}
    with bb.function("main", list(func.params), dict(func.attrs) if func.attrs else None):
        with bb.dataflow():
            for k, part in enumerate(partitions):
                sub = part.candidate.subgraph
                if part.backend == REFERENCE_BACKEND and len(sub) == 1:
                    node = graph[next(iter(sub.nodes))]
                    remap.mapping[node.var] = bb.emit(remap.visit_expr(node.value))
                    continue
                if part.backend == REFERENCE_BACKEND:
                    callee = sub.extract(lift_constants=True).without_attr(CALLEES_ATTR)
                    callee = callee.without_attr("global_symbol").with_attr("Primitive", True)
                    gv = bb.add_func(callee, f"{prefix}_{k}_tvm")
                    args = [remap.visit_expr(a) for a in sub.arguments(lift_constants=True)]
                    result = bb.emit(relax.Call(gv, args))
                else:
                    name, alone = f"{prefix}.{k}.{part.backend}", runs_alone(part, partitions)
                    spinning = beside_spinning(part, partitions, backends)
                    try:
                        kernel = _compile(part, backends, target, threads, compiled, alone, spinning)
                    except PartitionFailed:
                        _unregister([n for _, n, _ in kernels])  # no Assembly will own them
                        raise
                    kernels.append((part, name, kernel))
                    sources[name] = KernelSource(part.backend, part.pattern, alone, subgraph=sub,
                                                 precision=part.candidate.precision, beside_spinning=spinning)
                    tvm.register_global_func(name, kernel, override=True)
                    args = [remap.visit_expr(a) for a in sub.arguments(lift_constants=False)]
                    out_ty = [graph[i].ty for i in sub.outputs]
                    result = bb.emit(
                        relax.call_dps_packed(name, relax.Tuple(args), out_ty=out_ty if len(out_ty) > 1 else out_ty[0])
                    )
                if len(sub.outputs) == 1:
                    remap.mapping[graph[sub.outputs[0]].var] = result
                else:
                    for j, i in enumerate(sub.outputs):
                        remap.mapping[graph[i].var] = bb.emit(relax.TupleGetItem(result, j))
            value = graph.result if returns is None else relax.Tuple([graph[i].var for i in returns])
            out = bb.emit_output(remap.visit_expr(value))
        bb.emit_func_output(out)
    module = bb.get()
    for gv, func in graph.callees.items():  # what TVM's partitions call (importers' PrimFuncs)
        module[gv] = func
    return Assembly(module, kernels, sources)


# An engine partition keeps its users' settings (threads spinning between runs) when nothing of
# another library runs between its calls: it is the only partition outside TVM, and TVM's
# partitions take at most this share of its time (reshapes, a final add). Otherwise its threads
# would take the cores from the next library's kernel.
TRIVIAL_SHARE = 0.05


def runs_alone(part: Partition, partitions) -> bool:
    """Whether nothing of another library runs beside ``part``'s kernel in the placement."""
    others = [p for p in partitions if p is not part]
    if any(p.backend != REFERENCE_BACKEND for p in others):
        return False
    if not others:
        return True
    rest = sum(p.cost_ms for p in others)
    return math.isfinite(rest) and math.isfinite(part.cost_ms) and rest <= TRIVIAL_SHARE * part.cost_ms


def beside_spinning(part: Partition, partitions, backends: BackendSet) -> bool:
    """Whether another library's kernel in the placement leaves its threads spinning after
    its calls (``Backend.spins_after_calls``), where ``part``'s threads would find no core."""
    spinning = {b.name for b in backends if b.spins_after_calls} - {part.backend}
    return any(p.backend in spinning for p in partitions)


def _compile(part: Partition, backends: BackendSet, target: str, threads: int, compiled: dict | None, alone: bool,
             spinning: bool = False):
    """The partition's kernel; ``PartitionFailed`` with the reason when there is none (the
    caller falls the partition back to TVM)."""
    key = (part.backend, part.pattern, part.nodes, alone, part.candidate.precision, spinning)
    if compiled is not None and key in compiled:
        kernel, reason = compiled[key]
    else:
        func = part.candidate.subgraph.extract()
        kernel, reason = compile_kernel(backends[part.backend], func, part.pattern, target, threads, alone,
                                        part.candidate.precision, spinning)
        if compiled is not None:
            compiled[key] = (kernel, reason)
    if reason is not None:
        raise PartitionFailed(part, reason)
    return kernel
