"""How far each reduced precision a GPU offers takes a model from its float32 outputs,
forecast on the CPU, and how much of the model must stay in float32 to meet a budget.

A lent GPU has 15 minutes; an accuracy entry costs one optimization from an empty cost log
there. This script says beforehand, on any CPU, which precisions can meet the budget on which
model, with the budget's own metric (``measuring.arrays.relative_error``: the largest
difference over the largest magnitude of the float32 output):

- TF32 (cuDNN's, cuBLAS's and inductor's float32 on tensor cores): the inputs of every
  convolution and matrix product rounded to 10 bits of mantissa (to nearest, as the hardware
  converts), products summed in float32;
- float16 and bfloat16 as inductor runs them on the GPU, under ``torch.autocast``: here the
  CPU's autocast (its list of operators cast down is CUDA's for convolutions and matrix
  products; both keep softmax, normalization and reductions in float32).

Then, per precision, the fewest leading convolutions and matrix products that must stay in
float32 for the rest to meet ``--budget`` (bisection over the count, as ``policy.repaired``
brings the earliest partitions of a placement back to float32), and the share of the model's
multiply-adds left reduced. On a lent H100 (stop 53) inductor on ResNet-50 erred 2.5e-2 in TF32,
3.2e-2 in float16 and 0.13 in bfloat16: the TF32 and float16 forecasts here are checked
against those.

    python -m experiments.precision_forecast [--model resnet50 bert ...] [--budget 1e-2] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from collage.choosing.precision_split import rounded
from collage.measuring.arrays import relative_error
from collage.measuring.cost import cpu_info
from experiments import models

GPU_MODELS = ["resnet50", "bert", "mobilenet_v2", "vit", "gpt2", "convnext"]
TF32, FLOAT16, BFLOAT16 = "tfloat32", "float16", "bfloat16"
# The operators tensor cores run: what TF32 rounds and autocast casts down.
PRODUCTS = {F.conv1d, F.conv2d, F.conv3d, F.conv_transpose2d, F.linear, torch.matmul, torch.Tensor.matmul,
            torch.Tensor.__matmul__, torch.bmm, torch.mm, torch.addmm, torch.baddbmm, torch.einsum,
            F.scaled_dot_product_attention}  # fmt: skip


class Reduced(TorchFunctionMode):
    """Counts the products a forward pass calls, and computes those from ``first`` on in
    ``precision``: TF32 rounds their float32 inputs; float16 and bfloat16 are autocast's,
    switched on from that product on (earlier products and the operators between them stay
    float32). Also sums each product's multiply-adds, for the share left reduced."""

    def __init__(self, precision: str, first: int):
        super().__init__()
        self.precision, self.first, self.count, self.macs, self._autocast = precision, first, 0, [], None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in PRODUCTS:
            return func(*args, **kwargs)
        index, self.count = self.count, self.count + 1
        if index >= self.first and self.precision == TF32:
            args = tuple(rounded(a, TF32) for a in args)
        elif index == self.first and self._autocast is None:
            dtype = torch.float16 if self.precision == FLOAT16 else torch.bfloat16
            self._autocast = torch.autocast("cpu", dtype=dtype)
            self._autocast.__enter__()
        out = func(*args, **kwargs)
        self.macs.append(_macs(func, args, out))
        return out

    def __exit__(self, *exc):
        if self._autocast is not None:
            self._autocast.__exit__(*exc)
        return super().__exit__(*exc)


def _macs(func, args, out) -> float:
    """Multiply-adds of one product: the output's elements times the summed length."""
    if not isinstance(out, torch.Tensor):
        return 0.0
    if func in (F.conv1d, F.conv2d, F.conv3d, F.conv_transpose2d):
        return out.numel() * args[1][0].numel()  # a transposed one's is approximate
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if func is F.scaled_dot_product_attention:
        q, k = tensors[0], tensors[1]
        return 2.0 * q.numel() * k.shape[-2]
    if func in (torch.addmm, torch.baddbmm):
        tensors = tensors[1:]
    return out.numel() * tensors[0].shape[-1] if tensors and tensors[0].dim() else 0.0


def forward(w, precision: str | None, first: int = 0):
    """The model's outputs (numpy, float32) with products from ``first`` on in ``precision``
    (None: float32 throughout), and the mode that counted them."""
    mode = Reduced(precision or "float32", first if precision else 1 << 30)
    with torch.no_grad(), mode:
        out = w.torch(*w.inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.float().numpy() if o.is_floating_point() else o.numpy() for o in outs], mode


def forecast(name: str, budget: float) -> dict:
    w = models.load(name)
    reference, mode = forward(w, None)
    products, macs = mode.count, np.array(mode.macs)
    found = {"model": w.spec.description, "products": products, "gmacs": round(float(macs.sum()) / 1e9, 3)}
    for precision in (TF32, FLOAT16, BFLOAT16):
        error = relative_error(forward(w, precision)[0], reference)
        row = {"error": float(f"{error:.3g}")}
        if not error <= budget:
            row["float32_first"], row["error_then"] = _fewest_first(w, precision, reference, budget, products)
        kept = row.get("float32_first", 0)
        row["share_of_macs_reduced"] = round(float(macs[kept:].sum() / macs.sum()), 3) if macs.sum() else 0.0
        found[precision] = row
        print(f"  {name} {precision}: {row}", flush=True)
    return found


def _fewest_first(w, precision, reference, budget, products) -> tuple[int, float]:
    """The fewest leading products kept in float32 for the rest in ``precision`` to meet
    ``budget`` (bisection: fewer in float32 is assumed to err more), and that error."""
    low, high, error_at_high = 0, products, 0.0  # all float32 (``products``) meets it
    while high - low > 1:
        middle = (low + high) // 2
        error = relative_error(forward(w, precision, middle)[0], reference)
        if error <= budget:
            high, error_at_high = middle, error
        else:
            low = middle
    return high, float(f"{error_at_high:.3g}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=GPU_MODELS)
    parser.add_argument("--budget", type=float, default=1e-2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = {"machine": cpu_info(), "budget": args.budget, "torch": torch.__version__, "models": {}}
    for name in args.model:
        started = time.perf_counter()
        results["models"][name] = forecast(name, args.budget)
        results["models"][name]["seconds"] = round(time.perf_counter() - started, 1)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
