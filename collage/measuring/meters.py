"""Energy meters: what collage reads to price candidates in joules as well as milliseconds.

A meter reads a cumulative energy counter; the energy of a timed run is the difference of two
readings around it (``joules(before, after)``), divided by the calls it made. Built in:

- ``Rapl``: Linux's powercap interface to RAPL, ``/sys/class/powercap/intel-rapl:N/energy_uj``
  (one counter per CPU package; Intel, and AMD since Zen, under the same name). Counters
  wrap at ``max_energy_range_uj``; a difference across one wrap is corrected.
- ``Nvml``: NVIDIA's NVML (``nvidia-ml-py``), ``nvmlDeviceGetTotalEnergyConsumption`` of one
  GPU, in millijoules since the driver loaded (Volta and newer).

``energy_meter(target)`` returns the meter this machine has for ``target``, or raises
``NoEnergyMeter`` saying why there is none: collage never invents an energy figure. Cloud
machines usually hide RAPL from their guests, as the development machines do.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Protocol

POWERCAP = "/sys/class/powercap"


class NoEnergyMeter(Exception):
    """This machine has no energy counter collage can read for the target."""


class EnergyMeter(Protocol):
    name: str

    def read(self) -> tuple[float, ...]:
        """The counters now (any unit the meter understands)."""

    def joules(self, before: tuple[float, ...], after: tuple[float, ...]) -> float:
        """The energy used between two readings, in joules."""


@dataclass(frozen=True)
class Rapl:
    """The package domains of RAPL (their sum: every socket's CPU energy)."""

    domains: tuple[str, ...]  # sysfs directories, e.g. /sys/class/powercap/intel-rapl:0
    name: str = "rapl"

    def read(self) -> tuple[float, ...]:
        return tuple(float(_read(os.path.join(d, "energy_uj"))) for d in self.domains)

    def joules(self, before, after) -> float:
        total = 0.0
        for domain, a, b in zip(self.domains, before, after):
            delta = b - a
            if delta < 0:  # the counter wrapped once
                delta += float(_read(os.path.join(domain, "max_energy_range_uj")))
            total += delta
        return total / 1e6


@dataclass(frozen=True)
class Nvml:
    """One NVIDIA GPU's energy counter."""

    index: int = 0
    name: str = "nvml"

    def read(self) -> tuple[float, ...]:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        return (float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),)

    def joules(self, before, after) -> float:
        return (after[0] - before[0]) / 1e3


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def rapl(powercap: str = POWERCAP) -> Rapl:
    """The RAPL package domains under ``powercap`` this process can read, or NoEnergyMeter
    saying why none."""
    if not os.path.isdir(powercap):
        raise NoEnergyMeter(f"no RAPL: {powercap} does not exist (no powercap driver, or a virtual machine that hides it)")
    # Top-level zones are packages; their sub-zones (core, uncore, dram) are inside them.
    domains = sorted(d for d in glob.glob(os.path.join(powercap, "*rapl:[0-9]*")) if os.path.basename(d).count(":") == 1)
    if not domains:
        raise NoEnergyMeter(f"no RAPL: {powercap} has no rapl package zone")
    unreadable = [d for d in domains if not os.access(os.path.join(d, "energy_uj"), os.R_OK)]
    if unreadable:
        raise NoEnergyMeter(f"no RAPL: {unreadable[0]}/energy_uj is not readable by this user (root only since Linux 5.10)")
    return Rapl(tuple(domains))


def nvml(index: int = 0) -> Nvml:
    """NVML's energy counter of GPU ``index``, or NoEnergyMeter saying why none."""
    try:
        import pynvml
    except ImportError:
        raise NoEnergyMeter("no NVML: the nvidia-ml-py package is not installed (pip install collage-tvm[gpu])") from None
    try:
        meter = Nvml(index)
        meter.read()
    except pynvml.NVMLError as err:
        raise NoEnergyMeter(f"no NVML energy counter on GPU {index}: {err}") from None
    return meter


def energy_meter(target: str) -> EnergyMeter:
    """The meter for ``target`` here: NVML for "cuda", RAPL for "llvm"."""
    return nvml() if target.startswith("cuda") else rapl()
