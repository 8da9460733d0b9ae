"""ATen operators TVM's PyTorch importer lacks or takes only in part, written in operators it takes.

``torch.export`` keeps some operators that its core ATen opset counts as primitive and TVM's
importer (``from_exported_program``) has no converter for ("Unsupported function types
['unfold.default']"), or calls one in a way the converter refuses (a ``cat`` of an empty
vector with a 4-d tensor); it then refuses the whole program. Each entry here is a decomposition in
``run_decompositions``'s form: a function of the operator's arguments, traced by torch into the
operators it calls, or ``NotImplemented`` where the operator is fine as it is.
``frontend.relax_of`` applies the table only to a program the importer refused, so every
other program is imported exactly as TVM's importer would.

What the importer converts wrong rather than refuses: arithmetic that torch computes in a
promoted dtype (an integer tensor times a float, integers divided truly), which the importer
computes in the tensor's own dtype, and running sums of booleans, which torch counts in int64
(``with_result_dtypes``). Those dtypes are made explicit in every program, and an ``arange``
counting down, whose length the importer declares wrong, counts up in every program
(``with_aranges_counting_up``).
"""

from __future__ import annotations

import contextlib
import math


def _unfold(x, dimension: int, size: int, step: int):
    """``Tensor.unfold``: the windows of ``size`` elements every ``step`` along ``dimension``,
    each a new last dimension (PatchTST's and PatchTSMixer's patches of a series). A gather of
    the windows' indices, then a reshape: ``take`` and ``reshape`` in Relax."""
    import torch

    dim = dimension % max(x.dim(), 1)
    windows = (x.shape[dim] - size) // step + 1
    starts = torch.arange(windows, device=x.device) * step
    indices = (starts[:, None] + torch.arange(size, device=x.device)[None, :]).reshape(-1)
    gathered = torch.index_select(x, dim, indices)
    shape = (*x.shape[:dim], windows, size, *x.shape[dim + 1 :])
    return gathered.reshape(shape).movedim(dim + 1, -1)


def _cat_without_empty_vectors(tensors, dim: int = 0):
    """``torch.cat`` as torch runs it: a 1-d tensor of no elements among tensors of more
    dimensions is skipped (a legacy rule torch keeps). transformers' key/value cache starts as
    ``torch.tensor([])`` and is concatenated with the first keys (decoders left at their
    default ``use_cache=True``, XLM always), which TVM's importer refuses ("Concat expects all
    input tensors to have same ndim"). Without such a tensor the ``cat`` stays as it is."""
    import torch

    kept = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if len(kept) == len(tensors) or not kept:
        return NotImplemented  # traced as the operator itself
    return torch.cat(kept, dim) if len(kept) > 1 else kept[0].clone()


def _divided_by_a_tensor(divide):
    """An integer division (``//``, ``torch.div`` with a rounding mode) of an integer tensor
    by a Python number, as one by a tensor of the same dtype: TVM's importer writes the
    number as an int32 constant beside an int64 tensor and refuses the mix ("Binary operators
    must have the same datatype"), where ``positions // block`` is common (LongT5's blocks)."""

    def decomposition(x, other, *args, **kwargs):
        import torch

        if not isinstance(other, (int, float)) or x.dtype.is_floating_point or x.dtype == torch.bool:
            return NotImplemented  # traced as the operator itself
        return divide(x, torch.full((), other, dtype=x.dtype, device=x.device), *args, **kwargs)

    return decomposition


# Operators whose result torch computes in the promoted dtype of their operands, and TVM's
# importer in the tensor's own dtype (silently: LongT5's ``ones_like(mask) / 16`` gave 0 for
# 0.0625, its outputs 7% off; ``mask * 0.5`` gave booleans; ``reciprocal`` of integers gave
# integers), or refuses (``exp``, ``sigmoid`` of integers; ``where`` of integers and floats):
# an integer tensor with a float number, integers divided truly, integers into a float
# function. Each maps to the positions of the operands that take the result's dtype (None: all;
# ``where``'s condition stays boolean).
_ALL = None
_PROMOTING = {
    **dict.fromkeys(("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar",
                     "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode",
                     "true_divide.Tensor", "floor_divide.default", "floor_divide.Scalar", "remainder.Tensor",
                     "remainder.Scalar", "fmod.Tensor", "fmod.Scalar", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
                     "pow.Scalar", "maximum.default", "minimum.default", "clamp.default", "clamp.Tensor"), _ALL),
    **dict.fromkeys(("exp.default", "exp2.default", "expm1.default", "log.default", "log2.default", "log10.default",
                     "log1p.default", "sqrt.default", "rsqrt.default", "reciprocal.default", "sigmoid.default",
                     "tanh.default", "sin.default", "cos.default", "tan.default", "asin.default", "acos.default",
                     "atan.default", "sinh.default", "cosh.default", "asinh.default", "acosh.default", "atanh.default",
                     "erf.default", "erfc.default"), (0,)),
    "where.self": (1, 2),
}  # fmt: skip
# A running sum or product of booleans or integers, which torch counts in int64.
_RUNNING = ("cumsum.default", "cumprod.default")
# Powers, which TVM computes of floats only ("power" of integers fails to build), and torch of
# integers too (``torch.pow(2, ids)``, relative-position buckets).
_POWERS = ("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")


def with_result_dtypes(program):
    """``program`` with the dtypes torch computes in made explicit where TVM's importer
    would compute in another: the operands of a promoting operator (``_PROMOTING``) cast to the
    result's dtype first, and a running sum or product (``_RUNNING``) given it as its
    ``dtype=`` (the importer reads only that, and otherwise keeps the input's: a mask's
    running count came out as booleans), an integer power computed in float64 and rounded
    back (``_power_in_float64``). The same computation; the program is changed in place."""
    import torch

    graph = program.graph
    for node in list(graph.nodes):
        result = node.meta.get("val") if node.op == "call_function" else None
        if not isinstance(result, torch.Tensor) or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = node.target.__name__  # "mul.Tensor", as the importer's table names it
        if name in _RUNNING and "dtype" not in node.kwargs and _dtype(node.args[0]) not in (None, result.dtype):
            node.kwargs = {**node.kwargs, "dtype": result.dtype}
        elif name in _POWERS and not result.dtype.is_floating_point:
            _power_in_float64(graph, node, result)
        elif name in _PROMOTING:
            taking = _PROMOTING[name]
            node.args = tuple(_cast(graph, node, arg, result.dtype) if taking is _ALL or k in taking else arg
                              for k, arg in enumerate(node.args))  # fmt: skip
    return program


def _power_in_float64(graph, node, result) -> None:
    """``node``, an integer power, computed on float64 operands, rounded to int64 and
    narrowed to its dtype: exact while the power is below 2**53 (float64's integers), and
    wrapping around a narrower dtype's range as torch's does (``2 ** 39`` in int32 is 0)."""
    import torch

    node.args = tuple(_cast(graph, node, arg, torch.float64) for arg in node.args)
    with _fake_mode(result):
        node.meta["val"] = result.to(torch.float64)
    aten = torch.ops.aten
    with graph.inserting_after(node):
        rounded = graph.call_function(aten.round.default, (node,))
    last = rounded
    for dtype in dict.fromkeys((torch.int64, result.dtype)):  # then narrowed, wrapping as torch's own powers do
        with graph.inserting_after(last):
            last = graph.call_function(aten._to_copy.default, (last,), {"dtype": dtype})
        with _fake_mode(result):
            last.meta["val"] = result.to(dtype)
    with _fake_mode(result):
        rounded.meta["val"] = result.to(torch.float64)
    node.replace_all_uses_with(last, delete_user_cb=lambda user: user is not rounded)


def _fake_mode(value):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([value]) or contextlib.nullcontext()


def _value(arg):
    """What tracing found an argument of a node to be (a fake tensor), or None for a number."""
    return arg.meta.get("val") if hasattr(arg, "meta") else None


def _dtype(arg):
    return getattr(_value(arg), "dtype", None)


def _cast(graph, node, arg, dtype):
    """``arg`` (an argument of ``node``) as ``dtype``, by a cast inserted before ``node`` where
    it is a tensor of another dtype."""
    import torch

    value = _value(arg)
    if not isinstance(value, torch.Tensor) or value.dtype == dtype:
        return arg
    with graph.inserting_before(node):
        cast = graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"dtype": dtype})
    with _fake_mode(value):
        cast.meta["val"] = value.to(dtype)
    return cast


def _arange_counting_down(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.arange`` with a negative step as an arange counting up, scaled and shifted:
    TVM 0.27's ``relax.op.arange`` computes the values of a negative step right but declares
    its length as if the step were positive (``arange(12, -13, -1)``: 25 values, a declared
    shape of 27), so the first reshape of it fails (Parakeet's relative positions) or, where
    nothing checks, the shapes that follow are wrong. The values keep the arange's dtype:
    XLNet's ``arange(beg, end, -1.0, dtype=torch.int64)``, scaled by the float step, had come
    out float32, and the program's own check of its dtype failed the import."""
    import torch

    numbers = (start, end, step)
    if not all(isinstance(v, (int, float)) for v in numbers) or step >= 0:
        return NotImplemented  # traced as the operator itself
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in numbers) else torch.get_default_dtype()
    count = max(math.ceil((end - start) / step), 0)
    if not dtype.is_floating_point and all(float(v).is_integer() for v in numbers):
        start, step = int(start), int(step)  # integer arithmetic: exact, and of the arange's dtype
    values = torch.arange(count, dtype=dtype, device=device) * step + start
    return values if values.dtype == dtype else values.to(dtype)


def with_aranges_counting_up(program):
    """``program`` with every arange of a negative step counting up instead
    (``_arange_counting_down``); a program without one as it is."""
    import torch

    arange = torch.ops.aten.arange.start_step
    # Sub-graphs too: a method under ``torch.no_grad`` is exported as one (Parakeet's positions).
    nodes = (node for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
             for node in module.graph.nodes)  # fmt: skip
    if not any(node.target is arange and _negative_step(node) for node in nodes):
        return program
    return program.run_decompositions({arange: _arange_counting_down})


def _negative_step(node) -> bool:
    step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    return isinstance(step, (int, float)) and step < 0


def table() -> dict:
    """The decompositions, keyed by the ATen overload they replace."""
    import torch

    aten = torch.ops.aten
    return {aten.unfold.default: _unfold, aten.cat.default: _cat_without_empty_vectors,
            aten.floor_divide.default: _divided_by_a_tensor(aten.floor_divide.default),
            aten.div.Tensor_mode: _divided_by_a_tensor(aten.div.Tensor_mode)}  # fmt: skip


def decomposed(program):
    """``program`` with the table's operators decomposed; every other operator as it was."""
    return program.run_decompositions(table())
