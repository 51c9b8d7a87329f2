"""benchmarks/keep_report_stores.py: a report's set As and timed waits kept as stores of their own.

The source is report 61's committed timed-wait store (30 real runs with their step records)
standing in for a compare store; a fake report names some of its runs as set A and closing
set A, and pairs all of them with a timed-wait row (one as a failed run). No torch job runs.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from factories import load_benchmark

REPO = Path(__file__).resolve().parent.parent
SOURCE = (REPO / "reports/local-2026-12-07-heldout-61/heldout-runs"
          / "report-61-timed-waits.sqlite")


def _rows(ids: list[int]) -> list[dict]:
    """comparisons.json rows pairing every source run as a timed wait, and one real row."""
    return [{"mode": "timed-wait", "runs": " ".join(map(str, ids[:-1])),
             "failed_runs": str(ids[-1])},
            {"mode": "real", "runs": "999999", "failed_runs": ""}]


def _module():
    return load_benchmark("keep_report_stores")


def _ids(path: Path, table: str = "runs", column: str = "id") -> set[int]:
    with sqlite3.connect(path) as con:
        return {r[0] for r in con.execute(f"SELECT DISTINCT {column} FROM {table}")}


@pytest.fixture
def setup(tmp_path):
    store = tmp_path / "compare.sqlite"
    shutil.copy(SOURCE, store)
    ids = sorted(_ids(store))
    report = tmp_path / "local-2026-12-07-heldout-7"
    report.mkdir()
    meta = {"set_a": {"ids": ids[:3]}, "bracket": {"ids_after": ids[3:5]}}
    (report / "comparisons.json").write_text(json.dumps({"meta": meta, "comparisons": _rows(ids)}))
    return store, report, ids


def test_each_store_holds_only_its_runs_and_their_records(setup):
    store, report, ids = setup
    assert _module().main([str(store), str(report)]) == 0
    first = report / "pooled/report-7-set-a.sqlite"
    after = report / "pooled/report-7-set-a-after.sqlite"
    waits = report / "heldout-runs/report-7-timed-waits.sqlite"
    assert _ids(first) == set(ids[:3])
    assert _ids(first, "steps", "run_id") == set(ids[:3])
    assert _ids(after) == set(ids[3:5])
    assert _ids(waits) == set(ids)          # every source run is a set-B timed wait
    with sqlite3.connect(store) as a, sqlite3.connect(first) as b:
        kept = ",".join(map(str, ids[:3]))
        q = f"SELECT COUNT(*) FROM steps WHERE run_id IN ({kept})"
        assert a.execute(q).fetchone() == b.execute(q).fetchone()


def test_a_run_the_store_lacks_writes_nothing(setup, capsys):
    store, report, ids = setup
    meta = {"set_a": {"ids": ids[:3]}, "bracket": {"ids_after": [10**9]}}
    (report / "comparisons.json").write_text(json.dumps({"meta": meta, "comparisons": _rows(ids)}))
    assert _module().main([str(store), str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keep_report_stores:") and "\n" not in err
    assert not (report / "pooled").exists() and not (report / "heldout-runs").exists()


def test_an_existing_store_is_not_overwritten(setup, capsys):
    store, report, _ = setup
    (report / "pooled").mkdir()
    kept = report / "pooled/report-7-set-a.sqlite"
    kept.write_bytes(b"mine")
    assert _module().main([str(store), str(report)]) == 2
    assert "already there" in capsys.readouterr().err
    assert kept.read_bytes() == b"mine"
    assert not (report / "heldout-runs").exists()
