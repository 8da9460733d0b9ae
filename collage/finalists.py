"""Finalists: complete placements timed end to end against each other, and the choice among them.

The additive cost model misses what kernels do to each other (threads handed over, caches
emptied) and what an engine gains across kernels, so ``optimize`` builds a few complete
placements and times them with the project's one protocol (``collage.timing``,
docs/timing.md):

- the op-level DP's answer;
- each inference engine alone on the whole model, as its users run it: from the user's own
  ONNX file when the model came as one (``collage.engine_alone``), and from collage's
  conversion, which is the engine's largest region when it covers every op;
- each engine's largest regions with TVM for the rest, when an op keeps it from the whole;
- the graph-level search's leaders.

Collage can then lose to no engine beyond measurement noise. Among finalists within noise of
the fastest, the simplest is kept: fewest libraries, then fewest partitions. It is as fast as
far as can be measured, and fewer libraries sharing the cores leave less to chance in the
runs that were not timed (``choose``).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from tvm import relax

from .assemble import Assembly
from .cost import Cost
from .meters import EnergyMeter
from .placement import Partition
from .runner import device_for, synchronized, to_tensors
from .substitute.objective import Objective
from .timing import Protocol, busy_cores_by_others, cpu_seconds, time_contenders

FINALIST_PROTOCOL = Protocol(rounds=7, block_ms=60.0, settle_s=0.1)
# Finalists closer than this share of the fastest's time are tied whatever their spreads say:
# runs in fresh processes differ by about that much (docs/timing.md).
NOISE_FLOOR = 0.02
# Other processes busier than this (cores, on average) while finalists were timed: time again.
MAX_OTHERS_BUSY = 0.15
ATTEMPTS = 3
PAUSE_S = 2.0


@dataclass
class Finalist:
    """One complete placement, assembled, checked against the unoptimized model, and ready to
    time: its partitions, the DP's estimate (NaN where a kernel was never measured alone), the
    partitions that fell back to TVM and why."""

    partitions: list[Partition]
    assembly: Assembly
    vm: relax.VirtualMachine
    estimated_ms: float
    fallbacks: list[tuple[Partition, str]] = field(default_factory=list)

    @property
    def simplicity(self) -> tuple[int, int]:
        """(libraries, partitions): the fewer, the simpler."""
        return len({p.backend for p in self.partitions}), len(self.partitions)


class Timed(NamedTuple):
    costs: dict[str, Cost]  # label -> end-to-end cost
    others_busy_cores: float | None  # what other processes kept busy while these were timed
    attempts: int


def time_finalists(
    vms: dict[str, relax.VirtualMachine],
    arrays: list[np.ndarray],
    target: str,
    protocol: Protocol = FINALIST_PROTOCOL,
    meter: EnergyMeter | None = None,
) -> Timed:
    """End-to-end cost of each module (label -> VM) on ``arrays``, timed against each other
    (and metered, with a ``meter``: the energy of one call, for objectives that weigh it).

    A shared host's other processes can take a core for seconds: on 2 cores a library that
    splits its work statically then runs nearly twice as slow while one that balances work
    loses less, and the comparison picks the wrong finalist (Inception-v3's OpenVINO placement
    once timed 124 ms beside ONNX Runtime's 82, while other processes kept 0.2 cores busy on
    average; 70 and 71 ms on a quiet machine). So the finalists are timed again, after a
    pause, while other processes kept more than ``MAX_OTHERS_BUSY`` cores busy, up to
    ``ATTEMPTS`` times; the quietest timing is kept."""
    inputs = to_tensors(arrays, device_for(target))
    calls = {label: synchronized(functools.partial(vm["main"], *inputs), target) for label, vm in vms.items()}
    quietest = None
    for attempt in range(1, ATTEMPTS + 1):
        before = cpu_seconds()
        costs = time_contenders(calls, protocol, meter)
        busy = busy_cores_by_others(before, cpu_seconds())
        if quietest is None or (busy is not None and busy < quietest.others_busy_cores):
            quietest = Timed(costs, busy, attempt)
        if busy is None or busy <= MAX_OTHERS_BUSY:
            break
        time.sleep(PAUSE_S)
    return quietest._replace(attempts=attempt)


def within_noise(cost: Cost, fastest: Cost) -> bool:
    """Whether ``cost`` is as fast as ``fastest`` as far as the timing can tell: apart by no
    more than either one's spread, or than ``NOISE_FLOOR`` of the fastest."""
    allowed = max(cost.spread_ms, fastest.spread_ms, NOISE_FLOOR * fastest.median_ms)
    return cost.median_ms - fastest.median_ms <= allowed


def choose(
    measured: dict[str, Cost], simplicity: dict[str, tuple[int, int]], objective: Objective = Objective()
) -> tuple[str, str | None]:
    """The finalist to keep, and a note when it is not the best: the simplest of those within
    noise of the best under ``objective`` (fewest libraries, then partitions, then the best).

    Time alone compares medians (``within_noise``). An objective that weighs energy compares
    each finalist's ``objective.value`` of its measured time and energy, relative to the
    fastest finalist's; its noise is the larger relative spread of the two finalists' times
    (energy is metered over the same blocks) or ``NOISE_FLOOR``."""
    if objective.is_time:
        best = min(measured, key=lambda name: measured[name].median_ms)
        tied = [name for name in measured if within_noise(measured[name], measured[best])]
        value = {name: cost.median_ms for name, cost in measured.items()}
    else:
        value = _objective_values(measured, objective)
        best = min(measured, key=value.get)
        tied = [name for name in measured
                if value[name] - value[best] <= _relative_noise(measured[name], measured[best]) * value[best]]  # fmt: skip
    chosen = min(tied, key=lambda name: (simplicity[name], value[name]))
    if chosen == best:
        return chosen, None
    worse = value[chosen] / value[best] - 1
    libraries, partitions = simplicity[chosen]
    what = "the fastest" if objective.is_time else f"the best for {objective}"
    return chosen, (
        f"kept {chosen!r} ({libraries} librar{'y' if libraries == 1 else 'ies'}, {partitions} partition(s)): "
        f"within noise of {what}, {best!r} ({worse:+.1%}), and simpler"
    )


def _objective_values(measured: dict[str, Cost], objective: Objective) -> dict[str, float]:
    unmetered = [name for name, cost in measured.items() if cost.energy_mj is None]
    if unmetered:
        raise ValueError(f"objective {objective} needs each finalist's energy; not metered: {', '.join(unmetered)}")
    fastest = min(measured.values(), key=lambda cost: cost.median_ms)
    reference = (fastest.median_ms, fastest.energy_mj)
    return {name: objective.value(cost.median_ms, cost.energy_mj, reference) for name, cost in measured.items()}


def _relative_noise(cost: Cost, best: Cost) -> float:
    return max(cost.spread_ms / cost.median_ms, best.spread_ms / best.median_ms, NOISE_FLOOR)
