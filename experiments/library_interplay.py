"""How two libraries' kernels slow each other in one module on this machine's cores.

Each library's transition probe (``measuring.transition``: a 3x3 convolution, else a matrix
product) is compiled eight times, as eight partitions of a model are eight kernels, and called
from one Relax module with TVM ops between calls, as a placement runs them. Five modules: TVM's
ops alone, A's kernels among them, B's, A's and B's alternating, and A's then B's (blocked).
Each is timed as a mean over 100 calls, the cost a serving loop pays (a median of single calls
hides the scheduler's stalls, which are the point here), seven times in turn.

What is beyond the sum of A's and B's costs alone is their interplay. On a 2-core Zen 4 (stop
61) MKL's products beside ONNX Runtime's convolutions cost 0.24 ms a pair of calls more
alternating, 0.34 blocked: not a cost of the boundary between them but of sharing the cores,
PyTorch's OpenMP workers spinning after each product while ONNX Runtime's caller spun waiting
for its own workers. Since ONNX Runtime's kernels never spin beside such a library
(``Backend.spins_after_calls``), 0.07 and 0.04; OpenVINO's beside MKL's, 0.21 and 0.12.

    python -m experiments.library_interplay mkl onnxruntime [--rounds 7] [--ignore-spinning]
"""

from __future__ import annotations

import argparse
import statistics
import time

import tvm
from tvm import relax

KERNELS = 8  # distinct kernels of each library, as a placement's partitions are
GAP_OPS = 16  # TVM ops before each call, as between two partitions of a model
CALLS = 100  # calls a sample's mean is over


def main() -> None:
    from collage.candidates.backend import default_backends
    from collage.measuring.arrays import random_inputs, to_tensors
    from collage.measuring.build import build_vm, compile_kernel, device_for, synchronized
    from collage.measuring.cost import cpu_info
    from collage.measuring.timing import Timing
    from collage.measuring.transition import TransitionTask, probes

    parser = argparse.ArgumentParser()
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ignore-spinning", action="store_true",
                        help="compile each kernel as if its neighbour's threads slept (as before stop 61)")
    args = parser.parse_args()
    target, backends = "llvm", default_backends()
    a, b = backends[args.first], backends[args.second]
    # Each kernel compiled as the assembly compiles it beside the other library
    # (``assemble.beside_spinning``).
    spinning = {a.name: b.spins_after_calls and not args.ignore_spinning,
                b.name: a.spins_after_calls and not args.ignore_spinning}

    def kernels(backend) -> list[tuple[str, relax.Function]]:
        task = TransitionTask.of(backend, target, args.threads, Timing())
        for (k, pattern), func in zip(task.tries, (f for f, _ in task.compiles())):
            made = [compile_kernel(backend, func, pattern, target, args.threads, beside_spinning=spinning[backend.name])
                    for _ in range(KERNELS)]  # fmt: skip
            if all(reason is None for _, reason in made):
                names = [f"interplay.{backend.name}.{i}" for i in range(KERNELS)]
                for name, (kernel, _) in zip(names, made):
                    tvm.register_global_func(name, kernel, override=True)
                return [(name, probes()[k]) for name in names]
        raise SystemExit(f"{backend.name} runs none of the transition probes")

    calls = {a.name: kernels(a), b.name: kernels(b)}
    device = device_for(target)

    def module(sequence: list[tuple[str, bool]]):
        """One stream of values per library; each step, TVM's ops on that stream, then (where
        the step says so) the library's next kernel."""
        streams = {name: relax.Var(f"x_{name}", calls[name][0][1].params[0].ty) for name in calls}
        bb, used, turn = relax.BlockBuilder(), {}, {name: 0 for name in calls}
        with bb.function("main", list(streams.values())):
            with bb.dataflow():
                values = dict(streams)
                for name, call in sequence:
                    for _ in range(GAP_OPS):
                        values[name] = bb.emit(relax.op.multiply(values[name], relax.const(0.5, "float32")))
                    if call:
                        callee, func = calls[name][turn[name]]
                        turn[name] += 1
                        used[callee] = backends[name]
                        values[name] = bb.emit(relax.call_dps_packed(callee, relax.Tuple([values[name]]),
                                                                     out_ty=func.params[0].ty))  # fmt: skip
                out = bb.emit_output(relax.Tuple(list(values.values())))
            bb.emit_func_output(out)
        vm = build_vm(bb.get(), target, used)
        inputs = [to_tensors(random_inputs(calls[name][0][1]), device)[0] for name in calls]
        return synchronized(lambda: vm["main"](*inputs), target)

    def steps(name: str, call: bool) -> list[tuple[str, bool]]:
        return [(name, call)] * KERNELS

    def alternating(x, y):
        return [step for pair in zip(x, y) for step in pair]

    modules = {
        "TVM's ops alone": module(alternating(steps(a.name, False), steps(b.name, False))),
        f"{a.name} alone": module(alternating(steps(a.name, True), steps(b.name, False))),
        f"{b.name} alone": module(alternating(steps(a.name, False), steps(b.name, True))),
        "alternating": module(alternating(steps(a.name, True), steps(b.name, True))),
        "blocked": module(steps(a.name, True) + steps(b.name, True)),
    }
    means: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(args.rounds):
        for name, call in modules.items():
            for _ in range(CALLS // 5):
                call()
            began = time.perf_counter()
            for _ in range(CALLS):
                call()
            means[name].append((time.perf_counter() - began) * 1e3 / CALLS)
    ms = {name: statistics.median(v) for name, v in means.items()}
    info = cpu_info()
    print(f"{info['model']} ({', '.join(info['isa'])}), {args.threads} threads; {KERNELS} kernels of each, "
          f"beside spinning: {a.name} {spinning[a.name]}, {b.name} {spinning[b.name]}")  # fmt: skip
    for name, v in means.items():
        print(f"  {name:24s} {ms[name]:7.3f} ms a call (spread {min(v):.3f}-{max(v):.3f})")
    alone = ms[f"{a.name} alone"] + ms[f"{b.name} alone"] - ms["TVM's ops alone"]
    for order in ("alternating", "blocked"):
        print(f"interplay, {order}: {(ms[order] - alone) / KERNELS:+.3f} ms a pair of calls")


if __name__ == "__main__":
    main()
