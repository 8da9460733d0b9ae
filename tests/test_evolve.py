"""The evolutionary search on test-only latencies: finds good strings, stops as told, replays."""

import itertools
import math
import random

import pytest

from collage.placing.evolve import evolutionary_search


def blocks_latency(bits):
    """A made-up model: each 1 saves 1 ms, but every switch between 0 and 1 costs 3 ms, as
    engine boundaries do; the best is all ones except where a unit cannot be offloaded."""
    cannot = {3}  # offloading unit 3 breaks the model
    if any(bits[i] for i in cannot if i < len(bits)):
        return math.inf
    switches = sum(a != b for a, b in zip(bits, bits[1:]))
    return 40.0 - sum(bits) + 3.0 * switches


def brute_force(bits, latency):
    return min(latency(s) for s in itertools.product((0, 1), repeat=bits))


def test_search_finds_the_best_string_of_a_small_space():
    n = 12
    result = evolutionary_search(n, blocks_latency, [[0] * n, [1] * n], budget_s=30, patience=15, seed=1, progress=False)
    assert result.best_ms == brute_force(n, blocks_latency)
    assert result.best_ms <= min(result.seed_ms)
    assert result.leaders[0] == (result.best, result.best_ms)


def test_each_distinct_string_is_measured_once():
    asked = []

    def latency(bits):
        asked.append(bits)
        return blocks_latency(bits)

    result = evolutionary_search(10, latency, [[0] * 10, [1] * 10], budget_s=30, patience=5, seed=0, progress=False)
    assert len(asked) == len(set(asked)) == result.evaluated


def test_the_same_seed_replays_the_same_search():
    runs = [evolutionary_search(16, blocks_latency, [[0] * 16, [1] * 16], budget_s=30, patience=4, seed=7, progress=False)
            for _ in range(2)]
    assert runs[0].best == runs[1].best
    assert list(runs[0].logbook) == list(runs[1].logbook)


def test_the_callers_random_state_is_left_alone():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    evolutionary_search(16, blocks_latency, [[0] * 16], generations=2, seed=5, progress=False)
    assert random.random() == expected


def test_it_stops_after_patience_or_generations_or_budget():
    flat = evolutionary_search(20, lambda bits: 1.0, [[0] * 20], patience=3, seed=0, progress=False)
    assert flat.stopped == "patience" and flat.generations == 3
    capped = evolutionary_search(20, blocks_latency, [[0] * 20], patience=100, generations=2, seed=0, progress=False)
    assert capped.stopped == "generations" and capped.generations == 2

    def slow(bits):
        import time

        time.sleep(0.05)
        return blocks_latency(bits)

    timed = evolutionary_search(20, slow, [[0] * 20, [1] * 20], budget_s=0.5, patience=100, seed=0, progress=False)
    assert timed.stopped == "budget" and timed.seconds < 1.5
    assert len(timed.seed_ms) == 2  # the seeds are measured whatever the budget


def test_a_tiny_space_is_measured_exhaustively():
    result = evolutionary_search(2, blocks_latency, [[0, 0]], seed=0, progress=False)
    assert result.stopped == "every placement measured" and result.evaluated == 4
    assert result.best_ms == brute_force(2, blocks_latency)


@pytest.mark.parametrize("n", [0, 1])
def test_no_or_one_unit(n):
    result = evolutionary_search(n, blocks_latency, [[0] * n], seed=0, progress=False)
    assert result.best_ms == brute_force(n, blocks_latency)
