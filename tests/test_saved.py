"""Saved placements: written by ``save_placement``, rebuilt by ``load_placement`` without
measuring, and refused for another model or a damaged file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tvm

import collage
from collage.deploying.saved import PlacementFileError, SavedPlacement, read_placement
from tests.quick_settings import FAST_CANDIDATES
from tests.tiny_onnx import INPUT_SHAPE, write_tiny_model

BACKENDS = ["tvm", "onnxruntime"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny model optimized once, its placement saved: (dir, module, optimized, log)."""
    path = tmp_path_factory.mktemp("saved")
    mod = collage.load_onnx(write_tiny_model(path / "tiny.onnx"))
    log = collage.CostLog(path / "costs.sqlite")
    opt = collage.optimize(mod, backends=BACKENDS, cost_log=log, threads=2, progress=False, timing=FAST_CANDIDATES)
    opt.save_placement(path / "placement.json")
    return path, mod, opt, log


def parts(placement):
    return [(p.backend, p.pattern, p.nodes) for p in placement]


def test_a_saved_placement_rebuilds_the_same_module_without_measuring(made):
    path, mod, opt, log = made
    logged = len(log)
    again = collage.load_placement(mod, path / "placement.json", cost_log=log)
    assert len(log) == logged
    assert parts(again.placement) == parts(opt.placement)
    assert again.target == opt.target and again.threads == opt.threads == 2
    assert all(p.cost.is_valid for p in again.placement)  # every cost found in the log
    assert math.isclose(again.estimated_ms, sum(p.cost_ms for p in opt.placement), rel_tol=1e-6)
    assert again.measured.is_valid and again.measured.samples > 1
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype("float32")
    np.testing.assert_allclose(again(x), opt(x), rtol=1e-5)


def test_the_file_records_the_model_and_each_partition(made):
    path, _, opt, _ = made
    saved = read_placement(path / "placement.json")
    assert saved.placement.model.ops == 5 and len(saved.placement.model.hash) == 16
    assert saved.simplify is True and saved.measured_ms == pytest.approx(opt.measured.median_ms, abs=1e-6)
    first = saved.placement.partitions[0]
    assert first.precision == "float32" and list(first.nodes) == sorted(first.nodes) and first.ops[0] == "relax.nn.conv2d"
    # The file is plain JSON, and reads back as what was written.
    written = json.loads((path / "placement.json").read_text())
    assert set(written["partitions"][0]) == {"backend", "pattern", "nodes", "ops", "cost_ms", "precision"}
    assert SavedPlacement.from_json(written, path).to_json() == written


def test_a_placement_for_another_model_is_refused(made):
    path, _, _, log = made
    other = collage.load_onnx(write_tiny_model(path / "other.onnx", seed=1))
    with pytest.raises(PlacementFileError, match="placement was made for another model"):
        collage.load_placement(other, path / "placement.json", cost_log=log)


def test_a_model_calling_its_own_prim_funcs_is_the_same_model_each_time_it_is_built():
    # TVM's importers write some operators as call_tir of a PrimFunc of their own (the ONNX
    # importer's Pad): a hash by GlobalVar identity differed at each import of one file.
    import tvm
    from tvm import relax, te, topi

    from collage.placing.recorded import module_hash

    def built(shift: float) -> tvm.IRModule:
        builder = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((2, 3), "float32"))
        with builder.function("main", [x]):
            with builder.dataflow():
                y = builder.emit_output(builder.emit_te(lambda t: topi.add(t, te.const(shift, "float32")), x))
            builder.emit_func_output(y)
        return builder.get()

    assert module_hash(built(1.0)) == module_hash(built(1.0))
    assert module_hash(built(1.0)) != module_hash(built(2.0))  # the callee's contents count


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda record: record["partitions"].pop(), "unplaced"),
        (lambda record: record.update(format="something else"), "not a collage placement file"),
        (lambda record: record["partitions"][0].update(backend="nosuch"), "backend 'nosuch'"),
    ],
    ids=["a partition missing", "another format", "unknown backend"],
)
def test_a_damaged_placement_file_is_refused(made, tmp_path, damage, message):
    path, mod, _, log = made
    record = json.loads((path / "placement.json").read_text())
    damage(record)
    (tmp_path / "damaged.json").write_text(json.dumps(record))
    with pytest.raises(PlacementFileError, match=message):
        collage.load_placement(mod, tmp_path / "damaged.json", cost_log=log)


def test_partitions_out_of_order_are_refused(made, tmp_path):
    """Reversed partitions use values before they are computed. The placement saved above may
    be one engine alone, so this one is TVM's op-level placement, of several partitions."""
    path, mod, _, log = made
    opt = collage.optimize(mod, backends=["tvm"], cost_log=log, threads=2, progress=False, timing=FAST_CANDIDATES)
    opt.save_placement(tmp_path / "placement.json")
    record = json.loads((tmp_path / "placement.json").read_text())
    assert len(record["partitions"]) > 1
    record["partitions"].reverse()
    (tmp_path / "damaged.json").write_text(json.dumps(record))
    with pytest.raises(PlacementFileError, match="before they are computed"):
        collage.load_placement(mod, tmp_path / "damaged.json", cost_log=log)


def test_a_file_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "placement.json").write_text("not json")
    with pytest.raises(PlacementFileError, match="not a collage placement file"):
        read_placement(tmp_path / "placement.json")


def test_a_model_with_nothing_to_place_runs_as_tvm_runs_it_and_its_placement_rebuilds(tmp_path):
    """A Range, as ONNX's importer writes it: shapes known only at run time (a match_cast)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from onnx import TensorProto, helper

    scalars = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in "sld"]
    graph = helper.make_graph([helper.make_node("Range", ["s", "l", "d"], ["y"])], "range", scalars,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    log = collage.CostLog(tmp_path / "costs.sqlite")
    opt = collage.optimize(mod, backends=BACKENDS, cost_log=log, threads=2, progress=False, timing=FAST_CANDIDATES)
    assert opt.placement == [] and "match_cast" in opt.record.unplaced
    assert "nothing placed" in opt.report()
    args = [np.array(v, "float32") for v in (1.0, 4.0, 0.5)]
    np.testing.assert_allclose(opt(*args), np.arange(1.0, 4.0, 0.5, dtype="float32"))
    again = collage.load_placement(mod, opt.save_placement(tmp_path / "placement.json"), cost_log=log)
    np.testing.assert_allclose(again(*args), opt(*args))


def test_an_engine_kernel_runs_alone_when_rebuilt_as_when_optimized(tmp_path):
    """An engine on all but a trivial TVM op keeps its users' settings (threads spinning:
    ``assemble.runs_alone``, decided from the partitions' costs). Rebuilt in a fresh process
    (``elsewhere.built_here``) or loaded with a log that lacks the costs, the placement is
    assembled from the costs it records, so the kernel is compiled as it was raced."""
    from collage.assembling.checked import assemble_and_check
    from collage.candidates.backend import default_backends
    from collage.candidates.generate import Candidate
    from collage.candidates.subgraph import SubGraph
    from collage.choosing import elsewhere
    from collage.measuring.arrays import Reference
    from collage.measuring.build import build_vm
    from collage.measuring.cost import Cost
    from collage.measuring.wire import unpack
    from collage.model.graph import DataflowGraph
    from collage.placing.placement import Partition, Placement
    from collage.placing.recorded import RecordedPartition

    mod = collage.load_onnx(write_tiny_model(tmp_path / "tiny.onnx"))
    graph = DataflowGraph.from_module(mod)
    last = len(graph) - 1
    engine = Candidate(SubGraph(graph, frozenset(range(last))), "onnxruntime", "onnxruntime.region")
    trivial = Candidate(SubGraph(graph, frozenset({last})), "tvm", "tvm.fused")
    placement = Placement(graph, (Partition(engine, Cost.of(1.0)), Partition(trivial, Cost.of(0.01))))
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype("float32")
    reference = Reference([x], [build_vm(mod)["main"](tvm.runtime.tensor(x)).numpy()])
    here = assemble_and_check(graph, placement, reference, default_backends(), "llvm", 2)

    def alone(finalist) -> list[bool]:
        return [source.alone for source in finalist.assembly.sources.values()]

    assert alone(here) == [True]
    header, arrays = unpack(elsewhere.request({"op-level": here}, mod, {}, None, reference, "llvm", None, metered=False))
    there = elsewhere.built_here(header, arrays, default_backends(), 2)
    assert alone(there.built["op-level"]) == [True]

    # The same placement saved, loaded with a new log: the costs are the file's.
    opt = collage.optimize(mod, backends=BACKENDS, threads=2, progress=False, timing=FAST_CANDIDATES,
                           cost_log=collage.CostLog(tmp_path / "first.sqlite"))  # fmt: skip
    saved = json.loads(opt.save_placement(tmp_path / "placement.json").read_text())
    saved["partitions"] = [RecordedPartition.of(p).to_json() for p in placement]
    (tmp_path / "placement.json").write_text(json.dumps(saved))
    loaded = collage.load_placement(mod, tmp_path / "placement.json", cost_log=collage.CostLog(tmp_path / "new.sqlite"))
    assert [p.cost_ms for p in loaded.placement] == [1.0, 0.01]
    assert [s.alone for s in loaded.assembly.sources.values()] == [True]
