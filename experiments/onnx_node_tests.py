"""ONNX's own backend node tests, run on TVM alone, on collage and on ONNX Runtime.

    python -m experiments.onnx_node_tests [--match REGEX] [--runners tvm collage onnxruntime]
                                          [--backends tvm onnxruntime openvino] [--sample N] [--resume]

The cases come from the ``onnx`` package's own case generators (its wheel ships no test
data): every case whose inputs and outputs are all float32, each a one-operator model (a few
are expanded into their function body) with inputs and expected outputs. Each runner's
outcome on a case is ``right``, ``wrong`` (with the largest difference), ``refused`` (with
the one line that says why) or, for collage, ``crashed`` (an exception that is not one of
its clear refusals: a defect). The rule ``tests/test_onnx_node_cases.py`` enforces on a
fixed subset: wherever TVM alone is right, collage is right, and it never crashes.

Results go to ``experiments/results/onnx_node_tests.json`` (one entry per case, with the CPU),
written after every case, and a count per runner is printed. The whole run takes about
90 minutes of a 2-core machine; ``--resume`` keeps the cases a stopped run finished (same
runners, CPU and backends) and runs the rest.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import random
import re
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

RESULTS = Path(__file__).parent / "results" / "onnx_node_tests.json"
RIGHT, WRONG, REFUSED, CRASHED = "right", "wrong", "refused", "crashed"
ORT_MAX_IR_VERSION = 10  # onnx writes newer IR versions than ONNX Runtime reads


@dataclass(frozen=True)
class Outcome:
    status: str  # RIGHT, WRONG, REFUSED or CRASHED
    detail: str = ""


def float32_cases(match: str | None = None) -> list:
    """The node test cases whose every input and output is float32, by name; ``match`` (a
    regular expression) keeps those whose name it finds."""
    return [case for name, case in _float32_cases().items() if match is None or re.search(match, name)]


@functools.cache
def _float32_cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    def float32(values) -> bool:
        return all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in values)

    cases = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators compute log(0) and the like on purpose
        for case in collect_testcases(None):
            graph = case.model.graph
            if case.data_sets and graph.output and float32(graph.input) and float32(graph.output):
                cases.setdefault(case.name, case)
    return dict(sorted(cases.items()))


def case_named(name: str):
    (case,) = [c for c in float32_cases(f"^{re.escape(name)}$")]
    return case


def agreement(actual: list[np.ndarray], case) -> Outcome:
    """Right when every output matches the case's expected one within its tolerances (NaN
    where NaN is expected is right)."""
    expected = case.data_sets[0][1]
    if len(actual) != len(expected):
        return Outcome(WRONG, f"{len(actual)} outputs, expected {len(expected)}")
    for k, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape:
            return Outcome(WRONG, f"output {k}: shape {list(a.shape)}, expected {list(e.shape)}")
        if not np.allclose(a, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
            diff = np.abs(a.astype("float64") - e.astype("float64"))
            return Outcome(WRONG, f"output {k}: max |diff| {np.nanmax(diff, initial=0.0):.3g}")
    return Outcome(RIGHT)


def inputs_of(case) -> list[np.ndarray]:
    return [np.asarray(x) for x in case.data_sets[0][0]]


def _import(case, directory: Path):
    """The case's model imported as collage imports a file (``collage.load_onnx``)."""
    from collage.model.frontend import load_onnx

    path = directory / f"{case.name}.onnx"
    onnx.save(case.model, path)
    return load_onnx(path), path


def run_tvm(case, directory: Path) -> Outcome:
    """TVM alone: its ONNX importer, its default pipeline, the Relax VM."""
    import tvm
    from tvm import relax

    from collage.model.frontend import ModelImportError
    from collage.errors import first_line
    from collage.measuring.arrays import numpy_outputs

    try:
        mod, _ = _import(case, directory)
    except ModelImportError as err:
        return Outcome(REFUSED, str(err).partition(": ")[2])
    try:
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        return agreement(numpy_outputs(vm["main"](*[tvm.runtime.tensor(x) for x in inputs_of(case)])), case)
    except Exception as err:  # noqa: BLE001 -- TVM's own failure on this case
        return Outcome(REFUSED, f"{type(err).__name__}: {first_line(err)}")


def run_collage(case, directory: Path, cost_log=None, backends=None, timing=None) -> Outcome:
    """``collage.optimize`` on the imported model, given the file as a user's CLI run would;
    ``timing`` of each candidate (``collage.measuring.timing.Timing``; default optimize's)."""
    import collage
    from collage.measuring.timing import Timing
    from collage.model.frontend import ModelImportError
    from collage.errors import first_line

    try:
        mod, path = _import(case, directory)
    except ModelImportError as err:
        return Outcome(REFUSED, str(err).partition(": ")[2])
    try:
        opt = collage.optimize(mod, backends=backends, cost_log=cost_log, onnx_model=path, progress=False,
                               timing=timing or Timing())
    except collage.OptimizeError as err:
        return Outcome(REFUSED, str(err))
    except Exception as err:  # noqa: BLE001 -- anything else is collage's defect
        return Outcome(CRASHED, f"{type(err).__name__}: {first_line(err)}")
    try:
        result = opt(*inputs_of(case))
    except Exception as err:  # noqa: BLE001
        return Outcome(CRASHED, f"calling the optimized module: {type(err).__name__}: {first_line(err)}")
    return agreement(list(result) if isinstance(result, tuple) else [result], case)


def run_onnxruntime(case, directory: Path) -> Outcome:
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.ir_version = min(model.ir_version, ORT_MAX_IR_VERSION)
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return agreement(session.run(None, dict(zip(names, inputs_of(case)))), case)
    except Exception as err:  # noqa: BLE001 -- ONNX Runtime's own refusal
        return Outcome(REFUSED, f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}")


RUNNERS = {"tvm": run_tvm, "collage": run_collage, "onnxruntime": run_onnxruntime}


def run(cases, runners, cost_log=None, after_each=None, backends=None, done=None) -> dict[str, dict[str, Outcome]]:
    """Each case on each runner; ``after_each(results)`` is called after every case (to keep
    partial results of a long run). ``done``: results of cases already run, kept as they are."""
    results = dict(done or {})
    with tempfile.TemporaryDirectory() as tmp:
        for k, case in enumerate(cases):
            if case.name in results:
                continue
            started = time.perf_counter()
            results[case.name] = {
                name: (run_collage(case, Path(tmp), cost_log, backends) if name == "collage" else RUNNERS[name](case, Path(tmp)))
                for name in runners
            }
            summary = ", ".join(f"{n} {o.status}" for n, o in results[case.name].items())
            print(f"[{k + 1}/{len(cases)}] {case.name}: {summary} ({time.perf_counter() - started:.1f} s)", flush=True)
            if after_each is not None:
                after_each(results)
    return results


def counts(results: dict[str, dict[str, Outcome]]) -> dict[str, dict[str, int]]:
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for outcomes in results.values():
        for runner, outcome in outcomes.items():
            table[runner][outcome.status] += 1
    return {runner: dict(c) for runner, c in table.items()}


def collage_lost(results) -> list[str]:
    """Cases TVM alone gets right and collage does not: what the rule forbids."""
    return [
        name for name, o in results.items()
        if "collage" in o and o["tvm"].status == RIGHT and o["collage"].status != RIGHT
    ]  # fmt: skip


def finished(path: Path, cpu: str, runners, backends) -> dict[str, dict[str, Outcome]]:
    """The outcomes ``path`` holds, if they come from this CPU with these runners and
    backends; else none (a run elsewhere is not continued)."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    if saved.get("cpu") != cpu or saved.get("backends") != backends:
        return {}
    results = {name: {r: Outcome(**o) for r, o in outcomes.items()} for name, outcomes in saved["results"].items()}
    return {name: o for name, o in results.items() if set(o) == set(runners)}


def main(argv=None) -> None:
    from collage.measuring.cost import Device

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", help="only cases whose name this regular expression finds")
    parser.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    parser.add_argument("--log", help="collage's cost log (default: collage's own)")
    parser.add_argument("--backends", nargs="+", help="collage's backends (default: every registered one)")
    parser.add_argument("--sample", type=int, help="only this many cases, drawn at random (seeded)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--resume", action="store_true", help="keep the cases --out already holds; run the rest")
    args = parser.parse_args(argv)
    cases = float32_cases(args.match)
    if args.sample is not None and args.sample < len(cases):
        cases = sorted(random.Random(0).sample(cases, args.sample), key=lambda case: case.name)
    cpu = Device.this_machine(2).name

    def write(results):
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "cpu": cpu, "onnx": onnx.__version__, "cases": len(cases), "of": len(float32_cases()),
            "sample": args.sample, "backends": args.backends, "done": len(results),
            "counts": counts(results), "collage_lost": collage_lost(results),
            "results": {name: {r: asdict(o) for r, o in outcomes.items()} for name, outcomes in results.items()},
        }, indent=1) + "\n")  # fmt: skip

    done = finished(args.out, cpu, args.runners, args.backends) if args.resume else {}
    results = run(cases, args.runners, args.log, after_each=write, backends=args.backends, done=done)
    table, lost = counts(results), collage_lost(results)
    for runner, c in table.items():
        print(f"{runner:<12} " + ", ".join(f"{status} {c.get(status, 0)}" for status in (RIGHT, WRONG, REFUSED, CRASHED)))
    print(f"TVM alone right, collage not: {len(lost)}" + (f" ({', '.join(lost)})" if lost else ""))


if __name__ == "__main__":
    main()
