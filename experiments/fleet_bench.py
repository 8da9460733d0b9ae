"""How measuring time falls with the number of measuring servers (docs/fleet.md).

    python -m experiments.fleet_bench --model squeezenet resnet50

For each model, each time with an empty cost log: ``collage.optimize`` measuring here (its
worker process, candidates at one thread, both cores free to it), then through a TVM RPC
tracker and two ``collage serve --threads 1`` servers on loopback, each pinned to a core
of its own. Then, from the fleet run's per-work times (``RPCRunner.work_seconds``), the
measuring time of N servers (1-64): each ``run_all`` call's works placed, in the order
they were sent, on the server that frees first, each paying the dispatch overhead
measured here (a trivial candidate through one server against the same in a local
worker) as the least a work holds the runner, plus the part of measuring that is not dispatched (the model's values computed
here, tasks built, costs logged), which the two-server run fixes. Results, with the CPU,
go to ``experiments/results/fleet_bench.json``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "fleet_bench.json"
SERVERS = (1, 2, 4, 8, 16, 32, 64)
OVERHEAD_TASKS = 40
HOST = "127.0.0.1"


# -- a fleet on loopback, for this benchmark and the tests (tests/test_fleet.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start(args: list[str], core: int | None = None) -> subprocess.Popen:
    """``python ARGS`` in a process group of its own (on one ``core`` if given), so that
    killing the group kills what it started too (a server's session and its worker): a
    machine that dies."""
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    return subprocess.Popen([sys.executable, *args], start_new_session=True, preexec_fn=pin,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def kill(proc: subprocess.Popen) -> None:
    """``proc`` and everything in its group, at once (SIGKILL)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def start_tracker() -> tuple[str, subprocess.Popen]:
    """TVM's RPC tracker on a free loopback port, once it listens: its address and process."""
    from collage.measuring.rpc_runner import FleetError, reachable

    port = free_port()
    proc = start(["-m", "tvm.exec.rpc_tracker", "--host", HOST, "--port", str(port), "--port-end", str(port + 1)])
    deadline = time.monotonic() + 60
    while True:
        try:
            reachable((HOST, port), timeout_s=1.0)
            return f"{HOST}:{port}", proc
        except FleetError:
            if time.monotonic() > deadline:
                kill(proc)
                raise RuntimeError(f"the tracker did not start listening on {port} in 60 s") from None
            time.sleep(0.2)


def start_server(tracker: str, key: str, threads: int, core: int | None = None) -> subprocess.Popen:
    return start(["-m", "collage", "serve", "--tracker", tracker, "--key", key, "--threads", str(threads),
                  "--port", str(free_port())], core)  # fmt: skip


def wait_registered(tracker: str, key: str, count: int, timeout_s: float = 120.0) -> None:
    from collage.measuring.rpc_runner import parse_address, registered_servers

    deadline = time.monotonic() + timeout_s
    while registered_servers(parse_address(tracker), key) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} server(s) under {key!r} did not register in {timeout_s:g} s")
        time.sleep(0.3)


def optimize(model: str, runner) -> dict:
    import collage
    from experiments import models

    w = models.load(model)
    with tempfile.TemporaryDirectory() as tmp:
        opt = collage.optimize(w.relax, cost_log=Path(tmp) / "costs.sqlite", threads=1, progress=False, runner=runner)
    return {"measure_s": round(opt.record.seconds.measure, 2), "measured": opt.record.measured,
            "chosen": str(opt.record.chosen), "measured_ms": round(opt.measured.median_ms, 3)}  # fmt: skip


def dispatch_overhead_s(runner) -> float:
    """Seconds a trivial candidate takes through one server beyond the same in a local worker."""
    from collage.candidates.backend import default_backends
    from collage.measuring.runner import MeasureTask
    from collage.measuring.isolation import WorkerProcess
    from collage.measuring.timing import Timing
    from tvm import relax

    x = relax.Var("x", relax.TensorType((16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(np.ones((16, 16), "float32"))))
        bb.emit_func_output(out)
    once = Timing(warmup=1, warmup_s=0.0, max_warmup_s=0.0, min_samples=1, max_samples=1, min_sample_ms=0.0, budget_s=0.0)
    task = MeasureTask(default_backends()["onnxruntime"], bb.get()["main"], "onnxruntime.add", "llvm", 1, 0, once)
    local = WorkerProcess(1)

    def per_task(run) -> float:
        run(task)  # the worker started, the library loaded
        start = time.perf_counter()
        for _ in range(OVERHEAD_TASKS):
            run(task)
        return (time.perf_counter() - start) / OVERHEAD_TASKS

    here, there = per_task(local.run), per_task(runner.run)
    local.close()
    return there - here


def makespan(durations: list[float], servers: int) -> float:
    """The works, in the order sent, each on the server that frees first."""
    free = [0.0] * servers
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def modeled(work_seconds: list[tuple[int, float, float]], measured_s: float, overhead_s: float) -> dict:
    """Measuring seconds with N servers. A work's seconds, as the runner saw them, hold its
    dispatch already; the runner's own share of it is serial, so a call of k works takes at
    least k dispatch overheads however many servers there are. The part of measuring that is
    not dispatched is what two servers' measured time leaves beyond their makespans."""
    calls: dict[int, list[float]] = {}
    for call, seconds, _ in work_seconds:
        calls.setdefault(call, []).append(seconds)
    # Works overlap the client's own steps a little, so the difference can come out below zero.
    serial = max(0.0, measured_s - sum(makespan(d, 2) for d in calls.values()))
    times = {n: round(serial + sum(max(makespan(d, n), len(d) * overhead_s) for d in calls.values()), 2)
             for n in SERVERS}  # fmt: skip
    return {"servers": times, "not_dispatched_s": round(serial, 2)}


def _stats(values: list[float]) -> dict:
    return {"median": round(float(np.median(values)), 4), "max": round(max(values), 3), "total": round(sum(values), 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["squeezenet", "resnet50"])
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results JSON (default {RESULTS})")
    args = parser.parse_args(argv)

    from collage.measuring.cost import cpu_info
    from collage.measuring.rpc_runner import RPCRunner

    tracker, tracker_proc = start_tracker()
    procs = [tracker_proc]
    results = {"cpu": cpu_info(), "cores": len(os.sched_getaffinity(0)), "models": {}}
    try:
        procs += [start_server(tracker, "bench", threads=1, core=k) for k in range(2)]
        wait_registered(tracker, "bench", 2)
        for model in args.model:
            local = optimize(model, None)
            with RPCRunner(tracker, "bench") as runner:
                fleet = optimize(model, runner)
                overhead = dispatch_overhead_s(runner)
                work = runner.work_seconds
            entry = {
                "local": local, "two_servers": fleet,
                "ratio": round(fleet["measure_s"] / local["measure_s"], 3),
                "works": len(work), "work_s_total": round(sum(s for _, s, _ in work), 2),
                "server_s_total": round(sum(s for _, _, s in work), 2),
                "dispatch_s": {"trivial_task": round(overhead, 4),
                               **_stats([s - on_server for _, s, on_server in work])},
                "modeled_measure_s": modeled(work, fleet["measure_s"], overhead),
            }  # fmt: skip
            results["models"][model] = entry
            print(model, json.dumps(entry), flush=True)
    finally:
        for p in procs:
            kill(p)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
