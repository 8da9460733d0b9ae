"""What running an engine inside collage costs over running it directly, as its users do.

    python -m experiments.engine_overhead --model squeezenet dcgan mobilenet_v2 ... [--threads 2]

For each model and each inference engine (ONNX Runtime, OpenVINO), four contenders are timed
against each other with the project's protocol (``collage.measuring.timing.time_contenders``):

- ``native``: the engine on the model's ONNX export, called from Python as its users call it
  (``experiments.peers``: ``InferenceSession.run`` with a numpy feed, OpenVINO's ``infer``
  with arrays);
- ``native on collage's graph``: the same plain call on collage's own conversion of the
  whole model (``collage.candidates.onnx_convert``);
- ``opt(x)``: ``collage.optimize(w.relax, backends=["tvm", E])`` (the design's entry point, no
  file), called as the README shows, with numpy arrays, new ones each call as a user's are:
  whatever placement it kept;
- ``file``: the same file inside a collage module (``collage.choosing.engine_alone``), called as
  ``OptimizedModule.bind`` calls it: the engine's kernel directly, on buffers bound once
  (DLPack, IOBinding), since ``main`` is that one kernel;
- ``converted``: the whole model converted from Relax by collage (``collage.candidates.onnx_convert``),
  in a collage module, with the engine's users' settings (``assemble.runs_alone``);
- ``converted, spinning stops``: the same kernel as compiled for a placement among other
  libraries (ONNX Runtime's threads stop spinning after each run), to show what the
  per-placement setting buys.

The overhead is the median over rounds of each collage module's block median over
``native``'s in the same round, minus one (``collage.measuring.timing.paired_ratio``), with its
interquartile range: the aim is at most 2%. ``over_graph`` is the same ratio against ``native
on collage's graph``: for ``opt(x)``, the user's call against the engine's own plain call on
the same graph (the aim: within 3%). Results go to
``experiments/results/engine_overhead.json`` with the CPU and its ISA flags.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from experiments import models
from experiments.corpus import CORPUS
from experiments.peers import pin_threads, prepare_onnxruntime, prepare_openvino

RESULTS = Path(__file__).parent / "results" / "engine_overhead.json"
NATIVE = {"onnxruntime": prepare_onnxruntime, "openvino": prepare_openvino}


def contenders(w: models.Workload, engine: str, threads: int) -> dict:
    """Name -> call (no arguments) of the four ways to run ``w`` on ``engine``; the collage
    modules' outputs are checked against torch's."""
    import numpy as np
    import tvm

    import collage
    from collage.assembling.assemble import assemble, bound_main
    from collage.candidates.backend import BackendSet, default_backends
    from collage.candidates.generate import Candidate
    from collage.measuring.cost import Cost
    from collage.choosing.engine_alone import from_onnx_file
    from collage.model.graph import DataflowGraph
    from collage.placing.placement import Partition
    from collage.measuring.build import build_vm
    from collage.candidates.onnx_convert import to_onnx
    from collage.candidates.subgraph import SubGraph

    backend = default_backends()[engine]
    original = w.relax
    graph = DataflowGraph(collage.simplify(original)["main"])
    whole = Partition(Candidate(SubGraph(graph, frozenset(range(len(graph)))), engine, f"{engine}.region"), Cost.of(1.0))
    modules = {"file": from_onnx_file(original, graph, backend, w.onnx, "llvm", threads)[0]}
    modules["converted"] = assemble(graph, [whole], BackendSet([backend]), threads=threads)
    # A second partition of another library, however cheap, makes the engine's kernel one
    # among others: the setting a mixed placement gets.
    modules["converted, spinning stops"] = _among_others(graph, whole, backend, threads)
    inputs = [tvm.runtime.tensor(t.numpy()) for t in w.inputs]
    reference = w.reference()
    calls = {"native": NATIVE[engine](w, threads).run,
             "native on collage's graph": NATIVE[engine](w, threads, to_onnx(graph.func)).run}
    for name, assembly in modules.items():
        call = bound_main(assembly, build_vm(assembly.module), inputs, tvm.cpu())
        out = call()
        got = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
        error = float(np.abs(got - reference[0]).max() / np.abs(reference[0]).max())
        if error > 1e-3:
            raise SystemExit(f"{w.name} {engine} {name}: relative error {error:.2g}")
        calls[name] = call  # the VM looked its kernels up when it loaded: they outlive the Assembly
    opt = collage.optimize(original, backends=["tvm", engine], threads=threads, progress=False)
    arrays = [t.numpy() for t in w.inputs]
    calls["opt(x)"] = lambda: opt(*arrays)
    print(f"{w.name} {engine}: collage kept {opt.record.chosen} ({len(opt.placement)} partition(s))", flush=True)
    return calls


def _among_others(graph, whole, backend, threads):
    from collage.assembling.assemble import assemble
    from collage.candidates.backend import BackendSet
    from collage.measuring.build import compile_kernel

    kernel, reason = compile_kernel(backend, whole.candidate.subgraph.extract(), whole.pattern, "llvm", threads, alone=False)
    if reason is not None:
        raise SystemExit(reason)
    return assemble(graph, [whole], BackendSet([backend]), compiled={(whole.backend, whole.pattern, whole.nodes, True, whole.candidate.precision): (kernel, None)},
                    threads=threads)


def measure(name: str, threads: int, rounds: int) -> dict:
    from collage.measuring.timing import Protocol, median_and_iqr, paired_ratio, time_rounds

    w = models.load(name)
    entry = {}
    for engine in NATIVE:
        timed = time_rounds(contenders(w, engine, threads), Protocol(rounds=rounds, block_ms=100.0, settle_s=0.2))
        entry[engine] = {}
        for label, ms in timed.items():
            median, spread = median_and_iqr(ms)
            ratio, ratio_spread = paired_ratio(ms, timed["native"])  # paired within rounds
            over_graph, _ = paired_ratio(ms, timed["native on collage's graph"])
            entry[engine][label] = {"median_ms": round(median, 4), "spread_ms": round(spread, 4),
                                    "overhead": round(ratio - 1, 4), "overhead_spread": round(ratio_spread, 4),
                                    "over_graph": round(over_graph, 4)}  # fmt: skip
        print(f"{name} {engine}: " + ", ".join(f"{k} {v['median_ms']:.3f} ms ({v['overhead']:+.1%})"
                                             for k, v in entry[engine].items()), flush=True)
    return entry


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", required=True, choices=[*models.MODELS, *CORPUS], metavar="NAME")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    from collage.measuring.cost import Device, cpu_info

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in args.model:
        results[name] = {"cpu": Device.this_machine(args.threads).name, "cpu_info": cpu_info(),
                         "threads": args.threads, "date": time.strftime("%Y-%m-%d"),
                         **measure(name, args.threads, args.rounds)}
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
