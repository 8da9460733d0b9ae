"""Element-wise recurrences rolled back into one scan kernel.

``torch.export`` unrolls a Python loop over tokens. Where each token's step is element-wise
work on slices of whole tensors and on the states the step before left, the steps are one
recurrence over the token axis, each lane (every element of a slice) on its own.
transformers' RWKV-4 writes its time mixing (WKV) so when exporting: per token, three states
(numerator, denominator and running maximum) updated from ``k[t]`` and ``v[t]`` by ``exp``,
``maximum``, products and sums, and the output their quotient; 14 operators on a (1, 256)
slice. The corpus's two-layer RWKV (64 tokens) came out of simplification's other steps with
3,493 operators, 633 with this one; collage generated 201,069 candidates over the unrolled
form (11,588 distinct to measure, 692 s to optimize on a 2-core Zen 3), 30,677 over the
rolled one.

``linear_recurrence_as_scan`` (``loops``) rolls up ``h = a[t] * h + b[t]`` only. Here any
step of the element-wise operators in ``_LANE_OPS`` is matched: a run of consecutive steps
whose operators and operands agree step to step (a step's node reading the same
node of the step before, the next slice of the same tensor, or the same value from outside)
becomes one ``call_tir`` of a kernel that walks the token axis doing the step once per token,
parallel over the axes before it and vectorized over those after it. Each of the steps'
values read elsewhere becomes a slice of the kernel's output. Exact: the same operations in
the same order on each lane. The first step of the run may read its states from anywhere
(the model's initial values); steps before the run that differ stay unrolled. TVM runs the
kernel; the ONNX and FX conversions write it out step by step again for the engines and inductor.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .loops import is_scan_kernel, relax_functions, rewritten, scan_kernel, slice_at_constant
from .ops import static_shape

# The element-wise operators a step may hold, as TVMScript of their operands' lanes.
_LANE_OPS = {
    "relax.add": "{} + {}",
    "relax.subtract": "{} - {}",
    "relax.multiply": "{} * {}",
    "relax.divide": "{} / {}",
    "relax.maximum": "T.max({}, {})",
    "relax.minimum": "T.min({}, {})",
    "relax.power": "T.pow({}, {})",
    "relax.exp": "T.exp({})",
    "relax.log": "T.log({})",
    "relax.sqrt": "T.sqrt({})",
    "relax.rsqrt": "T.rsqrt({})",
    "relax.tanh": "T.tanh({})",
    "relax.sigmoid": "T.sigmoid({})",
    "relax.negative": "-{}",
    "relax.abs": "T.abs({})",
}
# Fewer steps than this stay unrolled: a kernel of its own is no gain over a few operators.
MIN_STEPS = 4
# The PrimFunc attribute marking a kernel written here, for its GPU form (``scan_kernels_for_the_gpu``).
RECURRENCE_ATTR = "collage.elementwise_recurrence"
_GPU_LANES = 256  # CUDA threads a block, a lane each


@dataclass(frozen=True)
class _Operand:
    """Where a step's operator reads an operand: ``node`` (an earlier node of the same step,
    by its place in the step), ``state`` (a node of the step before, likewise), ``slice``
    (the step's slice of a tensor, by the tensor's place in ``_Run.tensors``) or ``outside``
    (a value from outside the steps, by its place in ``_Run.outside``)."""

    kind: str
    index: int


@dataclass
class _Run:
    """Consecutive steps of one recurrence: each step's nodes in binding order, what each
    node computes (the template every step agrees with), and the kernel's inputs."""

    axis: int  # the token axis of the sliced tensors
    lane_shape: tuple[int, ...]
    dtype: str
    first_index: int  # the slices' index at the run's first step
    steps: list[list[relax.Var]]
    template: list[tuple[str, tuple[_Operand, ...]]]
    tensors: list[relax.Expr]  # the tensors sliced, whole
    outside: list[relax.Expr]  # the values read from outside, every step alike
    initial: dict[int, relax.Expr] = field(default_factory=dict)  # state slot -> what the first step reads

    @property
    def states(self) -> list[int]:
        return sorted({o.index for _, operands in self.template for o in operands if o.kind == "state"})


def _lane_node(binding) -> tuple[str, list[relax.Expr]] | None:
    """(operator, operands) of a binding a step may hold: an operator of ``_LANE_OPS`` on
    float tensors, its result of a known shape."""
    if not isinstance(binding, relax.VarBinding) or not isinstance(binding.var, relax.DataflowVar):
        return None
    call = binding.value
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in _LANE_OPS):
        return None
    ty = binding.var.ty
    if not isinstance(ty, relax.TensorType) or static_shape(binding.var) is None or not str(ty.dtype).startswith("float"):
        return None
    if any(not isinstance(a.ty, relax.TensorType) or str(a.ty.dtype) != str(ty.dtype) or static_shape(a) is None
           for a in call.args):  # fmt: skip
        return None
    return call.op.name, list(call.args)


class _Region:
    """The nodes of one function that may be steps: element-wise operators reading, however
    deep, a slice at a constant index (``take``), each with the latest index it reads."""

    def __init__(self, func: relax.Function):
        self.values = relax.analysis.get_var2val(func)
        self.bindings = [b for block in func.body.blocks for b in block.bindings]
        self.order: dict[relax.Var, int] = {}
        self.nodes: dict[relax.Var, tuple[str, list[relax.Expr]]] = {}
        self.step: dict[relax.Var, int] = {}
        self.slices = {}
        for position, binding in enumerate(self.bindings):
            self.order[binding.var] = position
            s = slice_at_constant(binding.var, self.values) if isinstance(binding, relax.VarBinding) else None
            if s is not None:
                self.slices[binding.var] = s
                continue
            node = _lane_node(binding)
            if node is None:
                continue
            shape = static_shape(binding.var)
            reads = [a for a in node[1] if a in self.slices or a in self.nodes]
            if not reads or any(static_shape(a) != shape for a in reads):
                continue
            if any(a not in self.slices and a not in self.nodes and not _broadcasts(a, shape) for a in node[1]):
                continue
            self.nodes[binding.var] = node
            self.step[binding.var] = max(self.slices[a].index if a in self.slices else self.step[a] for a in reads)

    def components(self) -> list[list[relax.Var]]:
        """The nodes in groups that read each other, each in binding order."""
        parent = {v: v for v in self.nodes}

        def root(v):
            while parent[v] is not v:
                parent[v] = parent[parent[v]]
                v = parent[v]
            return v

        for v, (_, args) in self.nodes.items():
            for a in args:
                if a in self.nodes:
                    parent[root(a)] = root(v)
        groups: dict[relax.Var, list] = {}
        for v in self.nodes:
            groups.setdefault(root(v), []).append(v)
        return [sorted(g, key=self.order.__getitem__) for g in groups.values()]


def _broadcasts(value: relax.Expr, shape: tuple[int, ...]) -> bool:
    own = static_shape(value)
    if own is None:
        return False
    try:
        return tuple(np.broadcast_shapes(own, shape)) == tuple(shape)
    except ValueError:
        return False


def _same_outside(a: relax.Expr, b: relax.Expr) -> bool:
    return a.same_as(b) or (isinstance(a, tvm.ir.GenericConst) and isinstance(b, tvm.ir.GenericConst)
                            and tvm_ffi.structural_equal(a, b))  # fmt: skip


class _Mismatch(Exception):
    pass


def _template(region: _Region, step: list[relax.Var], before: list[relax.Var] | None, index: int,
              run: _Run | None) -> tuple[list, list, list, dict]:
    """``step``'s template: each node's operator and operands, with the tensors it slices and
    the values it reads from outside, in the order met (or ``run``'s, which it must agree
    with). ``before``, the step before, or None for a first step, whose reads of a state
    (by ``run``'s template) are its initial values. Raises ``_Mismatch``."""
    place = {v: k for k, v in enumerate(step)}
    earlier = {} if before is None else {v: k for k, v in enumerate(before)}
    tensors, outside = (list(run.tensors), list(run.outside)) if run is not None else ([], [])
    initial: dict[int, relax.Expr] = {}
    template = []
    for k, v in enumerate(step):
        name, args = region.nodes[v]
        operands = []
        for j, a in enumerate(args):
            expected = None if run is None else run.template[k][1][j]
            if a in place:
                operand = _Operand("node", place[a])
            elif a in earlier:
                operand = _Operand("state", earlier[a])
            elif a in region.slices:
                s = region.slices[a]
                if s.index != index or s.axis != (run.axis if run else s.axis):
                    raise _Mismatch("a slice of another step")
                at = next((i for i, t in enumerate(tensors) if t.same_as(s.tensor)), None)
                if at is None:
                    if run is not None:
                        raise _Mismatch("another tensor sliced")
                    tensors.append(s.tensor)
                    at = len(tensors) - 1
                operand = _Operand("slice", at)
            elif before is None and expected is not None and expected.kind == "state":
                if not initial.setdefault(expected.index, a).same_as(a):
                    raise _Mismatch("two initial values of one state")
                if static_shape(a) != static_shape(v):
                    raise _Mismatch("an initial state of another shape")
                operand = expected
            elif a in region.nodes:
                raise _Mismatch("a node of a step further back")
            else:
                at = next((i for i, o in enumerate(outside) if _same_outside(o, a)), None)
                if at is None:
                    if run is not None:
                        raise _Mismatch("another value from outside")
                    outside.append(a)
                    at = len(outside) - 1
                operand = _Operand("outside", at)
            if expected is not None and operand != expected:
                raise _Mismatch("another operand")
            operands.append(operand)
        if run is not None and run.template[k][0] != name:
            raise _Mismatch("another operator")
        template.append((name, tuple(operands)))
    if run is not None and len(step) != len(run.template):
        raise _Mismatch("another number of operators")
    return template, tensors, outside, initial


def _runs(region: _Region) -> list[_Run]:
    """Each run of at least ``MIN_STEPS`` steps agreeing with one template, at most one per
    group of nodes that read each other."""
    runs = []
    for group in region.components():
        by_step: dict[int, list[relax.Var]] = {}
        for v in group:
            by_step.setdefault(region.step[v], []).append(v)
        indices = sorted(by_step)
        if len(indices) < MIN_STEPS or indices != list(range(indices[0], indices[-1] + 1)):
            continue
        run = _run_around(region, by_step, indices[len(indices) // 2])
        if run is not None:
            runs.append(run)
    return runs


def _run_around(region: _Region, by_step: dict, middle: int) -> _Run | None:
    """The run of the steps agreeing with step ``middle``'s template (its states all from
    the step before), on from it and back as far as they agree, its first step reading its
    states from anywhere; None when fewer than ``MIN_STEPS`` agree. The first and last
    steps of a loop often differ (an initial state written as constants, states left unused
    after the last token and dropped): they stay unrolled, reading from the run or read by it."""
    try:
        template, tensors, outside, _ = _template(region, by_step[middle], by_step.get(middle - 1, []), middle, None)
    except _Mismatch:
        return None
    if not tensors:
        return None
    axis = next(s.axis for s in region.slices.values() if s.tensor.same_as(tensors[0]))
    lane_shape = static_shape(by_step[middle][0])
    if any(len(static_shape(t)) != len(lane_shape) + 1 or tuple(np.delete(static_shape(t), axis)) != tuple(lane_shape)
           for t in tensors):  # fmt: skip
        return None
    run = _Run(axis, tuple(lane_shape), str(by_step[middle][0].ty.dtype), middle, [], template, tensors, outside)

    def agrees(t: int, before) -> bool:
        try:
            _template(region, by_step[t], before, t, run)
            return True
        except _Mismatch:
            return False

    if not agrees(middle, by_step.get(middle - 1, [])):  # its slices along the run's axis, every one
        return None

    last = middle
    while last + 1 in by_step and agrees(last + 1, by_step[last]):
        last += 1
    start = middle
    while start - 1 in by_step and agrees(start - 1, by_step.get(start - 2, [])):
        start -= 1
    try:  # its states from the step before, which differs and stays, or from the model's values
        _, _, _, initial = _template(region, by_step[start], None, start, run)
    except _Mismatch:
        return None
    if last - start + 1 < MIN_STEPS:
        return None
    run.first_index, run.initial = start, initial
    run.steps = [by_step[t] for t in range(start, last + 1)]
    return run


# ------------------------------------------------------------------ the kernel


@dataclass(frozen=True)
class KernelSpec:
    """What a recurrence kernel computes, enough to write it for the CPU or the GPU: the
    step's template (operator, operands), the shapes of its lanes, the lengths of the
    tensors it slices, the index its first step reads, its number of steps, how many values
    it reads from outside, its states (template places read by the next step, each given
    an initial value) and its outputs (template places written for every step, every state
    among them). The kernel carries it as JSON (``RECURRENCE_ATTR``)."""

    template: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    outer: int
    inner: int
    lengths: tuple[int, ...]
    first_index: int
    steps: int
    outside: int
    states: tuple[int, ...]
    outputs: tuple[int, ...]
    dtype: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> KernelSpec:
        d = json.loads(text)
        d["template"] = tuple((name, tuple((kind, i) for kind, i in operands)) for name, operands in d["template"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def recurrence_kernel(spec: KernelSpec, gpu: bool = False) -> tirx.PrimFunc:
    """The kernel of ``spec``: ``spec.steps`` steps in order along the token axis, each
    lane on its own; on the CPU parallel over the outer axes, each operator of a step a
    vectorized loop over the inner ones (its values in a scratch row, in cache), on the GPU
    a thread per lane. Parameters: the tensors sliced (outer, length, inner), the values from
    outside and the states' initial values (outer, inner), then the outputs (outer, steps,
    inner). Written as TVMScript, as ``loops.scan_kernel`` is, with the step's operators
    spelled out."""
    dtype, outer, inner, n = spec.dtype, spec.outer, spec.inner, spec.steps
    buffer = lambda name, shape: f'{name}: T.Buffer({shape}, "{dtype}")'  # noqa: E731
    params = [buffer(f"x{k}", (outer, length, inner)) for k, length in enumerate(spec.lengths)]
    params += [buffer(f"c{k}", (outer, inner)) for k in range(spec.outside)]
    params += [buffer(f"h{k}", (outer, inner)) for k in range(len(spec.states))]
    params += [buffer(f"y{k}", (outer, n, inner)) for k in range(len(spec.outputs))]
    output = {j: f"y{k}" for k, j in enumerate(spec.outputs)}
    initial = {j: f"h{k}" for k, j in enumerate(spec.states)}

    def operands(k: int, t: str, first: bool) -> list[str]:
        """The lanes node ``k`` of step ``t`` reads: a node's in a scratch row on the CPU, a
        register on the GPU, else the output it is."""
        def operand(kind: str, index: int) -> str:
            if kind == "node":
                return f"v{index}" if gpu else (f"{output[index]}[p, {t}, q]" if index in output else f"s{index}[q]")
            if kind == "slice":
                return f"x{index}[p, {t} + {spec.first_index}, q]"
            if kind == "outside":
                return f"c{index}[p, q]"
            return f"{initial[index]}[p, q]" if first else f"{output[index]}[p, {t} - 1, q]"

        return [operand(*o) for o in spec.template[k][1]]

    def value(k: int, t: str, first: bool) -> str:
        return _LANE_OPS[spec.template[k][0]].format(*operands(k, t, first))

    # float32 exps on the CPU as the rest of TVM's kernels compute them (``fast_math``): LLVM
    # has no vector exp, and calls libm's for each element.
    exps = {k for k, (name, _) in enumerate(spec.template) if name == "relax.exp" and dtype == "float32" and not gpu}

    def step(t: str, first: bool, indent: str) -> list[str]:
        if gpu:
            lines = [f"v{k}: T.{dtype} = {value(k, t, first)}" for k in range(len(spec.template))]
            lines += [f"{output[j]}[p, {t}, q] = v{j}" for j in spec.outputs]
            return [indent + line for line in lines]
        lines = []
        for k in range(len(spec.template)):
            target = f"{output[k]}[p, {t}, q]" if k in output else f"s{k}[q]"
            rows = _fast_exp(k, operands(k, t, first)[0], target) if k in exps else [f"{target} = {value(k, t, first)}"]
            for row in rows:
                lines += [f"for q in T.vectorized({inner}):", f"    {row}"]
        return [indent + line for line in lines]

    if gpu:
        lanes = outer * inner
        body = [f"for block in T.thread_binding({(lanes + _GPU_LANES - 1) // _GPU_LANES}, thread=\"blockIdx.x\"):",
                f"    for thread in T.thread_binding({_GPU_LANES}, thread=\"threadIdx.x\"):",
                f"        if block * {_GPU_LANES} + thread < {lanes}:",
                f"            p: T.int32 = (block * {_GPU_LANES} + thread) // {inner}",
                f"            q: T.int32 = (block * {_GPU_LANES} + thread) % {inner}",
                *step("0", True, " " * 12),
                f"            for t in range(1, {n}):",
                *step("t", False, " " * 16)]  # fmt: skip
    else:
        scratch = [f'    s{k} = T.alloc_buffer(({inner},), "{dtype}")' for k in range(len(spec.template)) if k not in output]
        scratch += [f'    {row}{k} = T.alloc_buffer(({inner},), "{dtype}")' for k in sorted(exps) for row in ("n", "r")]
        body = [f"for p in T.parallel({outer}):", *scratch, *step("0", True, " " * 4),
                f"    for t in range(1, {n}):", *step("t", False, " " * 8)]  # fmt: skip
    attrs = {"tir.noalias": True, "tirx.is_scheduled": True, RECURRENCE_ATTR: spec.to_json()}
    source = "\n".join(["@T.prim_func(private=True)", f"def main({', '.join(params)}):",
                        f"    T.func_attr({attrs!r})", *("    " + line for line in body)])  # fmt: skip
    return tvm.script.from_source(source, extra_vars={"T": tvm.script.tirx})


# Cephes' expf: exp(x) = 2^n exp(r), n the nearest integer to x / ln 2, r = x - n ln 2 (ln 2
# in two parts, the first exact in float32), exp(r) a polynomial on [-ln 2 / 2, ln 2 / 2];
# within about 2 float32 ulps, as TOPI's fast_exp, which TVM's other CPU kernels use here.
_EXP_RANGE = (-88.3762626647949, 88.3762626647949)
_LN2 = (0.693359375, -2.12194440e-4)
_EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def _fast_exp(k: int, operand: str, target: str) -> list[str]:
    """Rows computing ``target = exp(operand)``, each a vectorized loop's body, through
    scratch rows ``n<k>`` (the power of 2) and ``r<k>`` (the rest)."""
    x = f"T.max(T.min({operand}, T.float32({_EXP_RANGE[1]})), T.float32({_EXP_RANGE[0]}))"
    n, r = f"n{k}[q]", f"r{k}[q]"
    polynomial = f"T.float32({_EXP_POLYNOMIAL[0]})"
    for c in _EXP_POLYNOMIAL[1:]:
        polynomial = f"({polynomial} * {r} + T.float32({c}))"
    scale = f'T.reinterpret("float32", T.shift_left(T.Cast("int32", {n}) + 127, 23))'
    return [f"{n} = T.floor({x} * T.float32({1 / math.log(2)}) + T.float32(0.5))",
            f"{r} = {x} - {n} * T.float32({_LN2[0]}) - {n} * T.float32({_LN2[1]})",
            f"{target} = ({polynomial} * {r} * {r} + {r} + T.float32(1.0)) * {scale}"]  # fmt: skip


def is_recurrence_kernel(func) -> bool:
    """Whether ``func`` (a module function, or None) is a kernel ``recurrence_kernel`` wrote."""
    return isinstance(func, tirx.PrimFunc) and func.attrs is not None and RECURRENCE_ATTR in func.attrs


def for_the_gpu(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A recurrence kernel in its GPU form, written again from the spec it carries."""
    return recurrence_kernel(KernelSpec.from_json(str(func.attrs[RECURRENCE_ATTR])), gpu=True)


def scan_kernels_for_the_gpu(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each kernel simplification wrote in its GPU form: the linear scans
    (``loops.SCAN_ATTR``) and the recurrence kernels (``RECURRENCE_ATTR``)."""
    rewritten_mod = mod
    for gvar, func in mod.functions_items():
        if not (is_scan_kernel(func) or is_recurrence_kernel(func)):
            continue
        if rewritten_mod is mod:
            rewritten_mod = mod.clone()
        if is_scan_kernel(func):
            a = func.params[0]  # a buffer (outer, length, inner)
            rewritten_mod[gvar] = scan_kernel(*(int(d) for d in a.shape), str(a.dtype), gpu=True)
        else:
            rewritten_mod[gvar] = for_the_gpu(func)
    return rewritten_mod


# ------------------------------------------------------------------ the rewrite


def _users_outside(func: relax.Function, run: _Run) -> set[int]:
    """The template places whose value some step's node hands to a binding outside the run
    (or to the function's result)."""
    place = {v: j for step in run.steps for j, v in enumerate(step)}
    read = [relax.analysis.free_vars(b.value) for block in func.body.blocks for b in block.bindings
            if b.var not in place]  # fmt: skip
    read.append(relax.analysis.free_vars(func.body.body))
    return {place[v] for vs in read for v in vs if v in place}


def _ahead(region: _Region, run: _Run, taken: set) -> list[relax.VarBinding] | None:
    """The bindings to move before the run's first node so that every value the kernel
    reads is there: an initial state the step before computes after the run's first node
    (RWKV computes the next token's ``pp + w`` after this token's output), and what it reads
    in turn. None where one of them reads the run (or a node of another run, ``taken``)."""
    bindings, order = region.bindings, region.order
    start = min(order[v] for step in run.steps for v in step)
    todo = [x for x in (*run.tensors, *run.outside, *run.initial.values()) if order.get(x, -1) > start]
    moved: set[relax.Var] = set()
    while todo:
        v = todo.pop()
        if v in moved:
            continue
        if v in taken:
            return None
        moved.add(v)
        todo += [x for x in relax.analysis.free_vars(bindings[order[v]].value) if order.get(x, -1) > start]
    return [b for b in bindings if b.var in moved]


@mutator
class _Rolled(PyExprMutator):
    """A function with each run's nodes read from one kernel: the kernel emitted where the
    run's first node was, each node read elsewhere bound to its slice of the kernel's
    output, the others dropped."""

    def __init__(self, mod: tvm.IRModule, runs: list[tuple[_Run, tuple[int, ...], relax.Var, list]]):
        super().__init__(mod)
        self.start = {first: (run, outputs, ahead) for run, outputs, first, ahead in runs}
        self.moved = {b.var for *_, ahead in runs for b in ahead}
        self.place = {v: (run, t, j) for run, *_ in runs for t, step in enumerate(run.steps) for j, v in enumerate(step)}
        self.outputs: dict[int, dict[int, relax.Var]] = {}  # id(run) -> template place -> the kernel's output

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.start:
            run, outputs, ahead = self.start[binding.var]
            for moved in ahead:
                super().visit_var_binding_(moved)
            self.outputs[id(run)] = dict(zip(outputs, self._kernel(run, outputs)))
        elif binding.var in self.moved:  # bound already, ahead of the kernel
            return None
        if binding.var not in self.place:
            return super().visit_var_binding_(binding)
        run, t, j = self.place[binding.var]
        if j in self.outputs[id(run)]:
            value = relax.op.take(self.outputs[id(run)][j], relax.const(t, "int64"), axis=run.axis)
            self.set_var_remap(binding.var, self.builder_.emit(value, name_hint=binding.var.name))
        return None

    def _kernel(self, run: _Run, outputs: tuple[int, ...]) -> list[relax.Var]:
        shape, axis, dtype, n = run.lane_shape, run.axis, run.dtype, len(run.steps)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis:])
        lengths = tuple(static_shape(x)[axis] for x in run.tensors)
        spec = KernelSpec(tuple((name, tuple((o.kind, o.index) for o in operands)) for name, operands in run.template),
                          outer, inner, lengths, run.first_index, n, len(run.outside), tuple(run.states), outputs,
                          dtype)  # fmt: skip
        kernel = self.builder_.add_func(recurrence_kernel(spec), "elementwise_recurrence")
        emit = self.builder_.emit
        lanes = lambda x: emit(relax.op.reshape(emit(relax.op.broadcast_to(self.visit_expr(x), shape)), (outer, inner)))  # noqa: E731
        args = [emit(relax.op.reshape(self.visit_expr(x), (outer, length, inner))) for x, length in zip(run.tensors, lengths)]
        args += [lanes(x) for x in run.outside] + [lanes(run.initial[s]) for s in run.states]
        ty = relax.TensorType((outer, n, inner), dtype)
        result = emit(relax.call_tir(kernel, args, ty if len(outputs) == 1 else [ty] * len(outputs)))
        stacked = (*shape[:axis], n, *shape[axis:])
        fields = [result] if len(outputs) == 1 else [emit(relax.TupleGetItem(result, k)) for k in range(len(outputs))]
        return [emit(relax.op.reshape(y, stacked)) for y in fields]


class ElementwiseRecurrenceAsScan:
    """The simplification step rolling each run of element-wise steps into a kernel."""

    name = "elementwise_recurrence_as_scan"

    def apply(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        found = {}
        for gvar, func in relax_functions(mod):
            region = _Region(func)
            every = _runs(region)
            taken = {v for run in every for step in run.steps for v in step}
            runs = []
            for run in every:
                ahead = _ahead(region, run, taken)
                if ahead is None:
                    continue
                outputs = tuple(sorted(set(run.states) | _users_outside(func, run)))
                first = min((v for step in run.steps for v in step), key=region.order.__getitem__)
                runs.append((run, outputs, first, ahead))
            if runs:
                found[gvar] = runs
        return rewritten(mod, found, _Rolled)


ELEMENTWISE_RECURRENCE_AS_SCAN = ElementwiseRecurrenceAsScan()
