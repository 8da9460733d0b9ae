"""Does each engine run collage's conversion as fast as it runs `torch.onnx.export`'s file?

    python -m experiments.conversion_parity --model convnext regnet swinv2 ... [--rounds 7]

For each model and each graph-level engine (ONNX Runtime, OpenVINO, both f32) two contenders
are timed against each other with the project's protocol (``collage.measuring.timing.time_contenders``),
both called directly, as the engines' users call them (``experiments.peers``):

- ``export``: the engine on the file torch's exporter writes (``Workload.onnx``);
- ``converted``: the engine on collage's conversion of the whole simplified Relax module
  (``collage.candidates.onnx_convert.to_onnx``), the model an engine-alone finalist runs.

The gap is the median over rounds of ``converted``'s block median over ``export``'s in the same
round, minus one (``collage.measuring.timing.paired_ratio``): the aim is at most 3%. Where there is a gap,
the engines' own optimized graphs say why: the operator counts of ONNX Runtime's optimized
model (``SessionOptions.optimized_model_filepath``) and of OpenVINO's runtime model (its
``layerType``s) are recorded for both files; ``fusions_lost`` lists the operator kinds the
engine made of torch's file but not of collage's, ``differ`` every kind whose count differs. Results go to
``experiments/results/conversion_parity.json`` with the CPU and its ISA flags.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from experiments import models
from experiments.corpus_check import relative_diff
from experiments.peers import onnxruntime_session, openvino_request, pin_threads, prepare_onnxruntime, prepare_openvino

RESULTS = Path(__file__).parent / "results" / "conversion_parity.json"
ENGINES = {"onnxruntime": prepare_onnxruntime, "openvino": prepare_openvino}  # as experiments.peers calls them


def converted(w: models.Workload):
    """Collage's ONNX conversion of the whole simplified model, with torch's input names."""
    import collage
    from collage.model.graph import DataflowGraph
    from collage.candidates.onnx_convert import to_onnx
    from collage.candidates.subgraph import SubGraph

    graph = DataflowGraph.from_module(collage.simplify(w.relax))  # its callees too (the scan kernel)
    model = to_onnx(SubGraph(graph, frozenset(range(len(graph)))).extract())
    for i, value in enumerate(model.graph.input):
        value.name, old = f"input{i}", value.name
        for node in model.graph.node:
            node.input[:] = [f"input{i}" if name == old else name for name in node.input]
    return model


def onnxruntime_ops(model, threads: int) -> Counter:
    """The operator kinds of ONNX Runtime's optimized graph of ``model``."""
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        onnxruntime_session(model, threads, optimized_model_filepath=f"{folder}/optimized.onnx")
        return Counter(node.op_type for node in onnx.load(f"{folder}/optimized.onnx").graph.node)


def openvino_ops(model, threads: int) -> Counter:
    """The layer types of OpenVINO's compiled (runtime) model of ``model``."""
    request = openvino_request(model, threads)
    runtime = request.get_compiled_model().get_runtime_model()
    return Counter(op.get_rt_info()["layerType"].astype(str) for op in runtime.get_ordered_ops())


def measure(name: str, threads: int, rounds: int) -> dict:
    """The model's entry; with ``rounds=0`` the engines' graphs only, nothing timed."""
    from collage.measuring.timing import Protocol, median_and_iqr, paired_ratio, time_rounds

    w = models.load(name)
    files = {"export": w.onnx, "converted": converted(w)}
    refs = w.reference()
    result = {"description": w.spec.description, "input": list(w.input_shape)}
    for engine, prepare in ENGINES.items():
        count = onnxruntime_ops if engine == "onnxruntime" else openvino_ops
        runners = {kind: prepare(w, threads, model) for kind, model in files.items()}
        calls = {kind: r.run for kind, r in runners.items()}
        errors = {kind: f"{relative_diff(r.to_numpy(r.run()), refs):.1e}" for kind, r in runners.items()}
        ops = {kind: count(model, threads) for kind, model in files.items()}
        result[engine] = {"max_rel_err": errors}
        if rounds:
            timed = time_rounds(calls, Protocol(rounds=rounds, block_ms=100.0, settle_s=0.2))
            gap, gap_iqr = paired_ratio(timed["converted"], timed["export"])
            result[engine] |= {
                "ms": {kind: round(median_and_iqr(ms)[0], 4) for kind, ms in timed.items()},
                "spread_ms": {kind: round(median_and_iqr(ms)[1], 4) for kind, ms in timed.items()},
                "gap": round(gap - 1, 4),
                "gap_iqr": round(gap_iqr, 4),
            }
        result[engine] |= {
            "ops": {kind: dict(sorted(c.items())) for kind, c in ops.items()},
            "fusions_lost": sorted(set(ops["export"]) - set(ops["converted"])),
            "differ": {k: [ops["export"][k], ops["converted"][k]]
                       for k in sorted(ops["export"] | ops["converted"]) if ops["export"][k] != ops["converted"][k]},
        }  # fmt: skip
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7, help="0: compare the engines' graphs, time nothing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    from collage.measuring.cost import Device, cpu_info

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = {"cpu": Device.this_machine(args.threads).name, "cpu_info": cpu_info(),
                          "threads": args.threads, "date": time.strftime("%Y-%m-%d")}
    results.setdefault("models", {})
    for name in args.model:
        start = time.perf_counter()
        try:
            results["models"][name] = measure(name, args.threads, args.rounds)
        except Exception as err:  # noqa: BLE001 -- one model's failure is recorded, the rest go on
            results["models"][name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        entry = results["models"][name]
        entry["seconds"] = round(time.perf_counter() - start, 1)
        shown = ("ms", "gap", "differ")
        print(name, json.dumps({e: {k: entry[e].get(k) for k in shown} for e in ENGINES if e in entry} or entry), flush=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
