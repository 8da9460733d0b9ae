"""The transition cost: what entering a backend's partition costs beyond its kernel alone.

A candidate is timed alone, called back to back, so its library's threads are awake and its
data is in cache. Inside a model the Relax VM calls out to it through ``call_dps_packed``
after other kernels ran: its thread pool has gone to sleep and must be woken, its inputs were
just written by someone else. That difference is paid at every boundary into the backend.

It is measured, per backend, on a probe: a small shape-preserving sub-graph the backend can
run (a 3x3 convolution with ReLU, else a matrix product). A chain of ``calls`` rounds of
[a few TVM ops, then the probe through ``call_dps_packed``] runs on the VM; the transition is
what that chain costs beyond the same TVM ops alone and the probe's own time back to back,
per round. ``tvm`` partitions are called by the VM directly: their transition is zero.
On CUDA the chain is compiled as an assembled module is (``build.compile_module``): with
CUDA graphs where the backend is graph-safe, whose replays call no Python at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..candidates.generate import generate
from ..model.graph import DataflowGraph
from .cost import Cost
from .build import build_vm, compile_kernel, device_for, synchronized
from .arrays import empty_outputs, random_inputs, to_tensors
from ..errors import first_line
from .timing import Timing, median_and_iqr, time_call

CALLS = 8
# TVM ops between two probe calls: about 0.1 ms of other work, as between two partitions of
# a model, long enough for a library's idle threads to stop spinning.
GAP_OPS = 16


def probes() -> list[relax.Function]:
    """Shape-preserving sub-graphs with constant weights, the first a backend can run is used."""
    rng = np.random.default_rng(0)

    def build(shape, make):
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [x], {"global_symbol": "main"}):
            with bb.dataflow():
                out = bb.emit_output(make(bb, x))
            bb.emit_func_output(out)
        return bb.get()["main"]

    def conv(bb, x):
        w = relax.const(rng.standard_normal((32, 32, 3, 3)).astype("float32") * 0.05)
        return relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))

    def matmul(bb, x):
        return relax.op.matmul(x, relax.const(rng.standard_normal((256, 256)).astype("float32") * 0.05))

    return [build((1, 32, 28, 28), conv), build((64, 256), matmul)]


@dataclass(frozen=True)
class TransitionTask:
    """Measuring ``backend``'s transition, as a runner's task (``runner.MeasureRunner``),
    so that it is measured where the candidates are. ``tries`` are the (probe index,
    pattern) of the backend's candidates for a whole probe, in order: found where the
    backend's patterns are (``of``), compiled and timed where it runs (``measure``)."""

    backend: object  # its Backend record
    target: str
    threads: int
    timing: Timing
    tries: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, backend, target: str, threads: int, timing: Timing) -> TransitionTask:
        tries = []
        for k, probe in enumerate(probes()):
            graph = DataflowGraph(probe)
            tries += [(k, c.pattern) for c in generate(graph, [backend]) if len(c.subgraph) == len(graph)]
        return cls(backend, target, threads, timing, tuple(tries))

    def compiles(self) -> list[tuple[relax.Function, str]]:
        """The sub-graphs compiled to measure the transition, with their patterns, in the
        order they are tried: a compile pool can build them ahead (``warm``)."""
        from ..candidates.subgraph import SubGraph

        every = probes()
        graphs = [DataflowGraph(every[k]) for k, _ in self.tries]
        return [(SubGraph(graph, frozenset(range(len(graph)))).extract(), pattern)
                for graph, (_, pattern) in zip(graphs, self.tries)]  # fmt: skip

    def measure(self) -> Cost:
        """The transition into the backend, in ms per boundary; invalid when it runs none of
        the probes."""
        for func, pattern in self.compiles():
            kernel, reason = compile_kernel(self.backend, func, pattern, self.target, self.threads)
            if reason is not None:  # this probe is not for this backend; try the next
                continue
            try:
                return _measure(kernel, func, self.target, self.timing, self.backend)
            except Exception as err:  # a backend that fails here pays no transition, never raises  # noqa: BLE001
                return Cost.invalid(f"transition probe failed: {type(err).__name__}: {first_line(err)}")
        return Cost.invalid(f"{self.backend.name} runs none of the transition probes")


def measure_transition(backend, target: str, threads: int, timing: Timing) -> Cost:
    """The transition into ``backend`` (a Backend record), in ms per boundary, measured here."""
    return TransitionTask.of(backend, target, threads, timing).measure()


def _measure(kernel, probe: relax.Function, target: str, timing: Timing, backend) -> Cost:
    name = "collage.transition.probe"
    tvm.register_global_func(name, kernel, override=True)
    ty = probe.params[0].ty

    def chain(with_probe: bool):
        x = relax.Var("x", ty)
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                v = x
                for _ in range(CALLS):
                    for _ in range(GAP_OPS):
                        v = bb.emit(relax.op.multiply(v, relax.const(0.5, "float32")))
                    if with_probe:
                        v = bb.emit(relax.call_dps_packed(name, relax.Tuple([v]), out_ty=ty))
                out = bb.emit_output(v)
            bb.emit_func_output(out)
        vm = build_vm(bb.get(), target, {name: backend})
        arg = to_tensors(random_inputs(probe), device)[0]
        return synchronized(lambda: vm["main"](arg), target)

    device = device_for(target)
    with_probe, without = chain(True), chain(False)
    inputs, outputs = to_tensors(random_inputs(probe), device), empty_outputs(probe, device)
    alone = synchronized(lambda: kernel(*inputs, *outputs), target)
    # Interleaved, so a change of load on the machine hits all three alike.
    deltas = []
    for _ in range(timing.min_samples):
        chained = time_call(with_probe, timing).value_ms
        plain = time_call(without, timing).value_ms
        kernel_ms = time_call(alone, timing).value_ms
        deltas.append((chained - plain) / CALLS - kernel_ms)
    tvm_ffi.remove_global_func(name)
    median, spread = median_and_iqr(deltas)
    return Cost.of(max(median, 0.0), spread=spread, samples=len(deltas))
