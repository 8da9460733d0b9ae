"""Is there anything to gain by splitting a model between two inference engines on this CPU?

    python -m experiments.engine_splits --model resnet50 bert [--threads 2] [--cuts 5] [--rounds 15]

For each model: its ONNX form run whole on ONNX Runtime and on OpenVINO (the peers' own
settings, f32), and split in two at up to ``--cuts`` points where a single tensor crosses
(one engine runs the first part, the other the rest, both directions), all timed in
alternation with ``collage.measuring.timing.time_contenders`` (the project's protocol). Beside the times, the model's
multiply-adds give the rate each engine reaches, against the rate of a large f32 matrix
product on OpenVINO timed in the same alternation: how close to this machine's ceiling the
best engine already is. Split parts run as collage's backends run them (ONNX Runtime's
threads stop spinning after each run); the whole-model runs use the peers' settings.

Results go to ``experiments/results/engine_splits.json`` (one entry per model).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from experiments import models
from experiments.peers import onnxruntime_session, openvino_request, pin_threads

RESULTS = Path(__file__).parent / "results" / "engine_splits.json"
PEAK_GEMM_N = 2048  # the square f32 matrix product that measures the machine's peak
PEAK = "peak GEMM"


def multiply_adds(mod) -> int:
    """Multiply-adds of the convolutions, transposed convolutions and matrix products of a
    Relax module's ``main`` (static shapes); element-wise work is left out, so rates are
    slight underestimates."""
    from collage.model.graph import DataflowGraph
    from collage.measuring.arrays import static_shape

    total = 0
    for node in DataflowGraph.from_module(mod):
        if node.op not in ("relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul"):
            continue
        data, weight = (static_shape(arg.ty) for arg in node.call.args[:2])
        if node.op == "relax.nn.conv2d":  # each output: Cin/groups x kernel (weight OIHW)
            total += math.prod(static_shape(node.ty)) * math.prod(weight[1:])
        elif node.op == "relax.nn.conv2d_transpose":  # each input: Cout/groups x kernel (weight IOHW)
            total += math.prod(data) * math.prod(weight[1:])
        else:
            total += math.prod(static_shape(node.ty)) * data[-1]
    return total


def cut_points(model) -> list[str]:
    """Tensors that alone carry everything from the nodes before them to the nodes after, in
    running order (the first is nearest the input)."""
    nodes = model.graph.node
    made_at = {name: i for i, node in enumerate(nodes) for name in node.output}
    cuts = []
    for i in range(len(nodes) - 1):
        live = {x for node in nodes[i + 1 :] for x in node.input if made_at.get(x, len(nodes)) <= i}
        if len(live) == 1:
            cuts.append(live.pop())
    return cuts


def ort_session(model, threads: int, split: bool = False):
    # Split parts run as collage's backend runs them: threads left spinning would slow the other engine.
    session = onnxruntime_session(model, threads, **({"session.force_spinning_stop": "1"} if split else {}))
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def openvino_session(model, threads: int, split: bool = False):
    request = openvino_request(model, threads)

    def run(x):
        request.infer({0: x})
        return request.get_output_tensor(0).data

    return run


ENGINES = {"onnxruntime": ort_session, "openvino": openvino_session}


def peak_gemm(threads: int):
    """A call running OpenVINO's PEAK_GEMM_N-square f32 matrix product: timed beside the model,
    its rate is the machine's peak at that moment (this shared machine's speed drifts)."""
    import openvino as ov
    from openvino import opset13 as ops

    n = PEAK_GEMM_N
    a = ops.parameter([n, n], np.float32)
    b = ops.constant(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    request = openvino_request(ov.Model([ops.matmul(a, b, False, False)], [a]), threads)
    request.set_input_tensor(ov.Tensor(np.ones((n, n), np.float32)))
    return request.infer


def measure(name: str, threads: int, cuts: int, rounds: int) -> dict:
    import onnx
    from onnx import utils

    from collage.measuring.timing import Protocol, time_contenders

    w = models.load(name)
    model = onnx.shape_inference.infer_shapes(w.onnx)
    if len(model.graph.input) != 1 or len(model.graph.output) != 1:
        raise SystemExit(f"{name}: splitting handles one input and one output only")
    x = w.inputs[0].numpy()
    first, last = model.graph.input[0].name, model.graph.output[0].name
    points = cut_points(model)
    picked = points if len(points) <= cuts else [points[(k + 1) * len(points) // (cuts + 1)] for k in range(cuts)]

    def part(start, stop):
        sub = utils.Extractor(model).extract_model([start], [stop])
        sub.ir_version = model.ir_version
        return sub

    chains = {engine: [make(model, threads)] for engine, make in ENGINES.items()}
    for at in picked:
        head, tail = part(first, at), part(at, last)
        for a, b in ((e, f) for e in ENGINES for f in ENGINES if e != f):
            chains[f"{a} | {b} at {at}"] = [ENGINES[a](head, threads, True), ENGINES[b](tail, threads, True)]

    def call(chain):
        def run():
            y = x
            for stage in chain:
                y = stage(y)

        return run

    calls = {label: call(chain) for label, chain in chains.items()}
    costs = time_contenders({**calls, PEAK: peak_gemm(threads)}, Protocol(rounds=rounds))
    peak = 2 * PEAK_GEMM_N**3 / costs.pop(PEAK).median_ms / 1e6
    times = {label: round(cost.median_ms, 3) for label, cost in sorted(costs.items(), key=lambda kv: kv[1].median_ms)}
    best_engine = min(ENGINES, key=lambda e: times[e])
    best_split = min((label for label in times if "|" in label), key=times.get, default=None)
    macs = multiply_adds(w.relax)
    return {
        "threads": threads,
        "cut_points": len(points),
        "gmacs": round(macs / 1e9, 3),
        "times_ms": times,
        "best_engine": best_engine,
        "best_split": best_split,
        "best_split_vs_best_engine": round(times[best_engine] / times[best_split], 3) if best_split else None,
        "peak_gflops": round(peak, 1),
        "engine_gflops": {e: round(2 * macs / times[e] / 1e6, 1) for e in ENGINES},
        "share_of_peak": round(2 * macs / times[best_engine] / 1e6 / peak, 3),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["resnet50"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cuts", type=int, default=5, help="split points per model (spread evenly)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in args.model:
        results[name] = r = measure(name, args.threads, args.cuts, args.rounds)
        print(f"{name}: {r['best_engine']} {r['times_ms'][r['best_engine']]} ms "
              f"({r['share_of_peak']:.0%} of the {r['peak_gflops']:.0f} GFLOP/s peak); best split {r['best_split']} "
              f"{r['times_ms'].get(r['best_split'])} ms ({r['best_split_vs_best_engine']}x)", flush=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
