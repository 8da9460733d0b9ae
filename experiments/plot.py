"""The result plots, from the bench's JSON file.

    python -m experiments.plot [experiments/results/peers.json] [experiments/results/peers.png]
                               [--shares experiments/results/peers_shares.png]

``plot_latency``: latency per peer per model, collage among the peers. The y axis is
logarithmic because untuned TVM can be a hundred times slower than the rest. Bars show the
median; the whiskers span the interquartile range of the samples, centred on the median.

``plot_shares``: for each model, how collage's placement splits the estimated time among
the backends (stacked to 100%), in the colours of the placement pictures (``collage.deploying.draw``).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

DEFAULT_RESULTS = Path(__file__).parent / "results" / "peers.json"


def peer_names(results: dict[str, dict]) -> list[str]:
    """Every peer in the results, in the order they were first recorded (the bench records
    them in registry order, so a peer added later, such as Collage, comes last)."""
    names: dict[str, None] = {}
    for entry in results.values():
        names.update(dict.fromkeys(entry["peers"]))
    return list(names)


def format_ms(ms: float) -> str:
    """Three significant digits, or all the integer digits."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def plot_latency(results_json_path, png_path) -> None:
    """Grouped bars from the bench's JSON file: one group per model, one bar per peer; a peer
    that failed on a model gets the word "failed" where its bar would be."""
    results = json.loads(Path(results_json_path).read_text())
    model_names, peers = list(results), peer_names(results)
    width = 0.8 / len(peers)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.4 * len(model_names) * len(peers)), 5.0))
    below_bars = blended_transform_factory(ax.transData, ax.transAxes)

    for i, peer in enumerate(peers):
        xs, medians, whiskers, labels = [], [], ([], []), []
        for x, name in enumerate(model_names):
            record = results[name]["peers"].get(peer)
            position = x - 0.4 + width * (i + 0.5)
            if record is None:
                continue
            if record["error"] is not None:
                ax.text(position, 0.01, "failed", transform=below_bars, rotation=90,
                        ha="center", va="bottom", fontsize=8, color="firebrick")  # fmt: skip
                continue
            xs.append(position)
            medians.append(record["median_ms"])
            half = record.get("spread_ms", 0.0) / 2  # older results: p25/p75, below
            if "p25_ms" in record:
                whiskers[0].append(record["median_ms"] - record["p25_ms"])
                whiskers[1].append(record["p75_ms"] - record["median_ms"])
            else:
                whiskers[0].append(half)
                whiskers[1].append(half)
            labels.append(format_ms(record["median_ms"]))
        bars = ax.bar(xs, medians, width, yerr=whiskers, capsize=2, label=peer,
                      color=plt.cm.tab10(i), error_kw={"elinewidth": 0.8})  # fmt: skip
        ax.bar_label(bars, labels, rotation=90, padding=3, fontsize=7)

    ax.set_yscale("log")
    ax.margins(y=0.2)  # room above the tallest bar for its label
    ax.set_ylabel("latency per inference, ms (median, log scale)")
    ax.set_xticks(range(len(model_names)))
    ax.set_xticklabels([_model_label(results[name]) for name in model_names], fontsize=9)
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.set_axisbelow(True)
    # Below the longest label (four lines at most once wrapped).
    lines = max((_model_label(results[name]).count("\n") + 1 for name in model_names), default=2)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.045 * lines), ncol=len(peers), frameon=False)
    ax.set_title(_title(results), fontsize=10)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=130, bbox_inches="tight")  # "tight" keeps the legend below the axes
    plt.close(fig)


def plot_shares(results_json_path, png_path) -> None:
    """One stacked bar per model: each backend's share of collage's estimated time. Models
    where collage failed or was not run are left out."""
    from collage.deploying.draw import backend_colour

    results = json.loads(Path(results_json_path).read_text())
    shares = {
        name: entry["peers"]["collage"]["backend_shares"]
        for name, entry in results.items()
        if entry["peers"].get("collage", {}).get("error", "not run") is None
    }
    if not shares:
        raise ValueError(f"{results_json_path}: no model has a collage result with backend shares")
    backends = sorted(
        {b for s in shares.values() for b in s}, key=lambda b: -sum(s.get(b, 0.0) for s in shares.values())
    )
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 1.4 * len(shares)), 4.5))
    bottoms = [0.0] * len(shares)
    for backend in backends:
        heights = [100 * s.get(backend, 0.0) for s in shares.values()]
        bars = ax.bar(range(len(shares)), heights, 0.6, bottom=bottoms, label=backend,
                      color=backend_colour(backend), edgecolor="#555555", linewidth=0.5)  # fmt: skip
        ax.bar_label(bars, [f"{h:.0f}%" if h >= 5 else "" for h in heights], label_type="center", fontsize=8)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylim(0, 100)
    ax.set_ylabel("share of collage's estimated time, %")
    ax.set_xticks(range(len(shares)))
    ax.set_xticklabels([textwrap.fill(results[name]["description"], 16) for name in shares], fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(backends), frameon=False)
    ax.set_title(_title(results, "Each backend's share of collage's placement"), fontsize=10)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _model_label(entry: dict) -> str:
    shapes = " ".join("x".join(map(str, shape)) for shape in entry["input_shapes"])
    return f"{textwrap.fill(entry['description'], 28)}\n{shapes}"  # long names would run into each other


def _title(results: dict[str, dict], what: str = "Whole-model latency per peer") -> str:
    metas = [entry["meta"] for entry in results.values()]
    threads = "/".join(str(t) for t in sorted({m["threads"] for m in metas}))
    cpus = ", ".join(sorted({m["cpu"] for m in metas}))
    return f"{what}\n{cpus}, {threads} threads"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Draw the latency and backend-share charts from the bench's JSON.")
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("png", nargs="?", type=Path, help="latency chart (default: the JSON's path ending in .png)")
    parser.add_argument("--shares", type=Path, help="backend-share chart (default: the latency chart's name + _shares)")
    args = parser.parse_args(argv)
    png = args.png or args.results.with_suffix(".png")
    shares = args.shares or png.with_name(f"{png.stem}_shares.png")
    plot_latency(args.results, png)
    plot_shares(args.results, shares)
    print(png)
    print(shares)


if __name__ == "__main__":
    main()
