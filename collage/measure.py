"""The measurer: what each candidate costs on this machine, measured once and logged.

A candidate is extracted as a standalone function (its own weights inside), compiled alone on
its backend, run once on seeded random inputs and compared with TVM's result for the same
function, then timed: warm-up, then samples until their spread is small or a cap is hit.
Anything that goes wrong (the library rejects the sub-graph, compiling or running raises,
the values disagree) becomes ``Cost.invalid(reason)``: the DP never picks it, and nothing is
raised to the caller.

Costs go to the ``CostLog`` under (backend, library version, structural key, device, threads,
precision, pattern), so a second run over the same model measures nothing.

The transition cost is measured here too: what it takes the Relax VM to hand control to a
kernel outside TVM (``call_dps_packed`` into a Python function) and back, beyond running a
TVM kernel in its place. It is paid once per partition that is not on ``tvm``.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .backend import BackendSet, Unsupported
from .candidates import Candidate
from .cost import Cost, Device
from .cost_log import CostLog, LogKey
from .runner import device_for, empty_outputs, first_line, mismatch, random_inputs, run_reference, to_tensors

REFERENCE_BACKEND = "tvm"  # its kernels are TVM's default pipeline: their outputs are the reference
TRANSITION = "transition"  # the pattern name of the transition-cost row in the log


@dataclass(frozen=True)
class Timing:
    """How long to time one candidate.

    A sample is ``number`` back-to-back calls, with ``number`` chosen so a sample lasts at least
    ``min_sample_ms`` (the timer's resolution and Python's call overhead wash out). Sampling
    stops once ``min_samples`` are in and their interquartile range is within ``rel_spread``
    of the median, or at ``max_samples``, or when ``budget_s`` is spent (with at least
    ``min_samples``): a 50 ms TVM convolution needs fewer samples than a 5 µs add to be known.
    """

    warmup: int = 1
    min_samples: int = 5
    max_samples: int = 30
    rel_spread: float = 0.05
    min_sample_ms: float = 1.0
    budget_s: float = 2.0


def time_call(call: Callable[[], None], timing: Timing = Timing()) -> Cost:
    """Median and interquartile range, in ms, of one ``call()``."""
    start = time.perf_counter()
    for _ in range(timing.warmup):
        call()
    once = max((time.perf_counter() - start) / max(timing.warmup, 1), 1e-7)
    number = max(1, math.ceil(timing.min_sample_ms / 1e3 / once))

    def sample() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            call()
        return (time.perf_counter() - t0) * 1e3 / number

    return sample_until_stable(sample, timing)


def sample_until_stable(sample: Callable[[], float], timing: Timing = Timing()) -> Cost:
    """Take samples (each ``sample()`` returns ms per call) as ``timing`` says; warm-up is the
    caller's."""
    deadline = time.perf_counter() + timing.budget_s
    samples: list[float] = []
    while len(samples) < timing.max_samples:
        samples.append(sample())
        if len(samples) >= timing.min_samples:
            median, spread = _median_and_iqr(samples)
            if spread <= timing.rel_spread * median or time.perf_counter() > deadline:
                break
    median, spread = _median_and_iqr(samples)
    return Cost.of(median, spread=spread, samples=len(samples))


def _median_and_iqr(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


def pin_threads(threads: int) -> None:
    """Run every backend on ``threads`` threads: torch (oneDNN, MKL) at once, and through the
    environment TVM's thread pool (read when it starts, at its first parallel kernel) and the
    ONNX Runtime and OpenVINO sessions compiled from now on (``COLLAGE_NUM_THREADS``).

    Not ``runtime.config_threadpool``: it pins the calling thread to a core, and torch's OpenMP
    threads then share that core with it (a 0.08 ms convolution took 16 ms)."""
    os.environ["COLLAGE_NUM_THREADS"] = str(threads)
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


class Measurer:
    """The ``CostSource`` of real runs: logged costs first, measurements for the rest.

    ``backends`` is the BackendSet the candidates come from. Every measured cost is logged;
    ``measured`` counts what this measurer measured itself (zero on a re-run).
    """

    def __init__(
        self,
        backends: BackendSet,
        target: str = "llvm",
        threads: int | None = None,
        log: CostLog | None = None,
        timing: Timing = Timing(),
        precision: str = "float32",
        seed: int = 0,
    ):
        self.backends = backends
        self.target = target
        self.device = Device.this_machine(threads or default_threads(), target)
        self.log = log if log is not None else CostLog()
        self.timing = timing
        self.precision = precision
        self.seed = seed
        self.measured = 0
        self._costs: dict[LogKey, Cost] = {}
        self._references: dict[frozenset[int], list[np.ndarray]] = {}
        self._transition_ms: float | None = None

    # -- CostSource --

    def cost(self, candidate: Candidate) -> Cost:
        key = self.key(candidate)
        cost = self._costs.get(key) or self.log.get(key)
        if cost is None:
            cost = self.log.put(key, self.measure(candidate))
            self.measured += 1
        self._costs[key] = cost
        return cost

    def transition_ms(self, backend: str) -> float:
        """What entering a partition of ``backend`` costs beyond its kernel: zero for ``tvm``,
        whose kernels the VM calls directly, else the measured ``call_dps_packed`` round trip."""
        if backend == REFERENCE_BACKEND:
            return 0.0
        if self._transition_ms is None:
            key = LogKey("call_dps_packed", f"Apache TVM {tvm.__version__}", "python-kernel",
                         self.device.name, self.device.threads, self.precision, TRANSITION)
            cost = self.log.get(key)
            if cost is None:
                cost = self.log.put(key, measure_transition(self.timing))
            self._transition_ms = cost.value_ms
        return self._transition_ms

    def key(self, candidate: Candidate) -> LogKey:
        return LogKey.of(candidate, self.backends[candidate.backend], self.device, self.precision)

    def missing(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """The distinct candidates with no logged cost, the reference backend first for each
        sub-graph (its run gives the reference the others are checked against)."""
        todo: dict[LogKey, Candidate] = {}
        with self.log:
            for c in candidates:
                key = self.key(c)
                if key in todo or key in self._costs:
                    continue
                cost = self.log.get(key)
                if cost is None:
                    todo[key] = c
                else:
                    self._costs[key] = cost
        return sorted(todo.values(), key=lambda c: (min(c.subgraph.nodes), c.backend != REFERENCE_BACKEND))

    def measure_all(self, candidates: Iterable[Candidate], progress: bool = True) -> None:
        """Measure every candidate not in the log, with a progress bar on stderr."""
        from tqdm import tqdm

        todo = self.missing(candidates)
        for c in tqdm(todo, desc="measuring", unit="candidate", disable=not progress or not todo,
                      file=sys.stderr, dynamic_ncols=True, smoothing=0.05, mininterval=0.5):
            self.cost(c)

    # -- one measurement --

    def measure(self, candidate: Candidate) -> Cost:
        """Compile, check and time one candidate; never raises."""
        backend = self.backends[candidate.backend]
        reason = backend.unavailable_reason(self.target)
        if reason is not None:
            return Cost.invalid(reason)
        try:
            func = candidate.subgraph.extract()
            arrays = random_inputs(func, self.seed)
        except ValueError as err:  # a dynamic or symbolic shape: nothing can be measured
            return Cost.invalid(str(err))
        try:
            kernel = backend.compile(func, candidate.pattern, self.target)
        except Unsupported as err:
            return Cost.invalid(f"unsupported: {err}")
        except Exception as err:  # a library's own compile error excludes the candidate
            return Cost.invalid(f"compile failed: {type(err).__name__}: {first_line(err)}")
        device = device_for(self.target)
        inputs, outputs = to_tensors(arrays, device), empty_outputs(func, device)
        try:
            kernel(*inputs, *outputs)
            actual = [o.numpy() for o in outputs]
            problem = mismatch(actual, self._reference(candidate, func, arrays, actual))
            if problem is not None:
                return Cost.invalid(f"wrong result: {problem}")
            timer = getattr(kernel, "time_ms", None)
            if timer is not None:  # a kernel that can time itself without Python's overhead
                return timer(inputs, self.timing)
            return time_call(lambda: kernel(*inputs, *outputs), self.timing)
        except Exception as err:
            return Cost.invalid(f"run failed: {type(err).__name__}: {first_line(err)}")

    def _reference(self, candidate, func, arrays, actual) -> list[np.ndarray]:
        nodes = candidate.subgraph.nodes
        if nodes not in self._references:
            if candidate.backend == REFERENCE_BACKEND:
                self._references[nodes] = actual
            else:
                self._references[nodes] = run_reference(func, arrays)
        return self._references[nodes]


def default_threads() -> int:
    """The cores this process may run on (2 on the development machines)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def measure_transition(timing: Timing = Timing(), calls: int = 16) -> Cost:
    """The Relax VM's cost of calling out to a Python kernel and back, per call: a chain of
    ``calls`` small TVM ops with a no-op ``call_dps_packed`` after each, minus the same chain
    without them."""
    name = "collage.measure.noop"
    tvm.register_global_func(name, lambda *tensors: None, override=True)
    ty = relax.TensorType((1, 16), "float32")

    def chain(with_calls: bool):
        x = relax.Var("x", ty)
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                v = x
                for _ in range(calls):
                    v = bb.emit(relax.op.add(v, v))
                    if with_calls:
                        v = bb.emit(relax.call_dps_packed(name, relax.Tuple([v]), out_ty=ty))
                out = bb.emit_output(v)
            bb.emit_func_output(out)
        vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
        arg = tvm.runtime.tensor(np.ones((1, 16), "float32"))
        return lambda: vm["main"](arg)

    plain, called = chain(False), chain(True)
    # Interleaved, so that a load change on the machine hits both the same way.
    deltas = []
    for _ in range(timing.min_samples):
        deltas.append(time_call(called, timing).value_ms - time_call(plain, timing).value_ms)
    per_call = max(statistics.median(deltas), 0.0) / calls
    return Cost.of(per_call, spread=_median_and_iqr(deltas)[1] / calls, samples=len(deltas))
