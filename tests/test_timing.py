"""The timing protocol's settling pause (``collage.measuring.timing.settle``): a block starts
only once the threads a library left spinning are idle, as measured from the process's CPU
time, whatever the pause's length."""

import threading
import time

import pytest

from collage.measuring.timing import SETTLE_MAX_S, Protocol, block_calls, settle, time_rounds

# The pause is measured from the process's CPU time: alone on the machine (``make test``).
pytestmark = pytest.mark.timed


class Spinner:
    """A library's pool in miniature: each call leaves a thread of it spinning ``spin_s``."""

    def __init__(self, spin_s: float):
        self.spin_s, self.until = spin_s, 0.0
        self._wake = threading.Event()
        threading.Thread(target=self._spin, daemon=True).start()

    def __call__(self):
        self.until = time.perf_counter() + self.spin_s
        self._wake.set()

    def spinning(self) -> bool:
        return time.perf_counter() < self.until

    def _spin(self):
        while self._wake.wait():
            while self.spinning():
                pass
            self._wake.clear()


def test_settle_waits_out_a_spinning_thread_and_no_longer():
    spinner = Spinner(0.3)
    time.sleep(0.05)
    assert settle(0.02) < 0.1  # nothing spins
    spinner()
    waited = settle(0.02)
    assert not spinner.spinning() and 0.25 <= waited < SETTLE_MAX_S


def test_no_block_runs_beside_the_threads_its_neighbour_left_spinning():
    """A contender whose library spins three times as long as the pause: with a pause of fixed
    length the next contender's blocks ran beside its spinning thread; settled, none does."""
    spinner, beside = Spinner(0.3), []

    def quiet():
        beside.append(spinner.spinning())

    protocol = Protocol(rounds=4, block_ms=5.0, settle_s=0.1, warmup_s=0.01)
    time_rounds({"quiet": quiet, "spinner": spinner}, protocol)  # quiet warms up before any spin
    assert beside and not any(beside)


def test_a_block_is_sized_by_warm_calls_not_by_a_slow_first_one():
    """A first call longer than the whole warm-up (a library's lazy set-up in a fresh process)
    would make every block one call, each timed cold; the block is filled by warm calls."""
    calls = []

    def lazy():
        calls.append(None)
        time.sleep(0.25 if len(calls) == 1 else 0.001)

    protocol = Protocol(block_ms=20.0, warmup_s=0.2)
    assert block_calls(lazy, protocol) >= 10
