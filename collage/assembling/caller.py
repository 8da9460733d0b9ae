"""How a user's call reaches the assembled module: ``opt(x)``, ``opt.main(tensors)``, a loaded
export, the torch.compile backend.

The inputs are copied into buffers made once, and the module runs on those very buffers
(``assemble.bound_main``). A library kernel binds the buffers it is handed (an ONNX Runtime
IOBinding, an OpenVINO infer request) once per set of addresses (``BoundBuffers``): handed
new tensors on every call, as a user's arrays are, it made a new binding every call.
Measured on the corpus MLP (2-core Xeon, family 6 model 167): ``opt(x)`` 0.335 ms against
0.043 through ``bind`` with ONNX Runtime alone (its own ``run`` on the file: 0.098), 0.233
against 0.078 with OpenVINO (its ``infer``: 0.157). A copy into a buffer that stays put costs
one memcpy, as OpenVINO's own ``infer`` of numpy arrays makes; the old path copied too, into
a new allocation.

Where the whole model is one engine's kernel with a plain call of its own on numpy arrays
(ONNX Runtime's ``InferenceSession.run`` without its Python checks: ``Kernel.plain``), ``opt(x)``
on numpy arrays can be that call instead (``CallPath.ENGINE``), the engine checking each
array's dtype and shape in C++ as it does for its own users; collage's checks run only when
the engine refuses, to say in one line which input is wrong (on the corpus MLP, 20 us a call,
they were 1 us of it). Which of the two paths is faster is not the same on every machine or
process: on the corpus MLP (2-core Xeon, family 6 model 167) the engine's own call was the
faster in one run and 1.4x slower than the bound buffers an hour later. So ``optimize`` times
``opt(x)`` both ways on the user's inputs (``time_call_paths``) and keeps the faster; the
export keeps that choice. On that MLP, ONNX Runtime's C++ run takes 17.4 us; ``opt(x)``
through it 17.8 (before the call was made per path: 19.6), ONNX Runtime's own
``InferenceSession.run`` about 18.8.

The outputs are the caller's to keep: numpy copies for ``numpy``; for ``tensors``, where the
run writes into the same output buffers every call (an engine running the whole model),
copies of them, since the caller (torch.compile's graph) may hold one output while calling
again.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..measuring.arrays import static_shape
from ..measuring.cost import Cost
from ..measuring.timing import Protocol, time_contenders
from .assemble import bound_function

# (name, shape, dtype) of each of main's parameters, in order.
Signature = list[tuple[str, tuple[int, ...], str]]


def signature_of(params: list[relax.Var]) -> Signature:
    """The ``Signature`` of a Relax function's ``params``."""
    return [(p.name, static_shape(p.ty), str(p.ty.dtype)) for p in params]


class CallPath(enum.Enum):
    """How ``opt(x)`` on numpy arrays reaches the module; the value is its display text."""

    BUFFERS = "buffers bound once"  # copied into the module's own buffers, which the kernels bind once
    ENGINE = "the engine's own call"  # the user's arrays handed to the engine's plain call (``Kernel.plain``)


class Caller:
    """``main`` on buffers of its own: ``numpy(*arrays)`` for ``opt(x)``, ``tensors(*tensors)``
    for ``opt.main``. Given the Relax ``main`` the VM runs and the library ``kernels`` it
    calls, a ``main`` that is one engine's kernel is called without the VM
    (``assemble.bound_function``). Calls from several threads take turns (the buffers are
    shared; an engine's plain call needs no turns).

    Everything a call can know beforehand is made here (numpy views of the buffers, the
    dtypes to check against): an engine's threads keep spinning for a while after its run,
    and on a 2-core machine (two hyperthreads) the Python that follows runs at half speed
    beside them. Converting the MLP's output with ``Tensor.numpy()`` there cost 40 us (6 us
    idle); a copy of a numpy view costs under 1."""

    # ``main`` on numpy arrays (or anything ``np.asarray`` takes: CPU torch tensors), as numpy:
    # one array, or a tuple (of tuples) as ``main`` returns. Made for ``path`` (``through``).
    numpy: Callable[..., object]

    def __init__(self, vm: relax.VirtualMachine, signature: Signature, device, main: relax.Function | None = None,
                 kernels: dict | None = None, path: CallPath = CallPath.ENGINE):  # fmt: skip
        self.signature, self.device = signature, device
        self._expected = [(tuple(shape), np.dtype(dtype)) for _, shape, dtype in signature]
        self.inputs = [tvm.runtime.empty(shape, dtype, device) for _, shape, dtype in signature]
        self._on_cpu = device.dlpack_device_type() == CPU
        # numpy views of the CPU buffers: np.copyto into them is one memcpy, any layout in.
        self._views = [np.from_dlpack(t) for t in self.inputs] if self._on_cpu else None
        if main is not None:  # the Relax ``main`` the VM runs, and the kernels it calls by name
            self._run = bound_function(main, kernels or {}, vm, self.inputs, device)
        else:
            run = vm["main"]
            self._run = lambda: run(*self.inputs)
        # bound_main's direct call writes into the same output tensors on every call: their
        # numpy views are made once.
        self._reused_outputs = hasattr(self._run, "buffers")
        # An engine running the whole model that has a plain call of its own on numpy arrays
        # (``Kernel.plain``) may be handed the user's arrays as they are (``path``).
        self._engine_call = getattr(self._run, "plain", None) if self._on_cpu else None
        views = _views(self._run.result) if self._reused_outputs and self._on_cpu else None
        self._copy_outputs = _copier(views) if views is not None else None
        self._lock = threading.Lock()
        self.path = path

    @property
    def paths(self) -> tuple[CallPath, ...]:
        """The ways ``numpy`` can reach the module here."""
        return (CallPath.BUFFERS, CallPath.ENGINE) if self._engine_call is not None else (CallPath.BUFFERS,)

    @property
    def path(self) -> CallPath:
        """How ``numpy`` reaches the module: ``CallPath.ENGINE`` where the engine has a plain call."""
        return self._path

    @path.setter
    def path(self, path: CallPath) -> None:
        self._path = path if path in self.paths else CallPath.BUFFERS
        # ``numpy`` is made for the path: on a 20 us model each Python frame and check of a
        # call is a per cent of it.
        self.numpy = self.through(self._path)

    def through(self, path: CallPath):
        """``numpy`` through ``path`` (one of ``paths``), whatever ``self.path`` is."""
        if path is not CallPath.ENGINE or self._engine_call is None:
            return self._through_buffers
        plain, count, ndarray, checked = self._engine_call, len(self._expected), np.ndarray, self._checked

        def numpy(*arrays):
            if len(arrays) != count:
                self._refuse_count(arrays)
            for array in arrays:
                if type(array) is not ndarray:  # torch tensors, lists: as numpy arrays, any layout
                    return plain(checked(arrays))
            # The engine's own call checks each array's dtype and shape itself, in C++ (and
            # takes any layout): collage's checks run only to say in one line what was wrong.
            try:
                return plain(arrays)
            except Exception as err:  # noqa: BLE001 -- the engine's refusal, explained below if an input is wrong
                failure = err
            checked(arrays)
            raise failure

        return numpy

    def _through_buffers(self, *arrays):
        """``numpy`` on the module's own buffers: the arrays checked and copied in."""
        if len(arrays) != len(self._expected):
            self._refuse_count(arrays)
        arrays = self._checked(arrays)
        with self._lock:
            if self._views is not None:
                for view, array in zip(self._views, arrays):
                    np.copyto(view, array, casting="no")
            else:
                for buffer, array in zip(self.inputs, arrays):
                    buffer.copyfrom(array)
            result = self._run()
            return self._copy_outputs() if self._copy_outputs is not None else self._as_numpy(result)

    def _checked(self, arrays) -> list[np.ndarray]:
        """``arrays`` as numpy arrays, each of the dtype and shape ``main`` takes (else the
        one line that says which is not)."""
        arrays = [np.asarray(a) for a in arrays]
        for k, array in enumerate(arrays):
            if (array.shape, array.dtype) != self._expected[k]:
                self._refuse(k, array.shape, array.dtype)
        return arrays

    def tensors(self, *tensors):
        """``main`` on ``tvm.runtime.Tensor`` inputs, as ``tvm.runtime.Tensor`` outputs the
        caller may keep."""
        if len(tensors) != len(self._expected):
            self._refuse_count(tensors)
        for k, t in enumerate(tensors):
            if (tuple(t.shape), np.dtype(str(t.dtype))) != self._expected[k]:
                self._refuse(k, tuple(t.shape), t.dtype)
        with self._lock:
            for source, buffer in zip(tensors, self.inputs):
                source.copyto(buffer)
            result = self._run()
            return _copied(result, self.device) if self._reused_outputs else result

    def _as_numpy(self, result):
        if isinstance(result, tvm.runtime.Tensor):
            return np.from_dlpack(result).copy() if self._on_cpu else result.numpy()
        return tuple(self._as_numpy(r) for r in result)

    def _refuse_count(self, given):
        names = ", ".join(name for name, _, _ in self.signature)
        raise TypeError(f"the model takes {len(self.signature)} input(s) ({names}), got {len(given)}")

    def _refuse(self, k: int, shape, dtype):
        name, expected_shape, expected_dtype = self.signature[k]
        raise ValueError(f"input {name!r} must be {expected_dtype}{list(expected_shape)}, got {dtype}{list(shape)}")


@dataclass(frozen=True)
class CallPathTiming:
    """``opt(x)`` timed through each of its paths on the user's inputs, and the one kept."""

    chosen: CallPath
    costs: dict[CallPath, Cost]

    def summary(self) -> str:
        others = ", ".join(f"{p.value} {self.costs[p].median_ms * 1e3:.1f} us" for p in self.costs if p is not self.chosen)
        return (f"opt(x) on numpy arrays goes through {self.chosen.value} "
                f"({self.costs[self.chosen].median_ms * 1e3:.1f} us a call; {others}: timed both ways here)")  # fmt: skip


# Two contenders of one module: shorter blocks and warm-up than a race of finalists (about
# 2.5 s in all), the same settling between blocks.
CALL_PATHS = Protocol(rounds=7, block_ms=30.0, warmup_s=0.05)


def time_call_paths(caller: Caller, arrays: list[np.ndarray], protocol: Protocol | None = None) -> CallPathTiming | None:
    """``caller.numpy(*arrays)`` timed through each of its paths against the other with the
    project's protocol, ``caller`` left on the one ``preferred_path`` picks (None, and left
    as it is, where it has one path). The user's call is timed whole: the arrays checked,
    copied in and the outputs copied out where the path does. ``protocol`` defaults to
    ``CALL_PATHS``."""
    if len(caller.paths) < 2:
        return None
    calls = {path: functools.partial(caller.through(path), *arrays) for path in caller.paths}
    costs = time_contenders(calls, protocol or CALL_PATHS)
    chosen = preferred_path(costs)
    caller.path = chosen
    return CallPathTiming(chosen, costs)


def preferred_path(costs: dict[CallPath, Cost]) -> CallPath:
    """The faster path, except that the engine's own call is kept unless the buffers beat it
    by more than either's spread: it is the call the engine's users make, so that a tie
    decided by noise cannot leave ``opt(x)`` slower than it. SqueezeNet's user's file on ONNX
    Runtime went through the buffers at 3072 us against the engine's call at 3101 (spreads
    of 90-150 us), and the benchmark then timed ``opt(x)`` 4% over ONNX Runtime's own ``run``
    of the same file (2-core Xeon)."""
    fastest = min(costs, key=lambda p: costs[p].median_ms)
    engine = costs.get(CallPath.ENGINE)
    if engine is None or fastest is CallPath.ENGINE:
        return fastest
    allowed = max(engine.spread_ms, costs[fastest].spread_ms)
    return CallPath.ENGINE if engine.median_ms - costs[fastest].median_ms <= allowed else fastest


CPU = 1  # DLPack's device type of the host


def _views(result):
    if isinstance(result, tvm.runtime.Tensor):
        return np.from_dlpack(result)
    return tuple(_views(r) for r in result)


def _copier(views):
    """A call returning copies of ``views`` (an array, or tuples of them) in their structure."""
    if isinstance(views, np.ndarray):
        return views.copy
    if len(views) == 1 and isinstance(views[0], np.ndarray):  # torch.export's one-output tuple
        only = views[0].copy
        return lambda: (only(),)
    parts = [_copier(v) for v in views]
    return lambda: tuple(part() for part in parts)


def _copied(result, device):
    if isinstance(result, tvm.runtime.Tensor):
        return result.copyto(device)
    return tuple(_copied(r, device) for r in result)
