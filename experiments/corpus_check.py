"""Every corpus model through the three paths the project takes it by, checked against torch.

    python -m experiments.corpus_check [--model swinv2 llama ...]

For each model of ``experiments.corpus``:
- relax: torch.export, then TVM's importer (``Workload.relax``); the operators of ``main``
  (bindings that call a ``tvm.ir.Op``) are counted;
- onnx: the TorchScript exporter at opset 17 (``Workload.onnx``), loaded and run by ONNX Runtime;
- tvm: ``tvm.compile`` for llvm on the Relax VM, its output within 1e-3 of the largest
  reference magnitude of torch's;
- simplified: what collage places of the PyTorch module: its own import of the program
  (``collage.model.frontend.relax_of``, which makes explicit the dtypes torch computes in), as
  TVM computes it (``collage.prepare.defined``), its checks of constants that hold dropped,
  simplified; a model passes with relax, onnx and simplified (TVM's importer alone gets
  Falcon's multi-query split and LongT5's integer divisions wrong).
Each step passes or fails with a one-line reason. Results, with the versions and the CPU they
come from, go to ``experiments/results/corpus_check.json``, updated model by model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "corpus_check.json"
REL_TOL = 1e-3


def relative_diff(outs, refs) -> float:
    """The largest difference, relative to the largest reference magnitude, over all outputs."""
    return max(float(np.abs(o - r).max()) / max(float(np.abs(r).max()), 1e-12) for o, r in zip(outs, refs))


def count_ops(mod) -> int:
    import tvm
    from tvm import relax

    return sum(
        isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
        for block in mod["main"].body.blocks
        for b in block.bindings
    )


def step(check) -> dict:
    """``check()``'s one-line reason, as passed, or the error's last line, as failed."""
    start = time.perf_counter()
    try:
        passed, why = check()
    except Exception as err:  # noqa: BLE001 -- the table records every failure
        lines = str(err).strip().splitlines() or [""]
        passed, why = False, f"{type(err).__name__}: {lines[-1][:300]}"
    return {"pass": passed, "why": why, "seconds": round(time.perf_counter() - start, 1)}


def check_relax(w) -> tuple[bool, str]:
    return True, f"{count_ops(w.relax)} Relax operators"


def check_onnx(w) -> tuple[bool, str]:
    import onnxruntime as ort

    sess = ort.InferenceSession(w.onnx.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), w.inputs)})
    # Runs is what this step asks; how close ONNX Runtime comes is kept for the reader.
    return True, f"ONNX Runtime runs it, {relative_diff(outs, w.reference()):.2g} from torch"


def check_tvm(w, simplified: bool = False) -> tuple[bool, str]:
    import tvm
    from tvm import relax

    import collage

    from collage.model.asserts import without_asserts_that_hold
    from collage.model.frontend import relax_of
    from collage.prepare import defined

    mod = collage.simplify(without_asserts_that_hold(defined(relax_of(w.exported))[0])[0]) if simplified else w.relax
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in w.inputs])
    outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    refs = w.reference()
    if [o.shape for o in outs] != [r.shape for r in refs]:
        return False, f"output shapes {[o.shape for o in outs]} != torch's {[r.shape for r in refs]}"
    diff = relative_diff(outs, refs)
    return diff <= REL_TOL, f"{diff:.2g} of the largest reference magnitude from torch (tolerance {REL_TOL})"


def check(name: str) -> dict:
    from experiments import models
    from experiments.corpus import CORPUS

    start = time.perf_counter()
    spec = CORPUS[name]
    entry = {"family": spec.family, "description": spec.description, "input": list(spec.input)}
    try:
        w = models.load(name)
    except Exception as err:  # noqa: BLE001
        return {**entry, "build": f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"}
    entry["relax"] = step(lambda: check_relax(w))
    entry["relax_ops"] = count_ops(w.relax) if entry["relax"]["pass"] else None
    entry["onnx"] = step(lambda: check_onnx(w))
    entry["tvm"] = step(lambda: check_tvm(w)) if entry["relax"]["pass"] else {"pass": False, "why": "no Relax module"}
    # What collage runs: TVM on the simplified module of its own import of the exported program,
    # which mends what TVM's importer refuses or gets wrong, so it runs where the first step failed.
    entry["simplified"] = step(lambda: check_tvm(w, simplified=True))
    entry["passed"] = all(entry[s]["pass"] for s in ("relax", "onnx", "simplified"))
    entry["check_s"] = round(time.perf_counter() - start, 1)
    return entry


def main(argv=None) -> None:
    from experiments.corpus import CORPUS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=list(CORPUS), choices=list(CORPUS), metavar="NAME")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    import transformers
    import tvm

    from collage.measuring.cost import cpu_info
    from collage.measuring.threads import pin_threads

    pin_threads(args.threads)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.update(torch=torch.__version__, transformers=transformers.__version__, tvm=tvm.__version__,
                   cpu=cpu_info(), threads=args.threads)  # fmt: skip
    results.setdefault("models", {})
    for name in args.model:
        entry = results["models"][name] = check(name)
        results["models"] = {n: results["models"][n] for n in CORPUS if n in results["models"]}
        results["check_s"] = round(sum(e.get("check_s", 0) for e in results["models"].values()), 1)
        print(name, json.dumps({s: entry.get(s) for s in ("relax_ops", "passed", "build")}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
