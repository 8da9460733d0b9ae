"""What an optimization minimizes: time, energy, average power, or a weighted mix of them (the
energy-aware paper's cost functions). The substitution search prices graphs by it, and the
finalists are chosen by it.

An objective weighs three metrics of a placement, each divided by its value for the graph as
given, so that weights compare like with like, as the paper normalizes them: time (ms per
inference), energy (mJ per inference) and average power (energy over time). ``Objective()``
is time alone; ``Objective.parse("0.5*time+0.5*energy")`` the paper's balance.

The inner search, the DP placement, adds candidate costs, so it minimizes what adds up: each
candidate's weighted time and energy. Average power is a ratio and does not add up; the DP
counts its weight on energy (at equal time, less energy is less power), and the graph is then
priced with its true power. Transitions between libraries have a measured time but no
measured energy: they count in time only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..measuring.cost import Cost

METRICS = ("time", "energy", "power")


@dataclass(frozen=True)
class Objective:
    time: float = 1.0
    energy: float = 0.0
    power: float = 0.0

    def __post_init__(self):
        weights = (self.time, self.energy, self.power)
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"objective weights must be non-negative and not all zero, got {self}")

    @classmethod
    def parse(cls, spec: str | Objective) -> Objective:
        """``"time"``, ``"energy"``, ``"power"``, or a weighted sum such as
        ``"0.7*time+0.3*energy"``."""
        if isinstance(spec, Objective):
            return spec
        weights = dict.fromkeys(METRICS, 0.0)
        for term in spec.replace(" ", "").split("+"):
            found = re.fullmatch(r"(?:([0-9]*\.?[0-9]+)\*)?(time|energy|power)", term)
            if found is None:
                raise ValueError(
                    f"objective {spec!r}: write time, energy, power, or a weighted sum like 0.5*time+0.5*energy"
                )
            weights[found.group(2)] += float(found.group(1) or 1.0)
        return cls(**weights)

    @property
    def is_time(self) -> bool:
        return self.energy == 0 and self.power == 0

    def __str__(self):
        terms = [(w, m) for w, m in zip((self.time, self.energy, self.power), METRICS) if w]
        return "+".join(m if w == 1 and len(terms) == 1 else f"{w:g}*{m}" for w, m in terms)

    def value(self, time_ms: float, energy_mj: float, reference: tuple[float, float]) -> float:
        """The objective of a placement taking ``time_ms`` and ``energy_mj``, relative to the
        ``reference`` (time, energy) of the graph as given."""
        time0, energy0 = reference
        power, power0 = energy_mj / time_ms, energy0 / time0
        return self.time * time_ms / time0 + self.energy * energy_mj / energy0 + self.power * power / power0


class WeightedCosts:
    """The CostSource the DP minimizes under ``objective``: each candidate's measured time and
    energy (from ``costs``) weighted and normalized by ``reference``."""

    def __init__(self, costs, objective: Objective, reference: tuple[float, float]):
        self.costs, self.objective, self.reference = costs, objective, reference

    def cost(self, candidate) -> Cost:
        measured = self.costs.cost(candidate)
        if not measured.is_valid:
            return measured
        if measured.energy_mj is None:
            return Cost.invalid("no energy was measured for it (no meter when it was timed)")
        time0, energy0 = self.reference
        energy_weight = self.objective.energy + self.objective.power
        return Cost.of(self.objective.time * measured.median_ms / time0 + energy_weight * measured.energy_mj / energy0)

    def transition_ms(self, backend: str) -> float:
        return self.objective.time * self.costs.transition_ms(backend) / self.reference[0]

    def interplay_ms(self, a: str, b: str) -> float:
        return self.objective.time * self.costs.interplay_ms(a, b) / self.reference[0]
