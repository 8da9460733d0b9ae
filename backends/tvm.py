"""TVM's own code generator: LLVM on CPU, CUDA on GPU.

It runs every operator, so every graph has at least one placement. Groups follow TVM's
FuseOps rule (one anchor plus the element-wise ops consuming it, or a chain of injective
ops). In an assembled module, ``tvm`` partitions are compiled in place by TVM; the kernel
below, which runs the sub-graph on the Relax VM, serves measuring and checking it alone.
"""

import tvm
from tvm import relax

from collage.backend import OP_LEVEL, Backend
from collage.pattern import PatternRule
from collage.runner import device_for
from collage.patterns.fusion import anchor_then_elementwise


def probe(target: str) -> str | None:
    if target == "cuda" and not tvm.cuda().exist:
        return "no CUDA device visible to TVM"
    return None


def compile(func: relax.Function, pattern: str, target: str):
    executable = tvm.compile(tvm.IRModule({"main": func}), target=target)
    main = relax.VirtualMachine(executable, device_for(target))["main"]
    num_inputs = len(func.params)
    returns_tuple = isinstance(func.ret_ty, relax.TupleType)

    def kernel(*tensors):
        result = main(*tensors[:num_inputs])
        for src, dst in zip(result if returns_tuple else [result], tensors[num_inputs:]):
            src.copyto(dst)

    return kernel


BACKEND = Backend(
    name="tvm",
    kind=OP_LEVEL,
    targets=("llvm", "cuda"),
    compile=compile,
    rules=(PatternRule("tvm.fused", lambda graph, node: True, anchor_then_elementwise),),
    probe=probe,
    library=f"Apache TVM {tvm.__version__}",
)
