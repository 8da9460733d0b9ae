"""Test-wide settings: no test writes to the user's cost log; the timing of the finalists'
race, of the fresh-process race and of the call paths is the suite's quick one
(``tests/quick_settings.py``) wherever that mechanism is not itself under test."""

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


@pytest.fixture(autouse=True)
def no_race_in_fresh_processes(request, monkeypatch):
    """The fresh-process race runs only in tests marked ``fresh_race``."""
    if "fresh_race" not in request.keywords:
        monkeypatch.setattr("collage.choosing.confirm.CLOSE", quick_settings.FRESH_RACE_CLOSE)


@pytest.fixture(autouse=True)
def quick_call_path_timing(request, monkeypatch):
    """Both call paths timed in short blocks, but in ``tests/test_caller.py``, which tests that choice."""
    if not request.module.__name__.endswith("test_caller"):
        monkeypatch.setattr("collage.assembling.caller.CALL_PATHS", quick_settings.CALL_PATHS)


@pytest.fixture(autouse=True)
def quick_finalist_race(request, monkeypatch):
    """The finalists' race in short blocks, but in the tests of the race and its confirmation."""
    if not request.module.__name__.endswith(("test_finalists", "test_confirm")):
        monkeypatch.setattr("collage.choosing.finalists.FINALIST_PROTOCOL", quick_settings.FINALIST_PROTOCOL)
