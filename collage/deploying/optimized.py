"""The result of ``optimize``: the placed, assembled and checked model, callable like ``main``."""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..assembling.assemble import Assembly, bound_main
from ..assembling.caller import Caller, signature_of
from ..measuring.cost import Cost, Device
from ..measuring.build import device_for
from ..model.simplify import SimplifyReport
from ..placing.placement import Partition
from ..record import RunRecord
from .draw import draw
from .exported import export
from .report import backend_totals, format_report
from .saved import save_placement


@dataclass
class OptimizedModule:
    """The placed and assembled model. Call it with numpy arrays like the original ``main``:
    the arrays are copied into buffers made once, which the libraries bind once
    (``collage.assembling.caller``)."""

    module: tvm.IRModule  # the assembled Relax module (kernels outside TVM by call_dps_packed)
    placement: list[Partition]
    target: str
    threads: int  # what this module runs on here
    estimated_ms: float  # the DP's sum of measured candidate and transition costs
    measured: Cost  # the assembled module end to end
    simplified: SimplifyReport | None
    record: RunRecord = field(default_factory=RunRecord)  # what optimize did, stage by stage
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why it was not used
    fallbacks: list[tuple[Partition, str]] = field(default_factory=list)
    device: Device | None = None  # the device it was optimized for, when not this machine (a fleet's)
    _assembly: Assembly | None = field(default=None, repr=False)
    _vm: relax.VirtualMachine | None = field(default=None, repr=False)
    _params: list[relax.Var] = field(default_factory=list, repr=False)
    _caller: Caller | None = field(default=None, repr=False)

    def __call__(self, *arrays):
        caller = self._caller or self.caller  # the property's check, skipped once made
        return caller.numpy(*arrays)

    @property
    def caller(self) -> Caller:
        """How ``opt(x)`` and ``main`` reach the module: on input buffers of its own, made at
        the first call."""
        if self._caller is None:
            signature = signature_of(self._params)
            self._caller = Caller(self._vm, signature, device_for(self.target), self._assembly.module["main"],
                                  self._assembly.kernel_map())
        return self._caller

    @property
    def optimized_for(self) -> Device:
        """The device its placement was measured and timed on, and is saved and exported for:
        this machine on ``threads`` threads, or the fleet's device (``collage.RPCRunner``)."""
        return self.device or Device.this_machine(self.threads, self.target)

    @property
    def assembly(self) -> Assembly:
        """The assembled module and the libraries' kernels it calls, with what each was
        compiled from (``collage.assembling.assemble``)."""
        return self._assembly

    @property
    def main(self):
        """The assembled ``main``, taking ``tvm.runtime.Tensor`` inputs (new ones on each call,
        as the torch.compile backend passes them, are copied into the module's own buffers)
        and returning outputs the caller may keep; callers that run the same buffers again
        and again, such as a serving loop, may call ``bind`` instead."""
        return self.caller.tensors

    def bind(self, *tensors):
        """``main`` bound to these ``tvm.runtime.Tensor`` inputs, for callers that run the same
        buffers again and again (a serving loop, a benchmark): a call with no arguments that
        returns the outputs. Where the whole model runs in one engine, the outputs are the same
        tensors on every call, overwritten by the next, as the engine's own infer request
        does, and the call skips the VM (``assemble.bound_main``)."""
        return bound_main(self._assembly, self._vm, list(tensors), device_for(self.target))

    def backend_shares(self) -> dict[str, float]:
        """Each backend's share of the estimated time (fallbacks, never measured, count zero)."""
        totals = backend_totals(self.placement)
        all_ms = sum(t.ms for t in totals.values()) or 1.0
        return {backend: t.ms / all_ms for backend, t in totals.items()}

    def report(self) -> str:
        return format_report(self)

    def save_placement(self, path):
        """Write the placement as JSON (``collage.deploying.saved``), for ``collage.load_placement`` and
        ``collage run`` to rebuild this module without measuring; returns the path."""
        return save_placement(self, path)

    def export(self, path):
        """Write this module to the directory ``path`` (``collage.deploying.exported``), for
        ``collage.load`` to run it elsewhere without measuring or compiling; returns the path."""
        return export(self, path)

    def draw(self, path):
        """Draw the graph with each partition in its backend's colour (``collage.deploying.draw``): DOT
        for ``.dot``, rendered by Graphviz for ``.svg``/``.png``/``.pdf``; returns the path."""
        return draw(self, path)

