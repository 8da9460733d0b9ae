"""What the graph-level search gains over the op-level placement, per model, in a time budget.

    python -m experiments.graph_level --model resnet50 bert --budget 600 --patience 10 [--threads 2]

Each model is optimized with ``graph_level=True`` in a fresh process, on the default cost log
(candidate costs measured once, by any earlier run). The op-level placement, each engine's
own regions and the search's leaders are timed end to end in alternation at the end of that
run, so the ratio compares numbers measured together. Results go to
``experiments/results/graph_level.json``, a table to ``graph_level.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "graph_level.json"
TABLE = RESULTS.with_suffix(".md")
SIX = ["resnet50", "resnext50", "bert", "dcgan", "inception_v3", "squeezenet"]


def one(model: str, budget_s: float, patience: int, threads: int, seed: int) -> dict:
    """One optimize with the graph-level search, in this process."""
    from collage.measuring.threads import pin_threads

    pin_threads(threads)
    import collage
    from collage.record import OP_LEVEL, FinalistKind
    from experiments import models

    w = models.load(model)
    start = time.perf_counter()
    opt = collage.optimize(w.relax, threads=threads, graph_level=True, budget_s=budget_s,
                            patience=patience, seed=seed)
    wall = time.perf_counter() - start
    print(opt.report(), file=sys.stderr)
    timed = {str(name): f.measured.median_ms for name, f in opt.record.finalists.items()}
    refined = {str(name): f.measured.median_ms for name, f in opt.record.finalists.items()
               if name.kind is FinalistKind.GRAPH_LEVEL}  # fmt: skip
    op_level = opt.record.finalists[OP_LEVEL].measured.median_ms
    best_refined = min(refined.values()) if refined else float("nan")
    return {
        "threads": threads,
        "budget_s": budget_s,
        "patience": patience,
        "wall_s": round(wall, 1),
        "op_level_ms": round(op_level, 4),
        "refined_ms": round(best_refined, 4),
        "gain": round(op_level / best_refined, 4),
        "chosen": str(opt.record.chosen),
        "chosen_ms": round(opt.measured.median_ms, 4),
        "timed_ms": {name: round(ms, 4) for name, ms in timed.items()},
        "search": opt.record.graph_level,
        "backend_shares": {b: round(s, 4) for b, s in opt.backend_shares().items()},
        "partitions": [[p.backend, p.pattern, len(p.nodes)] for p in opt.placement],
    }


def table(results: dict) -> str:
    lines = [
        "| model | op-level ms | refined ms | gain | engine | units | generations | placements | search s | stopped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, r in results.items():
        s = r["search"]
        lines.append(
            f"| {model} | {r['op_level_ms']:.3f} | {r['refined_ms']:.3f} | {r['gain']:.3f}x | {s.get('engine', '-')} "
            f"| {s.get('units', '-')} | {s.get('generations', '-')} | {s.get('placements', '-')} "
            f"| {s.get('search_s', '-')} | {s.get('stopped', s.get('skipped', '-'))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=SIX)
    parser.add_argument("--budget", type=float, default=600.0)
    parser.add_argument("--patience", type=int, default=10, help="generations without a better best before stopping")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.budget, args.patience, args.threads, args.seed)))
        return
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for model in args.model:
        command = [sys.executable, "-m", "experiments.graph_level", "--one", model, "--budget", str(args.budget),
                   "--patience", str(args.patience), "--threads", str(args.threads), "--seed", str(args.seed)]
        out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        results[model] = json.loads(out.strip().splitlines()[-1])
        r = results[model]
        print(f"{model}: op-level {r['op_level_ms']:.3f} ms, refined {r['refined_ms']:.3f} ms ({r['gain']:.3f}x), "
              f"search {r['search'].get('search_s')} s", flush=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")  # after each model: a long run keeps what it has
        TABLE.write_text(table(results))


if __name__ == "__main__":
    main()
