"""Where a batch of TVM candidates spends its seconds on a GPU, step by step.

In every H100 lend since stop 46, ResNet-50's TVM candidates took 12-14 s a batch of 37 in
the measuring worker (0.35 s each), while on a CPU machine the same batch compiles for
``cuda -arch=sm_90`` in 1.7 s, nvcc compiles its CUDA source in 1.9 s, and its kernels' logged
medians are 5-400 us. This script runs one such batch in this process as the worker does,
each step timed apart: TVM's lowering and code generation (with the CUDA compile it calls,
NVRTC by default in TVM 0.27, ``TVM_CUDA_COMPILE_MODE``), the VM's creation, each kernel's
first call (where the CUDA module is loaded), the check against the model's values, and the
timing (``Kernel.time_ms``, the project's ``Timing``).

    python3 -m experiments.gpu_tvm_batch [--size 37] [--mode nvrtc nvcc] [--target cuda]

Prints one JSON object per compile mode; each mode runs in a fresh process, so that its
first compile pays what the worker's does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time


def one_batch(size: int, target: str) -> dict:
    import numpy as np
    import tvm
    from tvm import relax

    from collage.backends import tvm as tvm_backend
    from collage.candidates.generate import distinct, generate
    from collage.measuring.arrays import mismatch
    from collage.measuring.build import device_for, intermediate_values, tvm_compile
    from collage.measuring.timing import Timing
    from collage.prepare import dataflow_graph
    from experiments import models

    steps = {}
    started = time.perf_counter()
    graph = dataflow_graph(models.load("resnet50").relax)
    candidates = distinct(generate(graph, [tvm_backend.BACKEND]))[:size]
    steps["candidates_s"] = time.perf_counter() - started

    t = time.perf_counter()
    values = intermediate_values(graph, 0)
    steps["model_values_s"] = time.perf_counter() - t

    funcs = [c.subgraph.extract() for c in candidates]
    mod = tvm.IRModule({f"candidate_{k}": f.with_attr("global_symbol", f"candidate_{k}") for k, f in enumerate(funcs)})
    t = time.perf_counter()
    executable = tvm_compile(mod, target)
    steps["tvm_compile_s"] = time.perf_counter() - t
    device = device_for(target)
    t = time.perf_counter()
    vm = relax.VirtualMachine(executable, device)
    steps["vm_s"] = time.perf_counter() - t

    first, check, timing, medians = [], 0.0, [], []
    for k, c in enumerate(candidates):
        kernel = tvm_backend.Kernel(funcs[k], vm, device, f"candidate_{k}")
        inputs = [tvm.runtime.tensor(values[v], device) for v in c.subgraph.arguments()]
        t = time.perf_counter()
        result = vm[f"candidate_{k}"](*inputs)
        device.sync()
        first.append(time.perf_counter() - t)
        t = time.perf_counter()
        outputs = result if kernel.returns_tuple else [result]
        mismatch([o.numpy() for o in outputs], [values[graph[i].var] for i in c.subgraph.outputs])
        check += time.perf_counter() - t
        t = time.perf_counter()
        medians.append(kernel.time_ms(inputs, Timing()).median_ms)
        timing.append(time.perf_counter() - t)
    steps.update(
        first_calls_s=sum(first), first_call_max_s=max(first), check_s=check, timing_s=sum(timing),
        timing_max_s=max(timing), kernel_median_ms=float(np.median(medians)), candidates=len(candidates),
        cuda_source_kb=round(_cuda_source_bytes(executable.mod) / 1e3, 1),
    )
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in steps.items()}


def _cuda_source_bytes(module) -> int:
    """The CUDA source's size in ``module`` and the modules it imports."""
    own = 0
    if module.kind == "cuda":
        with contextlib.suppress(Exception):  # a module that kept only its binary
            own = len(module.inspect_source())
    return own + sum(_cuda_source_bytes(m) for m in module.imports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=37)
    parser.add_argument("--mode", nargs="+", default=["nvrtc", "nvcc"])
    parser.add_argument("--target", default="cuda", help="llvm checks the script on a CPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_batch(args.size, args.target)), flush=True)
        return
    for mode in args.mode:
        env = dict(os.environ, TVM_CUDA_COMPILE_MODE=mode)
        run = subprocess.run([sys.executable, "-m", "experiments.gpu_tvm_batch", "--child", "--size", str(args.size),
                              "--target", args.target],
                             env=env, capture_output=True, text=True)  # fmt: skip
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"failed": run.stderr.strip().splitlines()[-3:]}
        print(json.dumps({"mode": mode, **row}), flush=True)


if __name__ == "__main__":
    main()
