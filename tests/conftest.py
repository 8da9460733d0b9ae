"""Test-wide settings: no test writes to the user's cost log; the timing of the finalists'
race (run once, not again while other processes are busy), of the fresh-process race and of
the call paths is the suite's quick one (``tests/quick_settings.py``) wherever that mechanism
is not itself under test."""

import importlib

import pytest

from tests import quick_settings


@pytest.fixture(autouse=True, scope="session")
def private_cost_log(tmp_path_factory):
    """``collage.optimize`` calls without a ``cost_log`` (the bench's collage peer) use a log
    of this test session, never ``~/.cache/collage``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("COLLAGE_COST_LOG", str(tmp_path_factory.mktemp("cost_log") / "costs.sqlite"))
    yield
    mp.undo()


@pytest.fixture(autouse=True, scope="session")
def quick_timing():
    """The suite's quick settings for the whole session: module-scoped fixtures that optimize
    a model are made before any function-scoped fixture runs. Yields the real settings."""
    mp = pytest.MonkeyPatch()
    real = {}
    for module, name, value in quick_settings.SETTINGS:
        real[module, name] = getattr(importlib.import_module(module), name)
        mp.setattr(f"{module}.{name}", value)
    yield real
    mp.undo()


# Where each mechanism is under test, and so keeps its real setting: the fresh-process race in
# tests marked ``fresh_race``; the two call paths in ``tests/test_caller.py``, which tests that
# choice; the race run again while other processes are busy, and its rounds for undecided
# leaders, in ``tests/test_finalists.py``, which tests them; the settling pause's probes in
# ``tests/test_timing.py``, which tests the pause. The finalists' race is quick everywhere: the
# tests of its rules time with protocols of their own, and the one optimization of
# ``tests/test_confirm.py`` races every runner-up again, close or not (its real race was 6-9 s
# of that test).
UNDER_TEST = {
    "CLOSE": lambda request: "fresh_race" in request.keywords,
    "CALL_PATHS": lambda request: request.module.__name__.endswith("test_caller"),
    "ATTEMPTS": lambda request: request.module.__name__.endswith("test_finalists"),
    "MAX_ROUNDS": lambda request: request.module.__name__.endswith("test_finalists"),
    "SETTLE_PROBE_S": lambda request: request.module.__name__.endswith("test_timing"),
}


@pytest.fixture(autouse=True)
def real_timing_where_under_test(request, monkeypatch, quick_timing):
    for (module, name), value in quick_timing.items():
        if name in UNDER_TEST and UNDER_TEST[name](request):
            monkeypatch.setattr(f"{module}.{name}", value)
