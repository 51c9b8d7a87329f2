"""The measurement store: every real run and its records in one SQLite file.

Where: `--db PATH`, else `$PERFMODEL_DB`, else `<data home>/measurements.sqlite`
(`perfmodel.cluster.data_home()`, `~/.local/share/perfmodel` by default). WAL journal, so
readers never block the writer; a writer waits `busy_timeout_s` for another writer, then
gives up with a clear error. A run is ingested in ONE transaction (`ingest`): a crash
part-way leaves no trace of it, and a run that failed is stored too, with its reason.
No torch here.

Schema (version 1). Every record table has `run_id` (-> runs.id), `rank` (the process that
wrote it), `seq` (its position in that rank's file) and `extra_json` (fields a run wrote that
have no column, as a JSON object, or NULL) besides the columns below. Times are seconds,
sizes bytes, bandwidths GB/s (1e9 B/s).

runs         one row per launched run
  id INTEGER PRIMARY KEY, kind ("ddp", "fsdp", "ps", "compute", "collectives", ...),
  status ("ok" | "failed"), reason (why it failed; "" when ok),
  started_at, ended_at (ISO 8601, UTC), wall_s (launch to last process gone),
  workload, workers (training workers), world_size (processes), batch_size, steps, seed,
  backend ("gloo" | "nccl"), device, host, torch_version, backend_version (NCCL version if
  the worker reports one), python_version, git_revision (perfmodel checkout; "-dirty" when
  modified), oversubscribed (0/1: more compute processes than cores), link_rate_Gbps (the
  emulated link cap of measure/netem.py, NULL when none), run_dir, config_json (config.json
  exactly as the workers read it).
ranks        start/done/error of each process: host, backend, device, world_size,
             torch_version, backend_version, state ("done" | "error" | "lost": started and
             left no last record, e.g. killed).
steps        one training step of one rank: step, wall_s, compute_s, comm_wait_s, loss, samples.
updates      one gradient applied by a PS server (staleness events): worker, step,
             version_read, version_applied, time_s, and staleness = version_applied -
             version_read (a generated column).
memory       peak memory of one rank: peak_bytes, params_bytes, grads_bytes, optimizer_bytes,
             activations_bytes, other_bytes, method (how it was measured).
collectives  one collective at one size (nccl-tests, doc/PERFORMANCE.md): op, bytes (S, the
             total size nccl-tests reports), count (elements), dtype, time_s (slowest rank's
             mean per iteration), algbw_GBps (S/t), busbw_GBps, busbw_factor; in
             extra_json time_median_s (ping-pong's median call, runs from 2026-12-03 on)
             and cpu_busy_fraction (each rank's CPU seconds over wall seconds in the timed
             loop, averaged over ranks; runs before 2026-12-03 lack it).
compute      forward or backward time of one workload unit: unit, batch_size, pass
             ("forward" | "backward"), median_s, iqr_s, repeats.
evals        held-out evaluation: step, time_s, accuracy, loss.
summaries    free-form per-rank numbers: key, value (a number, or JSON text for anything else).
errors       an error a rank recorded: message, traceback.
other_records  any record of a type not listed above: type, json (the whole record).
meta         key/value; "schema_version".
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from measure.recorder import read_records
from perfmodel.cluster import data_home
from perfmodel.errors import PerfmodelError

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed")
BUSY_TIMEOUT_S = 10.0       # how long a writer waits for another writer before giving up

# record type -> (table, its columns besides run_id, rank, seq, extra_json)
RECORD_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "step": ("steps", ("step", "wall_s", "compute_s", "comm_wait_s", "loss", "samples")),
    "update": ("updates", ("worker", "step", "version_read", "version_applied", "time_s")),
    "memory": ("memory", ("peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
                          "activations_bytes", "other_bytes", "method")),
    "collective": ("collectives", ("op", "bytes", "count", "dtype", "time_s", "algbw_GBps",
                                   "busbw_GBps", "busbw_factor")),
    "compute": ("compute", ("unit", "batch_size", "pass", "median_s", "iqr_s", "repeats")),
    "eval": ("evals", ("step", "time_s", "accuracy", "loss")),
    "error": ("errors", ("message", "traceback")),
}
TABLES = ("runs", "ranks", *(t for t, _ in RECORD_TABLES.values()), "summaries",
          "other_records")

_RUN_COLUMNS = ("kind", "status", "reason", "started_at", "ended_at", "wall_s", "workload",
                "workers", "world_size", "batch_size", "steps", "seed", "backend", "device",
                "host", "torch_version", "backend_version", "python_version", "git_revision",
                "oversubscribed", "link_rate_Gbps", "run_dir", "config_json")
_RANK_COLUMNS = ("host", "backend", "device", "world_size", "torch_version", "backend_version",
                 "state")
_KEYS = "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, rank INTEGER, seq INTEGER"


def _schema() -> list[str]:
    run_cols = ", ".join(f'"{c}"' for c in _RUN_COLUMNS[3:])
    ddl = [
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
        "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "kind TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('ok', 'failed')), "
        f"reason TEXT NOT NULL DEFAULT '', {run_cols})",
        f"CREATE TABLE IF NOT EXISTS ranks ({_KEYS}, "
        + ", ".join(f'"{c}"' for c in _RANK_COLUMNS) + ", extra_json TEXT)",
        f"CREATE TABLE IF NOT EXISTS summaries ({_KEYS}, key TEXT, value)",
        f"CREATE TABLE IF NOT EXISTS other_records ({_KEYS}, type TEXT, json TEXT)",
    ]
    for table, cols in RECORD_TABLES.values():
        extra = (", staleness INTEGER GENERATED ALWAYS AS (version_applied - version_read) "
                 "VIRTUAL" if table == "updates" else "")
        ddl.append(f"CREATE TABLE IF NOT EXISTS {table} ({_KEYS}, "
                   + ", ".join(f'"{c}"' for c in cols) + f", extra_json TEXT{extra})")
    ddl += [f"CREATE INDEX IF NOT EXISTS {t}_run ON {t}(run_id)" for t in TABLES[1:]]
    return ddl


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow:
    """One row of the runs table."""

    id: int
    kind: str
    status: str
    reason: str
    started_at: str | None
    ended_at: str | None
    wall_s: float | None
    workload: str | None
    workers: int | None
    world_size: int | None
    batch_size: int | None
    steps: int | None
    seed: int | None
    backend: str | None
    device: str | None
    host: str | None
    torch_version: str | None
    backend_version: str | None
    python_version: str | None
    git_revision: str | None
    oversubscribed: int
    link_rate_Gbps: float | None
    run_dir: str | None
    config_json: str

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.config_json)


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """A run with its records: table name -> rows as plain dicts (extra fields merged in)."""

    row: RunRow
    records: dict[str, list[dict[str, Any]]]

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.records.get(name, [])


def default_db_path() -> Path:
    env = os.environ.get("PERFMODEL_DB")
    return Path(env) if env else data_home() / "measurements.sqlite"


class Store:
    """The SQLite measurement store at `path` (default: `default_db_path()`)."""

    def __init__(self, path: Path | str | None = None, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path) if path is not None else default_db_path()
        self.busy_timeout_s = busy_timeout_s

    @property
    def journal_dir(self) -> Path:
        """Where launchers note the runs they have started and not yet stored (one small
        file per run, measure/session.py): beside the store, named after it."""
        return self.path.parent / f"{self.path.name}.running"

    def check(self) -> None:
        """Open the store (creating it if new) and check it, before anything is launched: a
        corrupt, foreign or newer store is refused now, not after the run."""
        with self._connect():
            pass

    # -- writing ----------------------------------------------------------------------------

    def ingest(self, run_dir: Path, status: str, reason: str = "") -> int:
        """Store the run in `run_dir` (config.json, launch.json, rank*.jsonl) with every
        rank's records, in one transaction; return its id."""
        if status not in STATUSES:
            raise PerfmodelError(f"run status must be one of {', '.join(STATUSES)}, "
                                 f"got '{status}'")
        run_dir = Path(run_dir)
        try:
            config = json.loads((run_dir / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PerfmodelError(f"{run_dir} is not a run directory: cannot read config.json "
                                 f"({e})") from e
        launch = _read_json(run_dir / "launch.json")
        records = read_records(run_dir)
        with self._connect() as conn, self._transaction(conn):
            run_id = conn.execute(
                f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES "
                f"({', '.join('?' * len(_RUN_COLUMNS))})",
                _run_values(config, launch, records, status, reason, run_dir)).lastrowid
            _insert_records(conn, run_id, records)
        return run_id

    # -- reading ----------------------------------------------------------------------------

    def list_runs(self, *, kind: str | None = None, workload: str | None = None,
                  status: str | None = None) -> list[RunRow]:
        """Runs matching every filter given, oldest first."""
        if not self.path.exists():
            return []
        where, args = _filters(kind=kind, workload=workload, status=status)
        with self._connect() as conn:
            rows = conn.execute(f"SELECT * FROM runs{where} ORDER BY id", args).fetchall()
        return [_run_row(r) for r in rows]

    def get_run(self, run_id: int) -> Run:
        if not self.path.exists():
            raise PerfmodelError(f"no run {run_id}: the store {self.path} does not exist yet")
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise PerfmodelError(f"no run {run_id} in {self.path}")
            records = {t: _table_rows(conn, t, (run_id,)) for t in TABLES[1:]}
        return Run(row=_run_row(row), records=records)

    def rows(self, table: str, run_ids: list[int] | None = None) -> list[dict[str, Any]]:
        """Rows of one table (all runs, or the given ones), extra fields merged in."""
        if table not in TABLES:
            raise PerfmodelError(f"unknown table '{table}'; choose from: {', '.join(TABLES)}")
        if not self.path.exists():
            return []
        with self._connect() as conn:
            if table == "runs":
                rows = conn.execute("SELECT * FROM runs ORDER BY id").fetchall()
                return [dict(r) for r in rows if run_ids is None or r["id"] in run_ids]
            return _table_rows(conn, table, run_ids)

    def export_csv(self, out: TextIO, table: str = "runs", *, kind: str | None = None,
                   workload: str | None = None, status: str | None = None) -> int:
        """Write the runs matching the filters (or those runs' rows of `table`) as CSV;
        return the number of rows written."""
        ids = [r.id for r in self.list_runs(kind=kind, workload=workload, status=status)]
        rows = self.rows(table, ids)
        columns = self._columns(table)
        for r in rows:
            columns += [k for k in r if k not in columns]
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _csv_value(v) for k, v in r.items()})
        return len(rows)

    # -- plumbing ---------------------------------------------------------------------------

    def _columns(self, table: str) -> list[str]:
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [r[1] for r in conn.execute(f"PRAGMA table_xinfo({table})")
                    if r[1] not in ("extra_json", "seq")]

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise PerfmodelError(f"cannot open the measurement store {self.path}: {e}") from e
        conn.row_factory = sqlite3.Row
        try:
            with self._errors():
                self._prepare(conn)
            with self._errors():
                yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")     # take the write lock now (waits busy_timeout_s)
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check it is a database (never touching a file that is not), switch to WAL, and
        create the schema if it is new."""
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        conn.execute("PRAGMA foreign_keys = ON")
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" in tables:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise PerfmodelError(f"{self.path} has store schema {version}, newer than this "
                                     f"perfmodel's {SCHEMA_VERSION}; upgrade perfmodel")
            if version == SCHEMA_VERSION and set(TABLES) <= tables:
                return
        with self._transaction(conn):
            for statement in _schema():
                conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """sqlite3 errors as one sentence naming the file."""
        try:
            yield
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise PerfmodelError(
                    f"the measurement store {self.path} is locked by another process "
                    f"(waited {self.busy_timeout_s:g} s); try again when it has finished"
                ) from e
            raise PerfmodelError(f"the measurement store {self.path} failed: {e}") from e
        except sqlite3.DatabaseError as e:
            raise PerfmodelError(
                f"{self.path} is not a usable SQLite measurement store ({e}); it was left "
                f"untouched: move it aside or choose another file with --db or PERFMODEL_DB"
            ) from e


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _run_values(config: dict, launch: dict, records: list[dict], status: str, reason: str,
                run_dir: Path) -> tuple:
    start = next((r for r in records if r.get("type") == "start"), {})
    value = {
        "kind": config.get("kind", "unknown"), "status": status, "reason": reason,
        "started_at": launch.get("started_at"), "ended_at": launch.get("ended_at"),
        "wall_s": launch.get("wall_s"), "workload": config.get("workload"),
        "workers": config.get("workers"), "world_size": start.get("world_size"),
        "batch_size": config.get("batch_size"), "steps": config.get("steps"),
        "seed": config.get("seed"), "backend": start.get("backend"),
        "device": start.get("device"), "host": start.get("host") or launch.get("host"),
        "torch_version": start.get("torch_version"),
        "backend_version": start.get("backend_version"),
        "python_version": launch.get("python_version", sys.version.split()[0]),
        "git_revision": launch.get("git_revision"),
        "oversubscribed": int(bool(config.get("oversubscribed") or launch.get("oversubscribed"))),
        "link_rate_Gbps": config.get("link_rate_Gbps"), "run_dir": str(run_dir.resolve()),
        "config_json": json.dumps(config, sort_keys=True),
    }
    return tuple(_sql_value(value[c]) for c in _RUN_COLUMNS)


def _insert_records(conn: sqlite3.Connection, run_id: int, records: list[dict]) -> None:
    """Every record into its table; start/done/error also summarised per rank in `ranks`."""
    seq: dict[int, int] = {}
    rows: dict[str, list[tuple]] = {}
    ranks: dict[int, dict[str, Any]] = {}
    for rec in records:
        rank, kind = rec.get("rank"), rec.get("type")
        n = seq[rank] = seq.get(rank, -1) + 1
        if kind == "start":
            ranks[rank] = {**{k: v for k, v in rec.items() if k not in ("type", "rank")},
                           "state": "lost"}
        elif kind in ("done", "error"):
            ranks.setdefault(rank, {"state": "lost"})["state"] = kind
        if kind in RECORD_TABLES:
            table, cols = RECORD_TABLES[kind]
            extra = {k: v for k, v in rec.items() if k not in (*cols, "type", "rank")}
            rows.setdefault(table, []).append(
                (run_id, rank, n, *(_sql_value(rec.get(c)) for c in cols), _json_or_null(extra)))
        elif kind == "summary":
            for key, value in rec.items():
                if key not in ("type", "rank"):
                    rows.setdefault("summaries", []).append(
                        (run_id, rank, n, key, _summary_value(value)))
        elif kind not in ("start", "done"):
            rows.setdefault("other_records", []).append(
                (run_id, rank, n, str(kind), json.dumps(rec)))
    for rank, info in ranks.items():
        extra = {k: v for k, v in info.items() if k not in _RANK_COLUMNS}
        rows.setdefault("ranks", []).append(
            (run_id, rank, 0, *(_sql_value(info.get(c)) for c in _RANK_COLUMNS),
             _json_or_null(extra)))
    for table, values in rows.items():
        _insert_rows(conn, table, values)


def _insert_rows(conn: sqlite3.Connection, table: str, values: list[tuple]) -> None:
    conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(values[0]))})", values)


def _table_rows(conn: sqlite3.Connection, table: str, run_ids) -> list[dict[str, Any]]:
    cols = [r[1] for r in conn.execute(f"PRAGMA table_xinfo({table})")]
    select = ", ".join(f'"{c}"' for c in cols)
    if run_ids is None:
        rows = conn.execute(f"SELECT {select} FROM {table} ORDER BY run_id, rank, seq")
    else:
        marks = ", ".join("?" * len(run_ids)) or "NULL"
        rows = conn.execute(f"SELECT {select} FROM {table} WHERE run_id IN ({marks}) "
                            f"ORDER BY run_id, rank, seq", tuple(run_ids))
    out = []
    for r in rows:
        d = dict(zip(cols, r, strict=True))
        d.pop("seq")
        extra = d.pop("extra_json", None)
        if extra:
            d.update(json.loads(extra))
        if table == "summaries" and isinstance(d["value"], str):
            d["value"] = json.loads(d["value"])
        out.append(d)
    return out


def _run_row(row: sqlite3.Row) -> RunRow:
    return RunRow(**{f.name: row[f.name] for f in fields(RunRow)})


def _filters(**given: str | None) -> tuple[str, tuple]:
    parts = [(f"{k} = ?", v) for k, v in given.items() if v is not None]
    if not parts:
        return "", ()
    return " WHERE " + " AND ".join(p for p, _ in parts), tuple(v for _, v in parts)


def _sql_value(v: Any) -> Any:
    """Numbers, strings and None as they are; bools as 0/1; anything else as JSON text."""
    if v is None or isinstance(v, int | float | str):
        return int(v) if isinstance(v, bool) else v
    return json.dumps(v)


def _summary_value(v: Any) -> Any:
    """Numbers as numbers; everything else (strings, bools, lists) as JSON text."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v
    return json.dumps(v)


def _json_or_null(d: dict) -> str | None:
    return json.dumps(d) if d else None


def _csv_value(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, dict | list | bool) else v
