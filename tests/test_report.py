"""The report reads the run record's typed fields: finalists by name and kind, what was
capped, skipped and left out, with nothing parsed back from text."""

import dataclasses
import math

from collage.measuring.cost import Cost
from collage.deploying.optimized import OptimizedModule
from collage.measuring.warm import Warmed
from collage.record import OP_LEVEL, FinalistKind, FinalistName, FinalistResult, RunRecord, StageSeconds

ON_FILE = FinalistName(FinalistKind.ENGINE_ON_FILE, "openvino")


def report(record: RunRecord) -> str:
    return OptimizedModule(None, [], "llvm", 2, math.nan, Cost.of(1.0, 0.01, samples=7), None, record=record).report()


def test_finalists_are_shown_by_name_with_the_kept_one_marked():
    record = RunRecord(
        candidates=10, distinct=8, measured=3, skipped={"TVM runs the same ops for less": 2},
        capped={"tvm.fused": 4}, left_out={"onnxruntime file": "onnxruntime on the ONNX file disagrees"},
        finalists={OP_LEVEL: FinalistResult(1.2, Cost.of(1.1, 0.01, samples=7), 1.12, "slower"),
                   ON_FILE: FinalistResult(math.nan, Cost.of(1.0, 0.01, samples=7), 1.01, "leader")},
        chosen=ON_FILE,
    )  # fmt: skip
    text = report(record)
    assert "openvino on the ONNX file" in text and "(leader)  <- kept" in text
    assert "op-level " in text and "(slower)" in text and text.count("<- kept") == 1
    assert "2 not measured (2: TVM runs the same ops for less)" in text
    assert "stopped growing 4 seed(s) of tvm.fused at its cap" in text
    assert "note: onnxruntime on the ONNX file disagrees" in text


def test_a_rebuilt_placement_has_no_optimization_line():
    assert "optimization:" not in report(RunRecord())
    assert str(FinalistName(FinalistKind.GRAPH_LEVEL, rank=2)) == "graph-level #2"
    assert str(FinalistName(FinalistKind.ENGINE_ALONE, "onnxruntime")) == "onnxruntime alone"


def test_a_cuda_module_without_graphs_says_why():
    reason = "tensorrt does not declare its kernels graph-safe (on TVM's stream, no host wait)"
    assert f"note: no CUDA graphs, each kernel launched on its own: {reason}" in report(RunRecord(cuda_graph_off=reason))
    assert "CUDA graphs" not in report(RunRecord())


def test_candidates_timed_with_the_gpus_cache_flushed_say_why():
    why = "the model's weights and inputs (102 MB) exceed the GPU's 52 MB cache, which each candidate then found flushed"
    assert f"candidates timed cold: {why}" in report(RunRecord(candidates=3, distinct=3, cache_flushed=why))
    assert "timed cold" not in report(RunRecord(candidates=3, distinct=3))


def test_the_compile_pool_says_what_its_slowest_compile_took_and_had():
    record = RunRecord(candidates=821, distinct=67, measured=67, seconds=StageSeconds(measure=182.2),
                       measuring_by_backend={"inductor": 56.6},
                       compiled_ahead=Warmed(9, 9, 112.3, 102.4, 355, 6))  # fmt: skip
    assert ("compiling 9 candidate(s) ahead 112.3 s (9 processes, the slowest 102.4 s, 355 ops, 6 compile thread(s))"
            in report(record))
    beside = dataclasses.replace(record, compiled_ahead=dataclasses.replace(record.compiled_ahead, measured_meanwhile=True))
    assert "6 compile thread(s); TVM's candidates measured meanwhile)" in report(beside)
