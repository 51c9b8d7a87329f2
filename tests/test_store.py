"""The measurement store (measure/store.py): every record type round-trips, a run is stored
in one transaction or not at all, failed runs keep their reason, and a locked or corrupted
database file gives one clear error without losing or overwriting anything."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from measure.store import RECORD_TABLES, TABLES, Store, default_db_path
from perfmodel.cli import cli
from perfmodel.errors import PerfmodelError

REPO = Path(__file__).resolve().parent.parent

# One record of every documented type (the contract in measure/worker.py), with an
# undocumented extra field on some and one record of a type the store does not know.
RECORDS = {
    0: [
        {"type": "start", "backend": "gloo", "device": "cpu", "world_size": 2,
         "torch_version": "2.13.0+cpu", "host": "node-a"},
        {"type": "step", "step": 2, "wall_s": 0.5, "compute_s": 0.375, "comm_wait_s": 0.125,
         "loss": 2.25, "samples": 32, "bucket_count": 3},
        {"type": "step", "step": 3, "wall_s": 0.25, "compute_s": 0.125, "comm_wait_s": 0.125,
         "loss": 2.0, "samples": 32},
        {"type": "update", "worker": 1, "step": 4, "version_read": 7, "version_applied": 9,
         "time_s": 1.5},
        {"type": "memory", "peak_bytes": 1000, "params_bytes": 100, "grads_bytes": 100,
         "optimizer_bytes": 200, "activations_bytes": 500, "other_bytes": 100,
         "method": "MemTracker"},
        {"type": "compute", "unit": "fc1", "batch_size": 16, "pass": "forward",
         "median_s": 0.001, "iqr_s": 0.0001, "repeats": 20},
        {"type": "eval", "step": 3, "time_s": 2.5, "accuracy": 0.875, "loss": 0.5},
        {"type": "collective", "op": "all-reduce", "bytes": 1024, "count": 256,
         "dtype": "float32", "time_s": 1e-4, "algbw_GBps": 0.01024, "busbw_GBps": 0.01024,
         "busbw_factor": 1.0},
        {"type": "summary", "throughput_samples_per_s": 128.0, "steps": 2, "mode": "async",
         "buckets": [1, 2]},
        {"type": "heartbeat", "seq_no": 1},
        {"type": "done"},
    ],
    1: [
        {"type": "start", "backend": "gloo", "device": "cpu", "world_size": 2,
         "torch_version": "2.13.0+cpu", "host": "node-a"},
        {"type": "step", "step": 2, "wall_s": 0.75, "compute_s": 0.5, "comm_wait_s": 0.25,
         "loss": 2.5, "samples": 32},
        {"type": "error", "message": "RuntimeError: boom", "traceback": "Traceback ..."},
    ],
}


def make_run_dir(root: Path, name: str = "run", *, kind: str = "ddp", records=RECORDS,
                 torn_line: bool = False) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"kind": kind, "workers": 2, "workload": "mlp", "batch_size": 32, "steps": 2,
              "warmup_steps": 2, "seed": 0, "speed": [1, 0.5], "options": {kind: {}},
              "timeout_s": 60, "threads_per_worker": 1, "oversubscribed": True}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "launch.json").write_text(json.dumps(
        {"started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2026-01-01T00:00:09+00:00",
         "wall_s": 9.0, "git_revision": "abc123", "python_version": "3.11.7"}))
    for rank, recs in records.items():
        lines = [json.dumps({**r, "rank": rank}) for r in recs]
        text = "\n".join(lines) + "\n" + ('{"type": "step", "ra' if torn_line else "")
        (run_dir / f"rank{rank}.jsonl").write_text(text)
    return run_dir


def counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def test_every_record_type_round_trips(tmp_path):
    store = Store(tmp_path / "m.sqlite")
    run_id = store.ingest(make_run_dir(tmp_path, torn_line=True), "ok")
    run = store.get_run(run_id)

    assert run.row.kind == "ddp" and run.row.status == "ok" and run.row.reason == ""
    assert run.row.workload == "mlp" and run.row.workers == 2 and run.row.world_size == 2
    assert run.row.host == "node-a" and run.row.torch_version == "2.13.0+cpu"
    assert run.row.git_revision == "abc123" and run.row.wall_s == 9.0
    assert run.row.oversubscribed == 1 and run.row.link_rate_Gbps is None
    assert run.row.config["speed"] == [1, 0.5]

    # every documented record comes back with the same fields and values, extras included
    for rank, recs in RECORDS.items():
        for rec in recs:
            if rec["type"] not in RECORD_TABLES:
                continue
            table = RECORD_TABLES[rec["type"]][0]
            mine = [r for r in run.table(table) if r["rank"] == rank]
            expected = {k: v for k, v in rec.items() if k != "type"}
            assert any(expected.items() <= r.items() for r in mine), (table, rec)
    assert [s["step"] for s in run.table("steps") if s["rank"] == 0] == [2, 3]  # torn line gone
    assert run.table("updates")[0]["staleness"] == 9 - 7
    summary = {s["key"]: s["value"] for s in run.table("summaries")}
    assert summary == {"throughput_samples_per_s": 128.0, "steps": 2, "mode": "async",
                       "buckets": [1, 2]}
    other = run.table("other_records")
    assert len(other) == 1 and json.loads(other[0]["json"])["seq_no"] == 1
    ranks = {r["rank"]: r for r in run.table("ranks")}
    assert ranks[0]["state"] == "done" and ranks[1]["state"] == "error"
    assert ranks[0]["host"] == "node-a" and ranks[0]["backend"] == "gloo"


def test_a_failed_run_is_stored_with_its_reason_and_filters_work(tmp_path):
    store = Store(tmp_path / "m.sqlite")
    ok = store.ingest(make_run_dir(tmp_path, "a"), "ok")
    bad = store.ingest(make_run_dir(tmp_path, "b", kind="ps"), "failed",
                       "rank 1 was killed by SIGKILL")
    assert [r.id for r in store.list_runs()] == [ok, bad]
    failed = store.list_runs(status="failed")
    assert [r.id for r in failed] == [bad] and failed[0].reason == "rank 1 was killed by SIGKILL"
    assert [r.id for r in store.list_runs(kind="ddp", workload="mlp")] == [ok]
    assert store.list_runs(workload="resnet50") == []
    with pytest.raises(PerfmodelError, match="status"):
        store.ingest(make_run_dir(tmp_path, "c"), "crashed")


def test_a_crash_mid_ingest_leaves_no_half_run(tmp_path):
    """The process dies (os._exit, no cleanup) after some rows of a run were inserted: after
    it, the store holds exactly what it held before (one transaction per run, WAL)."""
    db = tmp_path / "m.sqlite"
    store = Store(db)
    store.ingest(make_run_dir(tmp_path, "before"), "ok")
    before = counts(db)
    victim = make_run_dir(tmp_path, "victim")
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        import measure.store as store
        real = store._insert_rows
        def insert_then_die(conn, table, values):
            real(conn, table, values)
            if table == "updates":          # runs, steps, ... already inserted
                os._exit(9)
        store._insert_rows = insert_then_die
        store.Store({str(db)!r}).ingest({str(victim)!r}, "ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert counts(db) == before
    assert len(store.list_runs()) == 1
    store.ingest(victim, "ok")                      # and the store still works
    assert len(store.list_runs()) == 2


def test_an_exception_mid_ingest_rolls_back(tmp_path, monkeypatch):
    import measure.store as store_module

    db = tmp_path / "m.sqlite"
    store = Store(db)
    store.ingest(make_run_dir(tmp_path, "before"), "ok")
    before = counts(db)

    def fail(conn, table, values):
        raise KeyboardInterrupt
    monkeypatch.setattr(store_module, "_insert_rows", fail)
    with pytest.raises(KeyboardInterrupt):
        store.ingest(make_run_dir(tmp_path, "victim"), "ok")
    assert counts(db) == before


def test_a_locked_store_gives_a_clear_error_and_loses_nothing(tmp_path):
    db = tmp_path / "m.sqlite"
    store = Store(db, busy_timeout_s=0.2)
    store.ingest(make_run_dir(tmp_path, "first"), "ok")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")                # another writer holds the write lock
    try:
        with pytest.raises(PerfmodelError, match="locked by another process") as err:
            store.ingest(make_run_dir(tmp_path, "second"), "ok")
        assert str(db) in str(err.value) and "\n" not in str(err.value)
        assert len(store.list_runs()) == 1         # WAL: readers still read meanwhile
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.ingest(tmp_path / "second", "ok")
    assert len(store.list_runs()) == 2


def test_a_corrupted_store_is_named_and_left_untouched(tmp_path):
    db = tmp_path / "m.sqlite"
    garbage = b"this is not a database, just some bytes\n" * 200
    db.write_bytes(garbage)
    store = Store(db)
    with pytest.raises(PerfmodelError, match="not a usable SQLite") as err:
        store.ingest(make_run_dir(tmp_path), "ok")
    assert str(db) in str(err.value)
    with pytest.raises(PerfmodelError):
        store.list_runs()
    assert db.read_bytes() == garbage


def test_store_uses_wal(tmp_path):
    store = Store(tmp_path / "m.sqlite")
    store.ingest(make_run_dir(tmp_path), "ok")
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_default_path_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_DB", str(tmp_path / "env.sqlite"))
    assert default_db_path() == tmp_path / "env.sqlite"
    monkeypatch.delenv("PERFMODEL_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "perfmodel" / "measurements.sqlite"


def test_csv_export_of_runs_and_of_one_table(tmp_path):
    store = Store(tmp_path / "m.sqlite")
    store.ingest(make_run_dir(tmp_path, "a"), "ok")
    store.ingest(make_run_dir(tmp_path, "b"), "failed", "interrupted")
    out = io.StringIO()
    assert store.export_csv(out, "runs", status="failed") == 1
    header, row = out.getvalue().splitlines()[:2]
    assert header.startswith("id,kind,status,reason") and "interrupted" in row
    out = io.StringIO()
    assert store.export_csv(out, "steps") == 6                 # 3 steps per run, two runs
    assert out.getvalue().splitlines()[0].split(",")[:4] == ["run_id", "rank", "step", "wall_s"]


def test_runs_command_lists_and_exports(tmp_path):
    db = tmp_path / "m.sqlite"
    store = Store(db)
    store.ingest(make_run_dir(tmp_path, "a"), "ok")
    store.ingest(make_run_dir(tmp_path, "b", kind="ps"), "failed", "rank 1 was killed")
    runner = CliRunner()
    result = runner.invoke(cli, ["runs", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "rank 1 was killed" in result.output and "oversubscribed" in result.output
    result = runner.invoke(cli, ["runs", "--db", str(db), "--kind", "ps", "--json"])
    rows = json.loads(result.output)
    assert [r["kind"] for r in rows] == ["ps"] and rows[0]["config"]["workers"] == 2
    csv_file = tmp_path / "steps.csv"
    result = runner.invoke(cli, ["runs", "--db", str(db), "--csv", str(csv_file),
                                 "--table", "steps", "--status", "ok"])
    assert result.exit_code == 0, result.output
    assert len(csv_file.read_text().splitlines()) == 1 + 3
    result = runner.invoke(cli, ["runs", "--db", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 0 and "no runs" in result.output
