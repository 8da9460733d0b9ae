"""One optimization's settings: fixed when it starts, handed down to every stage.

``optimize``'s keyword arguments, the command line's flags and the options of the
torch.compile backend all become one ``Config``; nothing below reads the environment or a
dict of option strings. A ``Config`` checks itself when it is made, so a mistake (an unknown
target, ``alpha`` below 1, an energy objective without the search it steers) is one
``OptimizeError`` before any work starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .candidates.backend import TARGETS
from .errors import OptimizeError
from .measuring.threads import default_threads
from .measuring.timing import Timing
from .placing.objective import Objective

if TYPE_CHECKING:
    from .measuring.runner import MeasureRunner



@dataclass(frozen=True, kw_only=True)
class Config:
    """What steers one optimization (``collage.optimize`` documents each setting).

    ``threads`` is resolved when the config is made (0: the cores this process may use) and
    reaches every backend's ``compile`` as an argument. ``objective`` may be given as text
    ("time", "0.5*time+0.5*energy") and is parsed then. ``runner`` is where candidates are
    measured (None: this process's shared worker process)."""

    target: str = "llvm"
    threads: int = 0
    seed: int = 0
    simplify: bool = True
    timing: Timing = Timing()
    progress: bool = True
    graph_level: bool = False
    budget_s: float = 600.0
    patience: int = 5
    substitutions: bool = False
    alpha: float = 1.05
    substitution_budget_s: float = 120.0
    objective: Objective = Objective()
    runner: MeasureRunner | None = None
    accuracy: float | None = None  # the largest error accepted, relative to each output's largest magnitude

    def __post_init__(self):
        if self.target not in TARGETS:
            raise OptimizeError(f"unknown target {self.target!r}; collage supports {', '.join(TARGETS)}")
        # Frozen, yet resolved once here: every stage sees the same thread count and objective.
        if not self.threads:  # 0 or None: every core this process may use
            object.__setattr__(self, "threads", default_threads())
        if not isinstance(self.threads, int) or self.threads < 0:
            raise OptimizeError(f"threads must be a positive number of threads (0: every core), got {self.threads!r}")
        if self.accuracy is not None and not 0 < self.accuracy < 1:
            raise OptimizeError(f"accuracy is the largest error accepted relative to each output's largest magnitude, "
                                f"between 0 and 1 (1e-2: 1%), got {self.accuracy}")
        if self.substitutions and self.alpha < 1:
            raise OptimizeError(f"alpha must be at least 1 (1 keeps only improving substitutions), got {self.alpha}")
        try:
            object.__setattr__(self, "objective", Objective.parse(self.objective))
        except ValueError as err:
            raise OptimizeError(str(err)) from None
        if not self.objective.is_time and not self.substitutions:
            raise OptimizeError(f"objective {self.objective} steers the substitution search: pass substitutions=True too")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings a config holds (what the torch.compile backend's options may set)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes) -> Config:
        return dataclasses.replace(self, **changes)
