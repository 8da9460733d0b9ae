"""Cost: what running one candidate takes, as the placement DP sees it.

A Cost is a value type with three kinds, as in TVM's Relay Collage (``cost.h``):

- *valid*: a measured median latency in milliseconds, with its spread and sample count, and
  the energy of one call in millijoules where a meter measured it (``collage.measuring.meters``);
- *invalid*: the candidate cannot be used (it failed to compile, to run, or to match TVM's
  reference); its value is infinite and it carries the reason, so failure is a cost the DP
  never picks rather than an exception;
- *unknown*: not measured yet.

``CostSource`` is what the DP asks for a candidate's cost; the measurer and test-only price
lists implement it. ``Device`` names the machine a cost was measured on.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from typing import Protocol

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"


@dataclass(frozen=True)
class Cost:
    """A latency in milliseconds, or invalid (with a reason), or unknown.

    Build one with ``Cost.of``, ``Cost.invalid`` or ``Cost.unknown``. Costs add up along a
    placement: invalid absorbs everything (a placement with one unusable candidate is
    unusable), otherwise unknown absorbs the rest (a sum with a missing term is not known).
    Costs order by value, invalid last, so ``min`` picks the cheapest usable one; ordering
    an unknown cost raises, since the DP must measure before it compares.
    """

    kind: str
    median_ms: float = math.nan
    spread_ms: float = 0.0
    samples: int = 0
    reason: str | None = None
    energy_mj: float | None = None  # per call; None where no meter measured it
    # Its outputs' error against TVM's float32 (``runner.relative_error``), measured with the
    # timing for a candidate in a reduced precision, or why it is invalid where that error
    # missed the accuracy budget; None for float32 ones.
    error: float | None = None

    @classmethod
    def of(cls, median_ms: float, spread: float = 0.0, samples: int = 1, energy_mj: float | None = None,
           error: float | None = None) -> Cost:
        """A measured cost: the median of ``samples`` timings and their spread (both in ms), the
        energy of one call (mJ) if it was metered, and the error of its outputs if it was
        computed in a reduced precision."""
        if not (math.isfinite(median_ms) and median_ms >= 0):
            raise ValueError(f"a valid cost needs a finite, non-negative median, not {median_ms!r}")
        if not (math.isfinite(spread) and spread >= 0):
            raise ValueError(f"spread must be finite and non-negative, not {spread!r}")
        if samples < 0:
            raise ValueError(f"samples must be non-negative, not {samples!r}")
        if energy_mj is not None and not (math.isfinite(energy_mj) and energy_mj >= 0):
            raise ValueError(f"energy must be finite and non-negative, not {energy_mj!r}")
        if error is not None and not (math.isfinite(error) and error >= 0):
            raise ValueError(f"error must be finite and non-negative, not {error!r}")
        return cls(VALID, float(median_ms), float(spread), int(samples), energy_mj=None if energy_mj is None else float(energy_mj),
                   error=None if error is None else float(error))  # fmt: skip

    @classmethod
    def invalid(cls, reason: str, error: float | None = None) -> Cost:
        """An unusable candidate; ``reason`` says why (shown in reports and kept in the log),
        and ``error`` is its error where that is why (a reduced precision over the budget)."""
        if not reason:
            raise ValueError("an invalid cost needs a reason")
        return cls(INVALID, math.inf, reason=reason, error=error)

    @classmethod
    def unknown(cls) -> Cost:
        return cls(UNKNOWN)

    @property
    def is_valid(self) -> bool:
        return self.kind == VALID

    @property
    def is_invalid(self) -> bool:
        return self.kind == INVALID

    @property
    def is_unknown(self) -> bool:
        return self.kind == UNKNOWN

    @property
    def value_ms(self) -> float:
        """The latency in ms; ``math.inf`` when invalid. Unknown has no value and raises."""
        if self.is_unknown:
            raise ValueError("an unknown cost has no value; measure the candidate first")
        return self.median_ms

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        if self.is_invalid or other.is_invalid:
            return self if self.is_invalid else other  # the first reason is the one to report
        if self.is_unknown or other.is_unknown:
            return Cost.unknown()
        # A sum is not one measurement: spreads add up as a bound, and it has no samples; errors
        # compound through the ops after them, so a sum has none (the whole module's is measured).
        energy = None if self.energy_mj is None or other.energy_mj is None else self.energy_mj + other.energy_mj
        return Cost(VALID, self.median_ms + other.median_ms, self.spread_ms + other.spread_ms, 0, energy_mj=energy)

    def __radd__(self, other) -> Cost:
        # Lets built-in sum() start from its integer 0.
        if other == 0:
            return self
        return NotImplemented

    def _order_value(self, other) -> tuple[float, float]:
        if not isinstance(other, Cost):
            raise TypeError(f"cannot compare a Cost with {type(other).__name__}")
        if self.is_unknown or other.is_unknown:
            raise ValueError("an unknown cost cannot be ordered; measure the candidate first")
        return self.median_ms, other.median_ms

    def __lt__(self, other: Cost) -> bool:
        mine, theirs = self._order_value(other)
        return mine < theirs

    def __le__(self, other: Cost) -> bool:
        mine, theirs = self._order_value(other)
        return mine <= theirs

    def __gt__(self, other: Cost) -> bool:
        mine, theirs = self._order_value(other)
        return mine > theirs

    def __ge__(self, other: Cost) -> bool:
        mine, theirs = self._order_value(other)
        return mine >= theirs

    def __str__(self):
        if self.is_invalid:
            return f"invalid ({self.reason})"
        if self.is_unknown:
            return "unknown"
        return f"{self.median_ms:.4g} ms ± {self.spread_ms:.2g}"


class CostSource(Protocol):
    """What the placement DP asks: the cost of one candidate (a ``Candidate``).

    The measurer (backed by the cost log) implements it for real runs; tests inject price
    lists through the same interface. A source never raises for a bad candidate: it returns
    ``Cost.invalid(reason)``.
    """

    def cost(self, candidate) -> Cost: ...


@dataclass(frozen=True)
class Device:
    """Where costs were measured: the CPU model or GPU name, the thread count used, and
    whether each call found the device's cache flushed (``Timing.cache_flush_bytes``).

    Costs from different devices, thread counts or cache states are different measurements
    and are kept apart in the cost log (``logged_as``).
    """

    name: str
    threads: int
    cache_flushed: bool = False

    @property
    def logged_as(self) -> str:
        """The cost log's device column: the name, and the cache state where it was flushed."""
        return f"{self.name}, cache flushed before each call" if self.cache_flushed else self.name

    def __post_init__(self):
        if not self.name:
            raise ValueError("a device needs a name")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, not {self.threads!r}")

    @classmethod
    def this_machine(cls, threads: int, target: str = "llvm") -> Device:
        """This machine's CPU (``target="llvm"``) or its first CUDA GPU (``target="cuda"``)."""
        if target == "cuda":
            return cls(_gpu_name(), threads)
        if target == "llvm":
            return cls(_cpu_name(), threads)
        raise ValueError(f"unknown target {target!r}; known: 'llvm', 'cuda'")

    def __str__(self):
        return f"{self.logged_as}, {self.threads} thread{'s' if self.threads != 1 else ''}"


# The instruction-set extensions that decide which library is fastest at f32 and below.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_info() -> dict:
    """The CPU as /proc/cpuinfo describes it (Linux): model name, family and model numbers,
    and which of ``ISA_FLAGS`` it has; elsewhere, what ``platform`` reports."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                field, _, value = line.partition(":")
                if not field.strip():
                    break  # the first processor's block is enough
                fields.setdefault(field.strip(), value.strip())
    except OSError:
        pass  # not Linux: fall back to platform below
    flags = set(fields.get("flags", "").split())
    return {
        "model": fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU",
        "family": fields.get("cpu family"),
        "model_number": fields.get("model"),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
    }


def _cpu_name() -> str:
    """The CPU model with its family, model number and ISA flags: a cloud CPU's name alone
    ("AMD EPYC") has named a Zen 3 without AVX-512 and a Zen 5 with it, and costs measured on
    one do not hold on the other."""
    info = cpu_info()
    if info["family"] is None:
        return info["model"]
    return f"{info['model']} (family {info['family']} model {info['model_number']}; {' '.join(info['isa']) or 'no AVX2'})"


def _gpu_name() -> str:
    """The first CUDA GPU's name, or a clear error when TVM sees none."""
    import tvm  # imported here: reading a CPU name should not need TVM loaded

    gpu = tvm.cuda(0)
    if not gpu.exist:
        raise RuntimeError("target 'cuda' asked for, but TVM sees no CUDA GPU on this machine")
    return gpu.device_name


def gpu_cache_bytes() -> int:
    """The first CUDA GPU's L2 cache, in bytes (0 where TVM reports none)."""
    import tvm

    return int(tvm.cuda(0).l2_cache_size_bytes or 0)
