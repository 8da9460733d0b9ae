"""Graph simplification before/after, for every zoo model at full size.

    python -m experiments.simplify_bench [--model resnet50 bert] [--reps 5] [--min-seconds 3]

For each model: op count and BatchNorm count before and after ``collage.simplify``, the
output difference, and the latency of TVM's default pipeline (``tvm.compile`` for an llvm
target with ``num-cores`` threads: legalized and fused, untuned) before and after. The two
modules are warmed up, then timed in alternating calls, the order swapping every round so
that drift in the machine hits both alike, for at least ``reps`` rounds and ``min_seconds``
(a fast model gets many samples; a slow one, such as untuned BERT, gets ``reps``).

Results go to ``results/simplify.json`` keyed by model (running some models updates only
their entries) and the table ``results/simplify.md`` is regenerated from the whole file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

THREADS = 2
os.environ.setdefault("TVM_NUM_THREADS", str(THREADS))  # read once, when TVM's thread pool starts

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import collage  # noqa: E402
from collage.model.simplify import op_count, op_histogram  # noqa: E402
from experiments import models  # noqa: E402

RESULTS_DIR = Path(__file__).parent / "results"
JSON_PATH, TABLE_PATH = RESULTS_DIR / "simplify.json", RESULTS_DIR / "simplify.md"
BATCH_NORM = "relax.nn.batch_norm"
MAX_REPS = 200


@dataclass(frozen=True)
class ModelResult:
    model: str
    input_shape: list[int]
    ops_before: int
    ops_after: int
    batch_norm_before: int
    batch_norm_after: int
    rewrites: dict[str, int]  # the steps that applied, with their counts from the report
    iterations: int
    simplify_s: float
    max_rel_err: float  # max |after - before| / max |before| over the outputs
    latency_ms_before: float
    latency_ms_after: float
    samples_ms_before: list[float]
    samples_ms_after: list[float]
    measured_at: str


def compile_for_cpu(mod: tvm.IRModule):
    target = tvm.target.Target({"kind": "llvm", "num-cores": THREADS})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"]


def to_numpy(out) -> list[np.ndarray]:
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [t.numpy() for t in out]


def max_rel_err(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    return max(float(np.abs(a - e).max() / np.abs(e).max()) for a, e in zip(actual, expected))


def time_interleaved(
    calls: dict[str, Callable[[], object]], reps: int, min_seconds: float
) -> dict[str, list[float]]:
    """Milliseconds per call, in rounds that run every call once, starting one further along
    each round; at least ``reps`` rounds and ``min_seconds``, at most ``MAX_REPS`` rounds."""
    names = list(calls)
    samples = {name: [] for name in names}
    deadline = time.perf_counter() + min_seconds
    r = 0
    while r < MAX_REPS and (r < reps or time.perf_counter() < deadline):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
        r += 1
    return samples


def measure(name: str, reps: int, min_seconds: float, warmup_calls: int) -> ModelResult:
    workload = models.load(name)
    original = workload.relax
    start = time.perf_counter()
    simplified, report = collage.simplify(original, report=True)
    simplify_s = time.perf_counter() - start

    inputs = [tvm.runtime.tensor(t.numpy()) for t in workload.inputs]
    before, after = compile_for_cpu(original), compile_for_cpu(simplified)
    for _ in range(warmup_calls):
        before(*inputs), after(*inputs)
    error = max_rel_err(to_numpy(after(*inputs)), to_numpy(before(*inputs)))
    calls = {"before": lambda: before(*inputs), "after": lambda: after(*inputs)}
    samples = time_interleaved(calls, reps, min_seconds)

    return ModelResult(
        model=name,
        input_shape=list(workload.input_shape),
        ops_before=op_count(original),
        ops_after=op_count(simplified),
        batch_norm_before=op_histogram(original)[BATCH_NORM],
        batch_norm_after=op_histogram(simplified)[BATCH_NORM],
        rewrites={step.name: step.applied for step in report.steps if step.applied},
        iterations=report.iterations,
        simplify_s=round(simplify_s, 2),
        max_rel_err=error,
        latency_ms_before=round(statistics.median(samples["before"]), 3),
        latency_ms_after=round(statistics.median(samples["after"]), 3),
        samples_ms_before=[round(s, 3) for s in samples["before"]],
        samples_ms_after=[round(s, 3) for s in samples["after"]],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


# --------------------------------------------------------------------------- reporting


def environment(reps: int, min_seconds: float, warmup_calls: int) -> dict:
    return {
        "tvm": tvm.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": THREADS,
        "target": f'{{"kind": "llvm", "num-cores": {THREADS}}}',
        "reps": reps,
        "min_seconds": min_seconds,
        "warmup_calls": warmup_calls,
    }


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"


def table(results: dict[str, dict]) -> str:
    rows = [
        "| model | ops | BatchNorm | median latency (ms) | speedup | min latency (ms) "
        "| spread | calls | max rel. error | rewrites applied |",
        "|" + "---|" * 10,
    ]
    for name in models.MODELS:
        if name not in results:
            continue
        r = results[name]
        fastest = min(r["samples_ms_before"]), min(r["samples_ms_after"])
        samples = r["samples_ms_before"] + r["samples_ms_after"]
        rewrites = ", ".join(f"{step} {n}" for step, n in r["rewrites"].items())
        rows.append(
            f"| {name} | {r['ops_before']} → {r['ops_after']} "
            f"| {r['batch_norm_before']} → {r['batch_norm_after']} "
            f"| {_ms(r['latency_ms_before'])} → {_ms(r['latency_ms_after'])} "
            f"| {r['latency_ms_before'] / r['latency_ms_after']:.2f}x "
            f"| {_ms(fastest[0])} → {_ms(fastest[1])} | {max(samples) / min(samples):.2f} "
            f"| {len(r['samples_ms_before'])} | {r['max_rel_err']:.1e} | {rewrites} |"
        )
    return "\n".join(rows)


def write_markdown(path: Path, data: dict) -> None:
    env = data["environment"]
    path.write_text(
        "# Graph simplification: before/after\n\n"
        "Written by `python -m experiments.simplify_bench`; do not edit by hand.\n\n"
        "Every zoo model at full size, before → after `collage.simplify`. Latency: TVM's default "
        f"pipeline (`tvm.compile`, target `{env['target']}`, untuned kernels), "
        f"{env['threads']} threads, after {env['warmup_calls']} warm-up call(s), before and "
        f"after timed in alternating calls (at least {env['reps']} each and "
        f"{env['min_seconds']:g} s; calls: the number each); speedup is of the medians. Spread: slowest / fastest of all the model's calls, the run-to-run noise of "
        "this shared machine; a speedup inside it is not a measured difference, and the "
        "minimum is the steadier estimate. Max rel. error: "
        "max |after − before| / max |before|. Rewrites: how often each step applied (for TVM "
        "passes, the ops they removed; for CanonicalizeBindings, the bindings).\n\n"
        f"{table(data['models'])}\n\n"
        f"Machine: {env['cpu_count']} CPUs ({env['cpu']}), TVM {env['tvm']}; other processes "
        "shared the CPU, so latencies are noisy. Dates and every sample: `simplify.json`.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", nargs="+", default=list(models.MODELS), choices=list(models.MODELS)
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--warmup-calls", type=int, default=1)
    args = parser.parse_args()

    data = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {"models": {}}
    data["environment"] = environment(args.reps, args.min_seconds, args.warmup_calls)
    for name in args.model:
        result = measure(name, args.reps, args.min_seconds, args.warmup_calls)
        data["models"][name] = asdict(result)
        print(
            f"{name}: ops {result.ops_before} -> {result.ops_after}, "
            f"{result.latency_ms_before:.2f} -> {result.latency_ms_after:.2f} ms",
            flush=True,
        )
        RESULTS_DIR.mkdir(exist_ok=True)
        JSON_PATH.write_text(json.dumps(data, indent=2) + "\n")
        write_markdown(TABLE_PATH, data)
    print(table(data["models"]))


if __name__ == "__main__":
    main()
