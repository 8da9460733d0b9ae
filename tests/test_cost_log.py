"""CostLog: round trips, keys, WAL mode, default path, concurrent writers, bad files."""

import numpy as np
import dataclasses
import multiprocessing
import sqlite3
from types import SimpleNamespace

import pytest

from collage.candidates.backend import OP_LEVEL, Backend
from collage.candidates.generate import Candidate
from collage.measuring.cost import Cost, Device
from collage.measuring.cost_log import CostLog, CostLogError, LogKey, Stats

KEY = LogKey(
    backend="dnnl",
    library="oneDNN in PyTorch 2.13.0",
    key="ab" * 32,
    device="Some CPU @ 3.0GHz",
    threads=4,
    precision="float32",
    pattern="dnnl.conv2d",
)


@pytest.fixture
def log(tmp_path):
    return CostLog(tmp_path / "costs.sqlite")


def test_a_new_log_is_empty(log):
    assert len(log) == 0
    assert log.get(KEY) is None
    assert log.stats() == {}


def test_valid_cost_round_trips(log):
    cost = Cost.of(1.25, spread=0.05, samples=30)
    assert log.put(KEY, cost) == cost
    assert log.get(KEY) == cost
    assert len(log) == 1


def test_a_reduced_precision_cost_round_trips_with_its_error(log):
    key = dataclasses.replace(KEY, precision="bfloat16")
    cost = Cost.of(0.5, spread=0.01, samples=20, error=3.2e-3)
    log.put(key, cost)
    assert log.get(key) == cost and log.rows()[0].error == 3.2e-3


def test_a_log_written_before_errors_were_kept_gets_the_column(tmp_path):
    path = tmp_path / "costs.sqlite"
    CostLog(path).put(KEY, Cost.of(1.0, samples=5))
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE costs DROP COLUMN error")
    assert CostLog(path).get(KEY) == Cost.of(1.0, samples=5)


def test_invalid_cost_round_trips_with_its_reason(log):
    cost = Cost.invalid("output differs from TVM: max relative error 0.3")
    log.put(KEY, cost)
    got = log.get(KEY)
    assert got.is_invalid and got.reason == cost.reason


def test_an_unknown_cost_is_not_logged(log):
    with pytest.raises(ValueError, match="unknown"):
        log.put(KEY, Cost.unknown())
    assert len(log) == 0


def test_the_first_writer_wins(log):
    first = Cost.of(1.0, samples=10)
    log.put(KEY, first)
    assert log.put(KEY, Cost.of(9.0, samples=10)) == first
    assert log.put(KEY, Cost.invalid("late failure")) == first
    assert log.get(KEY) == first and len(log) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"device": "Another CPU"},
        {"threads": 8},
        {"library": "oneDNN in PyTorch 2.14.0"},
        {"precision": "float16"},
        {"pattern": "dnnl.conv2d_relu"},
        {"backend": "mkl"},
        {"key": "cd" * 32},
    ],
)
def test_each_key_field_makes_a_different_row(log, change):
    other = dataclasses.replace(KEY, **change)
    log.put(KEY, Cost.of(1.0))
    log.put(other, Cost.of(2.0))
    assert len(log) == 2
    assert log.get(KEY) == Cost.of(1.0)
    assert log.get(other) == Cost.of(2.0)


def test_log_key_of_a_candidate():
    backend = Backend("dnnl", OP_LEVEL, ("llvm",), compile=None, library="oneDNN in PyTorch 2.13.0")
    candidate = Candidate(SimpleNamespace(structural_key="ab" * 32), "dnnl", "dnnl.conv2d")
    device = Device("Some CPU @ 3.0GHz", 4)
    assert LogKey.of(candidate, backend, device, "float32") == KEY
    with pytest.raises(ValueError, match="mkl"):
        LogKey.of(dataclasses.replace(candidate, backend="mkl"), backend, device)


def test_stats_count_rows_and_failures_per_backend_and_device(log):
    log.put(KEY, Cost.of(1.0))
    log.put(dataclasses.replace(KEY, key="1"), Cost.invalid("no"))
    log.put(dataclasses.replace(KEY, backend="mkl"), Cost.of(1.0))
    log.put(dataclasses.replace(KEY, backend="mkl", device="GPU"), Cost.invalid("no"))
    assert log.stats() == {
        ("dnnl", KEY.device): Stats(rows=2, failures=1),
        ("mkl", "GPU"): Stats(rows=1, failures=1),
        ("mkl", KEY.device): Stats(rows=1, failures=0),
    }


def test_clear_forgets_everything(log):
    log.put(KEY, Cost.of(1.0))
    log.clear()
    assert len(log) == 0 and log.get(KEY) is None


def test_rows_are_plain_values_in_wal_mode(log):
    log.put(KEY, Cost.of(1.0, spread=0.1, samples=5))
    log.put(dataclasses.replace(KEY, key="1"), Cost.invalid("no"))
    with sqlite3.connect(log.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        types = conn.execute(
            "SELECT DISTINCT typeof(median_ms), typeof(spread_ms), typeof(samples), typeof(failure) FROM costs"
        ).fetchall()
    assert set(types) == {("real", "real", "integer", "null"), ("null", "null", "null", "text")}


def test_a_with_block_shares_one_connection_and_reopens_after(log):
    with log:
        log.put(KEY, Cost.of(1.0))
        assert log.get(KEY) == Cost.of(1.0)
    assert len(log) == 1
    with log:
        assert len(log) == 1


def test_costs_persist_across_log_objects(tmp_path):
    CostLog(tmp_path / "costs.sqlite").put(KEY, Cost.of(2.0))
    assert CostLog(tmp_path / "costs.sqlite").get(KEY) == Cost.of(2.0)


def test_default_path_is_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("COLLAGE_COST_LOG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    log = CostLog()
    assert log.path == tmp_path / ".cache" / "collage" / "costs.sqlite"
    assert log.path.exists()


def test_environment_variable_overrides_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLLAGE_COST_LOG", str(tmp_path / "deep" / "dir" / "mine.sqlite"))
    assert CostLog().path == tmp_path / "deep" / "dir" / "mine.sqlite"
    assert CostLog(tmp_path / "explicit.sqlite").path == tmp_path / "explicit.sqlite"
    assert not (tmp_path / "home").exists()


def test_a_corrupt_file_is_named_in_the_error(tmp_path):
    path = tmp_path / "costs.sqlite"
    path.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(CostLogError, match=str(path)):
        CostLog(path)


def test_another_programs_database_is_refused(tmp_path):
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    with pytest.raises(CostLogError, match=f"{path}.*not a collage cost log"):
        CostLog(path)


def test_a_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "costs.sqlite"
    CostLog(path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(CostLogError, match="user_version 99"):
        CostLog(path)


SHARED, OWN, WORKERS = 200, 50, 4


def _open_and_put(path, worker, barrier):
    barrier.wait()
    CostLog(path).put(dataclasses.replace(KEY, key=f"first-{worker}"), Cost.of(1.0))


def test_processes_creating_one_new_log_at_once_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(WORKERS)
    path = tmp_path / "new" / "costs.sqlite"
    workers = [ctx.Process(target=_open_and_put, args=(path, w, barrier)) for w in range(WORKERS)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=60)
    assert [p.exitcode for p in workers] == [0] * WORKERS
    assert len(CostLog(path)) == WORKERS


def _write_at_once(log, worker, barrier):
    """One optimizer process: logs the shared keys and its own, interleaved, then reads all."""
    barrier.wait()
    shared = [dataclasses.replace(KEY, key=f"shared-{i}") for i in range(SHARED)]
    own = [dataclasses.replace(KEY, key=f"own-{worker}-{i}") for i in range(OWN)]
    for i, key in enumerate(shared):
        log.put(key, Cost.of(float(worker), samples=1) if i % 7 else Cost.invalid(f"worker {worker}"))
        if i % 4 == 0:
            log.put(own[i // 4], Cost.of(float(i)))
    assert all(log.get(k) is not None for k in shared + own)


def test_concurrent_writers_lose_and_duplicate_nothing(log):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(WORKERS)
    with log:  # the parent's held connection must not leak into the forked writers
        workers = [ctx.Process(target=_write_at_once, args=(log, w, barrier)) for w in range(WORKERS)]
        for p in workers:
            p.start()
        for p in workers:
            p.join(timeout=60)
        assert [p.exitcode for p in workers] == [0] * WORKERS
        assert len(log) == SHARED + WORKERS * OWN
    for i in range(SHARED):
        assert log.get(dataclasses.replace(KEY, key=f"shared-{i}")) is not None
    for w in range(WORKERS):
        for i in range(OWN):
            assert log.get(dataclasses.replace(KEY, key=f"own-{w}-{i}")) == Cost.of(float(4 * i))


def test_reference_outputs_round_trip_as_plain_arrays(tmp_path):
    log = CostLog(tmp_path / "costs.sqlite")
    assert log.get_reference("model-a") is None
    outputs = [np.arange(6, dtype="float32").reshape(2, 3), np.array([1, 2], dtype="int64")]
    log.put_reference("model-a", outputs)
    log.put_reference("model-a", [np.zeros(1)])  # first writer wins, as for costs
    again = CostLog(tmp_path / "costs.sqlite").get_reference("model-a")
    assert [a.dtype for a in again] == [np.float32, np.int64]
    for a, b in zip(again, outputs):
        np.testing.assert_array_equal(a, b)
    log.clear()
    assert log.get_reference("model-a") is None
