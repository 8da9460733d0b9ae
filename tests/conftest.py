"""Test-wide settings: no test writes to the user's cost log."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_cost_log(tmp_path_factory):
    """``collage.optimize`` calls without a ``cost_log`` (the bench's collage peer) use a log
    of this test session, never ``~/.cache/collage``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("COLLAGE_COST_LOG", str(tmp_path_factory.mktemp("cost_log") / "costs.sqlite"))
    yield
    mp.undo()
