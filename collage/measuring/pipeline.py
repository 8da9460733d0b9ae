"""The Relax pipeline collage builds with: TVM's own for the target, fusing as TVM's does.

``tvm.compile`` builds a CPU module with TVM's target-agnostic pipeline, which fuses nothing:
each of an assembled placement's TVM partitions (a function marked ``Primitive``: the group
the placement chose) ran as a Relax function calling one kernel per operator, each writing a
buffer the next reads, each on one thread. TVM's CPU pipeline (``cpu_generic``) has the
fusion passes its CUDA pipeline has, FuseOps and FuseTIR, which make such a function one
kernel, but schedules nothing after them. ``relax_pipeline`` is TVM's pipeline for the
target with two additions:

- ``constants_as_parameters`` before fusion: FoldConstant leaves tensor constants inside a
  ``Primitive`` function (a ``full`` of a constant folded, a scalar operand legalized), and
  FuseTIR refuses them ("Tensor constants are not supported in primitive functions"). FuseOps
  makes each constant of a group it forms a parameter; this does so for the groups collage
  formed.
- ``unfusable_groups_ungrouped`` before fusion: FuseTIR fuses only kernels written as blocks
  (TVM's legalized operators are); a group calling one written already scheduled
  (simplification's scan kernel) is no longer a group, and FuseOps fuses its operators as it
  fuses any function's, that kernel a call of its own. FuseTIR had refused every module with
  the scan in a TVM partition (Mamba's, RecurrentGemma's), alone or with the operators
  feeding it, and the whole module was built unfused.
- on the CPU, after fusion, the element-wise kernels scheduled on every core
  (``elementwise.ELEMENTWISE``), as the CUDA pipeline schedules every kernel there; not in
  a module beside a library whose threads spin after its calls (``parallel``).
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir
from tvm.s_tir import dlight

from ..model.graph import called_functions
from .elementwise import ELEMENTWISE


def relax_pipeline(target: tvm.target.Target, parallel: bool = True) -> tvm.transform.Pass:
    """TVM's default pipeline for ``target`` (CPU or CUDA), with collage's ``Primitive``
    functions' constants made parameters before fusion, and on the CPU its element-wise
    kernels scheduled on every core after it, unless not ``parallel``: beside PyTorch's
    OpenMP threads, which hold their cores spinning after each call, a parallel TVM kernel
    waits for one (entering oneDNN after TVM's parallel ops measured 8 ms, against 0.02-0.04
    for ONNX Runtime)."""
    on_gpu = "gpu" in target.keys
    if on_gpu:
        from tvm.relax.backend.cuda import pipeline
    else:
        from tvm.relax.backend.cpu_generic import pipeline
    legalize = list(pipeline.legalize_passes(target))
    fuse = next(k for k, p in enumerate(legalize) if p.info.name == "FuseOps")
    legalize[fuse:fuse] = [unfusable_groups_ungrouped, constants_as_parameters]
    if not on_gpu and parallel:
        legalize.append(dlight.ApplyDefaultSchedule(ELEMENTWISE))

    @tvm.transform.module_pass(opt_level=0, name="CollagePipeline")
    def passes(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(
                pipeline.library_dispatch_passes(target) + legalize
                + pipeline.dataflow_lower_passes(target) + pipeline.finalize_passes(target)
            )(mod)  # fmt: skip

    return passes


@tvm.transform.module_pass(opt_level=0, name="UnfusableGroupsUngrouped")
def unfusable_groups_ungrouped(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """``mod`` with each function marked ``Primitive`` that calls a kernel FuseTIR cannot fuse
    (``_fusable``) unmarked: FuseOps then groups its operators by TVM's own rules."""
    ungrouped = {gvar: func.without_attr("Primitive") for gvar, func in mod.functions_items()
                 if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Primitive")
                 and not all(map(_fusable, _kernels_called(mod, func)))}  # fmt: skip
    if not ungrouped:
        return mod
    mod = mod.clone()
    for gvar, func in ungrouped.items():
        mod[gvar] = func
    return mod


def _kernels_called(mod: tvm.IRModule, func: relax.Function) -> list[tvm.tirx.PrimFunc]:
    """The PrimFuncs ``func``'s ``call_tir``s run."""
    return [f for f in called_functions(mod, func).values() if isinstance(f, tvm.tirx.PrimFunc)]


def _fusable(kernel: tvm.tirx.PrimFunc) -> bool:
    """Whether FuseTIR can fuse ``kernel``: its body is its root block."""
    return isinstance(kernel.body, s_tir.SBlockRealize)


@tvm.transform.module_pass(opt_level=0, name="ConstantsAsParameters")
def constants_as_parameters(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """``mod`` with each tensor constant inside a function marked ``Primitive`` made a
    parameter of it, and every call of the function passing that constant."""
    lifted: dict[tvm.ir.GlobalVar, list] = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Primitive"):
            constants = _constants(func)
            if constants:
                lifted[gvar] = constants
    if not lifted:
        return mod
    # The functions under new GlobalVars (a GlobalVar carries its function's type, and ``mod``'s
    # may be shared), each call then passing the constants to the new one.
    rest = mod.clone()
    for gvar in lifted:
        del rest[gvar]
    builder = relax.BlockBuilder(rest)
    calls = {gvar: (builder.add_func(_with_constants_as_parameters(mod[gvar], constants), gvar.name_hint), constants)
             for gvar, constants in lifted.items()}  # fmt: skip
    mutator = _PassingConstants(builder.get(), calls)
    for gvar, func in rest.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def _constants(func: relax.Function) -> list:
    """The tensor constants ``func`` holds, each once, in the order they are first met."""
    found: list = []

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and not any(expr.same_as(c) for c in found):
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _with_constants_as_parameters(func: relax.Function, constants: list) -> relax.Function:
    params = [relax.Var(f"c{k}", c.ty) for k, c in enumerate(constants)]
    body = _Substituted(list(zip(constants, params))).visit_expr(func.body)
    return relax.Function(list(func.params) + params, body, func.ret_ty, func.is_pure, func.attrs)


@relax.expr_functor.mutator
class _Substituted(relax.PyExprMutator):
    """Each of the given constants replaced by its var."""

    def __init__(self, pairs: list):
        super().__init__()
        self.pairs = pairs

    def visit_generic_const_(self, const):
        return next((var for c, var in self.pairs if c.same_as(const)), const)


@relax.expr_functor.mutator
class _PassingConstants(relax.PyExprMutator):
    """Each call of a function whose constants were lifted, as a call of its new GlobalVar with
    the constants after its arguments."""

    def __init__(self, mod: tvm.IRModule, calls: dict):
        super().__init__(mod)
        self.calls = calls

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.GlobalVar) or call.op not in self.calls:
            return call
        gvar, constants = self.calls[call.op]
        return relax.Call(gvar, list(call.args) + constants, call.attrs, call.ty_args)
