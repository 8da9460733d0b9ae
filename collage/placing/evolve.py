"""Graph-level refinement: DEAP's evolutionary search over bit strings (Collage §4.3).

An individual is one bit per unit of an ``OffloadSpace`` (1 = hand it to the engine); its
fitness is the latency it measures end to end, so lower is better. The loop is DEAP's
(mu + lambda) scheme: tournament selection, two-point crossover and bit-flip mutation make
the offspring, and the best distinct strings of parents and offspring survive, so the best
latency never gets worse. The first population holds the seeds (the op-level placement, all ones) and mutants of
them. It stops when ``budget_s`` is spent, when the best has not improved for ``patience``
generations, or after ``generations``.

DEAP draws from Python's ``random`` module: the search seeds it and restores its state after.
With the same seed and the same measured latencies (a second run reads them from the cost
log) the search visits the same individuals and returns the same answer.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deap import algorithms, base, tools


class Latency(base.Fitness):
    weights = (-1.0,)  # minimize


class Individual(list):
    """A bit string with its fitness, as DEAP's operators expect."""

    def __init__(self, bits=()):
        super().__init__(bits)
        self.fitness = Latency()


@dataclass
class EvolutionResult:
    best: tuple[int, ...]
    best_ms: float
    leaders: list[tuple[tuple[int, ...], float]]  # the best distinct strings found, best first
    seed_ms: list[float]  # each seed's latency, in the order given
    generations: int
    evaluated: int  # distinct bit strings whose latency was asked for
    seconds: float
    stopped: str  # "budget", "patience", "generations" or "every placement measured"
    logbook: tools.Logbook


def evolutionary_search(
    bits: int,
    latency_ms: Callable[[tuple[int, ...]], float],
    seeds: Sequence[Sequence[int]],
    *,
    budget_s: float = 600.0,
    patience: int = 5,
    population: int = 12,
    generations: int | None = None,
    crossover: float = 0.6,
    mutation: float = 0.4,
    tournament: int = 3,
    leaders: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> EvolutionResult:
    """The bit strings of ``bits`` bits with the lowest ``latency_ms`` (math.inf for one that
    cannot run) that the search finds, the best ``leaders`` of them kept (one noisy sample can
    flatter a string, so the caller may time the leaders again); each distinct string is asked
    for once."""
    started = time.perf_counter()
    seen: dict[tuple[int, ...], float] = {}
    logbook = tools.Logbook()
    logbook.header = ["gen", "evaluated", "best_ms"]
    if 2**bits <= population:  # so few strings that measuring them all is the search
        strings = [tuple(s) for s in seeds] + list(itertools.product((0, 1), repeat=bits))
        for key in strings:
            if key not in seen:
                seen[key] = latency_ms(key)
        leading = sorted(seen.items(), key=lambda kv: kv[1])[:leaders]
        logbook.record(gen=0, evaluated=len(seen), best_ms=leading[0][1])
        return EvolutionResult(*leading[0], leading, [seen[tuple(s)] for s in seeds], 0, len(seen),
                            time.perf_counter() - started, "every placement measured", logbook)

    toolbox = base.Toolbox()
    toolbox.register("mate", tools.cxTwoPoint)
    # About two flips per mutant: every flip adds up to two engine boundaries, and each costs.
    toolbox.register("mutate", tools.mutFlipBit, indpb=min(0.5, 2.0 / bits))
    toolbox.register("select", tools.selTournament, tournsize=tournament)
    best = tools.HallOfFame(leaders)
    deadline = started + budget_s
    bar = _progress_bar(budget_s, progress)

    def evaluate(individuals: list[Individual], whatever_the_time: bool = False) -> bool:
        """Give each individual its fitness; False when the budget ran out first."""
        for ind in individuals:
            if ind.fitness.valid:
                continue
            key = tuple(ind)
            if key not in seen:
                if time.perf_counter() > deadline and not whatever_the_time:
                    return False
                seen[key] = latency_ms(key)
            ind.fitness.values = (seen[key],)
            if bar is not None:
                bar.n = min(round(time.perf_counter() - started), bar.total)
                best_now = min(seen.values())
                bar.set_postfix_str(f"gen {len(logbook)}, best {best_now:.3f} ms, measured {len(seen)}")
        return True

    state = random.getstate()
    random.seed(seed)
    try:
        pop = [Individual(s) for s in seeds]
        while len(pop) < population:
            (mutant,) = toolbox.mutate(Individual(random.choice(seeds)))
            pop.append(mutant)
        stopped = "budget"
        evaluate(pop[: len(seeds)], whatever_the_time=True)  # the seeds are the baselines: always known
        seed_ms = [ind.fitness.values[0] for ind in pop[: len(seeds)]]
        in_time = evaluate(pop)
        pop = [ind for ind in pop if ind.fitness.valid]
        best.update(pop)
        logbook.record(gen=0, evaluated=len(seen), best_ms=best[0].fitness.values[0])
        since_better = 0
        while in_time:
            if generations is not None and len(logbook) > generations:
                stopped = "generations"
                break
            if since_better >= patience:
                stopped = "patience"
                break
            offspring = algorithms.varAnd(toolbox.select(pop, len(pop)), toolbox, crossover, mutation)
            in_time = evaluate(offspring)
            before = best[0].fitness.values[0]
            pop = tools.selBest(_distinct(pop + [ind for ind in offspring if ind.fitness.valid]), population)
            best.update(pop)
            since_better = 0 if best[0].fitness.values[0] < before else since_better + 1
            logbook.record(gen=len(logbook), evaluated=len(seen), best_ms=best[0].fitness.values[0])
    finally:
        random.setstate(state)
        if bar is not None:
            bar.close()
    leading = [(tuple(ind), ind.fitness.values[0]) for ind in best]
    return EvolutionResult(
        *leading[0], leading, seed_ms, len(logbook) - 1, len(seen), time.perf_counter() - started, stopped, logbook
    )


def _distinct(individuals: list[Individual]) -> list[Individual]:
    """One individual per bit string: copies of the best would crowd out the rest."""
    return list({tuple(ind): ind for ind in individuals}.values())


def _progress_bar(budget_s: float, shown: bool):
    if not shown:
        return None
    from tqdm import tqdm

    total = round(budget_s) if math.isfinite(budget_s) else None
    return tqdm(total=total, desc="graph-level search", unit="s", file=sys.stderr, dynamic_ncols=True,
                bar_format="{desc}: {bar} {n}/{total} s, {remaining} left{postfix}")
