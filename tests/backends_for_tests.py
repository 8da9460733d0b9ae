"""Small NumPy backends for testing the measurer and optimize: one that is right, and ones
that fail in each way a real library can (compile error, run error, wrong values, a crash of
the whole process, a hang); and a test-only energy meter."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
from tvm import relax

from collage.candidates.backend import OP_LEVEL, Backend, Unsupported
from collage.measuring.cost import Cost
from collage.candidates.pattern import PatternRule

ELEMENTWISE = {"relax.nn.relu": lambda x: np.maximum(x, 0), "relax.exp": np.exp, "relax.sigmoid": lambda x: 0.5 * (1 + np.tanh(x / 2))}


def _one_elementwise_op(graph, node):
    return node.op in ELEMENTWISE


def _chain(group, node):
    return True


def compile_elementwise(func, pattern, target, threads):
    """A chain of unary element-wise ops, run by NumPy on the caller's buffers."""
    ops = []
    for binding in func.body.blocks[0].bindings:
        if isinstance(binding.value, relax.Var):  # the output binding
            continue
        name = binding.value.op.name
        if name not in ELEMENTWISE:
            raise Unsupported(f"no NumPy kernel for {name}")
        ops.append(ELEMENTWISE[name])

    def kernel(x, out):
        value = np.from_dlpack(x)
        for op in ops:
            value = op(value)
        np.copyto(np.from_dlpack(out), value)

    return kernel


NUMPY = Backend(
    name="numpy",
    kind=OP_LEVEL,
    targets=("llvm",),
    compile=compile_elementwise,
    rules=(PatternRule("numpy.chain", _one_elementwise_op, _chain, max_size=3),),
    library=f"NumPy {np.__version__}",
)


def _cannot_compile(func, pattern, target, threads):
    raise RuntimeError("the library crashed while compiling\nsecond line")


def _raises_when_run(func, pattern, target, threads):
    def kernel(*tensors):
        raise MemoryError("out of scratch space")

    return kernel


def _wrong(func, pattern, target, threads):
    right = compile_elementwise(func, pattern, target, threads)

    def kernel(x, out):
        right(x, out)
        np.from_dlpack(out)[...] += 1.0

    return kernel


def _aborts_when_compiling(func, pattern, target, threads):
    """A library that crashes the process (a failed assertion in C++ calls abort)."""
    os.abort()


def _hangs_when_run(func, pattern, target, threads):
    def kernel(*tensors):
        time.sleep(3600)  # a deadlocked library

    return kernel


def variant(name: str, compile, compile_many=None) -> Backend:
    rule = PatternRule(f"{name}.chain", _one_elementwise_op, _chain, max_size=3)
    return dataclasses.replace(NUMPY, name=name, compile=compile, compile_many=compile_many, rules=(rule,))


BATCHES: list[int] = []  # the size of each batch ``compile_elementwise_together`` was given


def compile_elementwise_together(funcs, patterns, target, threads):
    BATCHES.append(len(funcs))
    return [compile_elementwise(f, p, target, threads) for f, p in zip(funcs, patterns)]


def _batch_rejected(funcs, patterns, target, threads):
    """A library that rejects a batch as soon as one of its sub-graphs is bad."""
    raise RuntimeError("one sub-graph of the batch does not compile")


def _batch_aborts(funcs, patterns, target, threads):
    os.abort()


CANNOT_COMPILE = variant("cannot_compile", _cannot_compile)
RAISES_WHEN_RUN = variant("raises_when_run", _raises_when_run)
WRONG = variant("wrong", _wrong)
ABORTS = variant("aborts", _aborts_when_compiling)
HANGS = variant("hangs", _hangs_when_run)
# Each compiles several sub-graphs at once (``Backend.compile_many``), and each alone as NumPy.
TOGETHER = variant("together", compile_elementwise, compile_elementwise_together)
BATCH_REJECTED = variant("batch_rejected", compile_elementwise, _batch_rejected)
BATCH_ABORTS = variant("batch_aborts", compile_elementwise, _batch_aborts)


def _priced_cheaply(kernel):
    """``kernel``, timing itself at a fixed 1 ns a call: a test-only price, far below TVM's, so
    the placement takes it whatever the machine's load makes of two microsecond kernels."""
    kernel.time_ms = lambda inputs, timing, meter=None: Cost.of(1e-6)
    return kernel


class RightOnlyWhenMeasured:
    """Each sub-graph's first kernel is right, later ones are wrong: a library that passes the
    measurer's check and then misbehaves inside the model (what the end-to-end check is for).
    Priced far below TVM, so the placement takes it."""

    def __init__(self):
        self.seen = set()
        self.backend = variant("flaky", self.compile)

    def compile(self, func, pattern, target, threads):
        text = func.script()
        first = text not in self.seen
        self.seen.add(text)
        return _priced_cheaply((compile_elementwise if first else _wrong)(func, pattern, target, threads))


class CompilesOnlyOnce:
    """Each sub-graph compiles once (when measured); compiling it again for the model fails.
    Priced far below TVM, so the placement takes it."""

    def __init__(self):
        self.seen = set()
        self.backend = variant("once", self.compile)

    def compile(self, func, pattern, target, threads):
        text = func.script()
        if text in self.seen:
            raise RuntimeError("license expired")
        self.seen.add(text)
        return _priced_cheaply(compile_elementwise(func, pattern, target, threads))


@dataclasses.dataclass(frozen=True)
class ClockMeter:
    """A test-only energy meter: a machine drawing ``watts`` whatever runs, so a call's energy
    is its wall time times ``watts``. It tests the energy path; it measures nothing real."""

    watts: float = 50.0
    name: str = "test clock"

    def read(self) -> tuple[float, ...]:
        return (time.perf_counter(),)

    def joules(self, before, after) -> float:
        return (after[0] - before[0]) * self.watts


def coarse(name: str, errors: dict[str, float]) -> Backend:
    """NumPy's element-wise chains, offered in the reduced precisions ``errors`` names too,
    each computed off by its error relative to each output's largest magnitude: a library
    whose reduced precisions are as coarse as that, on any CPU."""

    def compile_coarse(func, pattern, target, threads, precision="float32"):
        right = compile_elementwise(func, pattern, target, threads)
        if precision == "float32":
            return right

        def kernel(x, out):
            right(x, out)
            values = np.from_dlpack(out)
            values += errors[precision] * np.abs(values).max()

        return kernel

    return dataclasses.replace(NUMPY, name=name, compile=compile_coarse, rules=(PatternRule(f"{name}.chain", _one_elementwise_op, _chain, max_size=3),),
                               precisions=lambda target: tuple(errors))  # fmt: skip


FINE = coarse("fine", {"bfloat16": 1e-3})  # within a 1e-2 budget
TOO_COARSE = coarse("too_coarse", {"bfloat16": 0.3})  # far outside it
