"""An engine over the accuracy budget in a reduced precision, split where the budget holds:
float32 up to a cut, the reduced precision after it.

Errors compound along a model, so the earliest ops' precision matters most. ResNet-50 in
float16 errs 3.2e-2 of its largest output (inductor on an H100, and forecast so on a CPU), and
1e-2 would hold with its first 11 of 54 convolutions in float32, 81% of its multiply-adds still
in float16 (``experiments/precision_forecast.py``; MobileNetV2 alike). Where an engine alone on
the whole model misses the budget in a reduced precision, ``split_in_precision`` finds the
earliest cut after which the rest may compute reduced, and returns the engine on both sides: one
finalist of two partitions, held to the budget like any other.

Where to cut is forecast, not built: trying a cut for real is compiling two engine modules
(inductor: tens of seconds each on a GPU machine). The forecast runs collage's conversion of each
side (``fx_convert``) in PyTorch, eager, on the target's device: the first side in float32, the
second with its convolutions and matrix products in the reduced precision as tensor cores and AMX
compute them (inputs rounded to it, sums in float32), on every input set the budget is held to.
Run so on a CPU, with only its stem convolution in float32, ResNet-50 errs about as inductor
did on the whole model on an H100: TF32 2.5e-2 (H100: 2.5e-2), float16 2.9e-2 (3.2e-2),
bfloat16 0.15 (0.13). Bisection over the
cuts where the fewest tensors cross (a residual block's end, a layer's) finds the earliest cut
whose forecast is within the budget. That split is then built and checked for real; where the
engine errs more than the forecast (OpenVINO's bfloat16 keeps element-wise results in bfloat16
too), the forecast's budget shrinks by the ratio of the two, and the earliest cut within that is
built, and no more.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np
from tvm import relax

from ..assembling.checked import Finalist, assemble_and_check
from ..candidates.backend import Unsupported
from ..candidates.generate import PART_SUFFIX, Candidate, crossings, split_at
from ..candidates.precision import BFLOAT16, FLOAT16, FLOAT32, TF32, reduced, short
from ..candidates.subgraph import SubGraph
from ..errors import OptimizeError
from ..measuring.arrays import GROSS_FAULT, Reference, relative_error
from ..measuring.build import is_cuda
from ..placing.placement import Partition, Placement

TRIES = 2  # real builds: at the forecast's cut, then at the cut the engine's own error calls for
# The ops whose conversion computes in the reduced precision (``_reduced_products``: the
# convolutions and matrix products ``fx_convert`` writes them as); the rest stay float32 in
# both, so a cut after the last of them would reduce nothing.
PRODUCTS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul", "relax.einsum"})
MARGIN = 0.9  # a second try aims this far inside the budget: the engine's errors vary from cut to cut


class Split(NamedTuple):
    """The engine split: its finalist, its error over the budget's input sets, and the last op
    (a position in the model's topological order) computed in float32."""

    finalist: Finalist
    error: float
    cut: int

    def how(self, graph) -> str:
        reduced_at = self.finalist.partitions[-1].candidate.precision
        return (f"float32 up to op {self.cut + 1} of {len(graph)} ({graph[self.cut].op.removeprefix('relax.')}) "
                f"and {short(reduced_at)} after it")  # fmt: skip


class NoSplit(Exception):
    """Why an engine's reduced finalist could not be split within the budget (one line), and
    the error a split erred where that is why."""

    def __init__(self, why: str, error: float | None = None):
        super().__init__(why)
        self.error = error


def split_in_precision(whole: Candidate, draws: list[Reference], graph, costs, backends, config, error_of) -> Split:
    """An engine on the whole model in a reduced precision (``whole``, over the budget) with
    float32 up to the earliest cut the forecast finds within ``config.accuracy``, built,
    checked and priced (``costs``); ``error_of(finalist)`` is a module's error over ``draws``.
    Where the engine errs more than forecast, the forecast's budget shrinks by as much and a
    later cut is tried. Raises NoSplit."""
    engine, precision, region = whole.backend, whole.precision, whole.subgraph
    counts = crossings(region)
    order = sorted(region.nodes)
    last_product = max((k for k, node in enumerate(order) if graph[node].op in PRODUCTS), default=-1)
    counts = counts[: max(last_product, 0)]  # a cut after which a product is left to reduce
    if not counts:
        raise NoSplit("no cut leaves a convolution or matrix product to compute reduced")
    cuts = [k for k, count in enumerate(counts) if count == min(counts)]
    forecast = Forecast(graph, draws, precision, "cuda" if is_cuda(config.target) else "cpu")
    forecasts: dict[int, float] = {}  # cut index -> forecast error

    def earliest(within: float, after: int) -> int | None:
        """The earliest cut after index ``after`` whose forecast is ``within`` (bisection:
        the later the cut, the less is reduced), or None."""
        low, high = after + 1, len(cuts) - 1
        if low > high or forecasts.setdefault(high, forecast.error(region, cuts[high])) > within:
            return None
        while low < high:
            middle = (low + high) // 2
            if forecasts.setdefault(middle, forecast.error(region, cuts[middle])) <= within:
                high = middle
            else:
                low = middle + 1
        return high

    why, within, tried = [], config.accuracy, -1
    for _ in range(TRIES):
        i = earliest(within, tried)
        if i is None:
            break
        tried, k = i, cuts[i]
        try:
            built = _built(region, k, engine, precision, graph, draws[0], costs, backends, config)
            error = error_of(built)
        except NoSplit as err:
            why.append(str(err))
            error = err.error
        else:
            if reduced(built.partitions) and error <= config.accuracy:
                return Split(built, error, k)
            why.append(f"split after op {k + 1} erred {error:.3g}, forecast {forecasts[i]:.3g}")
        if error is None:
            break
        within *= MARGIN * forecasts[i] / max(error, forecasts[i])
    if not why:
        raise NoSplit(f"not within the budget even in float32 up to its last cut (op {cuts[-1] + 1} of {len(graph)}), "
                      f"forecast in PyTorch")  # fmt: skip
    raise NoSplit("; ".join(why))


def _built(region: SubGraph, k: int, engine: str, precision: str, graph, reference: Reference, costs, backends,
           config) -> Finalist:  # fmt: skip
    """The engine on ``region``'s ops up to ``k`` in float32 and on the rest in ``precision``,
    measured (so the report prices it, and the cost log keeps it) and assembled."""
    partitions = []
    for part, at in zip(split_at(region, k), (FLOAT32, precision)):
        candidate = Candidate(part, engine, f"{engine}{PART_SUFFIX}", at)
        cost = costs.cost(candidate)
        if not cost.is_valid:
            raise NoSplit(f"its {short(at)} side after op {k + 1}: {cost.reason}", cost.error)
        partitions.append(Partition(candidate, cost, costs.transition_ms(engine)))
    try:
        # Checked for gross faults only (beyond the largest output): the caller holds the
        # split to the budget and, where it misses, needs by how much.
        built = assemble_and_check(graph, Placement(graph, tuple(partitions)), reference, backends, config.target,
                                   config.threads, GROSS_FAULT, held_to_budget=True)  # fmt: skip
    except OptimizeError as err:
        raise NoSplit(f"split after op {k + 1}: {err}") from None
    if built.fallbacks:
        raise NoSplit(f"split after op {k + 1}: {built.fallbacks[0][1]}")
    return built


class Forecast:
    """The model's error with float32 up to a cut and ``precision`` after it, run eagerly in
    PyTorch on collage's conversion of each side (``_reduced_products``); the largest over
    ``draws``. Raises NoSplit for a precision of no floating-point format, or where a side
    does not convert."""

    def __init__(self, graph, draws: list[Reference], precision: str, device: str):
        if precision not in (FLOAT16, BFLOAT16, TF32):
            raise NoSplit(f"no forecast of {precision}, a precision of no floating-point format")
        self.graph, self.draws, self.precision, self.device = graph, draws, precision, device

    def error(self, region: SubGraph, k: int) -> float:
        import torch

        from ..candidates.fx_convert import to_fx

        sides = split_at(region, k)
        try:
            modules = [to_fx(side.extract(), self.device) for side in sides]
        except Unsupported as err:
            raise NoSplit(f"no forecast: {err}") from None
        worst = 0.0
        for draw in self.draws:
            values = {p: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
                      for p, a in zip(self.graph.func.params, draw.inputs)}  # fmt: skip
            with torch.no_grad(), _float32_math():
                for side, module, reduced_here in zip(sides, modules, (False, True)):
                    with _reduced_products(self.precision) if reduced_here else contextlib.nullcontext():
                        outputs = module(*[values[a] for a in side.arguments()])
                    if len(outputs) != len(side.outputs):
                        raise NoSplit(f"no forecast: a tuple crosses the cut after op {k + 1}")
                    values.update((self.graph[i].var, out) for i, out in zip(side.outputs, outputs))
            leaves = _leaves(self.graph.result)
            if not all(isinstance(v, relax.Var) for v in leaves):
                raise NoSplit("no forecast: the model returns a constant")
            found = [_numpy(values[v]) for v in leaves]
            worst = max(worst, relative_error(found, draw.outputs))
        return worst


@contextlib.contextmanager
def _float32_math():
    """cuDNN and cuBLAS in float32 (PyTorch lets cuDNN run TF32 by default): the forecast's
    float32 side must be float32, its reduced side rounds its own inputs."""
    import torch

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def _reduced_products(precision: str):
    """PyTorch's convolutions and matrix products computed as tensor cores and AMX compute
    them in ``precision``: float32 inputs rounded to it, products summed in float32, results
    rounded to it (TF32's kept in float32, as cuDNN and cuBLAS write them); every other op in
    float32. Spelled out rather than left to ``torch.autocast``, whose CPU list has no
    ``aten.convolution`` (collage's conversion writes convolutions so): on the CPU it would
    forecast float32 for them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    products = {aten.convolution.default, aten.mm.default, aten.bmm.default, aten.addmm.default,
                aten.baddbmm.default, aten.mv.default, aten.addmv.default}  # fmt: skip

    class Reduced(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in products:
                return func(*args, **kwargs)
            args = [rounded(a, precision) for a in args]
            out = func(*args, **kwargs)
            return out if precision == TF32 else out.to(torch.float32)

    return Reduced()


def rounded(value, precision: str):
    """A float32 tensor rounded to ``precision`` (to nearest, ties to even, as the hardware
    converts): TF32's 10 bits of mantissa kept in float32; others as that dtype."""
    import torch

    if not (isinstance(value, torch.Tensor) and value.dtype == torch.float32):
        return value
    if precision != TF32:
        return value.to(getattr(torch, precision))
    bits = value.view(torch.int32)
    return ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def _leaves(expr: relax.Expr) -> list[relax.Expr]:
    """The values a function's result holds, in order, its tuples flattened (as
    ``arrays.numpy_outputs`` flattens what the module returns)."""
    return [leaf for field in expr.fields for leaf in _leaves(field)] if isinstance(expr, relax.Tuple) else [expr]


def _numpy(tensor) -> np.ndarray:
    import torch

    return (tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor).cpu().numpy()
