"""Models written by others through both user paths, checked against torch.

    python -m experiments.real_models [--model gpt2 vit ...] [--backends tvm,onnxruntime] [--full]

For each model (transformers' GPT-2, DistilBERT, ViT, ConvNeXt, whisper's and T5's encoders,
and the MBConv net; tiny configs unless ``--full``):
- torch.export to Relax, then ``collage.optimize``, its output compared with torch's;
- ONNX export to a file, then ``collage optimize`` and ``collage run`` on the command line, as
  a user types them, and the saved placement rebuilt in Python to compare with torch.
Each path is right, wrong (the largest difference beyond 1e-3 of the largest output) or
failed (the last line the command or the call said), with its time and the placement kept.
Results, with the CPU they come from, go to ``experiments/results/real_models.json``
(``--full``: ``real_models_full.json``), updated model by model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
REAL_MODELS = ["gpt2", "distilbert", "vit", "convnext", "whisper_encoder", "t5_encoder", "mbconv"]
REL_TOL = 1e-3


def compare(outs, refs) -> dict:
    """Right or wrong, with the worst difference relative to the largest reference value."""
    worst = max(float(np.abs(o - r).max()) / max(float(np.abs(r).max()), 1e-12) for o, r in zip(outs, refs))
    return {"status": "right" if worst <= REL_TOL else "wrong", "max_rel_diff": float(f"{worst:.3g}")}


def as_list(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]


def torch_export_path(w, backends, log) -> dict:
    import collage

    start = time.perf_counter()
    try:
        opt = collage.optimize(w.relax, backends=backends, cost_log=log, progress=False)
        result = compare(as_list(opt(*[x.numpy() for x in w.inputs])), w.reference())
    except Exception as err:  # noqa: BLE001 -- the table records every failure
        return {"status": "failed", "why": f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"}
    return {**result, "optimize_s": round(time.perf_counter() - start, 1), "chosen": str(opt.record.chosen),
            "backend_shares": {b: round(s, 3) for b, s in opt.backend_shares().items()},
            "measured_ms": round(opt.measured.median_ms, 4)}  # fmt: skip


def onnx_file_path(w, backends, log, threads) -> dict:
    import onnx

    import collage
    from collage.model.frontend import load_onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(w.onnx, path)
        env = {**os.environ, "COLLAGE_COST_LOG": str(log), "PYTHONPATH": str(Path(__file__).parents[1])}
        start, times, stray = time.perf_counter(), {}, 0
        for command in ("optimize", "run"):
            args = [command, path.name, "--threads", str(threads)] + (["--backends", backends] if backends else [])
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "collage", *args, *(["--quiet"] if command == "optimize" else [])],
                                  capture_output=True, text=True, env=env, cwd=tmp)  # fmt: skip
            times[f"{command}_s"] = round(time.perf_counter() - t, 1)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
                return {"status": "failed", "why": f"collage {command}: {last[:300]}"}
            stray += sum(not line.startswith("collage:") for line in done.stderr.splitlines())
        try:
            rebuilt = collage.load_placement(load_onnx(path), Path(tmp) / "placement.json", cost_log=log, onnx_model=path)
            result = compare(as_list(rebuilt(*[x.numpy() for x in w.inputs])), w.reference())
        except Exception as err:  # noqa: BLE001
            return {"status": "failed", "why": f"rebuilding: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"}
    return {**result, **times, "total_s": round(time.perf_counter() - start, 1),
            "chosen": "saved placement",
            "backend_shares": {b: round(s, 3) for b, s in rebuilt.backend_shares().items()},
            "stray_stderr_lines": stray}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=REAL_MODELS)
    parser.add_argument("--backends", help="comma-separated (default: every registered backend)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="the full configs, as benchmarked")
    args = parser.parse_args(argv)

    from collage.measuring.cost import cpu_info
    from collage.measuring.threads import pin_threads
    from experiments import models

    pin_threads(args.threads)
    out = RESULTS / ("real_models_full.json" if args.full else "real_models.json")
    results = json.loads(out.read_text()) if out.exists() else {}
    results.update(cpu=cpu_info(), threads=args.threads, backends=args.backends or "all registered")
    backends = args.backends.split(",") if args.backends else None
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "costs.sqlite"  # fresh: every model is measured, as a new user's
        for name in args.model:
            w = models.load(name, small=not args.full)
            entry = {"description": w.spec.description, "input": list(w.input_shape),
                     "torch.export": torch_export_path(w, backends, log),
                     "onnx file": onnx_file_path(w, args.backends, log, args.threads)}  # fmt: skip
            results.setdefault("models", {})[name] = entry
            print(name, json.dumps({k: entry[k] for k in ("torch.export", "onnx file")}), flush=True)
            out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
