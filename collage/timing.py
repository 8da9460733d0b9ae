"""Timing a call: warm-up, then samples until their spread is small or a cap is reached."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from .cost import Cost


@dataclass(frozen=True)
class Timing:
    """How long to time one candidate.

    A sample is ``number`` back-to-back calls, with ``number`` chosen so a sample lasts at least
    ``min_sample_ms`` (the timer's resolution and Python's call overhead wash out). Sampling
    stops once ``min_samples`` are in and their interquartile range is within ``rel_spread``
    of the median, or at ``max_samples``, or when ``budget_s`` is spent (with at least
    ``min_samples``): a 50 ms TVM convolution needs fewer samples than a 5 µs add to be known.
    Warm-up is at least ``warmup`` calls and ``warmup_s`` seconds: an engine's first runs of a
    whole model are slower (OpenVINO's ResNet-50 once measured 37 ms instead of 21 after one).
    """

    warmup: int = 1
    warmup_s: float = 0.1
    min_samples: int = 5
    max_samples: int = 30
    rel_spread: float = 0.05
    min_sample_ms: float = 1.0
    budget_s: float = 2.0


def time_call(call: Callable[[], None], timing: Timing = Timing()) -> Cost:
    """Median and interquartile range, in ms, of one ``call()``."""
    start, calls = time.perf_counter(), 0
    while calls < timing.warmup or time.perf_counter() - start < timing.warmup_s:
        last = time.perf_counter()
        call()
        calls += 1
    once = max(time.perf_counter() - last, 1e-7)  # the last warm call: the warmest estimate
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
            median, spread = median_and_iqr(samples)
            if spread <= timing.rel_spread * median or time.perf_counter() > deadline:
                break
    median, spread = median_and_iqr(samples)
    return Cost.of(median, spread=spread, samples=len(samples))


def median_and_iqr(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


def time_interleaved(
    calls: dict[str, Callable[[], None]],
    rounds: int = 15,
    min_sample_ms: float = 5.0,
    warmup_s: float = 0.1,
    quiet_s: float = 0.05,
    seed: int = 0,
) -> dict[str, Cost]:
    """Median and spread of each call, sampled in rounds so a change of load on the machine
    hits every one alike. Each round takes the calls in a fresh random order (``seed``), so
    none always follows the same neighbour.

    Libraries leave their worker threads spinning after a call (ONNX Runtime's for 10-40 ms
    here), and on a 2-core machine a spinning neighbour halves the next library's speed:
    OpenVINO's DCGAN ran 1.43 ms right after ONNX Runtime's against 0.68 ms alone. So each
    sample starts after ``quiet_s`` of sleep and one untimed call: every call is timed as it
    would run on a machine of its own."""
    number = {}
    for name, call in calls.items():
        start, last = time.perf_counter(), 0.0
        while time.perf_counter() - start < warmup_s or last == 0.0:  # warm-up; the last call times one
            began = time.perf_counter()
            call()
            last = time.perf_counter() - began
        number[name] = max(1, math.ceil(min_sample_ms / 1e3 / max(last, 1e-7)))
    quiet_s = quiet_s if len(calls) > 1 else 0.0
    samples = {name: [] for name in calls}
    order = random.Random(seed)
    for _ in range(rounds):
        for name in order.sample(list(calls), len(calls)):
            call = calls[name]
            if quiet_s:
                time.sleep(quiet_s)
                call()
            start = time.perf_counter()
            for _ in range(number[name]):
                call()
            samples[name].append((time.perf_counter() - start) * 1e3 / number[name])
    return {name: Cost.of(*median_and_iqr(ms), samples=len(ms)) for name, ms in samples.items()}
