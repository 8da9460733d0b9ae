"""Deploying the zoo: exported modules loaded in a fresh process, and torch.compile with collage.

    python -m experiments.deploy --model resnet50 bert ... [--threads 2] [--out FILE]

For each model, as a user would deploy it:

1. ``collage.optimize`` on the model with its ONNX export (as the bench's collage peer, so a
   cost log the bench filled measures nothing again), then ``opt.export(dir)``; a fresh
   process runs ``collage.load(dir)`` (load time), calls it once (first call: the engines'
   lazy set-up) and times it with the project's protocol; its outputs are compared with
   torch's.
2. ``torch.compile(model, backend="collage")`` under ``torch.no_grad()``: the first call
   (dynamo, export, import, optimize) and its outputs against eager; then the compiled model
   and eager timed in alternation.

Results go to ``experiments/results/deploy.json`` with the CPU and its ISA flags.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments import models
from experiments.bench import max_relative_error, metadata, Settings

RESULTS = Path(__file__).parent / "results" / "deploy.json"
PROTOCOL_ROUNDS = 7


def loaded_in_fresh_process(directory: Path, inputs: list[np.ndarray], threads: int) -> dict:
    """Load time, first call and steady time of the export at ``directory``, and its outputs,
    measured by a new Python process (nothing of this one's libraries loaded or warm)."""
    with tempfile.TemporaryDirectory() as tmp:
        for k, x in enumerate(inputs):
            np.save(Path(tmp) / f"in{k}.npy", x)
        subprocess.run(
            [sys.executable, "-m", "experiments.deploy", "--load", str(directory), "--io", tmp, "--threads", str(threads)],
            check=True, timeout=1800,
        )  # fmt: skip
        record = json.loads((Path(tmp) / "record.json").read_text())
        outputs = [np.load(Path(tmp) / f"out{k}.npy") for k in range(record.pop("outputs"))]
    return record | {"outputs": outputs}


def _load_here(directory: str, io: str, threads: int) -> None:
    """The fresh process's side of ``loaded_in_fresh_process``."""
    started = time.perf_counter()
    import collage  # importing collage and its libraries is part of what a deployment pays
    from collage.measuring.arrays import to_tensors
    from collage.measuring.timing import Protocol, time_contenders

    imported_s = time.perf_counter() - started
    loaded = collage.load(directory, threads=threads)
    arrays = [np.load(p) for p in sorted(Path(io).glob("in*.npy"))]
    first_s = loaded.first_call_s(arrays)
    tensors = to_tensors(arrays)
    steady = time_contenders({"loaded": lambda: loaded.main(*tensors)}, Protocol(rounds=PROTOCOL_ROUNDS))["loaded"]
    result = loaded(*arrays)
    outputs = list(result) if isinstance(result, tuple) else [result]
    for k, out in enumerate(outputs):
        np.save(Path(io) / f"out{k}.npy", out)
    (Path(io) / "record.json").write_text(json.dumps({
        "import_s": round(imported_s, 3), "load_s": round(loaded.load_s, 3), "first_call_ms": round(first_s * 1e3, 3),
        "steady_ms": round(steady.median_ms, 3), "steady_spread_ms": round(steady.spread_ms, 3),
        "kernels": len(loaded.manifest["kernels"]), "outputs": len(outputs),
    }))  # fmt: skip


def exported_entry(w: models.Workload, reference, threads: int) -> dict:
    import collage

    started = time.perf_counter()
    opt = collage.optimize(w.relax, threads=threads, onnx_model=w.onnx, progress=False)
    optimize_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        directory = opt.export(Path(tmp) / w.name)
        export_s = time.perf_counter() - started
        size_mb = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20
        record = loaded_in_fresh_process(directory, [x.numpy() for x in w.inputs], threads)
    return {
        "kept": str(opt.record.chosen), "optimize_s": round(optimize_s, 1), "export_s": round(export_s, 2),
        "size_mb": round(size_mb, 1), "optimized_ms": round(opt.measured.median_ms, 3),
        **{k: v for k, v in record.items() if k != "outputs"},
        "max_rel_err": max_relative_error(record["outputs"], reference),
    }  # fmt: skip


def torch_compile_entry(w: models.Workload, reference, threads: int) -> dict:
    import torch

    from collage.measuring.timing import Protocol, time_contenders

    import collage.api

    made, optimize = [], collage.api.optimize

    def counted(*args, **kwargs):  # each graph dynamo hands over is optimized once
        made.append(optimize(*args, **kwargs))
        return made[-1]

    torch._dynamo.reset()
    compiled = torch.compile(w.torch, backend="collage", options={"threads": threads})
    with torch.no_grad():
        collage.api.optimize = counted
        try:
            started = time.perf_counter()
            out = compiled(*w.inputs)
            first_s = time.perf_counter() - started
        finally:
            collage.api.optimize = optimize
        outputs = [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]
        costs = time_contenders(
            {"collage": lambda: compiled(*w.inputs), "eager": lambda: w.torch(*w.inputs)}, Protocol(rounds=PROTOCOL_ROUNDS)
        )  # fmt: skip
    return {
        "first_call_s": round(first_s, 1), "max_rel_err": max_relative_error(outputs, reference),
        "graphs": len(made), "measured_now": sum(opt.record.measured for opt in made),
        "kept": [str(opt.record.chosen) for opt in made],
        "compiled_ms": round(costs["collage"].median_ms, 3), "eager_ms": round(costs["eager"].median_ms, 3),
    }  # fmt: skip


def run(names: list[str], threads: int, out: Path) -> dict:
    from collage.measuring.threads import pin_threads

    pin_threads(threads)
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in names:
        w = models.load(name)
        reference = w.reference()
        entry = {"description": w.spec.description, "meta": metadata(Settings(threads=threads))}
        for part, measure in (("exported", exported_entry), ("torch_compile", torch_compile_entry)):
            try:
                entry[part] = measure(w, reference, threads)
            except Exception as err:  # noqa: BLE001 -- recorded, and the next model goes on
                entry[part] = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
            print(f"{name} {part}: {entry[part]}", flush=True)
        results[name] = entry
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
    return results


def format_table(results: dict) -> str:
    rows = ["| model | load | first call | steady | export size | torch.compile first call | compiled vs eager | max rel. err |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for entry in results.values():
        e, t = entry.get("exported", {}), entry.get("torch_compile", {})
        if "error" in e or "error" in t:
            rows.append(f"| {entry['description']} | {e.get('error', '')} {t.get('error', '')} |")
            continue
        rows.append(
            f"| {entry['description']} | {e['load_s']:.2f} s | {e['first_call_ms']:.1f} ms | {e['steady_ms']:.2f} ms | "
            f"{e['size_mb']:.0f} MB | {t['first_call_s']:.0f} s | {t['compiled_ms']:.2f} vs {t['eager_ms']:.2f} ms | "
            f"{max(e['max_rel_err'], t['max_rel_err']):.1e} |"
        )
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", choices=list(models.MODELS), metavar="NAME")
    parser.add_argument("--threads", type=int, default=Settings.threads)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the fresh process's side
    parser.add_argument("--io", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        _load_here(args.load, args.io, args.threads)
        return
    if not args.model:
        parser.error("give --model")
    results = run(args.model, args.threads, args.out)
    print(format_table(results))


if __name__ == "__main__":
    main()
