"""``torch.compile(model, backend="collage")``: registered by the package's entry point, each
graph optimized once per set of shapes, graph breaks, options passed to ``optimize``,
training refused, results equal to eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import collage.api
from collage.torch_compile import TorchCompileError, optimize_options, runner

OPTIONS = {"backends": ["tvm", "onnxruntime"], "threads": 2}


class SmallCnn(nn.Module):
    def __init__(self, graph_break: bool = False):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 4)
        self.drop = nn.Dropout(0.5)
        self.graph_break = graph_break

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.fc(self.drop(y.mean((2, 3))))


@pytest.fixture
def optimized(monkeypatch):
    """Every module the torch.compile backend optimized while the test runs."""
    made = []
    real = collage.api.optimize_with

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(collage.api, "optimize_with", counted)
    torch._dynamo.reset()
    yield made
    torch._dynamo.reset()


def test_the_package_registers_the_backend():
    assert "collage" in torch._dynamo.list_backends()


def test_a_graph_is_optimized_once_per_shape_and_matches_eager(optimized):
    model = SmallCnn().eval()
    compiled = torch.compile(model, backend="collage", options=OPTIONS)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        compiled(torch.randn(1, 3, 8, 8))  # the same shapes: nothing optimized again
        assert len(optimized) == 1
        y = torch.randn(2, 3, 8, 8)  # a new batch size: dynamo hands over a dynamic graph
        torch.testing.assert_close(compiled(y), model(y), rtol=1e-4, atol=1e-5)
    assert len(optimized) == 2
    used = {p.backend for opt in optimized for p in opt.placement}
    assert used <= set(OPTIONS["backends"]) and all(opt.threads == 2 for opt in optimized)


def test_torchs_own_thread_count_may_differ_from_collages(optimized):
    """Optimized while dynamo traces, which refuses a trace that changed torch's thread count,
    and called under dynamo's guard on the count it traced with: each call runs on collage's
    count and leaves the user's, so the graph is traced and optimized once."""
    model = SmallCnn().eval()
    compiled = torch.compile(model, backend="collage", options=OPTIONS)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(1, 3, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert len(optimized) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_each_graph_of_a_model_with_a_graph_break_is_optimized(optimized):
    model = SmallCnn(graph_break=True).eval()
    compiled = torch.compile(model, backend="collage", options=OPTIONS)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(optimized) == 2


def test_outputs_are_torch_tensors_on_the_modules_own_memory(optimized):
    model = SmallCnn().eval()
    compiled = torch.compile(model, backend="collage", options=OPTIONS)
    with torch.no_grad():
        first = compiled(torch.randn(1, 3, 8, 8))
        kept = first.clone()
        compiled(torch.randn(1, 3, 8, 8))
    assert isinstance(first, torch.Tensor) and torch.equal(first, kept)  # a later call does not overwrite it


def test_on_the_cpu_a_graph_reaches_its_module_as_opt_x_does(optimized, monkeypatch):
    # opt(x)'s own path is the engine's own call where one engine runs the whole model; main's
    # buffers cost MobileNetV1's graph 378 us a call against 300 (ONNX Runtime, 2-core Xeon).
    model = SmallCnn().eval()
    compiled = torch.compile(model, backend="collage", options=OPTIONS)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        compiled(x)
        (opt,) = optimized
        calls, numpy = [], opt.caller.numpy
        monkeypatch.setattr(opt.caller, "numpy", lambda *arrays: calls.append(arrays) or numpy(*arrays))
        (y,) = runner(opt)([x])
        torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    assert len(calls) == 1 and isinstance(calls[0][0], np.ndarray)


def test_training_is_refused_with_what_to_change(optimized):
    model = SmallCnn()
    with torch.no_grad(), pytest.raises(Exception, match="training mode .*dropout.*call model.eval"):
        torch.compile(model.train(), backend="collage", options=OPTIONS)(torch.randn(2, 3, 8, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="records gradients: call the compiled model under torch.no_grad"):
        torch.compile(model.eval(), backend="collage", options=OPTIONS)(torch.randn(1, 3, 8, 8))
    assert optimized == []


def test_options_are_optimizes_keywords():
    config, arguments = optimize_options({"backends": ["tvm"], "threads": 1, "objective": "time"})
    assert arguments == {"backends": ["tvm"]} and not config.progress and config.threads == 1 and config.objective.is_time
    with pytest.raises(TorchCompileError, match="unknown option.*budget.*collage takes target, threads"):
        optimize_options({"budget": 3})
    with pytest.raises(TorchCompileError, match="unknown target 'tpu'"):
        optimize_options({"target": "tpu"})
