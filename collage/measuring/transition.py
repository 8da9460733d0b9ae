"""The transition cost: what entering a backend's partition costs beyond its kernel alone.

A candidate is timed alone, called back to back, so its library's threads are awake and its
data is in cache. Inside a model the Relax VM calls out to it through ``call_dps_packed``
after other kernels ran: its thread pool has gone to sleep and must be woken, its inputs were
just written by someone else. That difference is paid at every boundary into the backend.

It is measured, per backend, on a probe: a small shape-preserving sub-graph the backend can
run (a 3x3 convolution with ReLU, else a matrix product). A chain of ``CALLS`` rounds of
[TVM ops sweeping a few MB, then a probe kernel through ``call_dps_packed``] runs on the VM;
the transition is what that chain costs beyond the same TVM ops alone and the probe's own
time back to back, per round. On the CPU each round calls a probe kernel of its own (distinct compiles,
as a model's partitions are: their own weights, their own ONNX Runtime session and thread
pool), and the sweep between them leaves the core's cache to the TVM ops, as a model's
kernels between two partitions do. One kernel called again after a few ops on a small tensor
found its weights and its threads as it had left them: it priced entering ONNX Runtime at
0.025 ms and OpenVINO at 0.034 (Zen 4, 2 threads), where inside SwiftFormer's op-level
placement a call of each of its 24 ONNX Runtime kernels cost 0.05 ms more than its second,
back-to-back call (stop 61); probed so, they were 0.032 and 0.048.
``tvm`` partitions are called by the VM directly: their transition is zero.
On CUDA the chain is compiled as an assembled module is (``build.compile_module``): with
CUDA graphs where the backend is graph-safe, whose replays call no Python at all.

Two libraries in one module also slow each other wherever their calls fall: on 2 cores,
PyTorch's OpenMP workers spinning after MKL's products kept the cores from OpenVINO's threads
(stop 61, ``experiments.library_interplay``). That *interplay* is a cost of the pair, not of a
boundary: a chain of rounds [TVM ops, A's kernel, TVM ops, B's kernel], each round's kernels
distinct compiles as a model's partitions are, costs beyond chains of A's alone and B's alone
(less TVM's ops, counted twice), per round. It is timed as means over blocks of calls: the
stalls hit a few calls each, which a median of single calls would hide.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, topi

from ..candidates.generate import generate
from ..model.graph import DataflowGraph
from .cost import Cost
from .build import build_vm, compile_kernel, device_for, is_cuda, synchronized
from .arrays import empty_outputs, random_inputs, to_tensors
from ..errors import first_line
from .timing import Timing, median_and_iqr, time_call

CALLS = 8
# TVM ops between two probe calls: about 0.1 ms of other work, as between two partitions of
# a model, long enough for a library's idle threads to stop spinning.
GAP_OPS = 16
# What the TVM ops between two probe calls sweep, besides the probe's own value: 256 KB, read
# and written GAP_OPS times (4 MB, 0.15 ms on a Zen 4's two cores), more than a core's L2.
SWEEP_SHAPE = (1, 16, 64, 64)
# Relax's OpPatternKind.kOpaque on a kernel: FuseOps fuses nothing with it.
OPAQUE = 8
# An interplay sample is the mean of calls filling this long: a few calls each stall.
INTERPLAY_BLOCK_MS = 20.0


def _function(shape: tuple[int, ...], make) -> relax.Function:
    """``main`` of one float32 tensor of ``shape``, returning ``make(bb, x)``."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"global_symbol": "main"}):
        with bb.dataflow():
            out = bb.emit_output(make(bb, x))
        bb.emit_func_output(out)
    return bb.get()["main"]


def probes() -> list[relax.Function]:
    """Shape-preserving sub-graphs with constant weights, the first a backend can run is used."""
    rng = np.random.default_rng(0)

    def conv(bb, x):
        w = relax.const(rng.standard_normal((32, 32, 3, 3)).astype("float32") * 0.05)
        return relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))

    def matmul(bb, x):
        return relax.op.matmul(x, relax.const(rng.standard_normal((256, 256)).astype("float32") * 0.05))

    return [_function((1, 32, 28, 28), conv), _function((64, 256), matmul)]


def sweep() -> relax.Function:
    """A function of one ``SWEEP_SHAPE`` tensor: a chain's stream for the TVM ops that stand
    for a model's kernels between two partitions (``chain_call``)."""
    return _function(SWEEP_SHAPE, lambda bb, x: relax.op.nn.relu(x))


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
    # With another backend's task, what is measured is the two's interplay instead (``interplay``).
    beside: TransitionTask | None = None

    @classmethod
    def of(cls, backend, target: str, threads: int, timing: Timing, beside=None) -> TransitionTask:
        """The task measuring ``backend``'s transition, or with ``beside`` (another Backend
        record) the interplay of the two."""
        tries = []
        for k, probe in enumerate(probes()):
            graph = DataflowGraph(probe)
            tries += [(k, c.pattern) for c in generate(graph, [backend]) if len(c.subgraph) == len(graph)]
        other = None if beside is None else cls.of(beside, target, threads, timing)
        return cls(backend, target, threads, timing, tuple(tries), other)

    def compiles(self) -> list[tuple[relax.Function, str]]:
        """The sub-graphs compiled to measure the transition, with their patterns, in the
        order they are tried: a compile pool can build them ahead (``warm``)."""
        from ..candidates.subgraph import SubGraph

        every = probes()
        graphs = [DataflowGraph(every[k]) for k, _ in self.tries]
        return [(SubGraph(graph, frozenset(range(len(graph)))).extract(), pattern)
                for graph, (_, pattern) in zip(graphs, self.tries)]  # fmt: skip

    def measure(self) -> Cost:
        """The transition into the backend, in ms per boundary, or with ``beside`` the two
        backends' interplay, in ms per pair of calls; invalid when a backend runs none of the
        probes."""
        if self.beside is not None:
            return self._interplay()
        # On a GPU, one kernel: a partition is a node of the module's CUDA graph, with no
        # threads to wake, and the cache it finds is the candidates' timing's (``time_flushed``);
        # inductor's eight compiles of the probe would lengthen an optimization by seconds.
        kernels, func = self.probe_kernels(1 if is_cuda(self.target) else CALLS)
        if kernels is None:
            return Cost.invalid(func)
        try:
            return _measure(kernels, func, self.target, self.timing, self.backend)
        except Exception as err:  # a backend that fails here pays no transition, never raises  # noqa: BLE001
            return Cost.invalid(f"transition probe failed: {type(err).__name__}: {first_line(err)}")

    def probe_kernels(self, count: int, beside_spinning: bool = False):
        """``count`` kernels of the first probe the backend compiles, and that probe; or None
        and why not."""
        for func, pattern in self.compiles():
            made = [compile_kernel(self.backend, func, pattern, self.target, self.threads, beside_spinning=beside_spinning)
                    for _ in range(count)]  # fmt: skip
            if all(reason is None for _, reason in made):
                return [kernel for kernel, _ in made], func
        return None, f"{self.backend.name} runs none of the transition probes"

    def _interplay(self) -> Cost:
        a, b = self.backend, self.beside.backend
        # Each compiled as the assembly compiles it beside the other (``assemble.beside_spinning``).
        mine, my_probe = self.probe_kernels(CALLS, b.spins_after_calls)
        theirs, their_probe = self.beside.probe_kernels(CALLS, a.spins_after_calls)
        if mine is None or theirs is None:
            return Cost.invalid(my_probe if mine is None else their_probe)
        try:
            return _interplay(mine, my_probe, a, theirs, their_probe, b, self.target, self.timing)
        except Exception as err:  # noqa: BLE001 -- a pair that fails here is charged nothing
            return Cost.invalid(f"interplay probe failed: {type(err).__name__}: {first_line(err)}")


def measure_transition(backend, target: str, threads: int, timing: Timing) -> Cost:
    """The transition into ``backend`` (a Backend record), in ms per boundary, measured here."""
    return TransitionTask.of(backend, target, threads, timing).measure()


def chain_call(streams: list[relax.Function], steps: list[tuple[int, str | None]], target: str, callees: dict):
    """A call of a module running ``steps`` on the VM: each step, GAP_OPS TVM ops on the value
    of its stream, then the kernel it names (registered, in ``callees`` with its backend) on
    it. A stream per probe function, of its input, so that kernels of different shapes share
    a chain."""
    xs = [relax.Var(f"x{k}", probe.params[0].ty) for k, probe in enumerate(streams)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            values = list(xs)
            for k, callee in steps:
                for _ in range(GAP_OPS):  # each a kernel of its own: fused, they were one pass
                    values[k] = bb.emit(bb.call_te(topi.multiply, values[k], 0.5, primfunc_name_hint="gap",
                                                   primfunc_attrs={"op_pattern": OPAQUE}))  # fmt: skip
                if callee is not None:
                    values[k] = bb.emit(relax.call_dps_packed(callee, relax.Tuple([values[k]]), out_ty=xs[k].ty))
            out = bb.emit_output(values[0] if len(values) == 1 else relax.Tuple(values))
        bb.emit_func_output(out)
    vm = build_vm(bb.get(), target, callees)
    device = device_for(target)
    args = [to_tensors(random_inputs(probe), device)[0] for probe in streams]
    return synchronized(lambda: vm["main"](*args), target)


def _measure(kernels: list, probe: relax.Function, target: str, timing: Timing, backend) -> Cost:
    """``CALLS`` rounds of [the sweep, a probe kernel: each its own where there are as many]
    against the rounds without the kernels and the first kernel back to back, per round."""
    names = [f"collage.transition.probe.{k}" for k in range(len(kernels))]
    for name, kernel in zip(names, kernels):
        tvm.register_global_func(name, kernel, override=True)
    rounds = lambda callee: [step for k in range(CALLS) for step in ((1, None), (0, callee(k)))]  # noqa: E731
    with_probe = chain_call([probe, sweep()], rounds(lambda k: names[k % len(names)]), target, dict.fromkeys(names, backend))
    without = chain_call([probe, sweep()], rounds(lambda k: None), target, {})
    device = device_for(target)
    inputs, outputs = to_tensors(random_inputs(probe), device), empty_outputs(probe, device)
    alone = synchronized(lambda: kernels[0](*inputs, *outputs), target)
    # Interleaved, so a change of load on the machine hits all three alike.
    deltas = []
    for _ in range(timing.min_samples):
        chained = time_call(with_probe, timing).value_ms
        plain = time_call(without, timing).value_ms
        kernel_ms = time_call(alone, timing).value_ms
        deltas.append((chained - plain) / CALLS - kernel_ms)
    for name in names:
        tvm_ffi.remove_global_func(name)
    median, spread = median_and_iqr(deltas)
    return Cost.of(max(median, 0.0), spread=spread, samples=len(deltas))


def _interplay(mine, my_probe, a, theirs, their_probe, b, target: str, timing: Timing) -> Cost:
    """What rounds of [A's kernel, B's kernel] cost beyond A's and B's rounds alone, per round."""
    names = [[f"collage.interplay.{side}.{k}" for k in range(CALLS)] for side in ("a", "b")]
    for side, kernels in zip(names, (mine, theirs)):
        for name, kernel in zip(side, kernels):
            tvm.register_global_func(name, kernel, override=True)
    callees = {name: a for name in names[0]} | {name: b for name in names[1]}

    def chain(with_a: bool, with_b: bool):
        steps = [step for k in range(CALLS)
                 for step in ((0, names[0][k] if with_a else None), (1, names[1][k] if with_b else None))]  # fmt: skip
        return chain_call([my_probe, their_probe], steps, target, callees)

    chains = {(x, y): chain(x, y) for x in (False, True) for y in (False, True)}
    # As many samples a chain as rounds ask: each takes a block, and the rounds' spread is the spread.
    blocks = dataclasses.replace(timing, min_sample_ms=max(timing.min_sample_ms, INTERPLAY_BLOCK_MS),
                                 max_samples=timing.min_samples)  # fmt: skip
    deltas = []
    for _ in range(timing.min_samples):  # interleaved, as the transition's
        ms = {uses: time_call(call, blocks).value_ms for uses, call in chains.items()}
        deltas.append((ms[True, True] - ms[True, False] - ms[False, True] + ms[False, False]) / CALLS)
    for name in names[0] + names[1]:
        tvm_ffi.remove_global_func(name)
    median, spread = median_and_iqr(deltas)
    return Cost.of(max(median, 0.0), spread=spread, samples=len(deltas))
