"""Timing: one candidate alone (``time_call``: warm-up, then samples until their spread is
small), and contenders against each other (``time_contenders``: the project's one protocol)."""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from .cost import Cost
from .meters import EnergyMeter


@dataclass(frozen=True)
class Timing:
    """How long to time one candidate.

    A sample is ``number`` back-to-back calls, with ``number`` chosen so a sample lasts at least
    ``min_sample_ms`` (the timer's resolution and Python's call overhead wash out). Sampling
    stops once ``min_samples`` are in and their interquartile range is within ``rel_spread``
    of the median, or at ``max_samples``, or when ``budget_s`` is spent (with at least
    ``min_samples``): a 50 ms TVM convolution needs fewer samples than a 5 µs add to be known.
    Warm-up goes in rounds of at least ``warmup`` calls and ``warmup_s`` seconds, until a
    round runs no faster than the one before it (within ``rel_spread``), or for
    ``max_warmup_s``: an engine's first runs of a whole model are slower (OpenVINO's ResNet-50
    once measured 37 ms instead of 21 after one), while a small kernel is warm after a few
    calls (a fixed 0.1 s of warm-up was most of the time a candidate took to measure).
    """

    warmup: int = 3
    warmup_s: float = 0.01
    max_warmup_s: float = 0.1
    min_samples: int = 5
    max_samples: int = 30
    rel_spread: float = 0.05
    min_sample_ms: float = 1.0
    budget_s: float = 2.0
    # The cheapest whole-model candidate's cost, set once those are measured: a candidate
    # whose first call takes more than CEILING_FACTOR times this (and CEILING_FLOOR_MS) is
    # timed by that call alone (``over_ceiling``). No placement using it can beat that
    # candidate, so its cost decides nothing; BERT-base's untuned TVM products took 2-2.6 s a
    # call, and timing each as the rest (ten calls and more) took half of its optimization on
    # a 2-core Xeon.
    ceiling_ms: float | None = None
    # On a GPU, bytes written between timed calls so that each call finds the device's cache
    # cold (``time_flushed``); 0: calls back to back, each finding what the last left. Set where
    # a model's weights exceed the cache: replayed in the model, stage 4's 3x3 convolutions of
    # ResNet-50 ran 50% over their cost measured back to back on an H200 (its 100 MB of weights
    # pass through the 50 MB L2 once a call), stage 1's 17%.
    cache_flush_bytes: int = 0


# Twice the ceiling: a first call slower than the steady state by as much as that (a cold
# cache, a lazy allocation) still leaves its candidate costlier than the whole-model one.
CEILING_FACTOR = 2.0
# And no less than this: a shorter first call is cheap to time as usual, and its own overheads
# (first touches of memory, cold caches) can be most of it (the MLP's untuned TVM products).
CEILING_FLOOR_MS = 10.0


def over_ceiling(first_ms: float, timing: Timing, meter: EnergyMeter | None = None) -> Cost | None:
    """The cost of a candidate whose first call took ``first_ms``, where that call alone is
    its timing (``Timing.ceiling_ms``); None where it is to be timed as usual (and always with
    a meter, whose energy per call needs the samples)."""
    if meter is None and timing.ceiling_ms is not None and first_ms > max(CEILING_FACTOR * timing.ceiling_ms, CEILING_FLOOR_MS):
        return Cost.of(first_ms, samples=1)
    return None


def time_call(call: Callable[[], None], timing: Timing = Timing(), meter: EnergyMeter | None = None) -> Cost:
    """Median and interquartile range, in ms, of one ``call()``; with a ``meter``, also the
    energy of one call: the counter's difference over all the timed calls, divided by them."""
    start = time.perf_counter()
    call()
    if (capped := over_ceiling((time.perf_counter() - start) * 1e3, timing, meter)) is not None:
        return capped
    # Warm-up in rounds of at least ``warmup`` calls and ``warmup_s``, until a round's time
    # per call is within ``rel_spread`` of the round before it (no longer falling).
    start, previous = time.perf_counter(), math.inf
    while True:
        round_start, round_calls = time.perf_counter(), 0
        while round_calls < timing.warmup or time.perf_counter() - round_start < timing.warmup_s:
            call()
            round_calls += 1
        now = time.perf_counter()
        once = (now - round_start) / round_calls
        if once >= previous / (1 + timing.rel_spread) or now - start >= timing.max_warmup_s:
            break
        previous = once
    once = max(once, 1e-7)  # the last round's: the warmest estimate
    number = max(1, math.ceil(timing.min_sample_ms / 1e3 / once))

    def sample() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            call()
        return (time.perf_counter() - t0) * 1e3 / number

    return sample_until_stable(sample, timing, meter, calls_per_sample=number)


# Calls per captured graph at most: each is a node of the graph, recorded once.
MAX_CAPTURED_CALLS = 200


def time_captured(call: Callable[[], None], timing: Timing = Timing(), meter: EnergyMeter | None = None) -> Cost:
    """Median and interquartile range, in ms, of one ``call()`` on the GPU as it runs inside
    a CUDA graph: ``call`` (a graph-safe library kernel on TVM's stream) is recorded a number
    of times into one graph, which is replayed and timed between CUDA events. Timed as Python
    calls each followed by a wait, a 20 us cuDNN kernel costs 60-90 us of Python and waiting
    that an assembled module, replayed as CUDA graphs, never pays. Raises where the kernel
    cannot be captured; the caller then times it as it is (``time_call``)."""
    import torch
    import tvm_ffi

    def captured(number: int) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"), tvm_ffi.use_torch_stream():
            for _ in range(number):
                call()
        return graph

    def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    call()  # lazy set-up (workspaces, handles) happens outside the capture
    torch.cuda.synchronize()
    one = captured(1)
    first_ms = replay_ms(one)
    if (capped := over_ceiling(first_ms, timing, meter)) is not None:
        return capped
    if timing.cache_flush_bytes:
        return time_flushed(one.replay, timing, meter)
    once = min(first_ms, *(replay_ms(one) for _ in range(max(timing.warmup, 3) - 1)))
    number = max(1, min(MAX_CAPTURED_CALLS, math.ceil(timing.min_sample_ms / max(once, 1e-4))))
    graph = one if number == 1 else captured(number)
    replay_ms(graph)  # warm
    return sample_until_stable(lambda: replay_ms(graph) / number, timing, meter, calls_per_sample=number)


# Flushes and calls per sample of ``time_flushed``: a sample's calls are enqueued together and
# waited for once.
FLUSHED_CALLS = 10


def time_flushed(launch: Callable[[], None], timing: Timing, meter: EnergyMeter | None = None) -> Cost:
    """Median and interquartile range, in ms, of one ``launch()`` on the GPU (a captured
    graph's replay, or TVM's VM on torch's current stream), each found by the device's cache
    cold: before each, ``timing.cache_flush_bytes`` are written (what triton's ``do_bench``
    does). Each launch is timed between CUDA events enqueued around it alone, the flush outside
    them; nothing waits for the device between launches, so the device is still writing the
    flush (tens of us) while the host enqueues the launch, and the events hold the kernels'
    time only, not the host's."""
    import torch

    scratch = torch.empty(timing.cache_flush_bytes, dtype=torch.uint8, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(FLUSHED_CALLS)]

    def sample() -> float:
        for start, end in events:
            scratch.zero_()
            start.record()
            launch()
            end.record()
        events[-1][1].synchronize()
        return statistics.fmean(start.elapsed_time(end) for start, end in events)

    for _ in range(max(timing.warmup, 1)):
        launch()
    return sample_until_stable(sample, timing, meter, calls_per_sample=FLUSHED_CALLS)


def sample_until_stable(
    sample: Callable[[], float], timing: Timing = Timing(), meter: EnergyMeter | None = None, calls_per_sample: int = 1
) -> Cost:
    """Take samples (each ``sample()`` returns ms per call) as ``timing`` says; warm-up is the
    caller's. With a ``meter``, also the energy of one call: the counter's difference over all
    the samples, divided by the calls they made (``calls_per_sample`` each)."""
    deadline = time.perf_counter() + timing.budget_s
    before = meter.read() if meter is not None else None
    samples: list[float] = []
    while len(samples) < timing.max_samples:
        samples.append(sample())
        if len(samples) >= timing.min_samples:
            median, spread = median_and_iqr(samples)
            if spread <= timing.rel_spread * median or time.perf_counter() > deadline:
                break
    median, spread = median_and_iqr(samples)
    energy_mj = None if meter is None else meter.joules(before, meter.read()) * 1e3 / (len(samples) * calls_per_sample)
    return Cost.of(median, spread=spread, samples=len(samples), energy_mj=energy_mj)


def cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, CPU seconds the whole machine has been busy, CPU seconds of this process),
    or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    except OSError:
        return None
    busy_s = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), busy_s, time.process_time()


def busy_cores_by_others(before, after) -> float | None:
    """How many cores other processes kept busy on average between two ``cpu_seconds()``:
    timings are only as trustworthy as this is close to zero."""
    if before is None or after is None:
        return None
    wall_s, machine_s, own_s = (b - a for a, b in zip(before, after))
    return round(max(machine_s - own_s, 0.0) / wall_s, 2)


def median_and_iqr(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


@dataclass(frozen=True)
class Protocol:
    """How contenders (whole modules, peers, engines) are timed against each other: the one
    protocol of docs/timing.md, used by ``optimize``'s finalists, ``collage run``, the
    benchmark and every experiment that compares libraries.

    A *block* is back-to-back calls of one contender, enough to fill ``block_ms`` (within
    ``min_block_calls`` .. ``max_block_calls``): the steady state of a serving loop, as
    ``benchmark_app`` and ``onnxruntime_perf_test`` measure it. Each call is timed alone and
    the block's median is its sample. Before each block the machine is left idle for
    ``settle_s``, and then until the process's threads are idle (``settle``): libraries
    leave worker threads spinning after a call (ONNX Runtime's for 10-40 ms here), and on a
    2-core machine a spinning neighbour halves the next library's speed (OpenVINO's DCGAN ran
    1.43 ms right after ONNX Runtime's, 0.68 ms alone). Each of
    ``rounds`` rounds takes every contender's block once, in a fresh random order (``seed``),
    so drift in the machine hits all alike and none always follows the same neighbour. With
    ``budget_s``, a contender leaves the rounds after ``min_rounds`` once its blocks have used
    its share of the budget (a multi-second untuned peer). The result is the median of the
    block medians, with their interquartile range as the spread.
    """

    rounds: int = 7
    block_ms: float = 60.0
    min_block_calls: int = 1
    max_block_calls: int = 2000
    settle_s: float = 0.1
    warmup_s: float = 0.2
    seed: int = 0
    budget_s: float | None = None
    min_rounds: int = 3


def time_contenders(
    calls: dict[str, Callable[[], object]], protocol: Protocol = Protocol(), meter: EnergyMeter | None = None
) -> dict[str, Cost]:
    """Each call's latency under ``protocol``: median of block medians and its spread (ms).
    With a ``meter``, also the energy of one call: the median over blocks of each block's
    counter difference divided by its calls."""
    rounds = _rounds(calls, protocol, meter)
    return {
        name: Cost.of(*median_and_iqr(ms), samples=len(ms),
                      energy_mj=statistics.median(rounds.energy_mj[name]) if meter is not None else None)
        for name, ms in rounds.ms.items()
    }  # fmt: skip


def time_rounds(calls: dict[str, Callable[[], object]], protocol: Protocol = Protocol()) -> dict[str, list[float]]:
    """Each call's block medians (ms), round by round, under ``protocol``; a contender that
    left the rounds (``budget_s``) has fewer."""
    return _rounds(calls, protocol, None).ms


@dataclass
class _Blocks:
    ms: dict[str, list[float]]  # each block's median call (ms), round by round
    energy_mj: dict[str, list[float]]  # each block's energy per call (mJ), when metered


def _rounds(calls, protocol: Protocol, meter: EnergyMeter | None) -> _Blocks:
    block = {name: block_calls(call, protocol) for name, call in calls.items()}
    settle_s = protocol.settle_s if len(calls) > 1 else 0.0
    blocks = _Blocks({name: [] for name in calls}, {name: [] for name in calls})
    spent = dict.fromkeys(calls, 0.0)
    share_s = protocol.budget_s / max(len(calls), 1) if protocol.budget_s else math.inf
    order = random.Random(protocol.seed)
    for _ in range(protocol.rounds):
        active = [n for n in calls if len(blocks.ms[n]) < protocol.min_rounds or spent[n] < share_s]
        for name in order.sample(active, len(active)):
            if settle_s:
                settle(settle_s)
            began = time.perf_counter()
            before = meter.read() if meter is not None else None
            blocks.ms[name].append(statistics.median(timed_block(calls[name], block[name])))
            if meter is not None:
                blocks.energy_mj[name].append(meter.joules(before, meter.read()) * 1e3 / block[name])
            spent[name] += time.perf_counter() - began
    return blocks


# While settling, the process's CPU time is read over probes this long: what its other threads
# (a library's pool still spinning after its run) burn while the timing thread sleeps.
SETTLE_PROBE_S = 0.005
IDLE_SHARE = 0.1  # of one core, over a probe: a spinning thread burns about a whole one
# Idle probes in a row: a spinning thread was seen to burn nothing over one probe in ten (a
# hypervisor's steal, a lock handed over), never over three.
IDLE_PROBES = 3
SETTLE_MAX_S = 1.0


def settle(min_s: float, max_s: float = SETTLE_MAX_S) -> float:
    """Sleep ``min_s``, then on until the process's other threads are idle, for at most
    ``max_s`` in all; the seconds slept. Idle is measured, not assumed from a pause: over
    ``IDLE_PROBES`` probes of ``SETTLE_PROBE_S`` in a row the process's CPU time
    (``time.process_time``, every thread's) grew by less than ``IDLE_SHARE`` of each. A
    pause of fixed length ends beside any pool that spins longer than it."""
    start = time.perf_counter()
    time.sleep(min_s)
    idle = 0
    while idle < IDLE_PROBES and time.perf_counter() - start < max_s:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(SETTLE_PROBE_S)
        idle = idle + 1 if time.process_time() - cpu < IDLE_SHARE * (time.perf_counter() - wall) else 0
    return time.perf_counter() - start


def paired_ratio(numerator: list[float], denominator: list[float]) -> tuple[float, float]:
    """Median and interquartile range of ``numerator[k] / denominator[k]`` over the rounds both
    took part in. Block medians of one round were taken seconds apart, so a machine whose
    speed drifts from round to round (a shared host: ±20% here on a small model) moves both
    alike, and their ratio is far steadier than the ratio of the two medians."""
    ratios = [a / b for a, b in zip(numerator, denominator) if b > 0]
    if not ratios:
        return math.nan, math.nan
    return median_and_iqr(ratios)


def block_calls(call: Callable[[], object], protocol: Protocol) -> int:
    """Warm ``call`` up for ``protocol.warmup_s``, and for two calls at least; how many calls
    of its fastest fill a block. A first call can outlast the warm-up (a library's lazy set-up
    in a fresh process): counted from the last warm-up call, inductor's RoBERTa in the fresh
    processes' race (2.4 ms a call in the optimizing process) had blocks of one call, each
    the first after a settling pause, 4-19 ms."""
    start, made, fastest = time.perf_counter(), 0, math.inf
    while time.perf_counter() - start < protocol.warmup_s or made < 2:
        began = time.perf_counter()
        call()
        fastest, made = min(fastest, max(time.perf_counter() - began, 1e-7)), made + 1
    calls = math.ceil(protocol.block_ms / 1e3 / fastest)
    return min(protocol.max_block_calls, max(protocol.min_block_calls, calls))


def timed_block(call: Callable[[], object], n: int) -> list[float]:
    """``n`` back-to-back calls, each timed (ms)."""
    times = []
    clock = time.perf_counter
    for _ in range(n):
        began = clock()
        call()
        times.append((clock() - began) * 1e3)
    return times
