"""Test-wide settings: no test writes to the user's cost log; finalists are raced again in
fresh processes only where that is under test, and raced in short blocks where the race itself
is not."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_cost_log(tmp_path_factory):
    """``collage.optimize`` calls without a ``cost_log`` (the bench's collage peer) use a log
    of this test session, never ``~/.cache/collage``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("COLLAGE_COST_LOG", str(tmp_path_factory.mktemp("cost_log") / "costs.sqlite"))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def no_race_in_fresh_processes(request, monkeypatch):
    """Racing the kept finalist again in fresh processes (``collage.choosing.confirm``) costs
    an optimization 7-10 s here, and most tests optimize with real engines: it runs only in
    tests marked ``fresh_race``."""
    if "fresh_race" not in request.keywords:
        monkeypatch.setattr("collage.choosing.confirm.CLOSE", None)


@pytest.fixture(autouse=True)
def quick_call_path_timing(request, monkeypatch):
    """Timing ``opt(x)`` through both of its paths (``caller.time_call_paths``) costs an
    optimization that keeps an engine alone 2 s: elsewhere than in ``tests/test_caller.py``,
    which tests that choice, both paths are timed in short blocks."""
    if not request.module.__name__.endswith("test_caller"):
        from collage.assembling import caller
        from collage.measuring.timing import Protocol

        monkeypatch.setattr(caller, "CALL_PATHS", Protocol(rounds=3, block_ms=5.0, settle_s=0.0, warmup_s=0.01))


@pytest.fixture(autouse=True)
def quick_finalist_race(request, monkeypatch):
    """The finalists' race (``finalists.time_finalists``) times each finalist in blocks of 60 ms
    after 0.1 s of idle, 7 rounds or up to 21: 5-13 s of each optimization here, most of the
    suite's time. Elsewhere than in the tests of the race and its confirmation, the same rounds
    run in blocks of 15 ms after 20 ms of idle (50 ms of warm-up); every verdict is reached as before."""
    if not request.module.__name__.endswith(("test_finalists", "test_confirm")):
        from collage.choosing import finalists
        from collage.measuring.timing import Protocol

        monkeypatch.setattr(finalists, "FINALIST_PROTOCOL", Protocol(rounds=7, block_ms=15.0, settle_s=0.02, warmup_s=0.05))
