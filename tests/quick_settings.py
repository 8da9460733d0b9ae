"""The suite's quick settings, one place for both the tests' own process (``conftest.py``,
each where its mechanism is not under test) and the command-line tests' subprocesses
(``subprocesses/sitecustomize.py``). Every verdict and check runs as in a user's process;
only the timing is shorter."""

from collage.measuring.timing import Protocol, Timing

# Racing the kept finalist again in fresh processes (``choosing.confirm``) costs an
# optimization 7-10 s here: CLOSE = None leaves it out.
FRESH_RACE_CLOSE = None
# Timing ``opt(x)`` through both of its paths (``caller.time_call_paths``): 2 s an optimization.
CALL_PATHS = Protocol(rounds=3, block_ms=5.0, settle_s=0.0, warmup_s=0.01)
# The finalists' race (``finalists.time_finalists``): blocks of 60 ms after 0.1 s of idle,
# 7 rounds or up to 21, were 5-13 s of each optimization here, most of the suite's time.
# Blocks of 15 ms after 5 ms: a pause longer than the block it precedes (20 ms) was 0.6-0.8 s
# of a race, and the races 13% of the suite.
FINALIST_PROTOCOL = Protocol(rounds=7, block_ms=15.0, settle_s=0.005, warmup_s=0.05)
# Undecided leaders' rounds go on up to 11, not 21: with blocks this short, a race between
# finalists that are one engine is undecided and runs to the end (the command-line tests'
# one-node model: 21 rounds, 6.6 s of its 18 s optimization).
FINALIST_MAX_ROUNDS = 11
# Before each of a race's blocks, the process is idle over three probes in a row
# (``timing.settle``): 2 ms each, not 5. The pause and the probes (35 ms a block) were 83 s of
# a 17-minute suite.
SETTLE_PROBE_S = 0.002
# The finalists' race run again, after a 2 s pause, while other processes keep more than 0.15
# cores busy (``finalists._quietest``): on a machine the suite shares, up to three races and
# 4 s of pauses an optimization (a single-operator ONNX case took 23 s, 13 of them there).
# One race: on a quiet machine nothing changes; on a busy one the suite no longer waits for it.
FINALIST_ATTEMPTS = 1

# The candidates' timing for tests that optimize a model whose costs they do not test (passed
# as ``timing=``; not applied to every test).
FAST_CANDIDATES = Timing(min_samples=3, max_samples=7, min_sample_ms=0.3, budget_s=0.3)

# (module, attribute, value): what ``apply`` sets.
SETTINGS = (
    ("collage.choosing.confirm", "CLOSE", FRESH_RACE_CLOSE),
    ("collage.assembling.caller", "CALL_PATHS", CALL_PATHS),
    ("collage.choosing.finalists", "FINALIST_PROTOCOL", FINALIST_PROTOCOL),
    ("collage.choosing.finalists", "ATTEMPTS", FINALIST_ATTEMPTS),
    ("collage.choosing.finalists", "MAX_ROUNDS", FINALIST_MAX_ROUNDS),
    ("collage.measuring.timing", "SETTLE_PROBE_S", SETTLE_PROBE_S),
)


def apply() -> None:
    """Every quick setting, in this process (a subprocess of the suite's)."""
    import importlib

    for module, name, value in SETTINGS:
        setattr(importlib.import_module(module), name, value)
