"""Peer baselines: the latency of each whole model on each framework alone.

    python -m experiments.bench --model resnet50 bert squeezenet [--threads 2] [--peers ...]
                                [--small] [--budget 60] [--out ...json] [--plot ...png]

For each model: export it once (ONNX, Relax), prepare every peer (see ``experiments.peers``),
check its output against torch's, warm it up, then time the peers with the project's one
protocol (``collage.measuring.timing.time_contenders``, docs/timing.md): rounds of one block of
back-to-back calls per peer, in a fresh random order, each after a settling pause; the median
of the block medians and their spread. A peer leaves the rounds after ``max_reps`` blocks, or
after ``min_reps`` once it has used its share of ``budget`` seconds.

The results go to a JSON file keyed by model (running one model updates only that model's
entry, so models can be run separately), to a table on the terminal and to a bar chart
regenerated from the whole JSON file. ``--small`` results go to files of their own.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

# Every peer runs with its library's defaults. torch's OpenMP threads spin while they wait
# (OMP_WAIT_POLICY unset = active): on a quiet machine that is 30-45% faster than sleeping
# (SqueezeNet 10.1 vs 14.7 ms, ResNet-50 37.6 vs 54.1 ms, 2 threads), but with one core busy
# elsewhere it makes torch 10-100x slower, so the table warns when other processes were busy.

import numpy as np

from experiments import models
from experiments.corpus import CORPUS
from experiments.torch_nn import TORCH_NN
from experiments.peers import ENTRY_POINTS, OURS, PEERS, PrepareFn, Runner, pin_threads, prepare_collage, second_draw, torch_outputs_on
from experiments.plot import format_ms, peer_names, plot_latency

RESULTS_DIR = Path(__file__).parent / "results"
MAX_REL_ERR = 1e-3  # outputs further than this from torch's are flagged in the table
ORDER_SEED = 0  # the rounds' random orders are the same in every run
BUSY_MACHINE_CORES = 0.25  # other processes using more than this while timing get a warning
EXPORTS = ("onnx", "relax")  # the Workload forms the peers compile from, besides torch
# What --model takes for a whole set of models: the zoo, the corpus, the torch.nn set.
MODEL_SETS = {"all": models.MODELS, "corpus": CORPUS, "torch_nn": TORCH_NN}
VERSIONED_PACKAGES = ("torch", "apache-tvm", "onnxruntime", "openvino", "onnx", "numpy")


@dataclass(frozen=True)
class Settings:
    """How each model is measured: the project's timing protocol (``collage.measuring.timing.Protocol``,
    docs/timing.md) with a time budget per model. Each round times one block of back-to-back
    calls of every peer, in a fresh random order, after a settling pause (the peer before it
    leaves threads spinning: OpenVINO's DCGAN took 1.43 ms right after ONNX Runtime's, 0.68 ms
    alone). A peer leaves the rounds after ``min_reps`` once it has used its share of
    ``budget_s`` (TVM's untuned kernels take seconds), else after ``max_reps``."""

    threads: int = 2
    budget_s: float = 60.0  # time for the rounds of one model, shared by its peers
    min_reps: int = 3
    max_reps: int = 15
    warmup_calls: int = 2  # at preparation: the check's call and one more
    warmup_s: float = 0.5
    block_ms: float = 100.0  # back-to-back calls filling this make one block
    settle_s: float = 0.2
    accuracy: float | None = None  # collage's accuracy budget, and the error a peer may have to count

    def protocol(self):
        from collage.measuring.timing import Protocol  # collage loads TVM: only after pin_threads

        return Protocol(rounds=self.max_reps, block_ms=self.block_ms, settle_s=self.settle_s,
                        warmup_s=self.warmup_s, seed=ORDER_SEED, budget_s=self.budget_s, min_rounds=self.min_reps)


@dataclass(frozen=True)
class Prepared:
    """A peer ready for the rounds, with what was learned while preparing it."""

    runner: Runner
    prepare_s: float
    max_rel_err: float


def default_results_path(small: bool) -> Path:
    """Small-input results never share a file with full-size ones."""
    return RESULTS_DIR / ("peers-small.json" if small else "peers.json")


# --------------------------------------------------------------------------- measuring


def one_line(error: BaseException) -> str:
    """An exception as one short line for the table and the JSON file."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 200 else text[:197] + "..."


def max_relative_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """max |out - ref| / max |ref|, over all outputs."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs, expected {len(reference)}")
    errors = []
    for out, ref in zip(outputs, reference):
        out = np.asarray(out, dtype=np.float64).reshape(ref.shape)
        ref = ref.astype(np.float64)
        errors.append(np.abs(out - ref).max() / max(np.abs(ref).max(), np.finfo(np.float64).tiny))
    return float(max(errors))


def prepare(prepare_fn: PrepareFn, w: models.Workload, reference, settings: Settings, second=None) -> Prepared:
    """Compile one peer, check its first output (and, with ``second``, (inputs, torch's
    outputs), its outputs on those: the error is the larger), and warm it up."""
    start = time.perf_counter()
    runner = prepare_fn(w, settings.threads)
    prepare_s = time.perf_counter() - start
    error = max_relative_error(runner.to_numpy(runner.run()), reference)
    if second is not None:
        if runner.outputs_on is None:
            raise ValueError("this peer cannot run other inputs, so it cannot be held to an accuracy budget")
        error = max(error, max_relative_error(runner.outputs_on(second[0]), second[1]))
    for _ in range(settings.warmup_calls - 1):
        runner.run()
    return Prepared(runner, prepare_s, error)


def time_peers(peers: dict[str, Prepared], settings: Settings) -> tuple[dict, dict[str, str]]:
    """Each peer's latency (a ``collage.measuring.cost.Cost``) under the protocol with its block medians
    round by round, and the errors of peers
    that broke while being timed (a broken peer's calls then do nothing, so the others' rounds
    go on)."""
    from collage.measuring.cost import Cost
    from collage.measuring.timing import median_and_iqr, time_rounds

    errors: dict[str, str] = {}

    def guarded(name, run):
        def call():
            if name in errors:
                return
            try:
                run()
            except Exception as error:  # a peer that breaks mid-way must not stop the others
                errors[name] = f"run: {one_line(error)}"

        return call

    rounds = time_rounds({name: guarded(name, p.runner.run) for name, p in peers.items()}, settings.protocol())
    return {name: (Cost.of(*median_and_iqr(ms), samples=len(ms)), ms) for name, ms in rounds.items()}, errors


def summarize(timed) -> dict:
    """Median of the block medians and their interquartile range (absolute and relative), and
    the block medians round by round (for ratios paired within a round), ms."""
    cost, rounds = timed
    return {
        "median_ms": cost.median_ms,
        "spread_ms": cost.spread_ms,
        "spread": cost.spread_ms / cost.median_ms if cost.median_ms else 0.0,
        "samples": cost.samples,
        "rounds_ms": [round(ms, 5) for ms in rounds],
    }


def failed_record(error: str) -> dict:
    return {"median_ms": None, "prepare_s": None, "max_rel_err": None, "error": error}


def export_forms(w: models.Workload) -> dict[str, float]:
    """Build the ONNX and Relax forms once, so that no peer's preparation time includes an
    export another peer shares. A failed export is left to fail again, and be recorded, in
    the peers that need it."""
    seconds = {}
    for form in EXPORTS:
        start = time.perf_counter()
        try:
            getattr(w, form)
        except Exception:
            continue
        seconds[form] = round(time.perf_counter() - start, 2)
    return seconds


def measure_model(
    name: str, peers: dict[str, PrepareFn], settings: Settings, small: bool = False
) -> dict:
    """The results entry of one model: its peers' records plus what they ran on."""
    w = models.load(name, small=small)
    entry = {
        "description": w.spec.description,
        "input_shapes": [list(t.shape) for t in w.inputs],
        "small": small,
        "meta": metadata(settings),
        "export_s": export_forms(w),
    }
    reference = w.reference()
    # With a budget, every peer is held to it on the bench's inputs and a second draw of them.
    second = None
    if settings.accuracy is not None:
        arrays = second_draw(w)
        second = (arrays, torch_outputs_on(w.torch)(arrays))

    prepared, records = {}, {}
    for peer, prepare_fn in peers.items():
        print(f"  {name}: preparing {peer}", flush=True)
        try:
            prepared[peer] = prepare(prepare_fn, w, reference, settings, second)
        except Exception as error:
            records[peer] = failed_record(f"prepare: {one_line(error)}")

    print(f"  {name}: timing {', '.join(prepared)}", flush=True)
    from collage.measuring.timing import busy_cores_by_others, cpu_seconds  # collage loads TVM: only after pin_threads

    before = cpu_seconds()
    timed, run_errors = time_peers(prepared, settings)
    entry["meta"]["busy_cores_by_others"] = busy_cores_by_others(before, cpu_seconds())
    for peer, p in prepared.items():
        common = {"prepare_s": round(p.prepare_s, 2), "max_rel_err": p.max_rel_err, **p.runner.info}
        if peer in run_errors:
            records[peer] = {**failed_record(run_errors[peer]), **common}
        else:
            records[peer] = {**summarize(timed[peer]), **common, "error": None}
    entry["peers"] = {peer: records[peer] for peer in peers}  # registry order
    return entry


def metadata(settings: Settings) -> dict:
    """What a measurement ran on and how it was made: the CPU with its ISA flags (the fastest
    engine differs between a Zen 3 with AVX2 and a Zen 5 with AVX-512)."""
    from collage.measuring.cost import Device, cpu_info
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": Device.this_machine(settings.threads).name,  # model, family, ISA flags
        "cpu_info": cpu_info(),
        "cpu_count": os.cpu_count(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        **asdict(settings),
        "python": platform.python_version(),
        "versions": versions,
    }


# --------------------------------------------------------------------------- results file


def update_results(path: Path, entries: dict[str, dict]) -> dict:
    """Merge new model entries into the JSON file and return its whole content. Peers measured
    now replace their old records; other peers of the same model stay, unless the thread
    count or the CPU changed, in which case the old entry is dropped as not comparable."""
    results = json.loads(path.read_text()) if path.exists() else {}
    for name, entry in entries.items():
        old = results.get(name)
        same = ("threads", "cpu")
        if old and all(old["meta"].get(k) == entry["meta"].get(k) for k in same):
            entry = {**entry, "peers": {**old["peers"], **entry["peers"]}}
        results[name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # never leave a half-written file behind
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(path)
    return results


# --------------------------------------------------------------------------- table


def speedups(results: dict[str, dict], ours: str = "collage") -> dict[str, tuple[float, str]]:
    """Per model: the best other peer's median over ours, and that peer's name (models where
    either is missing, failed or wrong are left out). Where both have their block medians
    round by round, the ratio is the median of the per-round ratios (``paired_speedups``)."""
    return {name: (ratio, best) for name, (ratio, _, best) in paired_speedups(results, ours).items()}


def paired_speedups(results: dict[str, dict], ours: str = "collage") -> dict[str, tuple[float, float, str]]:
    """Per model: (speed-up, its interquartile range, the best other peer). The best peer is
    the one with the lowest median; the speed-up is the median over rounds of that peer's
    block median over ours in the same round (``collage.measuring.timing.paired_ratio``): on a shared
    host whose speed drifts from round to round, pairing within rounds cancels the drift."""
    from collage.measuring.timing import paired_ratio

    out = {}
    for name, (ratio, best) in _median_speedups(results, ours).items():
        mine, theirs = results[name]["peers"][ours], results[name]["peers"][best]
        if mine.get("rounds_ms") and theirs.get("rounds_ms"):
            out[name] = (*paired_ratio(theirs["rounds_ms"], mine["rounds_ms"]), best)
        else:
            out[name] = (ratio, math.nan, best)
    return out


def _allowed(entry: dict) -> float:
    """The error a peer may have and still count: the accuracy budget the run gave collage
    (a peer in bf16 beyond it is not an answer the user accepts), else ``MAX_REL_ERR``."""
    return entry.get("meta", {}).get("accuracy") or MAX_REL_ERR


def _median_speedups(results: dict[str, dict], ours: str) -> dict[str, tuple[float, str]]:
    out = {}
    for name, entry in results.items():
        correct = {
            peer: r["median_ms"]
            for peer, r in entry["peers"].items()
            if r["error"] is None and r["max_rel_err"] <= _allowed(entry)
        }
        others = {peer: ms for peer, ms in correct.items() if peer not in OURS}
        if ours in correct and others:
            best = min(others, key=others.get)
            out[name] = (others[best] / correct[ours], best)
    return out


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def format_table(results: dict[str, dict]) -> str:
    """One row per model, one column per peer. The fastest correct peer of a row gets a '*',
    a peer whose outputs are off by more than MAX_REL_ERR a '!'; failures are explained below."""
    columns = peer_names(results)
    header = ["model"] + columns
    rows, notes = [], []
    for name, entry in results.items():
        records = entry["peers"]
        correct = {
            peer: r["median_ms"]
            for peer, r in records.items()
            if r["error"] is None and r["max_rel_err"] <= _allowed(entry)
        }
        best = min(correct, key=correct.get) if correct else None
        row = [name]
        for peer in columns:
            r = records.get(peer)
            if r is None:
                row.append("-")
            elif r["error"] is not None:
                row.append("failed")
                notes.append(f"  {name} / {peer} failed: {r['error']}")
            else:
                mark = "*" if peer == best else "!" if peer not in correct else " "
                median = format_ms(r["median_ms"])
                row.append(f"{median}{mark} ±{r['spread']:.0%} n={r['samples']}")
                if peer not in correct:
                    notes.append(f"  {name} / {peer}: max relative error {r['max_rel_err']:.1e}")
        rows.append(row)
        busy = entry["meta"].get("busy_cores_by_others")
        if busy is not None and busy > BUSY_MACHINE_CORES:
            notes.append(f"  {name}: other processes kept {busy:.1f} cores busy during its timing")

    for ours in [c for c in columns if c in OURS]:  # each of collage's columns over the best peer
        ratios = speedups(results, ours)
        if not ratios:
            continue
        header.append(f"{ours} vs best")
        paired = paired_speedups(results, ours)
        for name, row in zip(results, rows):
            ratio, spread, best = paired.get(name, (None, None, None))
            spread_text = "" if spread is None or math.isnan(spread) else f" ±{spread:.2f}"
            row.append(f"{ratio:.2f}x{spread_text} ({best})" if ratio else "-")
        notes.append(f"  geo-mean speed-up of {ours} over the best peer: {geomean(r for r, _ in ratios.values()):.2f}x")

    widths = [max(len(line[i]) for line in [header] + rows) for i in range(len(header))]

    def line(cells):  # model names to the left, numbers to the right
        numbers = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([cells[0].ljust(widths[0])] + numbers)

    threads = sorted({entry["meta"]["threads"] for entry in results.values()})
    title = (
        f"Latency in ms, median ±(p75-p25)/median, n samples; {'/'.join(map(str, threads))} "
        f"threads; * fastest, ! error above {MAX_REL_ERR:g}"
    )
    out = [title, line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return "\n".join(out + notes)


# --------------------------------------------------------------------------- entry points


def run(
    model_names: list[str],
    peers: dict[str, PrepareFn] = PEERS,
    settings: Settings = Settings(),
    small: bool = False,
    out: Path | None = None,
    plot: Path | None = None,
) -> tuple[dict, str]:
    """Measure the models, update the JSON file, redraw the chart. Returns this run's entries
    and their table. Thread counts are pinned first, before anything imports TVM, ONNX Runtime
    or OpenVINO (TVM ignores the pin in a process that has imported it already)."""
    pin_threads(settings.threads)
    out = Path(out or default_results_path(small))
    plot = Path(plot or out.with_suffix(".png"))
    entries = {}
    for name in model_names:
        entries[name] = measure_model(name, peers, settings, small)
        update_results(out, {name: entries[name]})  # keep finished models if a later one dies
    plot_latency(out, plot)
    return entries, format_table(entries)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", nargs="+", required=True, choices=[*models.MODELS, *CORPUS, *TORCH_NN, *MODEL_SETS],
        metavar="NAME", help="models to run, 'all' (the zoo), 'corpus' (experiments.corpus) or 'torch_nn' "
        f"(experiments.torch_nn): {', '.join([*models.MODELS, *CORPUS, *TORCH_NN])}",
    )  # fmt: skip
    parser.add_argument(
        "--peers", nargs="+", default=[p for p in PEERS if p not in ("openvino-default", "collage (substitutions)")],
        choices=list(PEERS), metavar="PEER",
        help=f"peers to time (default: all): {', '.join(PEERS)}",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=Settings.threads, help="threads for every peer"
    )
    parser.add_argument("--small", action="store_true", help="the reduced inputs of the test suite")
    parser.add_argument(
        "--budget", type=float, default=Settings.budget_s, help="seconds of timing rounds per model"
    )
    parser.add_argument(
        "--min-reps", type=int, default=Settings.min_reps,
        help="samples every peer gets, even past its share of the budget",
    )  # fmt: skip
    parser.add_argument(
        "--max-reps", type=int, default=Settings.max_reps, help="samples after which a peer stops"
    )
    parser.add_argument(
        "--out", type=Path, help="results JSON (default: experiments/results/peers.json, or "
        "peers-small.json with --small)",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, help="bar chart PNG (default: the JSON's, as .png)")
    parser.add_argument(
        "--accuracy", type=float, metavar="E",
        help="collage's accuracy budget (optimize(accuracy=E)); peers count if their error is within it",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.min_reps <= args.max_reps:
        parser.error("need 1 <= --min-reps <= --max-reps")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    names = [n for n in args.model if n not in MODEL_SETS]
    names += [name for key, specs in MODEL_SETS.items() if key in args.model for name in specs]
    settings = Settings(args.threads, args.budget, args.min_reps, args.max_reps, accuracy=args.accuracy)
    peers = {name: PEERS[name] for name in PEERS if name in args.peers}
    for name, entry in ENTRY_POINTS.items():
        if args.accuracy is not None and name in peers:
            peers[name] = functools.partial(prepare_collage, accuracy=args.accuracy, entry=entry)
    start = time.perf_counter()
    _, table = run(names, peers, settings, args.small, args.out, args.plot)
    print()
    print(table)
    print(f"\n{time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
