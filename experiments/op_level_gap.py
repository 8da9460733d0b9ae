"""Where an op-level placement's time goes on the CPU: each library kernel timed inside the
assembled module, against its estimate (measured alone).

SwiftFormer's op-level placement through its ONNX file (stop 60, a 2-core Zen 4) was estimated
at 4.45 ms and raced at 24-32 ms: 110 partitions over TVM, 24 ONNX Runtime sessions and MKL.
This script optimizes a corpus or zoo model (from ``--cost-log``, so a second run measures
nothing), keeps the op-level finalist aside, times its call as its users call it, and then
runs its module with every library kernel wrapped in a timer: per backend, the time inside
the module against the sum of the estimates, and the kernels furthest over theirs. Run it
under different thread settings (``OMP_WAIT_POLICY=PASSIVE``, ``TVM_THREAD_POOL_SPIN_COUNT=0``)
to see whose idle threads slow the others.

    python -m experiments.op_level_gap --model swiftformer [--entry onnx|relax] [--cost-log PATH]
"""

from __future__ import annotations

import argparse
import collections
import time

import tvm
from tvm import relax

CALLS = 30


def main() -> None:
    import collage
    from collage import api
    from collage.choosing.finalists import users_call
    from collage.measuring.build import compile_module
    from collage.measuring.timing import time_call
    from experiments.models import Workload

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--entry", choices=["onnx", "relax"], default="onnx")
    parser.add_argument("--cost-log", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    w = Workload(args.model)
    kept_aside = {}
    confirmed = api._confirmed

    def spy(chosen, note, finalists, *rest, **kw):  # the finalists, before the race's choice is confirmed
        kept_aside.update(finalists)
        return confirmed(chosen, note, finalists, *rest, **kw)

    api._confirmed = spy
    collage.optimize(w.onnx if args.entry == "onnx" else w.relax, threads=args.threads, progress=False,
                     cost_log=args.cost_log)  # fmt: skip
    op_level = next((f for name, f in kept_aside.items() if str(name) == "op-level"), None)
    if op_level is None:
        raise SystemExit("no op-level finalist (the model ran whole on one engine or in TVM)")
    arrays = [t.numpy() for t in w.inputs]
    called = time_call(users_call(op_level, arrays, "llvm"))
    print(f"op-level: {len(op_level.partitions)} partitions, estimated {op_level.estimated_ms:.3f} ms, "
          f"called {called.median_ms:.3f} ms ± {called.spread_ms:.3f} (median of {called.samples} samples)")  # fmt: skip

    spent, backend_of, estimate = collections.defaultdict(float), {}, {}
    for part, name, kernel in op_level.assembly.kernels:
        backend_of[name], estimate[name] = part.backend, part.cost_ms

        def timed(*tensors, _kernel=kernel, _name=name):
            began = time.perf_counter()
            _kernel(*tensors)
            spent[_name] += time.perf_counter() - began

        tvm.register_global_func(name, timed, override=True)  # the fresh VM below looks them up anew
    vm = relax.VirtualMachine(compile_module(op_level.assembly.module, "llvm"), tvm.cpu())
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    for _ in range(10):
        vm["main"](*tensors)
    spent.clear()
    began = time.perf_counter()
    for _ in range(CALLS):
        vm["main"](*tensors)
    total = (time.perf_counter() - began) * 1e3 / CALLS
    inside, estimated = collections.defaultdict(float), collections.defaultdict(float)
    for name, s in spent.items():
        inside[backend_of[name]] += s * 1e3 / CALLS
    for part in op_level.partitions:
        estimated[part.backend] += part.cost_ms
    print(f"inside the module: {total:.3f} ms a call")
    for backend in sorted(estimated, key=lambda b: -estimated[b]):
        took = inside[backend] if backend in inside else total - sum(inside.values())
        what = "" if backend in inside else " (and the glue between kernels)"
        print(f"  {backend:12s} estimated {estimated[backend]:7.3f} ms, took {took:7.3f}{what}")
    print("furthest over their estimates:")
    for name in sorted(spent, key=lambda n: estimate[n] - spent[n] * 1e3 / CALLS)[:8]:
        print(f"  {name:28s} {spent[name] * 1e3 / CALLS:7.3f} ms inside, {estimate[name]:7.3f} estimated")


if __name__ == "__main__":
    main()
