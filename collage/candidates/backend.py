"""Backend: one record per library that can run parts of a model.

A backend file in ``backends/`` builds one ``Backend`` and registers nothing when imported.
Backends are gathered in an explicit ``BackendSet``; ``register_backend`` and
``list_backends`` act on the default set (the built-ins plus what the user registered)
that ``collage.optimize`` uses when it is given none.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from tvm import relax

from .pattern import Pattern, PatternRule

OP_LEVEL = "op-level"  # an operator library: one kernel per candidate (oneDNN, cuBLAS, TVM)
GRAPH_LEVEL = "graph-level"  # an inference engine that optimizes across kernels (ORT, TensorRT)
TARGETS = ("llvm", "cuda")
# TVM's own codegen: it runs every operator, and its results are the reference others match.
REFERENCE_BACKEND = "tvm"


class Unsupported(Exception):
    """A backend cannot compile this sub-graph; the message names what (operator, dtype,
    attribute) so the candidate is excluded with that reason."""


class BoundBuffers:
    """A library's binding of a kernel's buffers (an ONNX Runtime IOBinding, an OpenVINO infer
    request), made once per set of buffers: binding costs more than running a small op, and
    the caller may pass the same few buffers again and again. ``get(tensors)`` returns the
    binding ``bind(tensors)`` made for the same pointers and shapes, keeping the last
    ``keep`` (a whole model's binding holds its intermediate buffers). ``made`` counts the
    bindings made: one per call where a caller hands new buffers every time."""

    def __init__(self, bind: Callable, keep: int = 4):
        self.bind, self.keep = bind, keep
        self.made = 0
        self._bound: dict[tuple, object] = {}

    def get(self, tensors):
        key = tuple([t.data_ptr() for t in tensors])  # shapes are static: a pointer names a buffer
        bound = self._bound.get(key)
        if bound is None:
            if len(self._bound) >= self.keep:
                self._bound.pop(next(iter(self._bound)))
            bound = self._bound[key] = self.bind(tensors)
            self.made += 1
        return bound


class Kernel(Protocol):
    """A compiled candidate, destination-passing style: ``kernel(*inputs, *outputs)``.

    Arguments are DLPack-capable tensors (tvm.runtime.Tensor); outputs are preallocated by
    the caller and written in place, so no tensor is copied at the boundary. A kernel that
    binds its buffers (``BoundBuffers``) may also have ``bound(tensors)``: a call with no
    arguments that runs it on those very tensors, for a caller that runs the same buffers
    again and again (``assembling.assemble.bound_main``), with nothing looked up per call.
    An engine's kernel may also have ``plain(arrays)``: its users' own call on numpy arrays
    (inputs in order), returning new arrays of its outputs, where that costs less than
    copying into bound buffers and out (``assembling.caller``).
    """

    def __call__(self, *tensors) -> None: ...


@dataclass(frozen=True)
class Backend:
    """What a library can run (patterns and rules) and how to compile it.

    ``compile(func, pattern_name, target)`` turns one extracted sub-graph function into a
    Kernel. An inference engine that reads ONNX also has ``compile_onnx(model, target,
    alone)``: a Kernel for an ONNX model (inputs, then outputs, in the model's order), which
    ``alone`` compiles with its users' own settings (threads left spinning between runs) for
    a kernel that nothing of another library runs beside: the whole model, from the user's
    ONNX file or converted, or all of it but trivial ops. An engine that compiles PyTorch
    programs has ``compile_program(program, main, target, threads, module=None)``: a Kernel
    running the user's own ``module`` whole (or where there is none, its ``torch.export``
    ``program``), in place of the Relax ``main`` imported from that program (its inputs, then
    its outputs, in ``main``'s order). ``requires`` names the Python modules the library needs, and ``probe(target)``
    says why the library cannot run here (no GPU, no oneDNN in this torch build) or None;
    a backend that cannot run is excluded with that reason rather than failing later.
    ``compile_many(funcs, pattern_names, target)``, where a library compiles several
    sub-graphs together faster than one by one (TVM: LLVM is set up once per module),
    returns one Kernel per function; the measurer then sends it candidates in batches.
    ``precisions(target)`` names the reduced precisions (``candidates.precision``) the library
    computes in natively here, besides float32; with an accuracy budget each candidate is
    offered in them too, and the compile functions then get ``precision=`` as well.
    ``graph_safe`` declares that on CUDA its kernels enqueue all their work on TVM's current
    stream and never wait on the host, so that a CUDA graph may capture them
    (``cuda_graph_blocker``): TVM then runs a module's static regions, library kernels
    included, as CUDA graphs, recorded once and replayed without Python. ``compile_cache``
    declares that its compiles keep what they built on disk, where the same compile in another
    process finds it (inductor's AOTInductor packages): its candidates are then compiled first
    in parallel processes (``measuring.warm``), and the measuring worker's compiles load them.
    ``prepare(target)``, for such a backend, is what all those compiles wait for that can
    start before them: it runs in the optimizing process beside the pool (inductor: probing
    the host's CPU, once a machine).
    ``spins_after_calls`` declares that its threads go on spinning on their cores for a while
    after a kernel returns, without yielding them (PyTorch's GNU OpenMP pool). An engine's
    kernel in a module beside such a kernel is compiled with ``beside_spinning=True``
    (``compile_onnx``): its threads must then never spin either (``assemble.beside_spinning``).
    """

    name: str
    kind: str
    targets: tuple[str, ...]
    compile: Callable[[relax.Function, str, str], Kernel] | None
    compile_onnx: Callable[..., Kernel] | None = None
    compile_program: Callable[..., Kernel] | None = None
    compile_many: Callable[[list[relax.Function], list[str], str], list[Kernel]] | None = None
    patterns: tuple[Pattern, ...] = ()
    rules: tuple[PatternRule, ...] = ()
    requires: tuple[str, ...] = ()
    probe: Callable[[str], str | None] | None = None
    library: str = ""  # what real library it drives, for reports
    precisions: Callable[[str], tuple[str, ...]] | None = None  # reduced precisions it runs natively here
    graph_safe: bool = False  # on TVM's CUDA stream, no host wait: a CUDA graph may capture its kernels
    compile_cache: bool = False  # its compiles leave an on-disk cache another process's compile hits
    prepare: Callable[[str], None] | None = None  # for compile_cache: their common set-up, started beside them
    spins_after_calls: bool = False  # its threads keep their cores a while after a kernel returns
    candidates_on: tuple[str, ...] | None = None  # where it offers candidates; elsewhere whole programs only

    def __post_init__(self):
        if self.kind not in (OP_LEVEL, GRAPH_LEVEL):
            raise ValueError(f"backend {self.name!r}: kind must be {OP_LEVEL!r} or {GRAPH_LEVEL!r}, not {self.kind!r}")
        unknown = set(self.targets) - set(TARGETS)
        if unknown:
            raise ValueError(f"backend {self.name!r}: unknown target(s) {sorted(unknown)}; known: {TARGETS}")
        unserved = set(self.candidates_on or ()) - set(self.targets)
        if unserved:
            raise ValueError(f"backend {self.name!r}: candidates on target(s) {sorted(unserved)} it does not serve")
        for p in self.patterns:
            if not p.name.startswith(self.name + "."):
                raise ValueError(f"backend {self.name!r}: pattern {p.name!r} must be named '{self.name}.<what>'")

    def reduced_precisions(self, target: str) -> tuple[str, ...]:
        """The precisions besides float32 this backend computes in natively for ``target``."""
        return self.precisions(target) if self.precisions is not None else ()

    def serving(self, target: str) -> Backend:
        """This backend as it serves ``target``: without patterns and rules where it offers
        no candidates there (``candidates_on``)."""
        if self.candidates_on is None or target in self.candidates_on:
            return self
        return replace(self, patterns=(), rules=())

    def unavailable_reason(self, target: str) -> str | None:
        """Why this backend cannot run ``target`` on this machine, or None when it can."""
        if target not in self.targets:
            return f"does not serve target {target!r}"
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"missing Python module(s): {', '.join(missing)}"
        return self.probe(target) if self.probe is not None else None


def cuda_graph_blocker(backends: Iterable[Backend]) -> str | None:
    """Why a module calling kernels of ``backends`` cannot run as CUDA graphs (one line,
    naming the first backend that does not declare ``graph_safe``), or None when it can. A
    capture would record such a kernel's work on the wrong stream or stall on its host wait."""
    for b in backends:
        if not b.graph_safe:
            return f"{b.name} does not declare its kernels graph-safe (on TVM's stream, no host wait)"
    return None


def installed_version(distribution: str) -> str:
    """A package's installed version, read without importing it, for ``Backend.library``:
    costs are kept per library version."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class BackendSet:
    """An explicit, ordered collection of backends, by name."""

    def __init__(self, backends: Iterable[Backend] = ()):
        self._by_name: dict[str, Backend] = {}
        for b in backends:
            self.add(b)

    def add(self, backend: Backend, replace: bool = False) -> None:
        if backend.name in self._by_name and not replace:
            raise ValueError(f"a backend named {backend.name!r} is already registered")
        self._by_name[backend.name] = backend

    def __getitem__(self, name: str) -> Backend:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"unknown backend {name!r}; registered: {', '.join(self._by_name) or 'none'}") from None

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._by_name.values())

    def __len__(self):
        return len(self._by_name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def usable(self, target: str) -> tuple[list[Backend], dict[str, str]]:
        """The backends that serve ``target`` and can run here, and why each other one cannot."""
        ok, excluded = [], {}
        for b in self:
            reason = b.unavailable_reason(target)
            if reason is None:
                ok.append(b.serving(target))
            else:
                excluded[b.name] = reason
        return ok, excluded


_default: BackendSet | None = None
# Where the built-ins come from: ``backends.builtin_backends``, handed in by the package
# (``collage/__init__.py``), since the backend files import this module.
_builtins: Callable[[], Iterable[Backend]] | None = None


def provide_builtins(load: Callable[[], Iterable[Backend]]) -> None:
    """Name what loads the built-in backends, for the default set to start from."""
    global _builtins
    _builtins = load


def default_backends() -> BackendSet:
    """The set ``collage.optimize`` uses when given none: the built-ins, then what the user
    registered. Built-ins load on first use, so importing collage stays cheap."""
    global _default
    if _default is None:
        if _builtins is None:
            raise RuntimeError("the built-in backends were never provided: import collage first")
        _default = BackendSet(_builtins())
    return _default


def register_backend(backend: Backend, replace: bool = False) -> Backend:
    """Add ``backend`` to the default set; ``replace`` swaps one of the same name."""
    default_backends().add(backend, replace)
    return backend


def list_backends() -> list[Backend]:
    return list(default_backends())
