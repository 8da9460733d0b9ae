"""TVM's own code generator: LLVM on CPU, CUDA on GPU.

It runs every operator, so every graph has at least one placement. Groups follow TVM's
FuseOps rule (one anchor plus the element-wise ops consuming it, or a chain of injective
ops). In an assembled module, ``tvm`` partitions are compiled in place by TVM; the kernel
below, which runs the sub-graph on the Relax VM, serves measuring and checking it alone.
"""

import math

import tvm
from collage.patterns.fusion import anchor_then_elementwise
from tvm import relax

from collage.candidates.backend import OP_LEVEL, Backend
from collage.model.graph import CALLEES_ATTR
from collage.candidates.pattern import PatternRule
from collage.measuring.build import as_module, device_for, tvm_compile


def probe(target: str) -> str | None:
    if target == "cuda" and not tvm.cuda().exist:
        return "no CUDA device visible to TVM"
    return None


class Kernel:
    """The sub-graph on the Relax VM. Called destination-passing style it copies its results
    into the caller's outputs; ``time_ms`` times it with TVM's own timer instead, as the VM of
    an assembled module would run it (no Python in the loop, no copy)."""

    def __init__(self, func: relax.Function, vm: relax.VirtualMachine, device, name: str = "main"):
        self.vm, self.device, self.name = vm, device, name
        self.num_inputs = len(func.params)
        self.returns_tuple = isinstance(func.ret_ty, relax.TupleType)

    def __call__(self, *tensors):
        result = self.vm[self.name](*tensors[: self.num_inputs])
        for src, dst in zip(result if self.returns_tuple else [result], tensors[self.num_inputs :]):
            src.copyto(dst)

    def time_ms(self, inputs, timing, meter=None):
        from collage.measuring.timing import over_ceiling, sample_until_stable, time_flushed

        first = self.vm.time_evaluator(self.name, self.device, number=1, repeat=1)(*inputs)
        if (capped := over_ceiling(first.mean * 1e3, timing, meter)) is not None:
            return capped
        if timing.cache_flush_bytes:
            import tvm_ffi

            # The VM launches on TVM's stream, made torch's current one: the flush and the events are torch's.
            with tvm_ffi.use_torch_stream():
                return time_flushed(lambda: self.vm[self.name](*inputs), timing, meter)
        once = self.vm.time_evaluator(self.name, self.device, number=1, repeat=max(timing.warmup, 1))(*inputs)
        number = max(1, math.ceil(timing.min_sample_ms / 1e3 / max(once.min, 1e-7)))
        evaluator = self.vm.time_evaluator(self.name, self.device, number=number, repeat=1)
        return sample_until_stable(lambda: evaluator(*inputs).mean * 1e3, timing, meter, calls_per_sample=number)


def compile(func: relax.Function, pattern: str, target: str, threads: int) -> Kernel:
    # TVM's thread pool is the process's, sized once when it starts (``collage.measuring.threads``).
    device = device_for(target)
    return Kernel(func, relax.VirtualMachine(tvm_compile(as_module(func), target), device), device)


def compile_many(funcs: list[relax.Function], patterns: list[str], target: str, threads: int) -> list[Kernel]:
    """The kernels of ``funcs``, from one module (``candidate_<k>``) compiled once: LLVM is
    set up per module, and for small sub-graphs that is most of the work (LeViT's
    candidates: 54 ms each alone, 7.5 ms each sixty at a time). A sub-graph that calls
    module functions of its own (``call_tir``) is compiled alone: callees of two sub-graphs
    may share a name."""
    alone = {k for k, func in enumerate(funcs) if func.attrs is not None and CALLEES_ATTR in func.attrs}
    mod = tvm.IRModule({f"candidate_{k}": func.with_attr("global_symbol", f"candidate_{k}")
                        for k, func in enumerate(funcs) if k not in alone})  # fmt: skip
    device = device_for(target)
    vm = relax.VirtualMachine(tvm_compile(mod, target), device) if len(mod.functions) else None
    return [compile(func, pattern, target, threads) if k in alone else Kernel(func, vm, device, f"candidate_{k}")
            for k, (func, pattern) in enumerate(zip(funcs, patterns))]  # fmt: skip


BACKEND = Backend(
    name="tvm",
    kind=OP_LEVEL,
    targets=("llvm", "cuda"),
    compile=compile,
    compile_many=compile_many,
    rules=(PatternRule("tvm.fused", lambda graph, node: True, anchor_then_elementwise),),
    probe=probe,
    # Costs of other CPU code than ``build.tvm_compile``'s (the host's x86-64 level, vector
    # transcendentals, element-wise kernels on every core) are not these.
    library=f"Apache TVM {tvm.__version__} (CPU: the host's level, vector math, element-wise on every core)",
    graph_safe=True,  # TVM launches its kernels on its current stream, and its capture pass knows them
)
