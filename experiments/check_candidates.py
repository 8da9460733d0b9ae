"""Candidates on zoo models: how many each backend gets, and whether each one runs right.

For every model, simplified first as ``collage.optimize`` will: generate the candidates of
every backend usable on the target, check that
``tvm`` alone covers every operator, then compile each distinct candidate (one per
structural key) on its backend, run it on random inputs and compare with TVM's reference.

    python -m experiments.check_candidates --model resnet50 bert [--small] [--no-run]

Prints a table per model and writes experiments/results/candidates.json (candidates-small.json
with --small).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import time
from collections import Counter

import numpy as np
import tvm_ffi
from tvm import relax

from collage.measuring.build import check_candidate, run_reference
from collage.model.simplify import simplify
from collage.candidates.backend import default_backends
from collage.candidates.generate import distinct, generate
from collage.model.graph import DataflowGraph
from experiments import models

RESULTS = pathlib.Path(__file__).parent / "results"


_REFERENCES: dict[tuple, list[np.ndarray]] = {}


def remembered_reference(func: relax.Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """TVM's result of ``func`` on ``arrays`` (``run_reference``), computed once per process:
    every backend's candidate on one sub-graph is checked on the same seeded inputs (three
    engines offer most of DCGAN's 30), and the suite's engine tests check the same zoo
    sub-graphs again (TVM's unoptimized reference of BERT's 40 took 18 s of a 40 s test)."""
    key = (tvm_ffi.structural_hash(func), tuple(hashlib.sha1(a.tobytes()).hexdigest() for a in arrays))
    if key not in _REFERENCES:
        _REFERENCES[key] = run_reference(func, arrays)
    return _REFERENCES[key]


def check_model(name: str, small: bool, target: str = "llvm", run: bool = True) -> dict:
    return check_module(models.load(name, small=small).relax, target, run)


def check_module(mod, target: str = "llvm", run: bool = True) -> dict:
    """``check_model``'s report on a model's Relax module ``mod``."""
    graph = DataflowGraph.from_module(simplify(mod))
    backends, excluded = default_backends().usable(target)
    started = time.perf_counter()
    candidates = generate(graph, backends)
    generate_s = time.perf_counter() - started
    by_backend = {b.name: [c for c in candidates if c.backend == b.name] for b in backends}
    covered_by_tvm = set().union(*(c.subgraph.nodes for c in by_backend.get("tvm", [])))
    report = {
        "nodes": len(graph),
        "generate_s": round(generate_s, 2),
        "uncovered_by_tvm": sorted({graph[i].op for i in range(len(graph)) if i not in covered_by_tvm}),
        "excluded_backends": excluded,
        "backends": {},
    }
    by_name = {b.name: b for b in backends}
    for backend_name, cands in by_backend.items():
        unique = distinct(cands)
        entry = {"candidates": len(cands), "distinct": len(unique), "patterns": dict(Counter(c.pattern for c in cands))}
        if run:
            failures = {}
            for c in unique:
                reason = check_candidate(by_name[backend_name], c.subgraph.extract(), c.pattern, target,
                                         reference=remembered_reference)
                if reason is not None:
                    failures[f"{c.pattern} {'+'.join(c.subgraph.ops)}"] = reason
            entry["failed"] = failures
        report["backends"][backend_name] = entry
    return report


def print_report(name: str, report: dict) -> None:
    print(f"\n{name}: {report['nodes']} operators, candidates generated in {report['generate_s']} s")
    print(f"  {'backend':<12} {'candidates':>10} {'distinct':>9} {'failed':>7}")
    for backend, entry in report["backends"].items():
        failed = len(entry.get("failed", {})) if "failed" in entry else "-"
        print(f"  {backend:<12} {entry['candidates']:>10} {entry['distinct']:>9} {failed:>7}")
    for backend, reason in report["excluded_backends"].items():
        print(f"  {backend:<12} excluded: {reason}")
    if report["uncovered_by_tvm"]:
        print(f"  NOT covered by tvm: {', '.join(report['uncovered_by_tvm'])}")
    for backend, entry in report["backends"].items():
        for what, reason in entry.get("failed", {}).items():
            print(f"  {backend} {what}: {reason}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["resnet50", "bert"], help="zoo model names, or 'all'")
    parser.add_argument("--small", action="store_true", help="reduced input sizes (as in the tests)")
    parser.add_argument("--no-run", action="store_true", help="count candidates only")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    names = list(models.MODELS) if args.model == ["all"] else args.model
    out = args.out or RESULTS / ("candidates-small.json" if args.small else "candidates.json")
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in names:
        results[name] = check_model(name, args.small, run=not args.no_run)
        print_report(name, results[name])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    failed = sum(len(e.get("failed", {})) for r in results.values() for e in r["backends"].values())
    uncovered = [n for n, r in results.items() if r["uncovered_by_tvm"]]
    return 1 if failed or uncovered else 0


if __name__ == "__main__":
    raise SystemExit(main())
