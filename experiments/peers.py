"""The peers: each whole model run by one framework alone, the baselines Collage must beat.

A peer is one function ``prepare(workload, threads) -> Runner`` that compiles the model for
its framework and converts the inputs once, so that ``runner.run()`` does one inference and
nothing else. ``PEERS`` lists them in the order the tables and charts show them; a new
baseline (Collage itself, later) is one more entry.

The frameworks are imported inside the prepare functions, not at the top of this module,
because TVM reads its thread count from the environment when it loads: ``pin_threads`` must
run first.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from experiments import models
from experiments.models import Workload

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


def pin_threads(n: int) -> None:
    """Give every framework the same ``n`` threads. The environment variables reach libraries
    loaded later (call this before TVM is imported) and child processes; torch, loaded already,
    is set directly, and ONNX Runtime and OpenVINO also get ``n`` in their session options."""
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n)
    torch.set_num_threads(n)


@dataclass(frozen=True)
class Runner:
    """A prepared peer. ``run()`` does one inference on inputs converted beforehand and returns
    the framework's own output object; ``to_numpy(output)`` turns that into a list of arrays
    (outside the timed call) for the comparison with ``Workload.reference()``."""

    run: Callable[[], Any]
    to_numpy: Callable[[Any], list[np.ndarray]]
    info: dict = field(default_factory=dict)  # what the peer decided while preparing, for the results
    # Its outputs on other inputs (arrays in the model's input order), leaving run()'s bound
    # inputs as they are: an accuracy budget is held on more than one input set.
    outputs_on: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None


def second_draw(w: Workload) -> list[np.ndarray]:
    """Inputs drawn as the workload's own, with the next seed: the second set on which a run
    with an accuracy budget holds every peer, collage included (as calibration), to it."""
    return [t.numpy() for t in models.random_inputs(w.spec, w.input_shape, models.SEED + 1)]


def torch_outputs_on(net):
    """A function from input arrays to ``net``'s outputs on them, as arrays."""

    def outputs_on(arrays):
        with torch.inference_mode():
            return _torch_outputs(net(*[torch.from_numpy(a) for a in arrays]))

    return outputs_on


def prepare_torch(w: Workload, threads: int) -> Runner:
    """PyTorch eager mode."""
    net, inputs = w.torch, w.inputs

    def run():
        with torch.inference_mode():
            return net(*inputs)

    return Runner(run, _torch_outputs, outputs_on=torch_outputs_on(net))


def prepare_torch_compile(w: Workload, threads: int) -> Runner:
    """``torch.compile`` with the inductor backend. Inductor compiles on the first call, so that
    call is made here, where it counts as preparation time."""
    torch._dynamo.reset()  # compiled graphs of an earlier model only take memory
    net, inputs = torch.compile(w.torch, backend="inductor"), w.inputs

    def run():
        with torch.inference_mode():
            return net(*inputs)

    run()
    return Runner(run, _torch_outputs, outputs_on=torch_outputs_on(net))


def _tvm_outputs(out) -> list[np.ndarray]:
    """A Relax VM result, one tensor or a tuple (duck-typed: TVM is imported only later)."""
    return [out.numpy()] if hasattr(out, "numpy") else [t.numpy() for t in out]


def _torch_outputs(out) -> list[np.ndarray]:
    return [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def onnxruntime_session(model, threads: int, optimized_model_filepath: str | None = None, **config_entries: str):
    """An ONNX Runtime CPU session on an ONNX ModelProto with all graph optimizations and
    ``threads`` intra-op threads; ``config_entries`` are session config entries. With
    ``optimized_model_filepath``, ONNX Runtime writes its optimized graph there."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if optimized_model_filepath is not None:
        options.optimized_model_filepath = optimized_model_filepath
    for key, value in config_entries.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def openvino_request(model, threads: int, precision: str | None = "f32"):
    """An infer request of OpenVINO's CPU plugin for an ONNX ModelProto or an ``ov.Model``:
    ``precision`` f32 by default (it would pick bf16 on a CPU with native bf16; None leaves
    its own choice), ``threads`` threads, tuned for latency."""
    import openvino as ov

    core = ov.Core()
    if not isinstance(model, ov.Model):
        model = core.read_model(model.SerializeToString(), b"")
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return core.compile_model(model, "CPU", config).create_infer_request()


def prepare_onnxruntime(w: Workload, threads: int, model=None) -> Runner:
    """ONNX Runtime's CPU execution provider with all graph optimizations, on ``model`` (by
    default the model's ONNX export), called as its users call it: ``InferenceSession.run``
    with a feed of numpy arrays."""
    session = onnxruntime_session(w.onnx if model is None else model, threads)
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), w.inputs)}
    output_names = [o.name for o in session.get_outputs()]
    return Runner(
        lambda: session.run(output_names, feed),
        list,
        outputs_on=lambda arrays: session.run(output_names, {i.name: a for i, a in zip(session.get_inputs(), arrays)}),
    )


def prepare_openvino(w: Workload, threads: int, model=None, precision: str | None = "f32") -> Runner:
    """OpenVINO's CPU plugin in f32 (it would pick bf16 on a CPU with native bf16), tuned for
    latency, on ``model`` (by default the model's ONNX export), called as its users call it:
    ``InferRequest.infer`` with numpy arrays (copied into the request's inputs, outputs
    copied out)."""
    request = openvino_request(w.onnx if model is None else model, threads, precision)
    inputs = [t.numpy() for t in w.inputs]

    def outputs(result) -> list[np.ndarray]:
        return [result[port] for port in request.model_outputs]

    return Runner(lambda: request.infer(inputs), outputs, outputs_on=lambda arrays: outputs(request.infer(list(arrays))))


def prepare_tvm(w: Workload, threads: int) -> Runner:
    """TVM's default Relax pipeline for a plain ``llvm`` target. That pipeline legalizes and
    fuses operators but does not schedule them, so its kernels are untuned (and slow)."""
    import tvm
    from tvm import relax

    target = tvm.target.Target({"kind": "llvm", "num-cores": threads})
    vm = relax.VirtualMachine(tvm.compile(w.relax, target=target), tvm.cpu())
    main = vm["main"]
    inputs = [tvm.runtime.tensor(t.numpy()) for t in w.inputs]

    return Runner(lambda: main(*inputs), _tvm_outputs,
                  outputs_on=lambda arrays: _tvm_outputs(main(*[tvm.runtime.tensor(a) for a in arrays])))


PrepareFn = Callable[[Workload, int], Runner]

def prepare_openvino_default(w: Workload, threads: int) -> Runner:
    """OpenVINO as its users run it: no precision hint, so bf16 on a CPU with AVX512_BF16 or
    AMX, f32 elsewhere."""
    return prepare_openvino(w, threads, precision=None)


def prepare_collage(w: Workload, threads: int, accuracy: float | None = None, entry: str = "relax",
                    substitutions: bool = False) -> Runner:
    """Collage itself through one of its entry points (``ENTRY_POINTS``): ``collage.optimize``
    on the Relax module alone, with no file (the design's own use); on the torch module with
    its example inputs (collage exports it, and that file's engines are finalists); or on the
    ONNX file. Every usable backend. Costs come from the cost log (``$COLLAGE_COST_LOG``, else
    ``~/.cache/collage``), so only the first run of a model measures its candidates. Prints
    the placement report. Timed through the call its users make, ``opt(x)`` with numpy
    arrays; ``info`` has ``bind_ms``, a quick timing of ``OptimizedModule.bind`` beside it.
    ``substitutions`` searches graph rewrites jointly with the placement, whose start (the
    placement without them) is one of its candidates: "collage (substitutions)" beside
    "collage" shows the search never returns something slower."""
    import tvm

    import collage
    from collage.measuring.timing import Protocol, time_contenders

    # With a budget, collage holds it on the two input sets every peer is held to.
    calibration = None if accuracy is None else [[t.numpy() for t in w.inputs], second_draw(w)]
    # Only the entry's own form is built: a model torch cannot export to ONNX still has the others.
    model, extra = {"relax": lambda: (w.relax, {}), "torch": lambda: (w.torch, {"example_inputs": tuple(w.inputs)}),
                    "onnx": lambda: (w.onnx, {})}[entry]()  # fmt: skip
    opt = collage.optimize(model, threads=threads, accuracy=accuracy, calibration=calibration,
                           substitutions=substitutions, **extra)  # fmt: skip
    print(opt.report(), flush=True)
    arrays = [t.numpy() for t in w.inputs]
    quick = time_contenders({"bind": opt.bind(*[tvm.runtime.tensor(a) for a in arrays])}, Protocol(rounds=3))["bind"]

    info = {
        "entry": entry,
        # An engine running the user's file whole has no estimate (NaN, which JSON cannot hold).
        "estimated_ms": round(opt.estimated_ms, 4) if math.isfinite(opt.estimated_ms) else None,
        "bind_ms": round(quick.median_ms, 4),
        "partitions": len(opt.placement),
        "backend_shares": {b: round(share, 4) for b, share in opt.backend_shares().items()},
        "optimize_s": round(opt.record.seconds.total, 1),
        "measured_candidates": opt.record.measured,
        "chosen": str(opt.record.chosen),
        "confirmation": opt.record.confirmation,
        "finalists_ms": {str(name): round(f.measured.median_ms, 4) for name, f in opt.record.finalists.items()},
    }
    return Runner(lambda: opt(*arrays), _flat, info, outputs_on=lambda arrays: _flat(opt(*arrays)))


def _flat(result) -> list[np.ndarray]:
    """``opt(x)``'s result (an array, or tuples of them) as a flat list."""
    if isinstance(result, np.ndarray):
        return [result]
    return [a for r in result for a in _flat(r)]


# Collage's entry points, as the bench names its peers: the Relax module alone first (the
# headline: the design's own use), then the torch module and the ONNX file.
ENTRY_POINTS = {"collage": "relax", "collage (torch)": "torch", "collage (onnx)": "onnx"}


PEERS: dict[str, PrepareFn] = {
    "torch": prepare_torch,
    "torch.compile": prepare_torch_compile,
    "onnxruntime": prepare_onnxruntime,
    "openvino": prepare_openvino,
    "openvino-default": prepare_openvino_default,
    "tvm": prepare_tvm,
    **{name: functools.partial(prepare_collage, entry=entry) for name, entry in ENTRY_POINTS.items()},
    "collage (substitutions)": functools.partial(prepare_collage, entry="relax", substitutions=True),
}
# Collage's own columns: each is compared with the peers, never counted as one.
OURS = (*ENTRY_POINTS, "collage (substitutions)")
