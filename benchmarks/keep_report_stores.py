"""Keep a held-out report's runs beside it, as `benchmarks/replay_reports.py` reads them.

After `perfmodel compare --cluster local --calibrate [--bracket] --db STORE --out DIR`, copy
out of STORE, each into a store of its own (the same schema, only those runs):

- `DIR/pooled/report-N-set-a.sqlite`: the first set A (comparisons.json meta.set_a.ids);
- `DIR/pooled/report-N-set-a-after.sqlite`: the closing set A of a --bracket report
  (meta.bracket.ids_after);
- `DIR/heldout-runs/report-N-timed-waits.sqlite`: set B's timed-wait runs (the runs of
  comparisons.json's timed-wait rows), whose step records say what the crowded node did.

N is read from DIR's name (`...-heldout-N`). Nothing is written when a target exists, when
meta lacks the ids, or when STORE lacks a run it names: one line, exit 2.

    python benchmarks/keep_report_stores.py /tmp/q62/compare.sqlite \
        reports/local-2026-12-07-heldout-62
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path


def timed_wait_ids(comparisons: list[dict]) -> list[int]:
    """Set B's timed-wait runs, as the report paired them (each row's runs and failed runs)."""
    return [int(i) for row in comparisons if row["mode"] == "timed-wait"
            for i in f"{row['runs']} {row['failed_runs']}".split()]


def keep(store: Path, ids: list[int], work: Path) -> None:
    """Copy `store` to `work` holding only the runs `ids` (every table keyed by run_id
    pruned to them), vacuumed."""
    shutil.copy(store, work)
    con = sqlite3.connect(work)
    have = {r[0] for r in con.execute("SELECT id FROM runs")}
    if missing := sorted(set(ids) - have):
        con.close()
        raise SystemExit(f"{store} lacks runs {missing[:5]}")
    con.execute("CREATE TEMP TABLE keep_ids (id INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO keep_ids VALUES (?)", [(i,) for i in ids])
    tables = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%run_id%'")]
    for table in tables:
        con.execute(f"DELETE FROM {table} WHERE run_id NOT IN (SELECT id FROM keep_ids)")
    con.execute("DELETE FROM runs WHERE id NOT IN (SELECT id FROM keep_ids)")
    con.commit()
    con.execute("VACUUM")
    con.close()


def plan(report: Path) -> dict[Path, list[int]]:
    """Each target store and the run ids it keeps."""
    n = report.name.rsplit("-", 1)[-1]
    if not n.isdigit():
        raise SystemExit(f"{report}: its name does not end in -heldout-N")
    saved = json.loads((report / "comparisons.json").read_text())
    meta = saved["meta"]
    ids = (meta.get("set_a") or {}).get("ids")
    if not ids:
        raise SystemExit(f"{report}/comparisons.json: meta.set_a.ids is missing")
    out = {report / "pooled" / f"report-{n}-set-a.sqlite": list(ids)}
    after = (meta.get("bracket") or {}).get("ids_after")
    if after:
        out[report / "pooled" / f"report-{n}-set-a-after.sqlite"] = list(after)
    waits = timed_wait_ids(saved.get("comparisons", []))
    if waits:
        out[report / "heldout-runs" / f"report-{n}-timed-waits.sqlite"] = waits
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path, help="the store perfmodel compare --db wrote")
    ap.add_argument("report", type=Path, help="the report folder (...-heldout-N)")
    args = ap.parse_args(argv)
    try:
        if not args.store.is_file():
            raise SystemExit(f"{args.store}: no such store")
        targets = plan(args.report)
        if existing := [str(t) for t in targets if t.exists()]:
            raise SystemExit(f"already there, not overwritten: {existing[0]}")
        with tempfile.TemporaryDirectory() as tmp:     # all built before any is placed
            built = {t: Path(tmp) / t.name for t in targets}
            for target, ids in targets.items():
                keep(args.store, ids, built[target])
            for target, work in built.items():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(work, target)
                print(f"{target}: {len(targets[target])} runs")
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"keep_report_stores: {e.code}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
