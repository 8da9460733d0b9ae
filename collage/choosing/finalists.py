"""Finalists: complete placements timed end to end against each other, and the choice among them.

The additive cost model misses what kernels do to each other (threads handed over, caches
emptied) and what an engine gains across kernels, so ``optimize`` builds a few complete
placements and times them with the project's one protocol (``collage.measuring.timing``,
docs/timing.md):

- the op-level DP's answer;
- each inference engine alone on the whole model, as its users run it: from the user's own
  ONNX file when the model came as one (``collage.choosing.engine_alone``), and from collage's
  conversion, which is the engine's largest region when it covers every op;
- each engine's largest regions with TVM for the rest, when an op keeps it from the whole;
- the graph-level search's leaders.

Collage can then lose to no engine beyond measurement noise. What a user pays is every
block of calls, the slow ones too: a library whose speed swings between blocks (OpenVINO's
0.44-0.67 ms on a 2-core host, beside ONNX Runtime's steady 0.351) is not known to be fast
by its median. So the leader is the finalist with the lowest upper quartile of its block
medians (``Race.paid_ms``), and each other finalist is compared with it round by round
(paired: drift hits both alike). Rounds go on, within ``MAX_ROUNDS``, until each is known
slower or known equivalent to the leader. Of the leader and those equivalent to it, the
simplest is kept: fewest libraries, then fewest partitions; fewer libraries sharing the
cores leave less to chance in the runs that were not timed (``choose``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from tvm import relax

from ..assembling.assemble import bound_main
from ..assembling.caller import Caller, signature_of
from ..measuring.cost import Cost
from ..measuring.meters import EnergyMeter
from ..measuring.build import device_for, is_cuda, synchronized
from ..measuring.arrays import to_tensors
from ..measuring.timing import Protocol, busy_cores_by_others, cpu_seconds, median_and_iqr, time_contenders, time_rounds
from ..assembling.checked import Finalist
from ..placing.objective import Objective

FINALIST_PROTOCOL = Protocol(rounds=7, block_ms=60.0, settle_s=0.1)
# Undecided leaders are timed again, ``EXTRA_ROUNDS`` at a time, up to this many rounds in all.
MAX_ROUNDS = 21
EXTRA_ROUNDS = 4
# Finalists closer than this share of the fastest's time are tied whatever their spreads say:
# runs in fresh processes differ by about that much (docs/timing.md).
NOISE_FLOOR = 0.02
# Other processes busier than this (cores, on average) while finalists were timed: time again.
MAX_OTHERS_BUSY = 0.15
ATTEMPTS = 3
PAUSE_S = 2.0


class Verdict(enum.Enum):
    """A finalist against the leader, from their paired rounds."""

    LEADER = "leader"
    EQUIVALENT = "equivalent"  # within NOISE_FLOOR in the middle half of the rounds
    SLOWER = "slower"  # slower by more than NOISE_FLOOR in three rounds of four
    UNDECIDED = "undecided"


@dataclass
class Race:
    """The finalists' block medians (ms), round by round: ``rounds[k][name]`` for each finalist
    that took part in round ``k``. Every comparison reads it; nothing else is kept."""

    rounds: list[dict[str, float]] = field(default_factory=list)

    def add(self, block_ms: dict[str, list[float]]) -> None:
        """Append rounds as ``timing.time_rounds`` returns them (each name's blocks in round order)."""
        for k in range(max(map(len, block_ms.values()), default=0)):
            self.rounds.append({name: ms[k] for name, ms in block_ms.items() if k < len(ms)})

    def blocks(self, name: str) -> list[float]:
        return [r[name] for r in self.rounds if name in r]

    def paid_ms(self, name: str) -> float:
        """The upper quartile of ``name``'s block medians: what a user pays, slow blocks included."""
        ms = self.blocks(name)
        return statistics.quantiles(ms, n=4, method="inclusive")[2] if len(ms) > 1 else ms[0]

    def cost(self, name: str) -> Cost:
        return Cost.of(*median_and_iqr(self.blocks(name)), samples=len(self.blocks(name)))

    def leader(self) -> str:
        return min({name for r in self.rounds for name in r}, key=lambda name: (self.paid_ms(name), self.cost(name).median_ms))

    def verdict(self, name: str, leader: str) -> Verdict:
        if name == leader:
            return Verdict.LEADER
        ratios = [r[name] / r[leader] for r in self.rounds if name in r and leader in r]
        if len(ratios) < 2:
            return Verdict.UNDECIDED
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        if q1 > 1 + NOISE_FLOOR:
            return Verdict.SLOWER
        if 1 - NOISE_FLOOR <= q1 and q3 <= 1 + NOISE_FLOOR:
            return Verdict.EQUIVALENT
        return Verdict.UNDECIDED

    def verdicts(self) -> dict[str, Verdict]:
        leader = self.leader()
        return {name: self.verdict(name, leader) for name in self.rounds[0]}


class Timed(NamedTuple):
    costs: dict[str, Cost]  # label -> end-to-end cost
    others_busy_cores: float | None  # what other processes kept busy while these were timed
    attempts: int
    race: Race | None = None  # the rounds behind ``costs``; None when metered (energy objectives)


def time_finalists(
    contenders: dict[str, Finalist | relax.VirtualMachine],
    arrays: list[np.ndarray],
    target: str,
    protocol: Protocol | None = None,
    meter: EnergyMeter | None = None,
) -> Timed:
    """End-to-end cost of each contender on ``arrays``, timed against each other (and metered,
    with a ``meter``: the energy of one call, for objectives that weigh it). A contender is a
    Finalist, called as ``OptimizedModule.bind`` calls it (``assemble.bound_main``), or a bare
    VM (a module with nothing placed, an exported one), whose ``main`` is called.

    A shared host's other processes can take a core for seconds: on 2 cores a library that
    splits its work statically then runs nearly twice as slow while one that balances work
    loses less, and the comparison picks the wrong finalist (Inception-v3's OpenVINO placement
    once timed 124 ms beside ONNX Runtime's 82, while other processes kept 0.2 cores busy on
    average; 70 and 71 ms on a quiet machine). So the finalists are timed again, after a
    pause, while other processes kept more than ``MAX_OTHERS_BUSY`` cores busy, up to
    ``ATTEMPTS`` times; the quietest timing is kept. Unmetered, the rounds then go on for the
    leader and each finalist still undecided against it (``Race``), up to ``MAX_ROUNDS``.
    ``protocol`` defaults to ``FINALIST_PROTOCOL``."""
    protocol = protocol or FINALIST_PROTOCOL
    calls = {label: users_call(contender, arrays, target) for label, contender in contenders.items()}
    if meter is not None:
        return _quietest(lambda: (time_contenders(calls, protocol, meter), None))
    timed = _quietest(lambda: _raced(calls, protocol))
    race = timed.race
    extra = 0
    while len(race.rounds) < MAX_ROUNDS:
        verdicts = race.verdicts()
        undecided = [name for name, v in verdicts.items() if v is Verdict.UNDECIDED]
        if not undecided:
            break
        extra += 1
        contenders = {name: calls[name] for name, v in verdicts.items() if v in (Verdict.LEADER, Verdict.UNDECIDED)}
        rounds = min(EXTRA_ROUNDS, MAX_ROUNDS - len(race.rounds))
        race.add(time_rounds(contenders, dataclasses.replace(protocol, rounds=rounds, seed=protocol.seed + extra)))
    return timed._replace(costs={name: race.cost(name) for name in calls})


def users_call(contender: Finalist | relax.VirtualMachine, arrays: list[np.ndarray], target: str):
    """A call with no arguments that runs ``contender`` once on ``arrays`` as its user will
    and waits for the device. On the CPU a Finalist runs as ``opt(x)`` does
    (``assembling.caller``): the arrays handed to an engine's own call where it has one, else
    copied into buffers of the module's, the outputs copied out. Timed on buffers bound once
    instead (``OptimizedModule.bind``), an engine that must copy its inputs in was charged
    nothing for it, beside one that reads the user's arrays in place: MobileNetV1 on
    OpenVINO raced at 0.24 ms against ONNX Runtime's 0.31, and ``opt(x)`` then paid 15-45 us
    more for its 600 KB input, where ONNX Runtime's ``run`` reads it in place (2-core Xeon).
    On a GPU the module's time is the device's (CUDA graphs): its buffers are bound once. A
    bare VM's ``main`` runs on tensors made once."""
    device = device_for(target)
    if not isinstance(contender, Finalist):
        return synchronized(functools.partial(contender["main"], *to_tensors(arrays, device)), target)
    if is_cuda(target):
        return synchronized(bound_main(contender.assembly, contender.vm, to_tensors(arrays, device), device), target)
    main = contender.assembly.module["main"]
    caller = Caller(contender.vm, signature_of(main.params), device, main, contender.assembly.kernel_map())
    return functools.partial(caller.numpy, *arrays)


def _raced(calls, protocol: Protocol) -> tuple[dict[str, Cost], Race]:
    race = Race()
    race.add(time_rounds(calls, protocol))
    return {name: race.cost(name) for name in calls}, race


def _quietest(timing) -> Timed:
    """``timing()`` (costs, race) again after a pause while others kept the machine busy."""
    quietest = None
    for attempt in range(1, ATTEMPTS + 1):
        before = cpu_seconds()
        costs, race = timing()
        busy = busy_cores_by_others(before, cpu_seconds())
        if quietest is None or (busy is not None and busy < quietest.others_busy_cores):
            quietest = Timed(costs, busy, attempt, race)
        if busy is None or busy <= MAX_OTHERS_BUSY:
            break
        if attempt < ATTEMPTS:  # no pause after the last: nothing is timed after it
            time.sleep(PAUSE_S)
    return quietest._replace(attempts=attempt)


def within_noise(cost: Cost, fastest: Cost) -> bool:
    """Whether ``cost`` is as fast as ``fastest`` as far as the timing can tell: apart by no
    more than either one's spread, or than ``NOISE_FLOOR`` of the fastest."""
    allowed = max(cost.spread_ms, fastest.spread_ms, NOISE_FLOOR * fastest.median_ms)
    return cost.median_ms - fastest.median_ms <= allowed


def choose(
    measured: dict[str, Cost],
    simplicity: dict[str, tuple[int, int]],
    objective: Objective = Objective(),
    race: Race | None = None,
) -> tuple[str, str | None]:
    """The finalist to keep, and a note when it is not the best: the simplest of those as good
    as the best under ``objective`` (fewest libraries, then partitions, then the best).

    Time with the ``race`` (how ``optimize`` decides): the best is the leader, the lowest
    upper quartile of block medians; as good are those equivalent to it round by round
    (``Race.verdict``). Time without rounds compares medians (``within_noise``). An objective
    that weighs energy compares each finalist's ``objective.value`` of its measured time and
    energy, relative to the fastest finalist's; its noise is the larger relative spread of the
    two finalists' times (energy is metered over the same blocks) or ``NOISE_FLOOR``."""
    if objective.is_time and race is not None:
        best = race.leader()
        verdicts = race.verdicts()
        tied = [name for name in measured if verdicts[name] in (Verdict.LEADER, Verdict.EQUIVALENT)]
        value = {name: race.paid_ms(name) for name in measured}
    elif objective.is_time:
        best = min(measured, key=lambda name: measured[name].median_ms)
        tied = [name for name in measured if within_noise(measured[name], measured[best])]
        value = {name: cost.median_ms for name, cost in measured.items()}
    else:
        value = _objective_values(measured, objective)
        best = min(measured, key=value.get)
        tied = [name for name in measured
                if value[name] - value[best] <= _relative_noise(measured[name], measured[best]) * value[best]]  # fmt: skip
    chosen = simplest(tied, simplicity, value)
    if chosen == best:
        return chosen, _steadier_note(chosen, measured, race) if race is not None else None
    worse = value[chosen] / value[best] - 1
    libraries, partitions = simplicity[chosen][:2]
    what = "the fastest" if objective.is_time else f"the best for {objective}"
    return chosen, (
        f"kept '{chosen}' ({libraries} librar{'y' if libraries == 1 else 'ies'}, {partitions} partition(s)): "
        f"within noise of {what}, '{best}' ({worse:+.1%}), and simpler"
    )


def simplest(names, simplicity: dict, value: dict):
    """Of ``names`` nobody can tell apart by time, the one to keep: the simplest (fewest
    libraries, then partitions, then reduced partitions: ``Finalist.simplicity``), then the
    lowest ``value``; the first of ``names`` where all are alike."""
    return min(names, key=lambda name: (simplicity[name], value[name]))


def _steadier_note(chosen: str, measured: dict[str, Cost], race: Race) -> str | None:
    """Why the leader was kept over a finalist whose median is lower, if one is."""
    lowest = min(measured, key=lambda name: measured[name].median_ms)
    if lowest == chosen or race.verdict(lowest, chosen) is Verdict.EQUIVALENT:
        return None
    return (
        f"kept '{chosen}' over '{lowest}': its median is {measured[chosen].median_ms:.3f} ms against "
        f"{measured[lowest].median_ms:.3f}, but '{lowest}''s slow blocks (upper quartile {race.paid_ms(lowest):.3f} ms "
        f"against {race.paid_ms(chosen):.3f}, over {len(race.blocks(lowest))} rounds) cost a user more"
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
