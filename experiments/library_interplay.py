"""How two libraries' kernels slow each other in one module on this machine's cores.

Each library's transition probe (``measuring.transition``: a 3x3 convolution, else a matrix
product) is compiled eight times, as eight partitions of a model are eight kernels, and called
from one Relax module with TVM ops between calls, as a placement runs them
(``transition.chain_call``). Five modules: TVM's ops alone, A's kernels among them, B's, A's
and B's alternating (what ``optimize`` measures as the pair's interplay), and A's then B's
(blocked). Each is timed as a mean over 100 calls, the cost a serving loop pays (a median of
single calls hides the scheduler's stalls, which are the point here), seven times in turn.

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

CALLS = 100  # calls a sample's mean is over


def main() -> None:
    from collage.candidates.backend import default_backends
    from collage.measuring.cost import cpu_info
    from collage.measuring.timing import Timing
    from collage.measuring.transition import CALLS as KERNELS
    from collage.measuring.transition import TransitionTask, chain_call

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
    # (``assemble.beside_spinning``), unless told otherwise.
    spinning = {a.name: b.spins_after_calls and not args.ignore_spinning,
                b.name: a.spins_after_calls and not args.ignore_spinning}  # fmt: skip
    probes, names, callees = [], [], {}
    for backend in (a, b):
        task = TransitionTask.of(backend, target, args.threads, Timing())
        kernels, probe = task.probe_kernels(KERNELS, spinning[backend.name])
        if kernels is None:
            raise SystemExit(probe)
        names.append([f"interplay.{backend.name}.{k}" for k in range(KERNELS)])
        for name, kernel in zip(names[-1], kernels):
            tvm.register_global_func(name, kernel, override=True)
            callees[name] = backend
        probes.append(probe)

    def module(order: str, with_a: bool, with_b: bool):
        steps_a = [(0, name if with_a else None) for name in names[0]]
        steps_b = [(1, name if with_b else None) for name in names[1]]
        steps = steps_a + steps_b if order == "blocked" else [s for pair in zip(steps_a, steps_b) for s in pair]
        return chain_call(probes, steps, target, callees)

    modules = {
        "TVM's ops alone": module("alternating", False, False),
        f"{a.name} alone": module("alternating", True, False),
        f"{b.name} alone": module("alternating", False, True),
        "alternating": module("alternating", True, True),
        "blocked": module("blocked", True, True),
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
