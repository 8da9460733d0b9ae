"""The result of ``optimize``: the placed, assembled and checked model, callable like ``main``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from .assemble import Assembly
from .cost import Cost
from .placement import Partition
from .report import backend_totals, format_report
from .runner import device_for, static_shape
from .simplify import SimplifyReport


class OptimizeError(Exception):
    """The model cannot be optimized as given; the message says what to change."""


@dataclass
class OptimizedModule:
    """The placed and assembled model. Call it with numpy arrays like the original ``main``."""

    module: tvm.IRModule  # the assembled Relax module (kernels outside TVM by call_dps_packed)
    placement: list[Partition]
    target: str
    threads: int
    estimated_ms: float  # the DP's sum of measured candidate and transition costs
    measured: Cost  # the assembled module end to end
    simplified: SimplifyReport | None
    stats: dict = field(default_factory=dict)  # candidates, measurements, timings of each stage
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why it was not used
    fallbacks: list[tuple[Partition, str]] = field(default_factory=list)
    _assembly: Assembly | None = field(default=None, repr=False)
    _vm: relax.VirtualMachine | None = field(default=None, repr=False)
    _params: list[relax.Var] = field(default_factory=list, repr=False)

    def __call__(self, *arrays):
        if len(arrays) != len(self._params):
            names = ", ".join(p.name for p in self._params)
            raise TypeError(f"the model takes {len(self._params)} input(s) ({names}), got {len(arrays)}")
        tensors = []
        for param, array in zip(self._params, arrays):
            array = np.asarray(array)
            shape, dtype = static_shape(param.ty), str(param.ty.dtype)
            if array.shape != shape or str(array.dtype) != dtype:
                raise ValueError(
                    f"input {param.name!r} must be {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}"
                )
            # np.ascontiguousarray would make a 0-d (scalar) input 1-d.
            tensors.append(tvm.runtime.tensor(array if array.flags.c_contiguous else array.copy(order="C"), device_for(self.target)))
        return _to_numpy(self._vm["main"](*tensors))

    @property
    def main(self):
        """The assembled ``main`` on the Relax VM, taking ``tvm.runtime.Tensor`` inputs: for
        callers that convert their inputs once, such as benchmarks."""
        return self._vm["main"]

    def backend_shares(self) -> dict[str, float]:
        """Each backend's share of the estimated time (fallbacks, never measured, count zero)."""
        totals = backend_totals(self.placement)
        all_ms = sum(t.ms for t in totals.values()) or 1.0
        return {backend: t.ms / all_ms for backend, t in totals.items()}

    def report(self) -> str:
        return format_report(self)

    def save_placement(self, path):
        """Write the placement as JSON (``collage.saved``), for ``collage.load_placement`` and
        ``collage run`` to rebuild this module without measuring; returns the path."""
        from .saved import save_placement

        return save_placement(self, path)

    def draw(self, path):
        """Draw the graph with each partition in its backend's colour (``collage.draw``): DOT
        for ``.dot``, rendered by Graphviz for ``.svg``/``.png``/``.pdf``; returns the path."""
        from .draw import draw

        return draw(self, path)


def _to_numpy(result):
    if isinstance(result, tvm.runtime.Tensor):
        return result.numpy()
    return tuple(_to_numpy(r) for r in result)
