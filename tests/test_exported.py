"""Exported modules: ``opt.export(dir)`` then ``collage.load(dir)``, in this process and in a
fresh one, measuring nothing and compiling no TVM code; refused or warned about where the
export does not fit this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import collage
from collage.measuring.cost import Device
from collage.deploying.exported import ExportError, ExportWarning, read_manifest
from collage.deploying.saved import placement_record
from tests.quick_settings import FAST_CANDIDATES
from tests.tiny_onnx import INPUT_SHAPE, write_tiny_model

BACKENDS = ["tvm", "onnxruntime"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny model optimized from its ONNX file, a placement mixing TVM with an ONNX Runtime
    kernel, and ONNX Runtime running the file whole: (dir, optimized, mixed, input, on_file)."""
    path = tmp_path_factory.mktemp("exported")
    model = write_tiny_model(path / "tiny.onnx")
    mod = collage.load_onnx(model)
    log = collage.CostLog(path / "costs.sqlite")
    opt = collage.optimize(mod, backends=BACKENDS, cost_log=log, threads=2, progress=False, timing=FAST_CANDIDATES,
                           onnx_model=model)
    record = json.loads(json.dumps(placement_record(opt).to_json()))
    ops = [op for p in record["partitions"] for op in p["ops"]]
    record["partitions"] = [
        {"backend": "onnxruntime" if i == 0 else "tvm", "pattern": "onnxruntime.conv2d" if i == 0 else "tvm.op",
         "nodes": [i], "ops": [op], "cost_ms": None}
        for i, op in enumerate(ops)
    ]  # fmt: skip
    (path / "mixed.json").write_text(json.dumps(record))
    mixed = collage.load_placement(mod, path / "mixed.json", cost_log=log)
    record["partitions"] = [{"backend": "onnxruntime", "pattern": "onnxruntime.model", "nodes": list(range(len(ops))), "ops": ops}]
    (path / "on_file.json").write_text(json.dumps(record))
    on_file = collage.load_placement(mod, path / "on_file.json", cost_log=log, onnx_model=model)
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype("float32")
    return path, opt, mixed, x, on_file


def test_an_export_loads_and_computes_what_the_optimized_module_does(made, monkeypatch):
    path, opt, mixed, x, _ = made
    for name, module in (("whole", opt), ("mixed", mixed)):
        exported = module.export(path / name)
        monkeypatch.setattr("tvm.compile", _must_not_compile)
        loaded = collage.load(exported)
        monkeypatch.undo()
        np.testing.assert_allclose(loaded(x), module(x), rtol=1e-5, atol=1e-6)
        assert loaded.load_s < 10 and "loaded in" in loaded.describe()


def _must_not_compile(*args, **kwargs):
    raise AssertionError("loading an export compiled TVM code")


def test_the_manifest_says_what_was_exported_and_where(made):
    path, _, mixed, _, _ = made
    manifest = read_manifest(mixed.export(path / "manifest"))
    assert manifest["target"] == "llvm" and manifest["threads"] == 2
    assert manifest["device"] == Device.this_machine(2).name
    assert set(manifest["libraries"]) >= {"apache-tvm", "apache-tvm-ffi", "collage-tvm"}
    assert manifest["inputs"] == [{"name": "x", "shape": list(INPUT_SHAPE), "dtype": "float32"}]
    (kernel,) = manifest["kernels"]  # the convolution on ONNX Runtime; the rest is in tvm.so
    assert kernel["backend"] == "onnxruntime" and kernel["file"].endswith(".json") and kernel["alone"] is False
    assert kernel["library"].startswith("ONNX Runtime")
    assert (path / "manifest" / "tvm.so").is_file()
    assert [p["backend"] for p in manifest["placement"]["partitions"]].count("tvm") == 4


def test_an_engine_running_the_whole_file_keeps_it_and_its_users_settings(made):
    path, _, _, x, on_file = made
    exported = on_file.export(path / "file")
    (kernel,) = read_manifest(exported)["kernels"]
    assert kernel["file"].endswith(".onnx") and kernel["alone"] is True
    np.testing.assert_allclose(collage.load(exported)(x), on_file(x), rtol=1e-5, atol=1e-6)


def test_an_export_loads_in_a_fresh_process(made, tmp_path):
    path, _, mixed, x, _ = made
    exported = mixed.export(path / "fresh")
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import numpy as np, tvm, collage
        def refuse(*a, **k):
            raise SystemExit("loading compiled TVM code")
        tvm.compile = refuse
        loaded = collage.load({str(exported)!r})
        np.save({str(tmp_path / "y.npy")!r}, loaded(np.load({str(tmp_path / "x.npy")!r})))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), mixed(x), rtol=1e-5, atol=1e-6)


def _damaged(made, tmp_path, change):
    path, _, mixed, _, _ = made
    exported = mixed.export(tmp_path / "damaged")
    manifest = json.loads((exported / "manifest.json").read_text())
    change(manifest)
    (exported / "manifest.json").write_text(json.dumps(manifest))
    return exported


def test_another_tvm_is_refused_with_what_differs(made, tmp_path):
    exported = _damaged(made, tmp_path, lambda m: m["libraries"].update({"apache-tvm": "0.26.0"}))
    with pytest.raises(ExportError, match=r"apache-tvm 0.26.0 \(here 0.27"):
        collage.load(exported)


def test_another_device_or_library_version_is_a_warning(made, tmp_path):
    def elsewhere(manifest):
        manifest["device"] = "Some Other CPU (avx512f)"
        manifest["kernels"][0]["library"] = "ONNX Runtime 0.1"

    exported = _damaged(made, tmp_path, elsewhere)
    with pytest.warns(ExportWarning) as caught:
        loaded = collage.load(exported)
    said = " ".join(str(w.message) for w in caught)
    assert "optimized for Some Other CPU" in said and "measured on ONNX Runtime 0.1" in said
    assert loaded(made[3]).shape == (1, 10)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m["kernels"][0].update(backend="nosuch"), "backend 'nosuch', which is not registered"),
        (lambda m: m["kernels"][0].update(file="kernels/gone.json"), "lacks kernels/gone.json"),
        (lambda m: m.update(format="other"), "not a collage export"),
    ],
    ids=["unknown backend", "missing kernel file", "another format"],
)
def test_a_damaged_export_is_refused_in_one_line(made, tmp_path, change, message):
    with pytest.raises(ExportError, match=message):
        collage.load(_damaged(made, tmp_path, change))


def test_a_directory_that_is_no_export_is_refused(tmp_path):
    with pytest.raises(ExportError, match="not a collage export"):
        collage.load(tmp_path)


def test_the_command_line_exports_and_runs_the_export(made, tmp_path, capsys):
    from collage.cli import EXIT_OK, EXIT_USAGE, main

    path = made[0]  # the model file and the cost log the fixture filled: nothing to measure again
    model = path / "tiny.onnx"
    args = ["--backends", "tvm,onnxruntime", "--log", str(path / "costs.sqlite"), "--quiet"]
    assert main(["optimize", str(model), "--out", str(tmp_path / "p.json"), "--export", str(tmp_path / "exp"), *args]) == EXIT_OK
    assert f"module exported to {tmp_path / 'exp'}" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "exp")]) == EXIT_OK
    printed = capsys.readouterr().out
    assert "exported module:" in printed and "first call" in printed and "now it runs in" in printed
    assert main(["run", str(tmp_path / "exp"), "--shape", "x=1x3x8x8"]) == EXIT_USAGE
    assert "--shape do not apply" in capsys.readouterr().err


def test_the_tvm_part_is_built_for_this_cpu_unless_optimized_for_a_fleets_device(made):
    """A fleet's device may lack this CPU's instructions (AVX-512 on a Zen 3): its export's
    TVM code is the CPU's baseline. One optimized here is built as ``optimize`` built it."""
    import dataclasses

    from collage.deploying.exported import _export_target
    from collage.measuring.build import host_cpu, host_target

    opt = made[1]
    assert host_target(_export_target(opt)).attrs["mcpu"] == host_cpu()
    elsewhere = dataclasses.replace(opt, device=Device("Some Other CPU (avx2)", 2))
    assert host_target(_export_target(elsewhere)).attrs["mcpu"] == "generic"
