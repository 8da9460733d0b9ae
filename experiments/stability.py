"""Is collage's choice stable? The same model optimized in fresh processes, one after another.

    python -m experiments.stability --model squeezenet dcgan [--runs 3] [--threads 2]

Each run is a new Python process calling ``collage.optimize`` on the zoo model (with its ONNX
export, as ``collage optimize model.onnx`` does) and a shared cost log, so only the first run
measures candidates; what differs between runs is the final timing of the finalists, which
is what decides. The aim (issue 13): whenever the finalists differ by more than 10%, every run
keeps the same one. Results go to ``experiments/results/stability.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments import models

RESULTS = Path(__file__).parent / "results" / "stability.json"

ONE_RUN = """
import json, sys
from experiments import models
from experiments.peers import pin_threads
pin_threads({threads})
import collage
w = models.load({name!r})
opt = collage.optimize(w.relax, threads={threads}, onnx_model=w.onnx, cost_log={log!r}, progress=False)
print(json.dumps({{"chosen": str(opt.record.chosen), "tie": opt.record.tie,
                  "finalists_ms": {{str(k): round(f.measured.median_ms, 4) for k, f in opt.record.finalists.items()}}}}))
"""


def runs(name: str, count: int, threads: int, log: str) -> list[dict]:
    out = []
    for k in range(count):
        code = ONE_RUN.format(name=name, threads=threads, log=log)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name} run {k + 1}: kept {out[-1]['chosen']!r} {out[-1]['finalists_ms']}", flush=True)
    return out


def verdict(results: list[dict]) -> dict:
    """Whether every run kept the same finalist, and the widest gap between the kept one and
    the fastest of the others in any run (the 10% rule applies when it is wider)."""
    chosen = {r["chosen"] for r in results}
    gaps = []
    for r in results:
        times = r["finalists_ms"]
        others = [ms for name, ms in times.items() if name != r["chosen"]]
        if others:
            gaps.append(min(others) / times[r["chosen"]] - 1)
    return {"same_choice": len(chosen) == 1, "chosen": sorted(chosen), "smallest_margin": min(gaps, default=None)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", required=True, choices=list(models.MODELS), metavar="NAME")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model:
            measured = runs(name, args.runs, args.threads, str(Path(tmp) / "costs.sqlite"))
            results[name] = {"runs": measured, **verdict(measured)}
            print(f"{name}: {results[name]['chosen']} same={results[name]['same_choice']}", flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
