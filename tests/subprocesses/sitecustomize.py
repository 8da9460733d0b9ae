"""Run by Python at start-up in the suite's command-line subprocesses, whose PYTHONPATH names
this folder (``tests.helpers.subprocess_env``): the suite's quick settings there too."""

from tests.quick_settings import apply

apply()
