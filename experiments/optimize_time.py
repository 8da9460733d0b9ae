"""How long collage.optimize takes: with an empty cost log, then again with the full one,
measuring candidates in a worker process (the default) and in the optimizing process.

    python -m experiments.optimize_time --model resnet50 [--threads 2] [--runner worker in-process]

Each run is a fresh process (``python -m experiments.optimize_time --one ...``), so the
second run pays everything a user's second run pays (imports, loading the model, TVM
compiling the assembled module) and inherits nothing but the log. Results, with each
stage's share and the CPU they come from, go to ``experiments/results/optimize_time.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "optimize_time.json"
STAGES = ("prepare", "generate", "measure", "place", "assemble", "final_timing", "total")  # collage.record.StageSeconds


RUNNERS = ("worker", "in-process")


def one(model: str, log: str, threads: int, runner: str) -> dict:
    """One optimize in this process; what it took."""
    from collage.measuring.runner import InProcess
    from collage.measuring.threads import pin_threads

    pin_threads(threads)
    import collage
    from experiments import models

    w = models.load(model)
    start = time.perf_counter()
    opt = collage.optimize(w.relax, cost_log=log, threads=threads, progress=False,
                           runner=InProcess() if runner == "in-process" else None)
    wall = time.perf_counter() - start
    return {
        "wall_s": round(wall, 1),
        **{f"{k}_s": round(getattr(opt.record.seconds, k), 2) for k in STAGES},
        "candidates": opt.record.candidates,
        "distinct": opt.record.distinct,
        "measured": opt.record.measured,
        "estimated_ms": round(opt.estimated_ms, 3),
        "measured_ms": round(opt.measured.median_ms, 3),
        "backend_shares": {b: round(s, 4) for b, s in opt.backend_shares().items()},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["resnet50"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runner", nargs="+", choices=RUNNERS, default=list(RUNNERS),
                        help="where candidates are measured (collage.measuring.isolation)")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "LOG", "RUNNER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.threads, args.one[2])))
        return
    from collage.measuring.cost import cpu_info

    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for model in args.model:
        entry = {"threads": args.threads, "cpu": cpu_info()}
        for runner in args.runner:
            with tempfile.TemporaryDirectory() as tmp:
                log = str(Path(tmp) / "costs.sqlite")
                runs = {}
                for label in ("empty_log", "full_log"):
                    command = [sys.executable, "-m", "experiments.optimize_time", "--one", model, log, runner]
                    out = subprocess.run(command + ["--threads", str(args.threads)], check=True,
                                         capture_output=True, text=True).stdout
                    runs[label] = json.loads(out.strip().splitlines()[-1])
                    print(f"{model} {runner} {label}: {runs[label]['wall_s']} s ({runs[label]['measured']} of "
                          f"{runs[label]['distinct']} distinct candidates measured)", flush=True)
            entry[runner] = runs
        results[model] = entry
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
