"""Is there anything to gain by splitting a model between two inference engines on this CPU?

    python -m experiments.engine_splits --model resnet50 bert [--threads 2] [--cuts 5] [--rounds 15]

For each model: its ONNX form run whole on ONNX Runtime and on OpenVINO (the peers' own
settings, f32), and split in two at up to ``--cuts`` points where a single tensor crosses
(one engine runs the first part, the other the rest, both directions), all timed in
alternation with ``collage.timing.time_interleaved``. Beside the times, the model's
multiply-adds give the rate each engine reaches, against the rate of a large f32 matrix
product on OpenVINO: how close to this machine's ceiling the best engine already is.

Results go to ``experiments/results/engine_splits.json`` (one entry per model).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from experiments import models
from experiments.peers import pin_threads

RESULTS = Path(__file__).parent / "results" / "engine_splits.json"
PEAK_GEMM_N = 2048  # the square f32 matrix product that measures the machine's peak


def multiply_adds(model) -> int:
    """Multiply-adds of the model's Conv, ConvTranspose, MatMul and Gemm nodes (shape-inferred
    ONNX); element-wise work is left out, so rates are slight underestimates."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
    }
    shapes.update({t.name: list(t.dims) for t in inferred.graph.initializer})
    total = 0
    for node in inferred.graph.node:
        out = math.prod(shapes[node.output[0]])
        if node.op_type == "Conv":
            total += out * math.prod(shapes[node.input[1]][1:])  # Cin/groups x kernel per output
        elif node.op_type == "ConvTranspose":
            w = shapes[node.input[1]]  # (Cin, Cout/groups, k...): each input element feeds Cout/g x k
            total += math.prod(shapes[node.input[0]]) * math.prod(w[1:])
        elif node.op_type == "MatMul":
            total += out * shapes[node.input[0]][-1]
        elif node.op_type == "Gemm":
            a = shapes[node.input[0]]
            trans_a = any(attr.name == "transA" and attr.i for attr in node.attribute)
            total += out * (a[0] if trans_a else a[-1])
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


def ort_session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def openvino_session(model, threads: int):
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    request = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU", config).create_infer_request()

    def run(x):
        request.infer({0: x})
        return request.get_output_tensor(0).data

    return run


ENGINES = {"onnxruntime": ort_session, "openvino": openvino_session}


def peak_gflops(threads: int) -> float:
    """f32 GFLOP/s of OpenVINO's PEAK_GEMM_N-square matrix product, best of 5 runs."""
    import openvino as ov
    from openvino import opset13 as ops

    n = PEAK_GEMM_N
    a = ops.parameter([n, n], np.float32)
    b = ops.constant(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    request = ov.Core().compile_model(ov.Model([ops.matmul(a, b, False, False)], [a]), "CPU", config).create_infer_request()
    request.set_input_tensor(ov.Tensor(np.ones((n, n), np.float32)))
    request.infer()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        request.infer()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def measure(name: str, threads: int, cuts: int, rounds: int, peak: float) -> dict:
    import onnx
    from onnx import utils

    from collage.timing import time_interleaved

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
            chains[f"{a} | {b} at {at}"] = [ENGINES[a](head, threads), ENGINES[b](tail, threads)]

    def call(chain):
        def run():
            y = x
            for stage in chain:
                y = stage(y)

        return run

    costs = time_interleaved({label: call(chain) for label, chain in chains.items()}, rounds=rounds, min_sample_ms=50.0)
    times = {label: round(cost.median_ms, 3) for label, cost in sorted(costs.items(), key=lambda kv: kv[1].median_ms)}
    best_engine = min(ENGINES, key=lambda e: times[e])
    best_split = min((label for label in times if "|" in label), key=times.get, default=None)
    macs = multiply_adds(model)
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
    peak = peak_gflops(args.threads)
    print(f"peak: {peak:.0f} GFLOP/s (OpenVINO, {PEAK_GEMM_N}-square f32 matrix product, {args.threads} threads)")
    for name in args.model:
        results[name] = r = measure(name, args.threads, args.cuts, args.rounds, peak)
        print(f"{name}: {r['best_engine']} {r['times_ms'][r['best_engine']]} ms "
              f"({r['share_of_peak']:.0%} of peak); best split {r['best_split']} "
              f"{r['times_ms'].get(r['best_split'])} ms ({r['best_split_vs_best_engine']}x)", flush=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
