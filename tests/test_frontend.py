"""Importing what users hand collage: a Relax module, an ONNX file or ModelProto, a PyTorch
module; each refusal is one clear line."""

import re

import numpy as np
import onnx
import pytest
import torch
import tvm

import collage
from collage.model.frontend import ModelImportError, _program_disagrees, import_model, unsound_ort_rewrites
from collage.prepare import defined
from collage.measuring.timing import Timing
from collage.record import FinalistKind, FinalistName
from tests.tiny_onnx import INPUT_SHAPE, write_tiny_model

FAST = Timing(min_samples=3, max_samples=5, min_sample_ms=0.3, budget_s=0.3)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_an_onnx_file_or_modelproto_imports_and_is_kept_for_the_engines(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.onnx")
    proto = onnx.load(path)
    for source in (path, str(path), proto):
        imported = import_model(source)
        mod = imported.mod
        # The file is read once, and that very model goes to the engines.
        assert isinstance(mod, tvm.IRModule) and imported.onnx_model == proto and imported.program is None
    assert import_model(proto).onnx_model is proto
    relax_mod = mod
    assert import_model(relax_mod) == (relax_mod, None, None, None, None, None, None)


def test_an_onnx_model_cleaned_up_to_import_computes_what_it_did(tmp_path):
    # The Pad's widths are computed as exporters write them (ConstantOfShape, Concat), which
    # TVM's importer cannot take: the model imports after ONNX Runtime's clean-up, which must
    # not fold the zero Pad into the MaxPool after it as the pool's -inf padding (BiT's stem:
    # 3e-3 off).
    from onnx import TensorProto, helper, numpy_helper

    shape, pooled = (1, 2, 6, 6), (1, 2, 3, 3)
    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2], "int64"))),
        helper.make_node("Constant", [], ["ones"], value=numpy_helper.from_array(np.array([1, 1], "int64"))),
        helper.make_node("ConstantOfShape", ["two"], ["zeros"], value=numpy_helper.from_array(np.array([0], "int64"))),
        helper.make_node("Concat", ["zeros", "ones", "zeros", "ones"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"], mode="constant"),  # with zeros
        helper.make_node("MaxPool", ["padded"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
    ]
    graph = helper.make_graph(nodes, "pad_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, pooled)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = -np.abs(np.random.default_rng(0).standard_normal(shape)).astype("float32") - 0.5
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    expected = np.stack([padded[..., 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(-2, -1))
                         for i in range(3) for j in range(3)], axis=-1).reshape(pooled)  # fmt: skip
    vm = tvm.relax.VirtualMachine(tvm.compile(import_model(model).mod, "llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, rtol=1e-6)
    # Only where the pattern is: a model without it keeps every rewrite.
    assert unsound_ort_rewrites(model) == ["Pad_Fusion"]
    assert unsound_ort_rewrites(onnx.load(write_tiny_model(tmp_path / "tiny.onnx"))) == []


def test_a_torch_module_imports_for_its_example_inputs():
    torch.manual_seed(0)
    model, x = Tiny().eval(), torch.randn(1, 3, 8, 8)
    imported = import_model(model, example_inputs=x)
    mod, onnx_model = imported.mod, imported.onnx_model
    assert [tuple(p.ty.shape) for p in mod["main"].params] == [(1, 3, 8, 8)]
    # torch.export's program, and the module itself, for an engine that compiles it whole (inductor)
    assert isinstance(imported.program, torch.export.ExportedProgram) and imported.module is model
    # torch.onnx.export's file, as the module's users would export it for an engine
    assert onnx_model.ir_version == 10 and onnx_model.opset_import[0].version == 17
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)
    exported = torch.export.export(model, (x,))
    assert isinstance(import_model(exported).mod, tvm.IRModule)
    # An exported program (what torch.compile's backend hands over) keeps its ONNX export too.
    from_program = import_model(exported, example_inputs=x)
    assert from_program.program is exported and from_program.module is None and from_program.onnx_note is None
    assert {"Conv", "Relu"} <= {n.op_type for n in from_program.onnx_model.graph.node}


def test_torchs_own_transformer_layers_export_as_their_users_export_them():
    # Called under no_grad, as inference code is, the export still traces the layers' plain
    # operators, not the fused fast path no ONNX opset has (aten::_transformer_encoder_layer_fwd).
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model, x = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval(), torch.randn(1, 8, 32)
    with torch.no_grad():
        imported = import_model(model, example_inputs=x)
        expected = model(x).numpy()
    assert imported.onnx_note is None
    import onnxruntime as ort

    session = ort.InferenceSession(imported.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


class Windows(torch.nn.Module):
    """Sliding windows, as PatchTST cuts a series into patches: ``Tensor.unfold``, which
    torch.export keeps and TVM's importer lacks."""

    def forward(self, x):
        patches = x.unfold(1, 4, 3)  # overlapping windows of a middle dimension; the tail left out
        strided = x.unfold(-1, 2, 3)  # windows with gaps between them along the last one
        return patches.sum(-1), strided * 2.0


class EmptyCache(torch.nn.Module):
    """Keys appended to a cache that starts empty, as transformers' key/value cache does in a
    decoder left at ``use_cache=True``: torch skips the empty vector, TVM's importer refuses it."""

    def forward(self, keys):
        cache = torch.tensor([])
        return torch.cat([cache, keys], dim=-2) * 2.0


@pytest.mark.parametrize("model, shape", [(Windows(), (2, 11, 7)), (EmptyCache(), (1, 2, 5, 8))])
def test_what_the_importer_lacks_is_imported_decomposed(model, shape):
    x = torch.randn(*shape)
    with pytest.raises(Exception):  # TVM's importer alone  # noqa: B017 -- an AssertionError or a ValueError
        from tvm.relax.frontend.torch import from_exported_program

        from_exported_program(torch.export.export(model, (x,)))
    mod = import_model(model.eval(), example_inputs=x).mod
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got, expected = vm["main"](tvm.runtime.tensor(x.numpy())), model(x)
    got = [got] if hasattr(got, "numpy") else list(got)  # the importer's main returns a tuple
    expected = expected if isinstance(expected, tuple) else (expected,)
    for out, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)


class RelativePositions(torch.nn.Module):
    """Parakeet's relative positions: an ``arange`` counting down, made under ``torch.no_grad``
    (a sub-graph of the exported program), its sines and cosines interleaved by a reshape; and
    a one-sided clamp of integer indices, as SAM's interpolated positions clamp theirs; and
    XLNet's, counting down by a float step in integers."""

    @torch.no_grad()
    def positions(self, count: int):
        return torch.arange(count - 1, -count, -1)

    def forward(self, x):
        ids = self.positions(x.shape[1])
        freqs = ids[:, None].float() * torch.arange(1, 5).float()
        table = torch.stack([freqs.sin(), freqs.cos()], dim=-1).reshape(len(ids), 8)
        xlnet = torch.arange(x.shape[1], -x.shape[1], -1.0, dtype=torch.int64).float()
        return x @ table[: x.shape[1]], x[:, torch.clamp(ids, min=0)], xlnet


def test_what_the_importer_declares_or_compiles_wrong_is_imported_as_torch_computes_it():
    x, model = torch.randn(3, 6), RelativePositions().eval()
    # TVM's importer alone: its arange counting down declares 13 values where it makes 11.
    with pytest.raises(ValueError, match="Reshape expects"):
        from tvm.relax.frontend.torch import from_exported_program

        from_exported_program(torch.export.export(model, (x,)))
    mod = import_model(model, example_inputs=x).mod
    mod, changes = defined(mod)  # a clip of int64 to -inf, which TVM cannot compile
    assert any("clip(s) of integers to an infinite bound" in change for change in changes)
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()))
    for out, want in zip(got, model(x), strict=True):
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


class Promotes(torch.nn.Module):
    """What torch computes in a promoted dtype and TVM's importer computed in the input's:
    integers times, plus or divided by floats, integers divided truly (LongT5's
    ``ones_like(mask) / 16`` was 0), integers into float functions, a mask's running count
    (booleans); and what it refused: ``//`` of int64 by a number, ``sigmoid`` of integers,
    ``where`` of integers and floats, integer powers (TVM's power takes floats)."""

    def forward(self, x, ids):
        mask = x > 0
        return (ids * 0.5, ids / 16, 1.5 - ids, mask * 0.5, ids // 2.5, ids**0.5, mask.cumsum(-1), ids.cumsum(-1),
                mask.cumprod(-1), ids.long() // 4, torch.div(ids.long() - 5, 4, rounding_mode="floor"),
                torch.reciprocal(ids), torch.sigmoid(ids), torch.where(mask, ids, x), torch.clamp(ids, min=0.5),
                torch.pow(2, ids % 40), ids.long() ** 3, torch.pow(ids, ids % 3))  # fmt: skip


def test_what_torch_computes_in_a_promoted_dtype_is_imported_in_that_dtype():
    x, ids = torch.randn(2, 9), torch.randint(0, 50, (2, 9), dtype=torch.int32)
    model = Promotes().eval()
    mod = import_model(model, example_inputs=(x, ids)).mod
    vm = tvm.relax.VirtualMachine(tvm.compile(defined(mod)[0], target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(ids.numpy()))
    for out, want in zip(got, model(x, ids), strict=True):
        assert out.numpy().dtype == want.numpy().dtype
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)


class Diverges(torch.nn.Module):
    """A branch on ``torch.compiler.is_compiling()``, which exporting takes, as transformers'
    ``is_torchdynamo_compiling()`` does (LongT5 then leaves its attention mask unset and
    computes something else)."""

    def forward(self, x):
        return x * 2.0 if torch.compiler.is_compiling() else x * 3.0


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


def test_a_program_that_computes_otherwise_than_its_module_is_imported_from_the_onnx_export():
    x = torch.randn(2, 5)
    imported = import_model(Diverges().eval(), example_inputs=x)
    assert imported.program is None
    assert imported.program_note.startswith("torch.export's program computes otherwise than the module (output 0:")
    assert imported.program_note.endswith("imported from torch's ONNX export, which agrees with the module")
    vm = tvm.relax.VirtualMachine(tvm.compile(imported.mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose((got if hasattr(got, "numpy") else got[0]).numpy(), x.numpy() * 3.0, rtol=1e-6)
    # A module that draws random numbers is compared from one seed; the caller's draws go on as they would.
    state = torch.random.get_rng_state()
    assert _program_disagrees(Noisy().eval(), torch.export.export(Noisy().eval(), (x,)), (x,)) is None
    assert torch.equal(torch.random.get_rng_state(), state)


class GuardsOnValues(torch.nn.Module):
    """A branch on its input's values, as EnCodec's padding checks its input's length against
    a maximum it computes: ``torch.export`` cannot guard on data; torch's ONNX exporter traces
    the branch taken."""

    def forward(self, x):
        return x * 0.0 if x.abs().max() > 100 else x * 3.0


class Unimportable(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4)  # neither TVM's importer nor ONNX has it


def test_a_module_torch_export_cannot_take_is_imported_from_its_onnx_export_or_is_one_line():
    x = torch.randn(2, 5)
    imported = import_model(GuardsOnValues().eval(), example_inputs=x)
    assert imported.program is None and imported.onnx_model is not None
    assert imported.program_note.startswith("torch.export cannot export the module: ")
    assert imported.program_note.endswith("imported from torch's ONNX export, which agrees with the module")
    vm = tvm.relax.VirtualMachine(tvm.compile(imported.mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose((got if hasattr(got, "numpy") else got[0]).numpy(), x.numpy() * 3.0, rtol=1e-6)


def test_a_model_tvm_cannot_import_runs_whole_on_the_engines_or_as_given(tmp_path):
    # Neither TVM's importers nor ONNX have histc: the module stands in for itself, run by PyTorch.
    x = torch.randn(2, 5)
    imported = import_model(Unimportable().eval(), example_inputs=x)
    assert re.match(r"TVM's PyTorch importer cannot import it: .*, and there is no ONNX export to import instead "
                    r"\(torch.onnx.export cannot export", imported.not_imported)  # fmt: skip
    assert imported.onnx_model is None and isinstance(imported.module, Unimportable)
    opt = collage.optimize(Unimportable().eval(), example_inputs=x, backends=["tvm", "onnxruntime"],
                           cost_log=tmp_path / "c.sqlite", timing=FAST, progress=False)  # fmt: skip
    assert opt.record.chosen == FinalistName(FinalistKind.AS_GIVEN) and opt.placement == []
    np.testing.assert_allclose(opt(x.numpy()), torch.histc(x, bins=4).numpy())
    assert "TVM cannot import the model (TVM's PyTorch importer cannot import it" in opt.report()
    assert "): it runs as given" in opt.report()
    with pytest.raises(collage.ExportError, match="runs the model as given, in this process only"):
        opt.export(tmp_path / "export")
    # An ONNX operator TVM's importer lacks: ONNX Runtime runs the file, which is what a user would do.
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Celu", ["x"], ["y"], alpha=0.5)], "celu",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (2, 5))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (2, 5))],
    ), opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)  # fmt: skip
    opt = collage.optimize(model, backends=["tvm", "onnxruntime"], cost_log=tmp_path / "c.sqlite", timing=FAST,
                           progress=False)  # fmt: skip
    assert opt.record.not_imported == "the ONNX model: TVM's ONNX importer does not support operator(s) Celu"
    assert set(map(str, opt.record.finalists)) == {"onnxruntime on the ONNX file"}  # the file unoptimized: a fallback only
    celu = np.where(x.numpy() > 0, x.numpy(), 0.5 * (np.exp(x.numpy() / 0.5) - 1))
    np.testing.assert_allclose(opt(x.numpy()), celu, rtol=1e-5, atol=1e-6)
    with pytest.raises(collage.PlacementFileError, match="TVM cannot import this model"):
        opt.save_placement(tmp_path / "p.json")
    # Without static inputs nothing can stand in for it: the importer's line, and why.
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(ModelImportError, match=r"Celu; nor can the model run as given: input x has a dynamic shape"):
        import_model(model)


class OneHotBlocks(torch.nn.Module):
    """Block ids the module computes from a mask of ones it makes itself, one-hot: LongT5's
    transient-global attention. ``one_hot`` checks its class values at run time."""

    def forward(self, x):
        ids = torch.cumsum(torch.ones(x.shape[-1], dtype=torch.long), 0) // 4
        return x @ torch.nn.functional.one_hot(ids, 4).float()


class ChecksItsInput(torch.nn.Module):
    def forward(self, x):
        torch._assert_async((x > -100).all(), "x out of range")
        return x * 2.0


def test_run_time_checks_split_no_placement(tmp_path):
    # An assertion splits the dataflow collage places: LongT5 ran whole on TVM, 30x slower.
    x = torch.randn(3, 8)
    opt = collage.optimize(OneHotBlocks().eval(), example_inputs=x, backends=["tvm"], cost_log=tmp_path / "c.sqlite",
                           timing=FAST, progress=False)  # fmt: skip
    assert opt.placement and opt.record.unplaced is None
    assert "2 run-time check(s) of values computed from constants alone, which hold, dropped" in opt.report()
    (got,) = opt(x.numpy())  # the importer's main returns a tuple
    np.testing.assert_allclose(got, OneHotBlocks()(x).numpy(), rtol=1e-6)
    opt = collage.optimize(ChecksItsInput().eval(), example_inputs=x, backends=["tvm"], cost_log=tmp_path / "c.sqlite",
                           timing=FAST, progress=False)  # fmt: skip
    assert opt.placement and opt.record.unplaced is None
    assert "1 run-time check(s) of the inputs (the first: 'x out of range') not made by the placed module" in opt.report()
    np.testing.assert_allclose(opt(x.numpy())[0], x.numpy() * 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    "model, kwargs, message",
    [
        (Tiny(), {"example_inputs": torch.randn(1, 3, 8, 8)}, "training mode; collage optimizes inference: call .eval()"),
        (Tiny().eval(), {}, "a PyTorch module needs example_inputs"),
        (Tiny().eval(), {"example_inputs": torch.randn(1, 3, 8, 8), "shapes": {"x": [1]}}, "shapes are for an ONNX model"),
        (np.zeros(3), {}, "cannot optimize a ndarray: collage takes a Relax tvm.IRModule, an ONNX model"),
        ("missing.onnx", {}, "missing.onnx: no such file"),
    ],
)
def test_what_cannot_be_imported_is_one_clear_line(model, kwargs, message):
    with pytest.raises(ModelImportError, match=re.escape(message)) as raised:
        import_model(model, **kwargs)
    assert "\n" not in str(raised.value)


def test_optimize_takes_an_onnx_file_and_runs_it_on_each_engine_too(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.onnx")
    opt = collage.optimize(path, backends=["tvm", "onnxruntime"], cost_log=tmp_path / "c.sqlite", timing=FAST,
                           progress=False)  # fmt: skip
    assert FinalistName(FinalistKind.ENGINE_ON_FILE, "onnxruntime") in opt.record.finalists
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype("float32")
    reference = collage.optimize(collage.load_onnx(path), backends=["tvm"], cost_log=tmp_path / "c.sqlite",
                                 timing=FAST, progress=False)  # fmt: skip
    np.testing.assert_allclose(opt(x), reference(x), rtol=1e-4, atol=1e-4)


def test_optimize_takes_a_torch_module_and_matches_it(tmp_path):
    torch.manual_seed(0)
    model, x = Tiny().eval(), torch.randn(1, 3, 8, 8)
    opt = collage.optimize(model, example_inputs=(x,), backends=["tvm"], cost_log=tmp_path / "c.sqlite",
                           timing=FAST, progress=False)  # fmt: skip
    with torch.no_grad():
        expected = model(x).numpy()
    (out,) = opt(x.numpy())  # TVM's PyTorch importer returns a tuple of the outputs
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(collage.OptimizeError, match="training mode"):
        collage.optimize(model.train(), example_inputs=(x,), backends=["tvm"], cost_log=tmp_path / "c.sqlite")
