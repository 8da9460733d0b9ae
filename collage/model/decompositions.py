"""ATen operators TVM's PyTorch importer lacks or takes only in part, written in operators it takes.

``torch.export`` keeps some operators that its core ATen opset counts as primitive and TVM's
importer (``from_exported_program``) has no converter for ("Unsupported function types
['unfold.default']"), or calls one in a way the converter refuses (a ``cat`` of an empty
vector with a 4-d tensor); it then refuses the whole program. Each entry here is a decomposition in
``run_decompositions``'s form: a function of the operator's arguments, traced by torch into the
operators it calls, or ``NotImplemented`` where the operator is fine as it is.
``frontend.relax_of`` applies the table only to a program the importer refused, so every
other program is imported exactly as TVM's importer would.

One thing the importer converts wrong rather than refuses: a running sum or product of
booleans or small integers, which torch counts in int64 and the importer types as its input
(``with_result_dtypes``: a mask's running count came out as booleans). That dtype is made
explicit in every program.
"""

from __future__ import annotations


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


def with_result_dtypes(program):
    """``program`` with each running sum or product given its result's dtype explicitly where
    torch's promotion (booleans and integers to int64) makes it differ from its input's: TVM's
    importer reads the dtype only from the call (``dtype=``) and otherwise keeps the input's.
    The same computation; the program is changed in place."""
    import torch

    running = (torch.ops.aten.cumsum.default, torch.ops.aten.cumprod.default)
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in running or "dtype" in node.kwargs:
            continue
        result, source = node.meta.get("val"), node.args[0].meta.get("val")
        if result is not None and source is not None and result.dtype != source.dtype:
            node.kwargs = {**node.kwargs, "dtype": result.dtype}
    return program


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
