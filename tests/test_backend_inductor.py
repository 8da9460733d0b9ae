"""The inductor backend: PyTorch's compiler over a sub-graph converted to torch.fx. It offers
regions only (each compile takes seconds), serves CUDA and is graph-safe there. Its kernel is
checked against TVM on the CPU here (inductor compiles C++ for the CPU as it compiles Triton
for the GPU); on a GPU, also its candidates, timed inside CUDA graphs, and whole optimizations."""

import time

import numpy as np
import pytest
import torch
import tvm
from collage.backends import cublas, cudnn, inductor
from collage.backends import tvm as tvm_backend

from collage.candidates.backend import cuda_graph_blocker
from collage.candidates.generate import PART_SUFFIX, REGION_SUFFIX, generate
from collage.candidates.precision import BFLOAT16, FLOAT16, FLOAT32, TF32
from collage.measuring.arrays import Reference, empty_outputs, mismatch, random_inputs, relative_error, to_tensors
from collage.measuring.build import run_reference, synchronized
from collage.model.graph import DataflowGraph
from experiments import models
from tests.helpers import failures, zoo_graph

BACKEND = inductor.BACKEND


def require_gpu():
    reason = BACKEND.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"inductor: {reason}")


def test_it_offers_regions_only_and_the_whole_model_among_them():
    graph = zoo_graph("mobilenet_v2", simplified=True)
    candidates = generate(graph, [BACKEND])
    assert {c.pattern for c in candidates} == {f"inductor{REGION_SUFFIX}", f"inductor{PART_SUFFIX}"}
    assert any(len(c.subgraph) == len(graph) for c in candidates)
    assert len(candidates) <= 1 + 2 * 4  # the region and its parts at up to four cuts


def test_it_serves_cuda_graph_safe_in_four_precisions():
    assert BACKEND.serving("cuda") is BACKEND
    assert cuda_graph_blocker([BACKEND, cudnn.BACKEND, cublas.BACKEND, tvm_backend.BACKEND]) is None
    assert BACKEND.reduced_precisions("cuda") == (TF32, BFLOAT16, FLOAT16)
    assert cudnn.BACKEND.reduced_precisions("cuda") == cublas.BACKEND.reduced_precisions("cuda") == (TF32,)


def test_on_the_cpu_it_offers_no_candidates_only_the_users_module_compiled_whole():
    graph = zoo_graph("mobilenet_v2", simplified=True)
    on_cpu = BACKEND.serving("llvm")
    assert generate(graph, [on_cpu]) == [] and on_cpu.compile_program is BACKEND.compile_program
    # bfloat16 where the CPU computes it natively, as torch.autocast does there; no TF32 or float16.
    assert on_cpu.reduced_precisions("llvm") in ((), (BFLOAT16,))


def run_kernel(func, precision=FLOAT32):
    arrays = random_inputs(func)
    kernel = inductor.compile(func, "inductor.region", "llvm", 2, precision=precision)
    inputs, outputs = to_tensors(arrays, tvm.cpu()), empty_outputs(func, tvm.cpu())
    kernel(*inputs, *outputs)
    return [o.numpy() for o in outputs], run_reference(func, arrays)


class TwoLayers(torch.nn.Module):
    """A user's module: what ``torch.compile`` of it runs is what its program compiled whole runs."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate="tanh")).softmax(-1)


def test_the_users_program_compiles_whole_in_place_of_main_on_the_cpu():
    """The user's ``torch.export`` program, compiled whole by inductor, replaces the Relax
    ``main`` imported from it and is checked against that module's reference (CPU here)."""
    from collage.model.frontend import import_model
    from collage.candidates.generate import PROGRAM_SUFFIX
    from collage.choosing.engine_alone import EngineAloneFailed, checked_on_program

    torch.manual_seed(0)
    imported = import_model(TwoLayers().eval(), example_inputs=torch.randn(4, 16))
    func = imported.mod["main"]
    arrays = random_inputs(func)
    check = Reference(arrays, run_reference(func, arrays))
    finalist = checked_on_program(imported.mod, DataflowGraph(func), BACKEND, imported.program, check, "llvm", 2)
    ((partition, name, _),) = finalist.assembly.kernels
    assert partition.pattern == f"inductor{PROGRAM_SUFFIX}" and finalist.assembly.sources[name].program is imported.program
    # The imported main returns its one output in a tuple: so does its replacement, so that
    # ``opt(x)`` has one shape whichever finalist is kept.
    tvm.ir.assert_structural_equal(finalist.assembly.module["main"].ret_ty, func.ret_ty)
    wrong = Reference(arrays, [expected + 1.0 for expected in check.outputs])
    with pytest.raises(EngineAloneFailed, match="inductor on the PyTorch module disagrees with the unoptimized module"):
        checked_on_program(imported.mod, DataflowGraph(func), BACKEND, imported.program, wrong, "llvm", 2)


def test_bfloat16_and_float16_are_computed_in_them_by_packages_exported_under_autocast(tmp_path, monkeypatch):
    import torch._inductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch, "compile", None)  # a package, or nothing
    func = models.load("mlp", small=True).relax["main"]
    errors = {}
    for precision in (BFLOAT16, FLOAT16):
        actual, expected = run_kernel(func, precision=precision)
        assert actual[0].dtype == np.float32  # the caller's float32 buffers, all the same
        errors[precision] = relative_error(actual, expected)
    # Each rounds its products' inputs, float16 to 10 bits of mantissa, bfloat16 to 7.
    assert 1e-6 < errors[FLOAT16] < errors[BFLOAT16] / 2 and errors[BFLOAT16] < 5e-2, errors
    assert len(list(tmp_path.glob("collage-packages/*.pt2"))) == 2


def test_inductors_probe_of_the_hosts_instruction_sets_is_made_once_a_machine(tmp_path, monkeypatch):
    """Torch probes each vector instruction set the CPU reports in every process (before 2.13,
    a Python process importing torch for each: 45 s a process on an H100's host); its verdict
    is kept on disk, so that another process (here: the wrapper installed again) only reads
    it, whether the set was supported or not."""
    from torch._inductor import cpu_vec_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    probed = []

    def probe(isa, code):
        probed.append(str(isa))
        return "amx" not in str(isa)

    isas = [cpu_vec_isa.VecAVX2(), cpu_vec_isa.VecAMX()]
    for process in range(2):
        monkeypatch.setattr(cpu_vec_isa.VecISA, "check_build", probe)
        inductor._remember_isa_probes()
        assert [isa.check_build(cpu_vec_isa.VecISA._avx_code) for isa in isas] == [True, False]
        assert probed == ["avx2", "avx512 avx512_vnni amx_tile"], f"process {process}"
    verdicts = sorted(path.read_text() for path in tmp_path.glob("collage-isa-probes/*") if path.suffix != ".lock")
    assert verdicts == ["supported", "unsupported"]


def test_preparing_checks_the_instruction_sets_the_cpu_reports_at_once(tmp_path, monkeypatch):
    """Beside the compile pool, the optimizing process checks each instruction set in a thread
    of its own (torch 2.11 on an H100's host: ten probes, 58.5 s one after another) and
    keeps the verdicts, which the pool's compiles then read."""
    import threading

    from torch._inductor import cpu_vec_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    # Of classes of their own: torch's sets are equal by their fields, and each one's verdict
    # is cached for the process (by an earlier test here).
    kinds = (cpu_vec_isa.VecAMX, cpu_vec_isa.VecAVX512VNNI, cpu_vec_isa.VecAVX512, cpu_vec_isa.VecAVX2)
    fresh = [type(f"Unchecked{kind.__name__}", (kind,), {})() for kind in kinds]
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", fresh)
    monkeypatch.setattr(cpu_vec_isa, "x86_isa_checker", lambda: ["avx2", "avx512", "avx512_vnni", "amx_tile"])
    lock, running, most, probed = threading.Lock(), [0], [0], []

    def probe(isa, code):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
            probed.append(str(isa))
        return True

    monkeypatch.setattr(cpu_vec_isa.VecISA, "check_build", probe)
    inductor.prepare("cuda")
    assert most[0] == len(fresh) and set(probed) == {str(isa) for isa in fresh}
    verdicts = [path.read_text() for path in tmp_path.glob("collage-isa-probes/*") if path.suffix != ".lock"]
    assert verdicts == ["supported"] * len(probed)


# ------------------------------------------------------------------ on a GPU


def test_zoo_regions_match_tvm_on_the_gpu():
    require_gpu()
    graph = zoo_graph("resnet50", simplified=True)
    assert failures(BACKEND, generate(graph, [BACKEND])[:3], "cuda") == {}


def test_on_the_gpu_a_package_built_in_one_process_is_only_loaded_in_another(tmp_path, monkeypatch):
    """On a GPU: a compile ahead (in a process of its own) leaves an AOTInductor package that
    the process measuring or assembling the candidate then loads, compiling nothing and warning
    of no fallback to ``torch.compile`` (which costs seconds a candidate in every process)."""
    require_gpu()
    import warnings

    import torch._inductor

    from collage.measuring.runner import MeasureTask
    from collage.measuring.timing import Timing
    from collage.measuring.warm import warm

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    candidates = generate(zoo_graph("mlp", simplified=True), [BACKEND])[:2]
    tasks = [MeasureTask(BACKEND, c.subgraph.extract(), c.pattern, "cuda", 1, 0, Timing()) for c in candidates]
    warmed = warm(tasks, [len(c.subgraph) for c in candidates], processes=2)
    assert (warmed.compiled, warmed.warnings) == (2, ()), warmed
    assert len(list(tmp_path.glob("collage-packages/*.pt2"))) == 2

    def compiles(*args, **kwargs):
        raise AssertionError("compiled again where it was to be loaded")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compiles)
    monkeypatch.setattr(torch, "compile", None)  # the package, or nothing
    func = tasks[0].func
    with warnings.catch_warnings():  # the fallback's reason, where this process has not warned of it yet
        warnings.filterwarnings("error", message="inductor:")  # no fallback to torch.compile
        kernel = inductor.compile(func, tasks[0].pattern, "cuda", 1)
    arrays = random_inputs(func)
    inputs, outputs = to_tensors(arrays, tvm.cuda()), empty_outputs(func, tvm.cuda())
    synchronized(lambda: kernel(*inputs, *outputs), "cuda")()
    assert mismatch([o.numpy() for o in outputs], run_reference(func, arrays)) is None


def test_a_library_kernel_is_timed_inside_a_cuda_graph():
    """On a GPU: a cuBLAS candidate's cost is its kernel replayed in a CUDA graph, below its
    time as a Python call waited for."""
    require_gpu()
    from collage.measuring.timing import time_call, time_captured
    from tests.helpers import zoo_candidates

    candidate = next(c for c in zoo_candidates("bert", cublas.BACKEND, simplified=True) if c.pattern == "cublas.dense_bias")
    func = candidate.subgraph.extract()
    kernel = cublas.BACKEND.compile(func, candidate.pattern, "cuda", 0)
    inputs = to_tensors(random_inputs(func), tvm.cuda())
    outputs = empty_outputs(func, tvm.cuda())
    plain = time_call(synchronized(lambda: kernel(*inputs, *outputs), "cuda"))
    captured = time_captured(lambda: kernel(*inputs, *outputs))
    assert captured.is_valid and captured.median_ms < plain.median_ms


def test_optimize_with_inductor_and_an_accuracy_budget_on_the_gpu(tmp_path):
    """On a GPU: inductor alone is a finalist; with a budget, the kept module's error is
    within it and the libraries were offered TF32."""
    require_gpu()
    import collage

    w = models.load("kws_dscnn")
    (expected,) = w.reference()
    for accuracy in (None, 1e-2):
        opt = collage.optimize(w.relax, target="cuda", backends=["tvm", "cudnn", "cublas", "inductor"],
                               cost_log=tmp_path / "costs.sqlite", progress=False, accuracy=accuracy)  # fmt: skip
        (actual,) = opt(*[t.numpy() for t in w.inputs])
        error = np.abs(actual - expected).max() / np.abs(expected).max()
        assert error <= (1e-3 if accuracy is None else accuracy)
        assert any("inductor" in str(name) for name in opt.record.finalists), opt.report()


def test_a_torch_module_on_the_gpu_has_its_own_program_compiled_whole_among_the_finalists(tmp_path):
    """On a GPU: handed a PyTorch module, ``optimize`` races inductor compiling the user's own
    program whole (``torch.compile`` of the module) against its placements of its graph."""
    require_gpu()
    import collage

    torch.manual_seed(0)
    model, x = TwoLayers().eval(), torch.randn(4, 16)
    opt = collage.optimize(model, example_inputs=x, target="cuda", backends=["tvm", "inductor"],
                           cost_log=tmp_path / "costs.sqlite", progress=False)  # fmt: skip
    assert "inductor on the PyTorch module" in {str(name) for name in opt.record.finalists}, opt.report()
    assert {p.device.type for p in model.parameters()} == {"cpu"}, "optimize moved the user's module to the GPU"
    (actual,) = opt(x.numpy())
    with torch.no_grad():
        assert mismatch([actual], [model(x).numpy()]) is None


# A user's script as many are written: no ``if __name__ == "__main__":`` guard.
UNGUARDED_SCRIPT = """
import dataclasses, json
import torch
from collage.backends import inductor
from collage.candidates.backend import default_backends
from collage.candidates.generate import generate
from collage.measuring.runner import MeasureTask
from collage.measuring.timing import Timing
from collage.measuring.warm import warm
from tests.helpers import zoo_graph

print("the script runs", flush=True)
on_cpu = dataclasses.replace(inductor.BACKEND, candidates_on=None)  # its candidates on the CPU too
graph = zoo_graph("mlp", simplified=True)
# One inductor candidate, and a TVM one beside it (a second C++ compile on 2 cores: 10 s more).
candidates = [generate(graph, [inductor.BACKEND])[0], generate(graph, [default_backends()["tvm"]])[0]]
tasks = [MeasureTask(on_cpu if c.backend == "inductor" else default_backends()["tvm"], c.subgraph.extract(), c.pattern,
                     "llvm", torch.get_num_threads(), 0, Timing()) for c in candidates]
print(json.dumps(dataclasses.asdict(warm(tasks, [len(c.subgraph) for c in candidates], processes=2))))
"""


def test_candidates_compiled_ahead_in_parallel_processes_are_only_loaded_where_measured(tmp_path, monkeypatch):
    """Inductor's candidates are compiled first in processes of their own (``measuring.warm``),
    each into an AOTInductor package on disk: the compile where each is then measured loads
    that package and compiles nothing, and its kernel, written into the caller's buffers,
    matches TVM. Those processes never run the user's script again (``multiprocessing``'s
    would, where it has no main guard). Inductor offers candidates on CUDA only; compiling C++ for the CPU
    takes the same path here."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    import torch._inductor

    from collage.measuring.runner import MeasureTask
    from collage.measuring.timing import Timing
    from collage.measuring.warm import warm
    from tests.helpers import ROOT

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    script = tmp_path / "users_script.py"
    script.write_text(UNGUARDED_SCRIPT)
    # Not the suite's quick settings (``subprocess_env``): inductor starts Python processes,
    # and each would import collage and TVM first, tripling the compiles' time.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.count("the script runs") == 1, ran.stdout
    warmed = json.loads(ran.stdout.splitlines()[-1])
    assert (warmed["compiled"], warmed["processes"]) == (2, 2)
    assert 0 < warmed["slowest_s"] <= warmed["seconds"] and warmed["slowest_threads"] >= 1 and warmed["warnings"] == []
    assert len(list(tmp_path.glob("collage-packages/*.pt2"))) == 1

    def compiles(*args, **kwargs):
        raise AssertionError("compiled again where it was to be loaded")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compiles)
    on_cpu = dataclasses.replace(BACKEND, candidates_on=None)
    candidates = generate(zoo_graph("mlp", simplified=True), [BACKEND])[:1]
    threads = torch.get_num_threads()
    tasks = [MeasureTask(on_cpu, c.subgraph.extract(), c.pattern, "llvm", threads, 0, Timing()) for c in candidates]
    func = tasks[0].func
    arrays = random_inputs(func)
    kernel = inductor.compile(func, tasks[0].pattern, "llvm", threads)
    inputs, outputs = to_tensors(arrays, tvm.cpu()), empty_outputs(func, tvm.cpu())
    kernel(*inputs, *outputs)
    assert mismatch([o.numpy() for o in outputs], run_reference(func, arrays)) is None
    assert warm(tasks[:1], [1], processes=2).compiled == 0  # one candidate: compiled where it is measured


def test_the_largest_compiles_ahead_have_the_most_compile_threads():
    """ViT-B's nine inductor candidates on an H100's 16 cores: with one compile thread each,
    the whole model's compile took 102 of the pool's 112 s. The compiles that start at once
    share twice the cores by their operators; a later one has its share by the same measure."""
    from collage.measuring.warm import OVERSUBSCRIPTION, compile_threads

    vit = [355, 284, 284, 213, 213, 142, 142, 71, 71]
    threads = compile_threads(vit, processes=9, cores=16)
    assert threads == [6, 5, 5, 3, 3, 2, 2, 1, 1]
    assert sum(threads) <= OVERSUBSCRIPTION * 16
    assert compile_threads([300, 200, 100, 50], processes=2, cores=3) == [3, 2, 1, 1]
    assert compile_threads([5, 5], processes=2, cores=2) == [2, 2]


def test_two_rounds_of_compiling_ahead_report_as_one():
    """bfloat16 candidates are compiled ahead in a round after float16's (``measure``): the
    report's pool line sums both, with the slower round's slowest compile."""
    from collage.measuring.warm import Warmed

    first, later = Warmed(9, 9, 40.0, 35.0, 100, 6), Warmed(2, 2, 20.0, 18.0, 50, 3)
    assert first.and_then(later) == Warmed(11, 9, 60.0, 35.0, 100, 6)
    assert Warmed().and_then(later) == later


def test_what_a_backend_warns_of_while_compiling_ahead_reaches_the_report(monkeypatch):
    """A compile ahead runs in a process whose output nobody reads: the backend's own warnings
    there (they start with its name; inductor's when it has no AOTInductor package and
    compiles the slow way) come back with the pool's record, and the report says them."""
    import warnings

    from collage.measuring.runner import MeasureTask
    from collage.measuring.timing import Timing
    from collage.measuring.warm import COMPILE_THREADS, Warmed, _compiles
    from collage.record import RunRecord, StageSeconds
    from collage.deploying.report import measuring_text
    from tests.backends_for_tests import compile_elementwise, variant
    from tests.test_optimize import Unary

    said = "warns: no package here (OSError: disk full); compiling the slow way"

    def compile_warning(func, pattern, target, threads):
        warnings.warn("a library's own notice")
        warnings.warn(said)
        return compile_elementwise(func, pattern, target, threads)

    monkeypatch.setenv(COMPILE_THREADS, "1")
    backend = variant("warns", compile_warning)
    candidate = generate(DataflowGraph(Unary["main"]), [backend])[0]
    task = MeasureTask(backend, candidate.subgraph.extract(), candidate.pattern, "llvm", 1, 0, Timing())
    assert _compiles(task, 4) == (True, 1, (said,))
    record = RunRecord(seconds=StageSeconds(measure=9.0), compiled_ahead=Warmed(2, 2, 8.0, 7.0, 3, 1, (said,)))
    assert measuring_text(record).endswith(f"compiling ahead, {said}")


def test_the_packages_kept_on_disk_stay_within_their_budget_least_recently_used_first(tmp_path, monkeypatch):
    """Packages hold their weights, so the least recently used go past ``PACKAGE_CACHE_BYTES``;
    the one just built and those other processes are still writing stay."""
    import os

    def package(name, mtime):
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (mtime, mtime))
        return path

    oldest, older, newest = package("a.pt2", 1), package("b.pt2", 2), package("c.pt2", 4)
    writing = package("d.1234.pt2", 0)
    built = package("e.pt2", 3)
    monkeypatch.setattr(inductor, "PACKAGE_CACHE_BYTES", 250)
    inductor._prune(tmp_path, keep=built)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt2", "d.1234.pt2", "e.pt2"]
    assert not oldest.exists() and not older.exists() and newest.exists() and writing.exists()


class Wide(torch.nn.Module):
    """Matmuls of a size where TVM's untuned kernels take many times what inductor's do."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.timed  # kept by the finalists' race
def test_the_users_module_compiled_whole_is_kept_on_the_cpu_and_an_export_compiles_it_again(tmp_path, monkeypatch):
    """On the CPU inductor offers the user's own module compiled whole, as ``torch.compile``
    of it runs: kept here over untuned TVM, called through its own plain call, exported with
    the module beside its program, and loaded compiling the module, not the program."""
    import collage
    from collage.assembling.caller import CallPath
    from tests.quick_settings import FAST_CANDIDATES

    torch.manual_seed(0)
    model, x = Wide().eval(), torch.randn(64, 256)
    opt = collage.optimize(model, example_inputs=x, backends=["tvm", "inductor"], cost_log=tmp_path / "c.sqlite",
                           threads=2, timing=FAST_CANDIDATES, progress=False)  # fmt: skip
    assert [p.pattern for p in opt.placement] == ["inductor.program"]
    assert CallPath.ENGINE in opt.caller.paths
    with torch.no_grad():
        expected = model(x).numpy()
    (got,) = opt(x.numpy())  # main imported from torch.export returns even one output in a tuple
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    exported = opt.export(tmp_path / "exported")
    assert (exported / "kernels" / "0.module.pt").is_file()

    def no_program(self):
        raise AssertionError("the exported program was compiled, not the module")

    monkeypatch.setattr(torch.export.ExportedProgram, "module", no_program)
    loaded = collage.load(exported)
    (got,) = loaded(x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
