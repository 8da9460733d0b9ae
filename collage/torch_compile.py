"""``torch.compile(model, backend="collage")``: collage as a backend of PyTorch's compiler.

The package registers ``collage_backend`` under PyTorch's ``torch_dynamo_backends`` entry
point, so ``backend="collage"`` works once collage is installed. Dynamo hands over each graph
it captured (several when the model has graph breaks); each is exported again with the
shapes it is called with (``torch.export``, its weights frozen as constants) and handed to
``collage.optimize`` as that program, which TVM's PyTorch frontend imports (the engines also
run ``torch.onnx.export``'s file of it, and inductor compiles it whole, as
``torch.compile`` of the graph would); ``options`` are optimize's keyword arguments::

    compiled = torch.compile(model, backend="collage", options={"backends": ["tvm", "onnxruntime"]})
    with torch.no_grad():
        y = compiled(x)

Tensors go in and come out through DLPack, without copies. A graph is optimized once per
set of input shapes: when dynamo hands over a graph with dynamic sizes, each new size is
optimized when it is first called. Collage is for inference: a graph that records
gradients or runs in training mode (dropout, batch norm updating its statistics) is refused
with a ``TorchCompileError`` that says what to change. The weights are read when a shape is
first optimized; changing them afterwards in place is not seen, as with any frozen
inference graph.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import tvm

from . import api
from .config import Config
from .errors import OptimizeError

# What ``options`` may set: each setting of a ``Config``, and what optimize takes beside them.
ARGUMENTS = ("backends", "cost_log", "meter")
OPTIONS = (*Config.names(), *ARGUMENTS)


class TorchCompileError(Exception):
    """Collage cannot compile this graph as asked; the message says what to change."""


def collage_backend(gm: torch.fx.GraphModule, example_inputs: list, *, options: dict | None = None, mode=None):
    """The dynamo backend: ``gm`` (called with ``example_inputs``) as a callable that runs
    the module collage optimized for it."""
    if mode is not None:
        raise TorchCompileError(f"collage takes no mode ({mode!r} is Inductor's); pass optimize's keywords as options")
    _refuse_training(gm, example_inputs)
    return CompiledGraph(gm, example_inputs, *optimize_options(options))


def optimize_options(options: dict | None) -> tuple[Config, dict]:
    """``options`` as the ``Config`` of each optimization (no progress lines unless asked)
    and the rest of optimize's arguments; a name it does not take, or a setting ``Config``
    refuses, is a ``TorchCompileError``."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TorchCompileError(f"unknown option(s) {', '.join(unknown)}; collage takes {', '.join(OPTIONS)}")
    settings = {"progress": False} | {name: value for name, value in options.items() if name not in ARGUMENTS}
    try:
        config = Config(**settings)
    except OptimizeError as err:
        raise TorchCompileError(str(err)) from None
    return config, {name: value for name, value in options.items() if name in ARGUMENTS}


def _refuse_training(gm: torch.fx.GraphModule, example_inputs: list) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        raise TorchCompileError(
            "collage compiles models for inference, and this call records gradients: "
            "call the compiled model under torch.no_grad() or torch.inference_mode()"
        )
    training = sorted({_name(n.target) for n in gm.graph.nodes if n.op == "call_function" and _in_training(n)})
    if training:
        raise TorchCompileError(
            f"collage compiles models for inference, and this one is in training mode ({', '.join(training)} "
            "with training=True): call model.eval() first"
        )


def _in_training(node: torch.fx.Node) -> bool:
    try:
        normalized = node.normalized_arguments(node.graph.owning_module, normalize_to_only_use_kwargs=True)
    except Exception:  # noqa: BLE001 -- a target without a Python signature takes no training flag
        return False
    return normalized is not None and normalized.kwargs.get("training") is True


def _name(target) -> str:
    return getattr(target, "__name__", str(target))


def is_weight(value) -> bool:
    """A parameter or buffer of the model: dynamo passes them to the graph as inputs and marks
    their addresses static (``torch._dynamo.utils.get_static_address_type``)."""
    from torch._dynamo.utils import get_static_address_type

    return isinstance(value, torch.nn.Parameter) or get_static_address_type(value) is not None


class CompiledGraph:
    """One graph dynamo handed over, optimized for each set of input shapes it is called
    with (``optimized``: shapes -> ``OptimizedModule``; ``mains``: shapes -> its ``main``,
    looked up once: a lookup per call costs a few microseconds)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, config: Config, arguments: dict):
        self.gm, self.config, self.arguments = gm, config, arguments
        self.weights = {k: v for k, v in enumerate(example_inputs) if is_weight(v)}
        self.inputs = [k for k, v in enumerate(example_inputs) if k not in self.weights and isinstance(v, torch.Tensor)]
        self.sizes = [k for k, v in enumerate(example_inputs) if isinstance(v, (int, torch.SymInt))]
        self.optimized: dict[tuple, object] = {}
        self.runs: dict[tuple, object] = {}
        self.static = None  # the one run of a graph with static shapes, which dynamo's guards keep
        if not any(isinstance(v, torch.SymInt) for v in example_inputs):
            self.static = self._optimized(example_inputs)  # optimize now, as dynamo expects of a backend

    def __call__(self, *args):
        run = self.static if self.static is not None else self._optimized(args)
        return run([_dlpack_ready(args[k]) for k in self.inputs])

    def _optimized(self, args):
        key = tuple(tuple(args[k].shape) for k in self.inputs) + tuple(int(args[k]) for k in self.sizes)
        if key not in self.optimized:
            program, inputs = exported(self.gm, args, self.weights)
            with _torch_threads_kept():
                self.optimized[key] = api.optimize_with(self.config, program, example_inputs=inputs, **self.arguments)
            self.runs[key] = runner(self.optimized[key])
        return self.runs[key]


@contextlib.contextmanager
def _torch_threads_kept():
    """torch's intra-op thread count as it was before, once optimizing (which sizes it to the
    threads it measures on) is done: a graph with static shapes is optimized while dynamo
    traces, and dynamo refuses a trace that changed it ("Global num_threads state changed
    while dynamo tracing"). Each of the module's calls sizes it for itself (``_run_on``)."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def runner(opt):
    """How a graph's tensors reach ``opt`` (an ``OptimizedModule``), as a function of the list
    of them returning a tuple of tensors. On the CPU, as numpy views of them handed to
    ``opt(x)``'s own path, whose new arrays come back as tensors without copies: where the
    whole model is one engine's kernel, that is the engine's own call, which ran MobileNetV1's
    graph in 300 us against 378 through ``main``'s buffers (ONNX Runtime, 2-core Xeon). On the
    GPU, and for a dtype numpy lacks (bfloat16), through DLPack to ``main``."""
    main, threads = opt.main, opt.threads

    def through_main(tensors):
        with _run_on(threads):
            result = main(*[tvm.runtime.from_dlpack(t) for t in tensors])
        if isinstance(result, tvm.runtime.Tensor):
            return (torch.from_dlpack(result),)
        return tuple(torch.from_dlpack(r) for r in result)

    if opt.target != "llvm":
        return through_main
    numpy = opt.caller.numpy

    def through_numpy(tensors):
        if any(t.dtype not in NUMPY_DTYPES for t in tensors):
            return through_main(tensors)
        with _run_on(threads):
            result = numpy(*[t.numpy() for t in tensors])
        if isinstance(result, np.ndarray):
            return (torch.from_numpy(result),)
        return tuple(torch.from_numpy(r) for r in result)

    return through_numpy


@contextlib.contextmanager
def _run_on(threads: int):
    """torch's intra-op threads (oneDNN's and MKL's kernels run on them) sized as they were
    measured for one call, then the user's again: dynamo guards the compiled frame on the
    count it traced with, and a call leaving collage's would have each graph traced and
    optimized a second time. Resizing costs well under a microsecond (2-core Zen 4)."""
    if torch.get_num_threads() == threads:
        yield
        return
    with _torch_threads_kept():
        torch.set_num_threads(threads)
        yield


# The tensor dtypes a numpy array can view.
NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                          torch.uint8, torch.bool})  # fmt: skip


def _dlpack_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` as DLPack takes it: contiguous, not recording gradients (a view, not a copy,
    when it already is contiguous)."""
    t = t.detach() if t.requires_grad else t
    return t if t.is_contiguous() else t.contiguous()


def exported(gm: torch.fx.GraphModule, args, weights: dict[int, torch.Tensor]):
    """``gm`` as ``torch.export`` exports it for these very ``args`` (the inputs that are not
    weights become its inputs, the weights constants, sizes their values), and those inputs.
    Handed the program, ``optimize`` imports it into Relax, runs each engine on
    ``torch.onnx.export``'s file of it (where that exporter can write one), and
    has inductor compile it whole, as ``torch.compile`` of the graph would."""
    frozen = _Frozen(gm, args, weights)
    inputs = tuple(a.detach() for k, a in enumerate(args) if k not in weights and isinstance(a, torch.Tensor))
    return torch.export.export(frozen, inputs), inputs


class _Frozen(torch.nn.Module):
    """``gm`` with its weights as this module's buffers (which ``torch.export`` lifts and TVM's
    importer binds as constants) and its size arguments fixed: ``forward`` takes the tensor
    inputs only."""

    def __init__(self, gm: torch.fx.GraphModule, args, weights: dict[int, torch.Tensor]):
        super().__init__()
        self.gm = gm
        self.slots: list[tuple[str, object]] = []  # per argument of gm: what fills it
        for k, a in enumerate(args):
            if k in weights:
                self.register_buffer(f"weight_{k}", weights[k].detach())
                self.slots.append(("weight", f"weight_{k}"))
            elif isinstance(a, torch.Tensor):
                self.slots.append(("input", None))
            else:
                self.slots.append(("size", int(a)))

    def forward(self, *inputs):
        given = iter(inputs)
        args = [next(given) if kind == "input" else getattr(self, what) if kind == "weight" else what for kind, what in self.slots]
        return self.gm(*args)
