"""Graph substitutions on the zoo: what the search finds, and what it is worth end to end.

    python -m experiments.substitutions [--model squeezenet inception_v3 ...] [--small]
                                        [--alpha 1.05] [--budget 120] [--log costs.sqlite]

For each model, ``collage.optimize(substitutions=True)`` with every CPU backend, twice: the
first run measures what the log lacks; the second, with the log full, gives the search's own
time (the issue's bound: 2 minutes). Recorded per model: the rules applied and how often, the
op-level placement estimate of the graph as given and of the best substituted graph, graphs
expanded, priced and pruned by alpha, and the measured latency of both op-level placements,
timed together with the other finalists in one run by the project's protocol
(docs/timing.md), with the finalist kept. Results, with the CPU and its ISA flags, go to
``experiments/results/substitutions.json`` (``--small``: ``substitutions-small.json``),
model by model, and a chart beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
WITHOUT, WITH = "op-level", "op-level, substituted graph"


def run_model(name: str, small: bool, alpha: float, budget_s: float, log: str | None) -> dict:
    import collage
    from experiments import models

    w = models.load(name, small=small)
    runs = []
    for _ in range(2):
        start = time.perf_counter()
        opt = collage.optimize(w.relax, cost_log=log, progress=False, substitutions=True, alpha=alpha,
                               substitution_budget_s=budget_s)  # fmt: skip
        runs.append((opt, time.perf_counter() - start))
    (first, first_s), (second, second_s) = runs
    found = second.record.substitution_search
    timed = {str(name): f.measured for name, f in second.record.finalists.items()}
    entry = {
        "rules_applied": found["rules_applied"],
        "estimated_ms": {"as given": found["initial_cost"], "substituted": found["best_cost"]},
        "explored": found["explored"], "priced": found["costed"], "pruned": found["pruned"],
        "stopped_by": found["stopped_by"], "failed": found["failed"],
        "search_s": {"empty log": round(first.record.seconds.substitute, 1), "full log": round(second.record.seconds.substitute, 1)},
        "optimize_s": {"empty log": round(first_s, 1), "full log": round(second_s, 1)},
        "measured_ms": {
            "as given": timed[WITHOUT].median_ms,
            "substituted": timed[WITH].median_ms if WITH in timed else None,
        },
        "spread_ms": {name: round(cost.spread_ms, 4) for name, cost in timed.items()},
        "finalists_ms": {name: round(cost.median_ms, 4) for name, cost in timed.items()},
        "finalist_timing": {"others_busy_cores": second.record.others_busy_cores, "attempts": second.record.timing_attempts},
        "kept": str(second.record.chosen),
        "kept_ms": second.measured.median_ms,
        "best_without_substitutions_ms": min(cost.median_ms for n, cost in timed.items() if n != WITH),
    }  # fmt: skip
    if entry["measured_ms"]["substituted"] is not None:
        entry["speedup_of_substituted_op_level"] = round(entry["measured_ms"]["as given"] / entry["measured_ms"]["substituted"], 3)
    return entry


def plot(results: dict, path: Path) -> None:
    """Per model, the gain the search estimated and the gain measured end to end (op-level
    placement of the graph as given over that of the substituted graph; 1 where no rule
    applied)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    entries = {n: e for n, e in results["models"].items() if "estimated_ms" in e}
    if not entries:
        return
    names = list(entries)
    estimated = [e["estimated_ms"]["as given"] / e["estimated_ms"]["substituted"] for e in entries.values()]
    measured = [e.get("speedup_of_substituted_op_level", 1.0) for e in entries.values()]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(names)), 3.4))
    ax.bar(x - 0.2, estimated, 0.4, label="estimated by the search", color="tab:blue")
    ax.bar(x + 0.2, measured, 0.4, label="measured end to end", color="tab:orange")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(min(0.8, *estimated, *measured) - 0.02, max(1.2, *estimated, *measured) + 0.02)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("as given / substituted")
    ax.set_title(f"Graph substitutions, op-level placement\n{results['cpu']}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    from collage.measuring.cost import Device
    from collage.measuring.threads import default_threads
    from experiments import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=list(models.MODELS), choices=list(models.MODELS), metavar="NAME")
    parser.add_argument("--small", action="store_true", help="the reduced inputs of the test suite")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds of substitution search per model")
    parser.add_argument("--log", help="cost log (default: collage's)")
    args = parser.parse_args(argv)
    out = RESULTS / ("substitutions-small.json" if args.small else "substitutions.json")
    results = json.loads(out.read_text()) if out.exists() else {"models": {}}
    results.update(cpu=Device.this_machine(default_threads()).name, alpha=args.alpha, budget_s=args.budget)
    for name in args.model:
        try:
            results["models"][name] = run_model(name, args.small, args.alpha, args.budget, args.log)
        except Exception as err:  # noqa: BLE001 -- the table records every failure
            results["models"][name] = {"failed": f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"}
        print(name, json.dumps(results["models"][name]), flush=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
