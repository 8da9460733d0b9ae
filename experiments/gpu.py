"""Collage on a CUDA GPU: ``optimize(target="cuda")`` end to end, against the GPU's own peers.

    python -m experiments.gpu --model kws_dscnn resnet50 bert [--energy kws_dscnn] [--accuracy 1e-2]
                              [--accuracy-only] [--stacks DIR] [--cost-log PATH] [--out experiments/results/gpu.json]

For each model: ``collage.optimize`` with every backend that serves ``cuda`` here (cuDNN and
cuBLAS through PyTorch, TVM's CUDA codegen, inductor; TensorRT where it is installed), its
report, its outputs checked against torch's, through both entry points: the Relax module
(``collage``) and the torch module (``collage (torch)``, where inductor compiling the user's
own program whole is a finalist too; ``--no-torch-entry`` leaves it out); then collage's
modules timed against their peers: torch eager,
``torch.compile`` (inductor, default mode and ``mode="reduce-overhead"``, which replays CUDA
graphs) and TVM CUDA alone (TVM's default pipeline: DLight's default schedules, untuned),
without and with CUDA graphs (``relax.backend.use_cuda_graph``), in one run with the
project's protocol (``collage.measuring.timing``), each call followed by a device
synchronization. Each peer is built and checked on its own: one that fails is reported under
``errors`` and the others still run. Everyone computes in float32 with TF32 off
(``PRECISION``, set before anything is built). ``--energy`` optimizes a model again with
``objective="energy"`` on NVML's counter (each candidate metered while timed) and reports it
beside ``objective="time"``. ``--accuracy E`` optimizes each model again with ``accuracy=E``
(TF32, bf16 and fp16 offered where the libraries compute them) and races it against torch's peers at
their own defaults, each with its error (``accuracy_entry``), and against the best float32 peer
through collage's float32 module, timed in both races (``over_best_float32_peer``);
``--accuracy-only`` does only that, for models whose float32 rows from this GPU are in
``--out`` already (a lent GPU's time is short), skipping those whose accuracy entry for ``E``
from this GPU is there too; a model without a float32 row from this GPU (a lent GPU of another
kind) gets its whole row. The GPU's name, driver and library versions go with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import signal
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from experiments import models
from experiments.bench import max_relative_error, one_line

RESULTS = Path(__file__).parent / "results" / "gpu.json"
PROTOCOL_ROUNDS = 9
PRECISION = "float32, TF32 off"
VERSIONED = ("torch", "apache-tvm", "nvidia-ml-py")


def gpu_info() -> dict:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1e3,
        "versions": {p: _version(p) for p in VERSIONED},
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _synchronized(call):
    def call_and_wait():
        out = call()
        torch.cuda.synchronize()
        return out

    return call_and_wait


def float32_everywhere() -> None:
    """TF32 off for torch's cuBLAS and cuDNN, so every contender computes in float32
    (collage's cuDNN kernels pass ``allow_tf32=False`` themselves; TVM's have no TF32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def peers(w: models.Workload) -> dict:
    """The GPU baselines by label, each as a builder that returns a call doing one inference
    and returning its outputs. Built one by one, so that one failing leaves the others."""
    torch._dynamo.reset()
    return {
        "torch": functools.partial(_torch_peer, w, compiled=False),
        "torch.compile": functools.partial(_torch_peer, w, compiled=True),
        "torch.compile reduce-overhead": functools.partial(_torch_peer, w, compiled=True, mode="reduce-overhead"),
        "tvm cuda": functools.partial(_tvm_peer, w, cuda_graph=False),
        "tvm cuda graph": functools.partial(_tvm_peer, w, cuda_graph=True),
    }


def _torch_peer(w: models.Workload, compiled: bool, mode: str | None = None):
    """torch eager, or ``torch.compile`` (inductor) in ``mode`` (None: its default)."""
    net = w.torch.to("cuda")
    model = torch.compile(net, mode=mode) if compiled else net
    inputs = [t.to("cuda") for t in w.inputs]

    def call():
        with torch.inference_mode():
            return model(*inputs)

    return call


def _tvm_peer(w: models.Workload, cuda_graph: bool):
    """TVM CUDA alone; with ``cuda_graph``, its static regions recorded once and replayed."""
    import tvm
    from tvm import relax

    from collage.measuring.build import USE_CUDA_GRAPH

    with tvm.transform.PassContext(config={USE_CUDA_GRAPH: cuda_graph}):
        vm = relax.VirtualMachine(tvm.compile(w.relax, target="cuda"), tvm.cuda())
    inputs = [tvm.runtime.tensor(t.numpy(), tvm.cuda()) for t in w.inputs]
    return lambda: vm["main"](*inputs)


def outputs_of(result) -> list[np.ndarray]:
    if isinstance(result, torch.Tensor):
        return [result.detach().cpu().numpy()]
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [a for r in result for a in outputs_of(r)]


def run_model(name: str, entry: dict, save, cost_log: str, energy: bool, accuracy: float | None = None,
              torch_entry: bool = True) -> None:
    """Fills ``entry`` stage by stage, calling ``save`` after each: a run cut off by a
    device's time limit keeps what it measured."""
    import tvm

    import collage

    w = models.load(name)
    reference = w.reference()
    entry.update({"model": w.spec.description, "input": list(w.input_shape)})
    started = time.perf_counter()
    opt = collage.optimize(w.relax, target="cuda", cost_log=cost_log)
    entry["optimize_s"] = round(time.perf_counter() - started, 1)
    entry["report"] = opt.report()
    print(entry["report"], flush=True)
    entry["measured_candidates"] = opt.record.measured
    entry.update(_chosen(opt))
    entry["cuda_graph_off"] = opt.record.cuda_graph_off  # None: its static regions run as CUDA graphs
    save()
    tensors = [tvm.runtime.tensor(t.numpy(), tvm.cuda()) for t in w.inputs]
    builders = {"collage": lambda: opt.bind(*tensors)}
    if torch_entry:  # the torch module handed over: its own program compiled whole is a finalist too
        started = time.perf_counter()
        from_torch = collage.optimize(w.torch, example_inputs=tuple(w.inputs), target="cuda", cost_log=cost_log)
        entry["torch_entry"] = {"optimize_s": round(time.perf_counter() - started, 1), **_chosen(from_torch)}
        print(from_torch.report(), flush=True)
        builders["collage (torch)"] = lambda: from_torch.bind(*tensors)
    entry.update(_race(builders | peers(w), reference))
    save()
    if accuracy is not None:
        entry["accuracy"] = {}
        accuracy_entry(w, reference, lambda: opt, accuracy, cost_log, entry["accuracy"], save)
        entry["accuracy"].update(over_best_float32_peer(entry))
        save()
    if energy:
        entry["energy"] = energy_beside_time(w, cost_log)


def _chosen(opt) -> dict:
    return {
        "chosen": str(opt.record.chosen),
        "backend_shares": {b: round(s, 4) for b, s in opt.backend_shares().items()},
        "finalists_ms": {str(n): round(f.measured.median_ms, 4) for n, f in opt.record.finalists.items()},
    }


def _race(builders: dict, reference) -> dict:
    """Each contender built (one that fails is reported, the others still run), checked
    against ``reference`` and timed against the others in one run with the project's
    protocol; collage's speed-up over the best of the others."""
    from collage.measuring.timing import Protocol, time_contenders

    contenders, errors, found = {}, {}, {"max_rel_err": {}}
    for label, build in builders.items():
        try:
            contenders[label] = build()
            found["max_rel_err"][label] = max_relative_error(outputs_of(contenders[label]()), reference)
        except Exception as err:  # a peer that cannot build or run is reported, the others still run
            errors[label] = one_line(err)
            contenders.pop(label, None)
            traceback.print_exc()
    costs = time_contenders({k: _synchronized(c) for k, c in contenders.items()}, Protocol(rounds=PROTOCOL_ROUNDS))
    found["ms"] = {k: round(c.median_ms, 4) for k, c in costs.items()}
    found["spread_ms"] = {k: round(c.spread_ms, 4) for k, c in costs.items()}
    peers_only = {k: c.median_ms for k, c in costs.items() if not k.startswith("collage")}
    if peers_only and "collage" in costs:
        best = min(peers_only, key=peers_only.get)
        found["best_peer"] = best
        found["speedup_over_best_peer"] = round(peers_only[best] / costs["collage"].median_ms, 3)
        if "collage (torch)" in costs:
            found["speedup_over_best_peer_torch_entry"] = round(peers_only[best] / costs["collage (torch)"].median_ms, 3)
    if errors:
        found["errors"] = errors
    return found


def accuracy_entry(w: models.Workload, reference, float32_module, accuracy: float, cost_log: str, entry: dict,
                   save) -> None:  # fmt: skip
    """``entry`` filled with ``optimize(accuracy=E)`` against torch's peers at their own
    defaults (cuDNN in TF32, as torch ships), in one race with collage's float32 module
    (``float32_module()``, asked for after the optimization, whose float32 candidates it then
    reads from the log); each with its error; ``save``d after the optimization and after the
    race. The speed-up over the best float32 peer is taken through collage's float32 module,
    timed in both races."""
    import tvm

    import collage

    started = time.perf_counter()
    opt = collage.optimize(w.relax, target="cuda", cost_log=cost_log, accuracy=accuracy)
    entry.update({"budget": accuracy, "optimize_s": round(time.perf_counter() - started, 1), **_chosen(opt),
                  "report": opt.report()})  # fmt: skip
    print(entry["report"], flush=True)
    save()
    float32_opt = float32_module()
    tensors = [tvm.runtime.tensor(t.numpy(), tvm.cuda()) for t in w.inputs]
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False  # torch's defaults
    try:
        torch._dynamo.reset()
        builders = {"collage": lambda: opt.bind(*tensors), "collage float32": lambda: float32_opt.bind(*tensors)}
        builders |= {f"{label} (default)": build for label, build in peers(w).items() if label.startswith("torch")}
        entry.update(_race(builders, reference))
    finally:
        float32_everywhere()
    save()


def over_best_float32_peer(entry: dict) -> dict:
    """collage's module within the budget against the best float32 peer of ``entry``'s float32
    race, through collage's float32 module, timed in both races (so the two races may come
    from two runs on one GPU)."""
    best, ms, budget_ms = entry.get("best_peer"), entry.get("ms", {}), entry["accuracy"].get("ms", {})
    if best is None or "collage" not in ms or not {"collage", "collage float32"} <= set(budget_ms):
        return {}
    ratio = ms[best] / ms["collage"] * budget_ms["collage float32"] / budget_ms["collage"]
    return {"best_float32_peer": best, "speedup_over_best_float32_peer": round(ratio, 3)}


def accuracy_only(name: str, entry: dict, save, cost_log: str, accuracy: float) -> None:
    """``--accuracy-only``: ``entry`` (a model's float32 row from this GPU) given its
    ``accuracy`` entry; its float32 race is not run again, and its float32 module is
    optimized after the budget's optimization, which measures every float32 candidate too."""
    import collage

    w = models.load(name)
    float32_module = functools.partial(collage.optimize, w.relax, target="cuda", cost_log=cost_log, progress=False)
    entry["accuracy"] = {}
    accuracy_entry(w, w.reference(), float32_module, accuracy, cost_log, entry["accuracy"], save)
    entry["accuracy"].update(over_best_float32_peer(entry))
    save()


def energy_beside_time(w: models.Workload, cost_log: str) -> dict:
    """``objective="energy"`` beside ``objective="time"``: each optimization's choice, and its
    time and energy per inference as its finalists measured them (NVML)."""
    import collage
    from collage.measuring.meters import nvml

    meter = nvml()
    found = {}
    for objective in ("time", "energy"):
        opt = collage.optimize(w.relax, target="cuda", cost_log=cost_log, substitutions=True,
                               objective=objective, meter=meter)
        chosen = str(opt.record.chosen)
        found[objective] = {
            "chosen": chosen,
            "backend_shares": {b: round(s, 4) for b, s in opt.backend_shares().items()},
            "finalists": {str(n): {"ms": round(f.measured.median_ms, 4),
                                   "mj": None if f.measured.energy_mj is None else round(f.measured.energy_mj, 4)}
                          for n, f in opt.record.finalists.items()},
        }
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", default=["kws_dscnn", "resnet50", "bert"])
    parser.add_argument("--energy", nargs="*", default=[], help="models to optimize for energy too")
    parser.add_argument("--cost-log", default=str(Path.home() / ".cache" / "collage" / "gpu-costs.sqlite"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--accuracy", type=float, metavar="E",
                        help="also optimize(accuracy=E), raced against torch's peers at their defaults")
    parser.add_argument("--no-torch-entry", action="store_true",
                        help="optimize the Relax module only, not the torch module too")
    parser.add_argument("--stacks", type=Path, metavar="DIR",
                        help="sample the stacks per model, into DIR/<model>.txt, and its worker processes' into DIR/<model>/<pid>.txt")
    parser.add_argument("--accuracy-only", action="store_true",
                        help="with --accuracy: only the accuracy entries, of models whose float32 rows from this GPU are in --out")
    args = parser.parse_args(argv)
    if args.accuracy_only and args.accuracy is None:
        parser.error("--accuracy-only needs --accuracy E")
    float32_everywhere()  # before any contender is built
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = gpu_info()
    results["precision"] = PRECISION
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        args.out.write_text(json.dumps(results, indent=1, default=str))

    signal.signal(signal.SIGTERM, _exit_on_term)  # a call's time limit still writes the stacks sampled
    for name in args.model:
        print(f"== {name}", flush=True)
        with _stacks_into(args.stacks, f"{name}.accuracy" if args.accuracy_only else name):
            _one_model(name, results, save, args)


def _one_model(name: str, results: dict, save, args) -> None:
    """``name``'s row of ``results`` measured (or with ``--accuracy-only`` its accuracy entry
    added), ``save``d stage by stage."""
    row, gpu = results.get(name, {}), results["machine"]["gpu"]
    if args.accuracy_only and row.get("gpu") == gpu and "ms" in row:
        if row.get("accuracy", {}).get("budget") == args.accuracy and "ms" in row["accuracy"]:
            print(f"{name}: its accuracy entry from this GPU ({gpu}) for {args.accuracy:g} is in {args.out} already", flush=True)
            return
        try:
            accuracy_only(name, row, save, args.cost_log, args.accuracy)
        except Exception as err:
            traceback.print_exc()
            row.setdefault("accuracy", {})["error"] = one_line(err)  # beside what it measured
        save()
        print(json.dumps({k: v for k, v in row["accuracy"].items() if k != "report"}, indent=1, default=str), flush=True)
        return
    if args.accuracy_only:  # a lent GPU of another kind: the float32 row is measured first
        print(f"{name}: no float32 row from this GPU ({gpu}) in {args.out}: the whole row is measured", flush=True)
    results[name] = {"gpu": gpu}  # rows of one file may come from several GPUs
    try:
        run_model(name, results[name], save, args.cost_log, name in args.energy, args.accuracy,
                  not args.no_torch_entry)
    except Exception as err:
        traceback.print_exc()
        results[name]["error"] = one_line(err)
    save()
    print(json.dumps({k: v for k, v in results[name].items() if k != "report"}, indent=1, default=str), flush=True)


def _exit_on_term(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _stacks_into(directory: Path | None, name: str):
    """The block's stacks sampled (``experiments.stacks``) and written to
    ``directory/name.txt``, also when it is cut off, and those of the processes it starts (the
    measuring worker, each compile ahead) to ``directory/name/<pid>.txt``; nothing without a
    directory."""
    if directory is None:
        yield
        return
    from experiments.stacks import in_every_process, sampled

    with in_every_process(directory / name), sampled() as stacks:
        try:
            yield
        finally:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{name}.txt").write_text(stacks.table())


if __name__ == "__main__":
    main()
