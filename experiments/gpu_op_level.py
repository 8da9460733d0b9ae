"""Where an op-level placement's time goes on a GPU: its estimate (the sum of its candidates,
each measured alone, replayed in a CUDA graph) against the whole module's replay, kernel by
kernel.

On a lent H200 (stop 58) ResNet-50's op-level placement (cuDNN, cuBLAS and TVM) was estimated
at 1.64 ms and measured at 2.22-2.38 ms as a whole, while inductor alone's estimate matched
its time (2.03 ms against 2.06); its reduced-precision twin was estimated at 0.79 ms and
measured at 2.65. This script optimizes a model with the op-level libraries only, times the
kept module's bound call between CUDA events, and records its calls with torch's profiler:
each kernel's device time, the kernels' count per call, and the device's idle time between
them: ``op_level.json`` and the trace, ``op_level_trace.json.gz``. With ``--accuracy E`` the
op-level placement over every precision the budget offers is profiled too
(``op_level_reduced.json``, ``op_level_reduced_trace_of_it.json.gz``),
from the costs the optimization logged: the one estimated at 0.79 ms and measured at 2.65.

    python3 -m experiments.gpu_op_level --model resnet50 [--backends tvm cudnn cublas] [--accuracy 1e-2]
                                        [--target cuda] [--cost-log PATH] [--out DIR]
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


def estimate(partitions) -> dict:
    """The DP's estimate of ``partitions``: in all (NaN with a fallback never measured, as the
    placement's), and by backend as the report splits it (ms)."""
    from collage.deploying.report import backend_totals

    return {"partitions": len(partitions), "estimated_ms": round(sum(p.cost_ms for p in partitions), 4),
            "estimated_ms_by_backend": {b: round(t.ms, 4) for b, t in backend_totals(partitions).items()}}  # fmt: skip


def profiled(call, cuda: bool, trace_to: Path) -> dict:
    """``call`` (one inference) timed back to back (between CUDA events on a GPU, else on the
    host's clock), then ``CALLS`` calls recorded by torch's profiler: its kernels per call and
    by name (on a GPU), the trace gzipped to ``trace_to``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    wait = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(20):
        call()
    wait()
    times = []
    for _ in range(7):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        for _ in range(50):
            call()
        if cuda:
            end.record()
            end.synchronize()
        times.append(start.elapsed_time(end) / 50 if cuda else (time.perf_counter() - began) * 1e3 / 50)
    found = {"ms_per_call": sorted(round(t, 4) for t in times)}
    print("back to back, ms per call:", found["ms_per_call"], flush=True)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(CALLS):
            call()
            wait()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        with open(path, "rb") as raw, gzip.open(trace_to, "wb") as packed:
            shutil.copyfileobj(raw, packed)
    kernels = kernel_rows(trace)
    found["profiled"] = per_call(kernels, CALLS)
    found["by_kernel"] = by_name(kernels, CALLS)
    print(json.dumps(found["profiled"]), flush=True)
    for row in found["by_kernel"][:25]:
        print(row, flush=True)
    return found


def reduced_op_level(model, backends: list[str], config, cost_log: Path):
    """The op-level DP's placement over every precision offered (the finalist "op-level,
    reduced precision allowed" before it is held to the budget), from the costs ``optimize``
    logged, assembled and checked as a finalist is."""
    from collage.assembling.checked import assemble_and_check
    from collage.candidates.backend import BackendSet
    from collage.candidates.generate import generate, in_precisions
    from collage.choosing import policy
    from collage.measuring.measure import Measurer
    from collage.placing.placement import place
    from collage.prepare import dataflow_graph, prepare_model
    from collage.record import RunRecord

    prepared = prepare_model(config, model, backends, str(cost_log))
    graph = dataflow_graph(prepared.prepared)
    offered = policy.reduced_precisions(prepared.usable, config, RunRecord())
    candidates = in_precisions(generate(graph, prepared.usable), offered)
    measurer = Measurer(BackendSet(prepared.usable), config, prepared.log, None)
    measurer.measure_all(candidates, progress=False)  # every cost from the log
    placement = place(graph, candidates, measurer, measurer.transition_ms)
    finalist = assemble_and_check(graph, placement, prepared.reference, prepared.backends, config.target,
                                  config.threads, config.accuracy, held_to_budget=True)  # fmt: skip
    return finalist, prepared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--backends", nargs="+", default=["tvm", "cudnn", "cublas"])
    parser.add_argument("--accuracy", type=float, default=None,
                        help="also profile the op-level placement over the reduced precisions this budget offers")
    parser.add_argument("--target", default="cuda", help="cuda, or llvm to try the script on a CPU")
    parser.add_argument("--cost-log", default=None, help="a cost log to reuse (default: a new one)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    import torch
    import tvm

    import collage
    from collage.assembling.assemble import bound_main
    from collage.config import Config
    from collage.measuring.build import device_for
    from experiments import models
    from experiments.gpu import float32_everywhere

    cuda = args.target == "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    found: dict = {"model": args.model, "backends": args.backends, "accuracy": args.accuracy,
                   "device": torch.cuda.get_device_name() if cuda else args.target}  # fmt: skip
    name = "op_level" if args.accuracy is None else "op_level_reduced"
    save = lambda: (out / f"{name}.json").write_text(json.dumps(found, indent=1))  # noqa: E731
    float32_everywhere()
    w = models.load(args.model)
    cost_log = Path(args.cost_log) if args.cost_log else Path(tempfile.mkdtemp()) / "costs.sqlite"
    started = time.perf_counter()
    opt = collage.optimize(w.relax, target=args.target, backends=args.backends, cost_log=cost_log,
                           accuracy=args.accuracy, progress=False)  # fmt: skip
    found["optimize_s"] = round(time.perf_counter() - started, 1)
    found["report"] = opt.report()
    print(found["report"], flush=True)
    found["kept"] = {"name": str(opt.record.chosen), **estimate(opt.placement), "cuda_graph_off": opt.record.cuda_graph_off}
    save()
    device = device_for(args.target)
    tensors = [tvm.runtime.tensor(t.numpy(), device) for t in w.inputs]
    found["kept"].update(profiled(opt.bind(*tensors), cuda, out / f"{name}_trace.json.gz"))
    save()
    if args.accuracy is None:
        return

    from collage.measuring.build import kernel_backends, module_cuda_graph_blocker

    config = Config(target=args.target, accuracy=args.accuracy)
    finalist, prepared = reduced_op_level(w.relax, args.backends, config, cost_log)
    backends = kernel_backends(finalist.assembly, prepared.backends)
    found["reduced"] = {**estimate(finalist.partitions), "fallbacks": [why for _, why in finalist.fallbacks],
                        "precisions": dict(collections.Counter(f"{p.backend} {p.candidate.precision}"
                                                               for p in finalist.partitions)),
                        "cuda_graph_off": module_cuda_graph_blocker(finalist.assembly.module, backends) if cuda else None}  # fmt: skip
    print("op-level over every precision:", json.dumps({k: v for k, v in found["reduced"].items()}), flush=True)
    save()
    call = bound_main(finalist.assembly, finalist.vm, tensors, device)
    found["reduced"].update(profiled(call, cuda, out / f"{name}_trace_of_it.json.gz"))
    save()


if __name__ == "__main__":
    main()
