"""Where an op-level placement's time goes on a GPU: its estimate (the sum of its candidates,
each measured alone, replayed in a CUDA graph) against the whole module's replay, kernel by
kernel.

On a lent H200 (stop 58) ResNet-50's op-level placement (cuDNN, cuBLAS and TVM) was estimated
at 1.64 ms and measured at 2.22-2.38 ms as a whole, while inductor alone's estimate matched
its time (2.03 ms against 2.06); its reduced-precision twin was estimated at 0.79 ms and
measured at 2.65. This script optimizes a model with the op-level libraries only, times the
kept module's bound call between CUDA events, and records its calls with torch's profiler:
each kernel's device time, the kernels' count per call, and the device's idle time between
them. The trace itself comes back as ``trace.json.gz``.

    python3 -m experiments.gpu_op_level --model resnet50 [--backends tvm cudnn cublas] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

CALLS = 10  # profiled calls


def kernel_rows(trace: dict) -> list[dict]:
    """The device kernels of a Chrome trace written by torch's profiler, in start order."""
    rows = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    return sorted(rows, key=lambda e: e["ts"])


def per_call(kernels: list[dict], calls: int) -> dict:
    """Per call, over ``calls`` calls whose kernels are ``kernels``: their count, their summed
    device time, the span from the first's start to the last's end, and the idle time between
    (microseconds). The calls are told apart by their kernels' count, or by the longest gaps (each call waits for the
    device before the next starts) where the kernels do not divide evenly among the calls; a
    gap inside a call, before its CUDA graph's replay, can be as long as one between calls."""
    if not kernels:
        return {"kernels": 0}
    if len(kernels) % calls == 0:
        cuts = list(range(len(kernels) // calls, len(kernels), len(kernels) // calls))
    else:
        gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i]["ts"] - _end(kernels[i - 1]), reverse=True)
        cuts = sorted(gaps[: calls - 1])
    groups = [kernels[a:b] for a, b in zip([0, *cuts], [*cuts, len(kernels)])]
    busy = [sum(k["dur"] for k in g) for g in groups]
    span = [_end(g[-1]) - g[0]["ts"] for g in groups]
    middle = len(groups) // 2
    return {
        "calls": len(groups),
        "kernels_per_call": [len(g) for g in groups],
        "busy_us_median": sorted(busy)[middle],
        "span_us_median": sorted(span)[middle],
        "idle_us_median": sorted(s - b for s, b in zip(span, busy))[middle],
        "gaps_between_calls_us": sorted(kernels[i]["ts"] - _end(kernels[i - 1]) for i in cuts),
    }


def _end(kernel: dict) -> float:
    return kernel["ts"] + kernel["dur"]


def by_name(kernels: list[dict], calls: int, top: int = 40) -> list[dict]:
    """Each kernel name's device time per call, most first."""
    total, count = collections.Counter(), collections.Counter()
    for k in kernels:
        total[k["name"]] += k["dur"]
        count[k["name"]] += 1
    return [{"name": n[:120], "us_per_call": round(t / calls, 2), "launches_per_call": count[n] / calls}
            for n, t in total.most_common(top)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--backends", nargs="+", default=["tvm", "cudnn", "cublas"])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    import torch
    import tvm

    import collage
    from experiments import models
    from experiments.gpu import float32_everywhere

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    found: dict = {"model": args.model, "backends": args.backends, "gpu": torch.cuda.get_device_name()}
    save = lambda: (out / "op_level.json").write_text(json.dumps(found, indent=1))  # noqa: E731
    float32_everywhere()
    w = models.load(args.model)
    log_dir = tempfile.mkdtemp()
    started = time.perf_counter()
    opt = collage.optimize(w.relax, target="cuda", backends=args.backends, cost_log=Path(log_dir) / "costs.sqlite",
                           progress=False)  # fmt: skip
    found["optimize_s"] = round(time.perf_counter() - started, 1)
    found["report"] = opt.report()
    print(found["report"], flush=True)
    parts = opt.placement
    found["partitions"] = len(parts)
    found["estimated_ms"] = round(sum(p.cost_ms for p in parts), 4)
    by_backend = collections.defaultdict(float)
    for p in parts:
        by_backend[p.backend] += p.cost_ms
    found["estimated_ms_by_backend"] = {b: round(ms, 4) for b, ms in by_backend.items()}
    found["cuda_graph_off"] = opt.record.cuda_graph_off
    save()

    tensors = [tvm.runtime.tensor(t.numpy(), tvm.cuda()) for t in w.inputs]
    call = opt.bind(*tensors)
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        for _ in range(50):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 50)
    found["events_ms_per_call"] = sorted(round(t, 4) for t in times)
    print("between CUDA events, ms per call:", found["events_ms_per_call"], flush=True)
    save()

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
            torch.cuda.synchronize()
    path = Path(log_dir) / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    with open(path, "rb") as raw, gzip.open(out / "trace.json.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    kernels = kernel_rows(trace)
    found["profiled"] = per_call(kernels, CALLS)
    found["by_kernel"] = by_name(kernels, CALLS)
    print(json.dumps(found["profiled"]), flush=True)
    for row in found["by_kernel"][:25]:
        print(row, flush=True)
    save()


if __name__ == "__main__":
    main()
