"""The measurer: what each candidate costs on this machine, measured once and logged.

A candidate is extracted as a standalone function (its own weights inside), compiled alone on
its backend (TVM's, several to a module), run once on the values it reads in the model (one
unoptimized TVM run of the whole graph on seeded inputs computes them all) and compared with
the values that run computed for its outputs, then timed: warm-up, then samples until their
spread is small or a cap is hit. Candidates no winning placement would use are not measured
(``SearchBound``). That
happens on a runner (``isolation``): by default a worker process, so a library that crashes or
hangs costs one candidate. Anything that goes wrong (the library rejects the sub-graph,
compiling or running raises, the values disagree, the worker dies or overruns) becomes
``Cost.invalid(reason)``: the DP never picks it, and nothing is raised to the caller.

Costs go to the ``CostLog`` under (backend, library version, structural key, device, threads,
precision, pattern), so a second run over the same model measures nothing.

The measurer also serves each backend's transition cost (``transition.py``), logged the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import tvm_ffi

from ..candidates.backend import REFERENCE_BACKEND, BackendSet
from ..candidates.generate import Candidate
from ..candidates.precision import FLOAT32, MEASURED_ONLY_AFTER, short
from .arrays import GROSS_FAULT
from .cost import Cost, Device, gpu_cache_bytes
from .cost_log import CostLog, LogKey
from .runner import MeasureResult, MeasureRunner, MeasureTask
from .isolation import shared_worker
from .warm import Warmed, processes_here, spare_one_core, warm
from .meters import EnergyMeter
from .build import intermediate_values, is_cuda
from .timing import Timing, over_ceiling
from .transition import TransitionTask

TRANSITION = "transition"  # the pattern name of the transition-cost row in the log
# The transitions and interplays measured in this process, by their log keys: costs of this
# machine, not of a model, which a second cost log opened here (another project's, each test's
# own) takes from here rather than measuring again (1.5 s a backend, 2-3 s a pair, on 2 cores).
MEASURED_HERE: dict[LogKey, Cost] = {}
# Its key: how the probe ran (``transition.py``), so that a row of an earlier probe (one kernel
# called again after a few ops on a small tensor, stop 61) is measured again, not reused.
TRANSITION_PROBE = "transition: distinct probe kernels, a sweep between"
INTERPLAY = "interplay"  # and of a pair of libraries' interplay
# Candidates compiled together (``Backend.compile_many``): large enough that setting up the
# compiler is paid rarely, small enough that a batch that does not compile (each of its
# candidates is then compiled alone) or a worker that dies on one costs little.
BATCH = 48


class MeasureSettings(Protocol):
    """What the measurer reads of an optimization's settings: ``collage.config.Config``, which
    the caller hands in (the settings name every stage's, and sit after them)."""

    target: str
    threads: int
    timing: Timing
    accuracy: float | None  # how closely a reduced-precision candidate must match
    seed: int
    runner: MeasureRunner | None  # None: this process's shared worker


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
        config: MeasureSettings,
        log: CostLog | None = None,
        meter: EnergyMeter | None = None,
    ):
        self.backends = backends
        self.target = config.target
        self.log = log if log is not None else CostLog()
        self.timing = config.timing
        self.accuracy = config.accuracy  # how closely a reduced-precision candidate must match
        self.seed = config.seed
        # A runner on other machines (``rpc_runner``) measures on its fleet's device, with its
        # libraries: costs are logged under them, never mixed with this machine's.
        fleet = getattr(config.runner, "fleet", None)
        self.device = fleet.device if fleet is not None else Device.this_machine(config.threads, config.target)
        self.libraries = fleet.libraries if fleet is not None else {}
        # A local GPU's cache, flushed before each timed call of a candidate from a model whose
        # weights exceed it (``measured_on``). Not with a meter (a call's energy would count the
        # flushes), nor on a fleet, whose GPUs' caches this machine does not know.
        self.cache_bytes = gpu_cache_bytes() if is_cuda(self.target) and fleet is None and meter is None else 0
        self.runner = config.runner if config.runner is not None else shared_worker(self.device.threads)
        self.meter = meter  # with a meter, every cost has the energy of a call too
        self.measured = 0
        self.warmed = Warmed()  # what the compile pool did (``_warm``)
        self.ceiling_ms: float | None = None  # the cheapest whole-model candidate's cost, once measured
        self.timed_once = 0  # candidates timed by their first call alone, over the ceiling (``over_ceiling``)
        # Where measuring's time went, where the runner measures one work at a time: seconds
        # from each backend's works being sent to their results back (compiling, checking and
        # timing its candidates, probing its transition), and computing the model's values.
        self.seconds_by_backend: dict[str, float] = {}
        self.compile_s_by_backend: dict[str, float] = {}  # of those seconds, compiling (``MeasureResult.compile_s``)
        self.values_s = 0.0
        self.skipped: dict[LogKey, str] = {}  # not measured, by which rule (``Skip``); never logged
        self.timed_out = 0  # candidates that overran the runner's deadline; never logged
        self._costs: dict[LogKey, Cost] = {}
        # The reference backend's outputs of each sub-graph function, by its structural hash
        # (not by node indices: the substitution search measures the candidates of many graphs).
        self._references: dict[int, list[np.ndarray]] = {}
        self._transitions: dict[str, float] = {}
        self._interplays: dict[tuple[str, str], float] = {}  # known so far, measured or logged
        self.interplay_s = 0.0  # seconds measuring them
        # While measure_all runs: its graph and every value it computes (runner.intermediate_values),
        # computed when the first candidate needs them (``_graph_values``).
        self._values: tuple[object, dict] = (None, {})
        self._values_of = None  # the graph whose values are still to compute

    # -- CostSource --

    def cost(self, candidate: Candidate) -> Cost:
        known = self.known(candidate)
        return known if known is not None else self._judged(self._keep(candidate, *self._measure_one(candidate)))

    def known(self, candidate: Candidate) -> Cost | None:
        """``candidate``'s cost as measured (or skipped) in this run or logged, never measuring
        it: None where it is not known yet (not measured, or not yet as this run needs it)."""
        key = self.key(candidate)
        if key not in self._costs and (cost := self.log.get(key)) is not None and not self._stale(cost):
            self._costs[key] = cost
        cost = self._costs.get(key)
        return None if cost is None else self._judged(cost)

    def _judged(self, cost: Cost) -> Cost:
        """``cost`` held to this run's accuracy budget: a reduced precision's measurement is
        logged with its error whatever the budget (the runner checks it for gross faults
        only), so that a cost measured under one budget serves every other."""
        if cost.is_valid and cost.error is not None and self.accuracy is not None and not cost.error <= self.accuracy:
            return Cost.invalid(f"wrong result: error {cost.error:.3g} of the largest output exceeds the accuracy "
                                f"budget {self.accuracy:g}", cost.error)  # fmt: skip
        return cost

    def _stale(self, cost: Cost) -> bool:
        """Whether a logged cost is to be measured again: without the energy this run needs,
        or a verdict where a measurement belongs (``_budget_verdict``)."""
        return self._lacks_energy(cost) or self._budget_verdict(cost)

    def _budget_verdict(self, cost: Cost) -> bool:
        """A reduced precision's failure on a tighter budget than this run's, as logs written
        before stop 68 hold it (the runner judged the budget, and timed nothing over it)."""
        return cost.is_invalid and cost.error is not None and self.accuracy is not None and cost.error <= self.accuracy

    def transition_ms(self, backend: str) -> float:
        """What entering a partition of ``backend`` costs beyond its kernel (``transition.py``),
        measured once per backend and device and logged."""
        if backend == REFERENCE_BACKEND:
            return 0.0
        if backend not in self._transitions:
            self._keep_transition(backend, self._logged(self.transition_key(backend), lambda: self._transition_task(backend)))
        return self._transitions[backend]

    def _logged(self, key: LogKey, task: Callable[[], TransitionTask]) -> Cost:
        """The cost the log (or this process) holds under ``key``, else ``task()``'s, measured
        on the runner and logged."""
        cost = self._machine_cost(key)
        return cost if cost is not None else self._log_machine_cost(key, self.runner.run(task()).cost)

    def _machine_cost(self, key: LogKey) -> Cost | None:
        """A transition or interplay the log holds, or one this process measured into another
        log (``MEASURED_HERE``), then written into this one too."""
        cost = self.log.get(key)
        if cost is None and key in MEASURED_HERE:
            cost = self.log.put(key, MEASURED_HERE[key])
        return cost

    def _log_machine_cost(self, key: LogKey, cost: Cost) -> Cost:
        MEASURED_HERE[key] = cost
        return self.log.put(key, cost)

    def _transition_task(self, backend: str) -> TransitionTask:
        return TransitionTask.of(self.backends[backend], self.target, self.device.threads, self.timing)

    def interplay_ms(self, a: str, b: str) -> float:
        """What two libraries' kernels in one module cost beyond each alone (``transition.py``),
        per pair of their calls, measured once per pair and device and logged. None for TVM,
        which yields the cores as it waits, and none on a GPU, where the kernels replay in
        CUDA graphs and no host threads share cores."""
        if REFERENCE_BACKEND in (a, b) or a == b or is_cuda(self.target):
            return 0.0
        pair = tuple(sorted((a, b)))
        if pair not in self._interplays:
            started = time.perf_counter()
            cost = self._logged(self.interplay_key(*pair), lambda: TransitionTask.of(
                self.backends[pair[0]], self.target, self.device.threads, self.timing, beside=self.backends[pair[1]]))
            self.interplay_s += time.perf_counter() - started  # a log's read is no time at all
            self._interplays[pair] = cost.value_ms if cost.is_valid else 0.0
        return self._interplays[pair]

    def interplays(self) -> dict[tuple[str, str], float]:
        """The interplays known so far (``interplay_ms``), by pair of libraries."""
        return dict(self._interplays)

    def interplay_key(self, a: str, b: str) -> LogKey:
        """Where the interplay of ``a`` and ``b`` (in that order) is logged."""
        first, second = self.backends[a], self.backends[b]
        libraries = f"{self.libraries.get(a, first.library)} beside {self.libraries.get(b, second.library)}"
        return LogKey(a, libraries, f"{INTERPLAY} with {b}", self.device.logged_as, self.device.threads, FLOAT32, INTERPLAY)

    def _keep_transition(self, backend: str, cost: Cost) -> None:
        # A backend that runs none of the probes has no measured transition: it is charged none.
        self._transitions[backend] = cost.value_ms if cost.is_valid else 0.0

    def _missing_transitions(self, candidates: list[Candidate]) -> list[str]:
        """The backends of ``candidates`` whose transition is neither known nor logged."""
        backends = sorted({c.backend for c in candidates} - {REFERENCE_BACKEND} - set(self._transitions))
        return [b for b in backends if self._machine_cost(self.transition_key(b)) is None]

    def key(self, candidate: Candidate) -> LogKey:
        backend = self.backends[candidate.backend]
        return LogKey.of(candidate, backend, self.measured_on(candidate), candidate.precision, self.libraries.get(backend.name))

    def measured_on(self, candidate: Candidate) -> Device:
        """This machine's device as ``candidate`` is timed on it (``flushes_cache``)."""
        flushed = self.flushes_cache(candidate.subgraph.graph)
        return dataclasses.replace(self.device, cache_flushed=True) if flushed else self.device

    def flushes_cache(self, graph) -> bool:
        """Whether the candidates of ``graph`` are timed with the GPU's cache flushed before
        each call: where the model's weights (``DataflowGraph.input_bytes``) exceed that
        cache, a kernel inside the model finds its own evicted by the kernels before it.
        Else they are timed back to back."""
        return 0 < self.cache_bytes < graph.input_bytes

    def transition_key(self, backend: str) -> LogKey:
        """Where ``backend``'s transition cost is logged."""
        b = self.backends[backend]
        # The transition probes run in float32.
        library = self.libraries.get(b.name, b.library)
        return LogKey(b.name, library, TRANSITION_PROBE, self.device.logged_as, self.device.threads, FLOAT32, TRANSITION)

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
                if cost is None or self._stale(cost):
                    todo[key] = c
                else:
                    self._costs[key] = cost
        return sorted(todo.values(), key=lambda c: (min(c.subgraph.nodes), c.backend != REFERENCE_BACKEND))

    def measure_all(self, candidates: Iterable[Candidate], progress: bool = True) -> None:
        """Measure every candidate not in the log, with a progress bar on stderr, less those
        no placement that could win would use (``SearchBound``; ``skipped`` says why).

        The reference backend's candidates go first, then each whole-model candidate (an
        engine alone), then the rest. Candidates of a backend that compiles several at once
        (``Backend.compile_many``) go in batches of ``BATCH``. Candidates of one graph run on
        the values its unoptimized run computes (``runner.intermediate_values``), which are
        also their reference outputs. A candidate in a precision measured only after another
        (``precision.MEASURED_ONLY_AFTER``: bfloat16 after float16) waits for its twin in that
        one, and is skipped where the twin is within the budget."""
        candidates = list(candidates)
        todo = self.missing(candidates)
        if todo and hasattr(self.runner, "start"):
            # The worker imports every library (seconds) while this process computes the
            # model's values or the compile pool runs, instead of after them.
            self.runner.start()
        graphs = {id(c.subgraph.graph): c.subgraph.graph for c in todo}
        # Candidates the search bound skips are never logged, so they are in ``todo`` each time:
        # BERT-base's values took 60 s of an optimization that then measured nothing.
        self._values_of = next(iter(graphs.values())) if len(graphs) == 1 else None
        try:
            self._measure_all(candidates, todo, progress)
        finally:
            self._values, self._values_of = (None, {}), None

    def _graph_values(self) -> tuple[object, dict]:
        """(graph, its values) for the candidates of ``measure_all``'s one graph, computed
        on first use; (None, {}) where TVM cannot run the whole graph (each candidate then
        draws its own inputs)."""
        if self._values_of is not None:
            graph, self._values_of = self._values_of, None
            started = time.perf_counter()
            try:
                values = intermediate_values(graph, self.seed)
            except Exception:  # noqa: BLE001 -- TVM cannot run the whole graph: each candidate draws its own
                values = None
            self.values_s += time.perf_counter() - started
            if values is not None:
                self._values = (graph, values)
        return self._values

    def _measure_all(self, candidates: list[Candidate], todo: list[Candidate], progress: bool) -> None:
        from tqdm import tqdm

        def in_batches(c: Candidate) -> bool:  # compile_many compiles float32 only
            return self.backends[c.backend].compile_many is not None and c.precision == FLOAT32

        offered = {self.key(c) for c in candidates}
        after = {c: twin for c in todo if (twin := self._measured_before(c, offered)) is not None}
        todo = [c for c in todo if c not in after]

        batched: dict[str, list[Candidate]] = {}
        for c in sorted(todo, key=lambda c: c.backend != REFERENCE_BACKEND):
            if in_batches(c):
                batched.setdefault(c.backend, []).append(c)
        batches = [batch for same in batched.values() for batch in self._batches(same)]
        alone = [c for c in todo if not in_batches(c)]
        ahead = [c for c in alone if self.backends[c.backend].compile_cache]
        with tqdm(total=len(todo) + len(after), desc="measuring", unit="candidate", disable=not progress or not (todo or after),
                  file=sys.stderr, dynamic_ncols=True, smoothing=0.05, mininterval=0.5) as bar:
            # On the GPU, TVM's candidates are measured while the pool compiles: ResNet-50's
            # took 50 s of an H100 host's measuring, after the pool's 45 s. They go without the
            # whole-model candidates' ceiling, which spares only seconds-long calls.
            tvms = [b for b in batches if b[0].backend == REFERENCE_BACKEND] if timed_off_the_host(self.target) else []
            with self._warming(ahead, self._missing_transitions(todo), beside=bool(tvms)) as compiling:
                if compiling and tvms:
                    self._measure_many(tvms, bar)
                    batches = [b for b in batches if b[0].backend != REFERENCE_BACKEND]
            # Whole-model candidates first: what they cost bounds the rest, as the transitions
            # do, which are measured beside them (on a fleet, at once). A candidate then slower
            # than the cheapest of them by far is timed by one call (``Timing.ceiling_ms``).
            whole = [c for c in alone if _whole(c)]
            self._measure_many(whole, bar, self._missing_transitions(todo))
            self.ceiling_ms = self._cheapest_whole_ms(candidates)
            self._measure_many(batches, bar)
            rest = [c for c in alone if not _whole(c)]
            bound = SearchBound.of(candidates, self) if rest else None
            measured = []
            for c in rest:
                skip = bound.skip(c)
                if skip is None:
                    measured.append(c)
                    continue
                self._skip(c, skip)
                bar.update()
            self._measure_many(measured, bar)
            self._measure_after_twins(after, bar)

    def _measured_before(self, candidate: Candidate, offered: set[LogKey]) -> Candidate | None:
        """``candidate``'s twin in the precision it is measured only after, where that is
        ``offered`` too; else None."""
        first = MEASURED_ONLY_AFTER.get(candidate.precision)
        if first is None:
            return None
        twin = dataclasses.replace(candidate, precision=first)
        return twin if self.key(twin) in offered else None

    def _measure_after_twins(self, after: dict[Candidate, Candidate], bar) -> None:
        """Each candidate of ``after`` measured where its twin (measured, skipped or logged by
        now) missed the budget or failed; skipped where the twin is within it, or was skipped."""
        wanted = []
        for c, twin in after.items():
            cost, rule = self.cost(twin), self.skipped.get(self.key(twin))
            if cost.is_valid:
                error = "" if cost.error is None else f" (error {cost.error:.2g})"
                self._skip(c, Skip(PRECISION_ENOUGH, f"not measured: {short(twin.precision)} is within the accuracy "
                                   f"budget here{error}, at {short(c.precision)}'s speed"))  # fmt: skip
            elif rule is not None:  # by a search bound that holds for it too
                self._skip(c, Skip(rule, cost.reason))
            else:
                wanted.append(c)
                continue
            bar.update()
        with self._warming([c for c in wanted if self.backends[c.backend].compile_cache]):
            pass  # nothing to measure before they are compiled
        self._measure_many(wanted, bar)

    def _skip(self, candidate: Candidate, skip: Skip) -> None:
        self.skipped[self.key(candidate)] = skip.rule
        self._costs[self.key(candidate)] = Cost.invalid(skip.reason)

    def _cheapest_whole_ms(self, candidates: list[Candidate]) -> float | None:
        """The cost of the cheapest float32 whole-model candidate known so far (a reduced
        precision may yet miss the budget), or None where none is valid."""
        costs = [self._costs.get(self.key(c)) for c in candidates if _whole(c) and c.precision == FLOAT32]
        return min((cost.median_ms for cost in costs if cost is not None and cost.is_valid), default=None)

    @contextlib.contextmanager
    def _warming(self, candidates: list[Candidate], transitions: list[str] = (), beside: bool = False):
        """While the ``with`` body runs, and until it has ended: ``candidates``, and the
        transition probes of those of the ``transitions``' backends that cache their compiles,
        compiled in parallel processes (``warm``), where they are measured on this machine: the
        worker's compile of each is then a hit of the on-disk cache they leave (inductor's
        transition probe took 16 s of an H100 host's worker). Yields whether they compile. With
        ``beside`` (the body measures meanwhile), the compiles keep off one core
        (``spare_one_core``). Meanwhile this process also computes the graph's values
        (``_graph_values``), which measuring needs and compiling does not (ResNet-50's, 12 s,
        had held the pool back), and the backends' set-up that their compiles would each wait
        for (``Backend.prepare``)."""
        processes = processes_here()
        if processes < 2 or getattr(self.runner, "fleet", None) is not None:
            yield False
            return
        tasks = []
        for c in candidates:
            with contextlib.suppress(ValueError):  # a symbolic shape: nothing to compile
                tasks.append((self._compile_task(c.backend, c.subgraph.extract(), c.pattern, c.precision), len(c.subgraph)))
        for name in transitions:
            if self.backends[name].compile_cache:
                for func, pattern in self._transition_task(name).compiles()[:1]:  # the probe tried first
                    tasks.append((self._compile_task(name, func, pattern, FLOAT32), 1))
        tasks = [(task, size) for task, size in tasks if task.backend.unavailable_reason(self.target) is None]
        if len(tasks) < 2:
            yield False
            return
        preparing = {task.backend.name: task.backend.prepare for task, _ in tasks if task.backend.prepare is not None}
        cores = spare_one_core() if beside else None
        with ThreadPoolExecutor(1 + len(preparing)) as pool:
            warming = pool.submit(warm, [task for task, _ in tasks], [size for _, size in tasks], processes, cores)
            for prepare in preparing.values():
                pool.submit(prepare, self.target)  # what it finds is on disk; a failure, each compile's own
            self._graph_values()
            yield True
            self.warmed = self.warmed.and_then(dataclasses.replace(warming.result(), measured_meanwhile=beside))

    def _compile_task(self, backend: str, func, pattern: str, precision: str) -> MeasureTask:
        """What compiling ahead needs of a task: no inputs, no reference."""
        return MeasureTask(self.backends[backend], func, pattern, self.target, self.device.threads, self.seed,
                           self.timing, precision=precision)  # fmt: skip

    def _batches(self, candidates: list[Candidate]) -> list[list[Candidate]]:
        """``candidates`` in batches of at most ``BATCH``, and at least one per server of the
        runner (``RPCRunner.servers``) while there are candidates for it, of even sizes."""
        servers = getattr(self.runner, "servers", 1)
        count = max(math.ceil(len(candidates) / BATCH), min(servers, len(candidates)))
        size = math.ceil(len(candidates) / count)
        return [candidates[start : start + size] for start in range(0, len(candidates), size)]

    def _measure_many(self, groups: list[Candidate | list[Candidate]], bar, transitions: list[str] = ()) -> None:
        """Each candidate measured on the runner (a list of them: a batch, ``run_batch``), and
        the ``transitions`` of these backends, all at once where the runner has several
        machines (``run_all``), each logged as its result comes back."""
        works, sent = [], []
        for group in groups:
            batch = group if isinstance(group, list) else [group]
            pending = []
            for c in batch:
                task = self._task(c)
                if isinstance(task, Cost):  # nothing to measure: the reason is the cost
                    self._keep(c, task)
                    bar.update()
                else:
                    pending.append((c, task))
            if pending:
                works.append([t for _, t in pending] if isinstance(group, list) else pending[0][1])
                sent.append(pending)

        first_transition = len(works)
        works += [self._transition_task(b) for b in transitions]
        in_turn = getattr(self.runner, "servers", None) is None  # a fleet measures several at once
        last = time.perf_counter()

        def done(index: int, result) -> None:
            nonlocal last
            now = time.perf_counter()
            backend = transitions[index - first_transition] if index >= first_transition else sent[index][0][0].backend
            if in_turn:
                self.seconds_by_backend[backend] = self.seconds_by_backend.get(backend, 0.0) + now - last
            last = now
            if index >= first_transition:
                self._keep_transition(backend, self._log_machine_cost(self.transition_key(backend), result.cost))
                return
            results = result if isinstance(result, list) else [result]
            if in_turn:
                compiled = sum(r.compile_s for r in results)
                self.compile_s_by_backend[backend] = self.compile_s_by_backend.get(backend, 0.0) + compiled
            for (c, task), r in zip(sent[index], results):
                self._keep(c, self._result(task, r), r.timed_out)
            bar.update(len(results))
            if getattr(self.runner, "servers", None) is not None:
                bar.set_postfix_str(f"{self.runner.servers} server(s)", refresh=False)

        self.runner.run_all(works, done)

    def _lacks_energy(self, cost: Cost) -> bool:
        return self.meter is not None and cost.is_valid and cost.energy_mj is None

    def _keep(self, candidate: Candidate, cost: Cost, timed_out: bool = False) -> Cost:
        """A fresh measurement, logged (only its energy, where the log had the rest). A
        candidate that timed out is not logged: measured again next time, when the machine
        may be quieter (``timed_out`` counts them)."""
        key = self.key(candidate)
        logged = self.log.get(key)
        if timed_out:
            self.timed_out += 1
        elif logged is None:
            cost = self.log.put(key, cost)
        elif cost.is_valid and cost.energy_mj is not None:  # measured again for its energy
            cost = self.log.add_energy(key, cost.energy_mj)
        elif self._budget_verdict(logged):  # measured again: its time, where a verdict was
            cost = self.log.replace(key, cost)
        else:
            cost = logged
        self.measured += 1
        self._costs[key] = cost
        return cost

    # -- measuring --

    def measure(self, candidate: Candidate) -> Cost:
        """Compile, check and time one candidate on the runner; never raises."""
        return self._measure_one(candidate)[0]

    def _measure_one(self, candidate: Candidate) -> tuple[Cost, bool]:
        """``measure``'s cost, and whether the candidate timed out."""
        task = self._task(candidate)
        if isinstance(task, Cost):
            return task, False
        result = self.runner.run(task)
        return self._result(task, result), result.timed_out

    def _task(self, candidate: Candidate) -> MeasureTask | Cost:
        """What the runner needs to measure ``candidate``, or why it cannot be measured."""
        backend = self.backends[candidate.backend]
        reason = backend.unavailable_reason(self.target)
        if reason is not None:
            return Cost.invalid(reason)
        try:
            func = candidate.subgraph.extract()
        except ValueError as err:  # a dynamic or symbolic shape: nothing can be measured
            return Cost.invalid(str(err))
        graph, values = self._graph_values()
        # How the result is checked: float32's tolerance widens along the sub-graph's longest path.
        checked = {"ops": candidate.subgraph.depth}
        if candidate.precision != FLOAT32:
            checked |= {"precision": candidate.precision, "rtol": GROSS_FAULT}
        timing = self.timing if self.ceiling_ms is None else dataclasses.replace(self.timing, ceiling_ms=self.ceiling_ms)
        if self.flushes_cache(candidate.subgraph.graph):
            # Twice the cache: written through, it leaves none of what the candidate reads.
            timing = dataclasses.replace(timing, cache_flush_bytes=2 * self.cache_bytes)
        if candidate.subgraph.graph is not graph:
            return MeasureTask(backend, func, candidate.pattern, self.target, self.device.threads, self.seed, timing,
                               self._references.get(tvm_ffi.structural_hash(func)), self.meter, **checked)
        # Read off the whole graph's values; TVM's own kernels are the reference, unchecked.
        inputs = [values[value] for value in candidate.subgraph.arguments()]
        reference = None if backend.name == REFERENCE_BACKEND else [values[graph[i].var] for i in candidate.subgraph.outputs]
        return MeasureTask(backend, func, candidate.pattern, self.target, self.device.threads, self.seed,
                           timing, reference, self.meter, inputs, **checked)  # fmt: skip

    def _result(self, task: MeasureTask, result: MeasureResult) -> Cost:
        """The cost in ``result``, keeping the reference outputs it brings for later tasks."""
        if result.reference is not None:
            self._references[tvm_ffi.structural_hash(task.func)] = result.reference
        cost = result.cost
        if cost.is_valid and cost.samples == 1 and over_ceiling(cost.median_ms, task.timing, task.meter) is not None:
            self.timed_once += 1
        return cost


TVM_CHEAPER = "TVM runs the same ops for less than entering the backend costs"
WHOLE_MODEL_FASTER = "entering the backend costs more than the best whole-model candidate takes"
PRECISION_ENOUGH = "a more precise format at the same speed is within the accuracy budget"


class Skip(NamedTuple):
    rule: str  # TVM_CHEAPER, WHOLE_MODEL_FASTER or PRECISION_ENOUGH
    reason: str  # with the numbers, the skipped candidate's (invalid) cost says this


def timed_off_the_host(target: str) -> bool:
    """Whether TVM's kernels for ``target`` are timed by the device's own clock (on the GPU:
    TVM's time evaluator between CUDA events), so that compiles on the host's other cores may
    run while they are measured; on the CPU they would share the cores the kernel runs on."""
    return is_cuda(target)


def _whole(candidate: Candidate) -> bool:
    return len(candidate.subgraph) == len(candidate.subgraph.graph)


@dataclass(frozen=True)
class SearchBound:
    """Which candidates no winning placement would use, from costs measured already.

    The DP prices a placement as its kernels' costs plus, for each partition of a backend
    other than TVM, that backend's transition (``transition.py``): at least the transition,
    whatever the kernel costs. So a candidate of backend B, not yet measured, is skipped when

    - *TVM runs the same ops for less than entering B costs* (``tvm_ms[nodes]`` at most
      B's transition): a placement using the candidate is never cheaper than the same with
      TVM's candidate in its place, so no placement the DP returns changes; or
    - *entering B costs more than the best whole-model candidate takes* (``whole_ms``, a
      kernel measured alone, as a whole-model placement runs: no neighbour puts its threads
      to sleep): every placement with a B partition is estimated slower than that one.

    Whole-model candidates are never skipped: each is a finalist of its own.
    """

    tvm_ms: dict[frozenset[int], float]  # TVM's measured cost of each sub-graph it has a candidate for
    whole_ms: float  # the cheapest valid whole-model candidate's cost; inf when none
    whole_by: str  # whose it is
    transition_ms: Callable[[str], float]

    @classmethod
    def of(cls, candidates: list[Candidate], measurer: Measurer) -> SearchBound:
        """The bound from ``measurer``'s costs of the TVM and whole-model candidates known so
        far (a whole-model candidate measured only after another precision may not be)."""
        tvm_ms, whole = {}, []
        for c in candidates:
            bounds = c.backend == REFERENCE_BACKEND or _whole(c)
            cost = measurer.known(c) if bounds else None
            if cost is None or cost.is_invalid:
                continue
            if c.backend == REFERENCE_BACKEND:
                tvm_ms[c.subgraph.nodes] = min(cost.median_ms, tvm_ms.get(c.subgraph.nodes, math.inf))
            if _whole(c):
                whole.append((cost.median_ms, c.backend))
        whole_ms, whole_by = min(whole, default=(math.inf, ""))
        return cls(tvm_ms, whole_ms, whole_by, measurer.transition_ms)

    def skip(self, candidate: Candidate) -> Skip | None:
        """Why ``candidate`` need not be measured, or None."""
        if candidate.backend == REFERENCE_BACKEND or _whole(candidate):
            return None
        b, entering = candidate.backend, self.transition_ms(candidate.backend)
        tvm = self.tvm_ms.get(candidate.subgraph.nodes, math.inf)
        if tvm <= entering:
            return Skip(TVM_CHEAPER, f"not measured: TVM runs these ops in {tvm:.3g} ms, no more than entering {b} costs ({entering:.3g} ms)")
        if entering >= self.whole_ms:
            return Skip(WHOLE_MODEL_FASTER, f"not measured: entering {b} costs {entering:.3g} ms, no less than "
                                            f"{self.whole_by} takes for the whole model ({self.whole_ms:.3g} ms)")  # fmt: skip
        return None


