"""The measurer: what each candidate costs on this machine, measured once and logged.

A candidate is extracted as a standalone function (its own weights inside), compiled alone on
its backend, run once on seeded random inputs and compared with TVM's result for the same
function, then timed: warm-up, then samples until their spread is small or a cap is hit. That
happens on a runner (``isolation``): by default a worker process, so a library that crashes or
hangs costs one candidate. Anything that goes wrong (the library rejects the sub-graph,
compiling or running raises, the values disagree, the worker dies or overruns) becomes
``Cost.invalid(reason)``: the DP never picks it, and nothing is raised to the caller.

Costs go to the ``CostLog`` under (backend, library version, structural key, device, threads,
precision, pattern), so a second run over the same model measures nothing.

The measurer also serves each backend's transition cost (``transition.py``), logged the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import numpy as np
import tvm_ffi

from .backend import REFERENCE_BACKEND, BackendSet
from .candidates import Candidate
from .cost import Cost, Device
from .cost_log import CostLog, LogKey
from .isolation import MeasureRunner, MeasureTask, shared_worker
from .meters import EnergyMeter
from .timing import Timing
from .transition import measure_transition

TRANSITION = "transition"  # the pattern name of the transition-cost row in the log


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

    ``backends`` is the BackendSet the candidates come from. ``runner`` is where candidates
    are measured (default: this process's shared worker process, ``isolation.shared_worker``).
    Every measured cost is logged; ``measured`` counts what this measurer measured itself
    (zero on a re-run).
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
        runner: MeasureRunner | None = None,
        meter: EnergyMeter | None = None,
    ):
        self.backends = backends
        self.target = target
        self.device = Device.this_machine(threads or default_threads(), target)
        self.log = log if log is not None else CostLog()
        self.timing = timing
        self.precision = precision
        self.seed = seed
        self.runner = runner if runner is not None else shared_worker(self.device.threads)
        self.meter = meter  # with a meter, every cost has the energy of a call too
        self.measured = 0
        self._costs: dict[LogKey, Cost] = {}
        # The reference backend's outputs of each sub-graph function, by its structural hash
        # (not by node indices: the substitution search measures the candidates of many graphs).
        self._references: dict[int, list[np.ndarray]] = {}
        self._transitions: dict[str, float] = {}

    # -- CostSource --

    def cost(self, candidate: Candidate) -> Cost:
        key = self.key(candidate)
        cost = self._costs.get(key) or self.log.get(key)
        if cost is None:
            cost = self.log.put(key, self.measure(candidate))
            self.measured += 1
        elif self._lacks_energy(cost):  # logged before a meter was used: measured again, for it
            again = self.measure(candidate)
            self.measured += 1
            if again.is_valid and again.energy_mj is not None:
                cost = self.log.add_energy(key, again.energy_mj)
        self._costs[key] = cost
        return cost

    def transition_ms(self, backend: str) -> float:
        """What entering a partition of ``backend`` costs beyond its kernel (``transition.py``),
        measured once per backend and device and logged."""
        if backend == REFERENCE_BACKEND:
            return 0.0
        if backend not in self._transitions:
            key = self.transition_key(backend)
            cost = self.log.get(key)
            if cost is None:
                cost = self.log.put(key, measure_transition(self.backends[backend], self.target, self.timing))
            # A backend that runs none of the probes has no measured transition: it is charged none.
            self._transitions[backend] = cost.value_ms if cost.is_valid else 0.0
        return self._transitions[backend]

    def key(self, candidate: Candidate) -> LogKey:
        return LogKey.of(candidate, self.backends[candidate.backend], self.device, self.precision)

    def transition_key(self, backend: str) -> LogKey:
        """Where ``backend``'s transition cost is logged."""
        b = self.backends[backend]
        return LogKey(b.name, b.library, TRANSITION, self.device.name, self.device.threads, self.precision, TRANSITION)

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
                if cost is None or self._lacks_energy(cost):
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

    def _lacks_energy(self, cost: Cost) -> bool:
        return self.meter is not None and cost.is_valid and cost.energy_mj is None

    # -- one measurement --

    def measure(self, candidate: Candidate) -> Cost:
        """Compile, check and time one candidate on the runner; never raises."""
        backend = self.backends[candidate.backend]
        reason = backend.unavailable_reason(self.target)
        if reason is not None:
            return Cost.invalid(reason)
        try:
            func = candidate.subgraph.extract()
        except ValueError as err:  # a dynamic or symbolic shape: nothing can be measured
            return Cost.invalid(str(err))
        function_key = tvm_ffi.structural_hash(func)
        task = MeasureTask(backend, func, candidate.pattern, self.target, self.seed, self.timing,
                           self._references.get(function_key), self.meter)
        result = self.runner.run(task)
        if result.reference is not None:
            self._references[function_key] = result.reference
        return result.cost


def default_threads() -> int:
    """The cores this process may run on (2 on the development machines)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
