"""The cost log: every measured cost, kept in SQLite so nothing is measured twice.

One row per (backend, library version, structural key, device, threads, precision,
pattern), holding the median, spread and sample count, when it was measured, and the
failure reason for an invalid cost; the energy of one call where a meter measured it; and,
for a candidate computed in a reduced precision, its outputs' error against TVM's float32. Rows are plain values that ``sqlite3`` can show; no
pickled objects. The file is in WAL mode with a busy timeout, so several processes
optimizing at once read while one writes and wait for each other instead of failing.

Conflict policy: the first writer wins. Two processes that measure the same key at once
both measured the same thing, so either value is right; keeping the first makes a row
immutable once written, so every process (and every later run) plans with the same number,
and ``put`` returns that stored cost so the second writer can use it too. Costs of a new
library version or another machine go to new rows, not over old ones; ``clear`` starts over.

Connections are opened per operation and closed after it, so none is ever carried across
``fork``. Inside ``with log:`` the calling process and thread share one connection, which
is faster for a planner that reads many rows; other processes and threads still open their own.
"""

from __future__ import annotations

import contextlib
import io
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .cost import Cost, Device

ENV_VAR = "COLLAGE_COST_LOG"
DEFAULT_PATH = "~/.cache/collage/costs.sqlite"
SCHEMA_VERSION = 1
TABLE = "costs"
# Writers hold the lock for one short statement; a minute covers many processes queueing.
BUSY_TIMEOUT_S = 60.0

# What every measurement row holds after its key: the measurement, or the failure reason.
_MEASUREMENT_COLUMNS = """
    median_ms   REAL,
    spread_ms   REAL,
    samples     INTEGER,
    measured_at TEXT NOT NULL,
    failure     TEXT,
    energy_mj   REAL,
    error       REAL,
    CHECK ((failure IS NULL) = (median_ms IS NOT NULL)),"""

_SCHEMA = f"""
CREATE TABLE {TABLE} (
    backend     TEXT NOT NULL,
    library     TEXT NOT NULL,
    key         TEXT NOT NULL,
    device      TEXT NOT NULL,
    threads     INTEGER NOT NULL,
    precision   TEXT NOT NULL,
    pattern     TEXT NOT NULL,{_MEASUREMENT_COLUMNS}
    PRIMARY KEY (backend, library, key, device, threads, precision, pattern)
)"""

# The unoptimized module's outputs on the check's seeded inputs, so a second optimize of the
# same model skips compiling and running it (5 of ResNet-50's 10 s with a full log). Stored
# as .npz bytes, read back with allow_pickle=False: plain arrays, no pickled objects.
_REFERENCES = """
CREATE TABLE IF NOT EXISTS reference_outputs (
    model    TEXT PRIMARY KEY,
    outputs  BLOB NOT NULL,
    saved_at TEXT NOT NULL
)"""

# Whole placements timed end to end by the graph-level search (evolve.py), so a second search
# over the same model measures none of the placements the first one did. ``placement`` names
# each partition (backend, pattern, nodes); ``libraries`` the versions of the backends it uses.
PLACEMENTS = "placement_latency"
_PLACEMENTS = f"""
CREATE TABLE IF NOT EXISTS {PLACEMENTS} (
    model       TEXT NOT NULL,
    placement   TEXT NOT NULL,
    device      TEXT NOT NULL,
    threads     INTEGER NOT NULL,
    libraries   TEXT NOT NULL,{_MEASUREMENT_COLUMNS}
    PRIMARY KEY (model, placement, device, threads, libraries)
)"""

_KEY_COLUMNS = ("backend", "library", "key", "device", "threads", "precision", "pattern")


class CostLogError(Exception):
    """The cost log file cannot be used (corrupt, or another program's database)."""


@dataclass(frozen=True)
class LogKey:
    """What identifies one measurement: the row's primary key, as plain strings and ints."""

    backend: str
    library: str  # the library and its version, e.g. "ONNX Runtime 1.22.0 (CPU ...)"
    key: str  # the sub-graph's structural key: ops, attributes, shapes and dtypes
    device: str
    threads: int
    precision: str
    pattern: str

    @classmethod
    def of(cls, candidate, backend, device: Device, precision: str = "float32", library: str | None = None) -> LogKey:
        """The key for measuring ``candidate`` on ``backend`` (its ``Backend`` record), with
        ``library`` where it is measured (default: the backend's here)."""
        if candidate.backend != backend.name:
            raise ValueError(f"candidate of backend {candidate.backend!r} keyed with backend {backend.name!r}")
        return cls(
            backend=backend.name,
            library=backend.library if library is None else library,
            key=candidate.subgraph.structural_key,
            device=device.logged_as,
            threads=device.threads,
            precision=precision,
            pattern=candidate.pattern,
        )

    def values(self) -> tuple:
        return tuple(getattr(self, c) for c in _KEY_COLUMNS)


class PlacementKey(NamedTuple):
    """What identifies one end-to-end latency: the model, the placement, where and with what."""

    model: str  # the simplified module's structural hash and the target
    placement: str  # "backend:pattern:n,n,...;..." over the partitions, sorted
    device: str
    threads: int
    libraries: str  # "backend=library version;..." of the backends the placement uses


class Stats(NamedTuple):
    rows: int
    failures: int


class Row(NamedTuple):
    """One logged cost as stored: its key, then the measurement or the failure reason."""

    backend: str
    library: str
    key: str
    device: str
    threads: int
    precision: str
    pattern: str
    median_ms: float | None
    spread_ms: float | None
    samples: int | None
    measured_at: str
    failure: str | None
    energy_mj: float | None = None  # per call, where a meter measured it
    error: float | None = None  # its outputs' error against float32, for a reduced precision


def default_path() -> Path:
    """``$COLLAGE_COST_LOG`` if set, else ``~/.cache/collage/costs.sqlite``."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH).expanduser()


class CostLog:
    """Measured costs in an SQLite file (see the module docstring for the policy)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._held: tuple[tuple[int, int], sqlite3.Connection] | None = None
        with self._connection() as conn:
            self._initialize(conn)

    def __repr__(self):
        return f"CostLog({str(self.path)!r})"

    # -- reading and writing --

    def get(self, key: LogKey) -> Cost | None:
        """The logged cost for ``key``, or None when it was never measured."""
        return self._get(TABLE, _KEY_COLUMNS, key.values())

    def put(self, key: LogKey, cost: Cost) -> Cost:
        """Log ``cost`` for ``key`` unless a cost is already there; returns the logged one."""
        if cost.is_unknown:
            raise ValueError(f"an unknown cost is not a measurement; not logging it for {key}")
        return self._put(TABLE, _KEY_COLUMNS, key.values(), cost)

    def replace(self, key: LogKey, cost: Cost) -> Cost:
        """Log ``cost`` for ``key`` in place of what is there; returns the logged one. Only
        for a row that holds a verdict where a measurement belongs (``Measurer._budget_verdict``):
        otherwise the first writer wins."""
        where = " AND ".join(f"{c} = ?" for c in _KEY_COLUMNS)
        with self._connection() as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE {where}", key.values())
        return self.put(key, cost)

    def add_energy(self, key: LogKey, energy_mj: float) -> Cost | None:
        """Fill in the energy of a cost logged without one (measured before a meter was used);
        energy already there stays (first writer wins). Returns the logged cost."""
        where = " AND ".join(f"{c} = ?" for c in _KEY_COLUMNS)
        with self._connection() as conn:
            conn.execute(
                f"UPDATE {TABLE} SET energy_mj = ? WHERE {where} AND energy_mj IS NULL AND failure IS NULL",
                (energy_mj, *key.values()),
            )
            return _select_cost(conn, TABLE, _KEY_COLUMNS, key.values())

    def get_reference(self, model: str) -> list[np.ndarray] | None:
        """The outputs saved for ``model`` (a key naming the module, inputs and target), or None."""
        with self._connection() as conn:
            row = conn.execute("SELECT outputs FROM reference_outputs WHERE model = ?", (model,)).fetchone()
        if row is None:
            return None
        with np.load(io.BytesIO(row[0]), allow_pickle=False) as saved:
            return [saved[f"out{k}"] for k in range(len(saved.files))]

    def put_reference(self, model: str, outputs: list[np.ndarray]) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, **{f"out{k}": a for k, a in enumerate(outputs)})
        saved_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._connection() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO reference_outputs (model, outputs, saved_at) VALUES (?, ?, ?)",
                (model, buffer.getvalue(), saved_at),
            )

    def get_latency(self, key: PlacementKey) -> Cost | None:
        """The end-to-end latency logged for a whole placement, or None."""
        return self._get(PLACEMENTS, PlacementKey._fields, key)

    def put_latency(self, key: PlacementKey, cost: Cost) -> Cost:
        """Log a whole placement's latency unless one is there (first writer wins, as for
        costs); returns the logged one."""
        if cost.is_unknown:
            raise ValueError("an unknown cost is not a measurement")
        return self._put(PLACEMENTS, PlacementKey._fields, key, cost)

    def _get(self, table: str, columns: tuple[str, ...], values: tuple) -> Cost | None:
        with self._connection() as conn:
            return _select_cost(conn, table, columns, values)

    def _put(self, table: str, columns: tuple[str, ...], values: tuple, cost: Cost) -> Cost:
        """Insert the row unless its key is there (the first writer wins); the stored cost."""
        measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if cost.is_valid:
            measurement = (cost.median_ms, cost.spread_ms, cost.samples, None, cost.energy_mj, cost.error)
        else:
            measurement = (None, None, None, cost.reason, None, cost.error)
        with self._connection() as conn:
            conn.execute(
                f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}, median_ms, spread_ms, samples, failure, "
                f"energy_mj, error, measured_at) VALUES ({', '.join('?' * (len(columns) + 7))})",
                (*values, *measurement, measured_at),
            )
            return _select_cost(conn, table, columns, values)

    def stats(self) -> dict[tuple[str, str], Stats]:
        """Rows and failures per (backend, device)."""
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT backend, device, COUNT(*), COUNT(failure) FROM {TABLE} "
                "GROUP BY backend, device ORDER BY backend, device"
            ).fetchall()
        return {(backend, device): Stats(n, failures) for backend, device, n, failures in rows}

    def rows(self, backend: str | None = None, limit: int | None = None) -> list[Row]:
        """Logged costs, newest first: only ``backend``'s when given, at most ``limit``."""
        where, args = ("WHERE backend = ?", [backend]) if backend is not None else ("", [])
        with self._connection() as conn:
            found = conn.execute(
                f"SELECT {', '.join(Row._fields)} FROM {TABLE} {where} ORDER BY measured_at DESC, rowid DESC"
                + (" LIMIT ?" if limit is not None else ""),
                args + ([limit] if limit is not None else []),
            ).fetchall()
        return [Row(*r) for r in found]

    def sizes(self) -> dict[str, int]:
        """How many rows each table of the file holds (costs, saved references, ...): what
        ``clear`` would delete."""
        with self._connection() as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
            return {t: conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}

    def clear(self) -> None:
        """Forget every logged cost and saved reference."""
        with self._connection() as conn:
            conn.execute(f"DELETE FROM {TABLE}")
            conn.execute("DELETE FROM reference_outputs")
            conn.execute(f"DELETE FROM {PLACEMENTS}")

    def __len__(self) -> int:
        with self._connection() as conn:
            return conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0]

    # -- connections --

    def __enter__(self) -> CostLog:
        if self._held is not None:
            raise RuntimeError(f"{self!r} is already open in a with block")
        self._held = (_owner(), self._open())
        return self

    def __exit__(self, *exc) -> None:
        owner, conn = self._held
        self._held = None
        # A connection inherited through fork belongs to the parent; closing it here could
        # checkpoint the parent's WAL from under it, so only its owner closes it.
        if owner == _owner():
            conn.close()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """The held connection when the caller owns it, else a fresh one for this operation."""
        if self._held is not None and self._held[0] == _owner():
            yield self._held[1]
            return
        conn = self._open()
        try:
            yield conn
        finally:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        # Autocommit: every statement is its own transaction, so writers hold the lock briefly.
        try:
            return sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise CostLogError(f"cannot open the cost log {self.path}: {e}") from e

    def _initialize(self, conn: sqlite3.Connection) -> None:
        """Turn on WAL and create the table in a new file; refuse a file that is not a log."""
        try:
            self._use_wal(conn)
            # IMMEDIATE takes the write lock first, so processes creating the file at once
            # create the table once.
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._create_or_check(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as e:
            raise CostLogError(
                f"cannot use {self.path} as a collage cost log ({e}); move it away or pass another path"
            ) from e

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        """Switch to WAL. The switch needs the file to itself, and SQLite can answer "locked"
        at once, without its busy timeout, while another process is creating the same file:
        so retry, for as long as the busy timeout would have waited."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _create_or_check(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if version == 0 and not tables:
            conn.execute(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION or TABLE not in tables:
            raise CostLogError(
                f"{self.path} is not a collage cost log of schema version {SCHEMA_VERSION} "
                f"(user_version {version}, tables {tables}); move it away or pass another path"
            )
        conn.execute(_REFERENCES)  # added to version 1 later: old logs get them on opening
        conn.execute(_PLACEMENTS)
        for table in (TABLE, PLACEMENTS):  # energy and error came later too: old logs get the columns
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            for column in ("energy_mj", "error"):
                if column not in columns:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} REAL")


def _owner() -> tuple[int, int]:
    """Who may use a held connection: the process and thread that opened it."""
    return os.getpid(), threading.get_ident()


def _select_cost(conn: sqlite3.Connection, table: str, columns: tuple[str, ...], values: tuple) -> Cost | None:
    where = " AND ".join(f"{c} = ?" for c in columns)
    row = conn.execute(
        f"SELECT median_ms, spread_ms, samples, failure, energy_mj, error FROM {table} WHERE {where}", values
    ).fetchone()
    return None if row is None else _cost_from_row(*row)


def _cost_from_row(median_ms, spread_ms, samples, failure, energy_mj, error) -> Cost:
    if failure is not None:
        return Cost.invalid(failure, error)
    return Cost.of(median_ms, spread=spread_ms, samples=samples, energy_mj=energy_mj, error=error)
