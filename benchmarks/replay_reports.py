"""Replay committed held-out reports with the code checked out now: an exploration tool.

Each `reports/local-*-heldout-N/` keeps its calibration set A (`pooled/*.sqlite`) and its
measured medians (`comparisons.csv`). For each report given, this refits the profile from
that set A alone with today's calibration, measuring nothing (into a temporary data home:
your own profile is not touched), predicts every held-out configuration with today's model
exactly as `perfmodel compare` does (perfmodel/compare/run.py `predict_all`, the report's own timed
steps, seed 0), and prints predicted against the report's measured step time,
row by row, with the report's own error beside it and the medians of both.

What it is for: seeing what a change would have done on sessions already measured, and
telling a change's effect from a session's (run it at the old commit and at the new one).
What it is not: evidence. Those measurements have been seen; a change explored with this
tool still needs a report whose plan is committed before its runs (docs/model.md labels
such replays "explorations on seen data").

    python benchmarks/replay_reports.py reports/local-2026-12-05-heldout-28 ... [--json out.json]
    python benchmarks/replay_reports.py reports/local-2026-12-06-heldout-52 \
        --after reports/local-2026-12-06-heldout-53/pooled/report-53-set-a.sqlite

A report made with `perfmodel compare --bracket` keeps its closing set A beside the first
(pooled/*-after.sqlite): it is replayed as the report predicted, each row the geometric mean
of the two set As' predictions, the timed waits with the first's waits
(perfmodel/compare/bracket.py). `--after STORE` replays one report so, with another store's
set A standing in for the closing one (an exploration).

With the report made by the code checked out now, the replay reproduces its predictions
(to the profile file's rounding).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SEED = 0                     # perfmodel compare's default --seed


def calibrate(set_a: Path, home: Path) -> None:
    """Fit the profile 'local' from `set_a`'s runs alone into data home `home`, measuring
    nothing: set A as `perfmodel compare` finds it in a store (perfmodel/compare/protocol.py
    `calibration_set`: the newest stored run of each suite item, from any host), fitted and
    written as `perfmodel calibrate` does (calibration/driver.py `fit_and_write`). Not
    `perfmodel calibrate` itself: it measures every suite item the store lacks or holds
    from more than 24 hours ago, so replaying a report made before the suite grew (the late
    1-process round, since report 46) measured those runs on the machine of the day, and
    two replays of report 41 fitted different profiles (2026-12-06); a day later it would
    measure all of set A again."""
    home.mkdir(parents=True, exist_ok=True)
    db = home / "set-a.sqlite"
    shutil.copy(set_a, db)                      # fitting may write its notes into the store
    code = ("import sys\n"
            "from calibration import driver\n"
            "from measure.store import Store\n"
            "from perfmodel.compare.protocol import calibration_set\n"
            "store = Store(sys.argv[1])\n"
            "found, _ = calibration_set(store.list_runs(), 'local', host='', any_host=True)\n"
            "driver.fit_and_write('local', found.ids, store, base='local')\n")
    subprocess.run([sys.executable, "-c", code, str(db)], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "XDG_DATA_HOME": str(home)})


def replay(report: Path, after: Path | None = None) -> list[dict]:
    """Every held-out row of `report`: key, mode, predicted and measured step (s), errors;
    bracketed where the report keeps a closing set A (pooled/*-after.sqlite) or `after`
    names one (see the module docstring)."""
    stores = sorted((report / "pooled").glob("*.sqlite"))
    closing = [p for p in stores if p.stem.endswith("-after")]
    stores = [p for p in stores if p not in closing]
    if len(stores) != 1 or len(closing) > 1:
        raise SystemExit(f"{report}: expected one set A store under pooled/ (and at most one "
                         f"*-after.sqlite), found {len(stores)} and {len(closing)}")
    after = after or (closing[0] if closing else None)
    measured = {r["key"]: r for r in csv.DictReader((report / "comparisons.csv").open())}
    # the report's own timed steps (12 before report 31; protocol.STEPS['full'] now) and its
    # PS rows' (the same before report 42; protocol.PS_STEPS['full'] since)
    meta = json.loads((report / "comparisons.json").read_text())["meta"]
    steps, repeats = meta["steps"], int(meta.get("repeats") or 1)
    ps_steps = int(meta.get("ps_steps") or steps)
    with tempfile.TemporaryDirectory() as tmp:
        first, closing_home = Path(tmp) / "first", Path(tmp) / "after"
        calibrate(stores[0], first)
        predicted = predict(first, None, steps=steps, repeats=repeats, ps_steps=ps_steps)
        if after is not None:
            calibrate(after, closing_home)
            later = predict(closing_home, first, steps=steps, repeats=repeats,
                            ps_steps=ps_steps)
            predicted = {k: [float(np.sqrt(v[0] * later[k][0])), *v[1:]]
                         for k, v in predicted.items()}
    rows = []
    for key, m in measured.items():
        if key not in predicted or not m["step_time_measured"]:
            continue
        step = float(m["step_time_measured"])
        step_s, by_worker, speed, intervals = predicted[key]
        rows.append({"key": key, "mode": m["mode"], "predicted_s": step_s,
                     "measured_s": step, "error": step_s / step - 1,
                     "report_error": float(m["step_time_error"]),
                     **_staleness(m, by_worker, speed, intervals)})
    return rows


def predict(home: Path, waits: Path | None, *, steps: int, repeats: int,
            ps_steps: int) -> dict[str, list]:
    """Every held-out row predicted from the profile fitted into data home `home`, as
    `perfmodel compare` does; timed waits with the waits of `waits`' profile where given."""
    code = (
        "import json, sys, tomllib\n"
        "from pathlib import Path\n"
        "from perfmodel.cluster import load_cluster, parse_profile\n"
        "from perfmodel.compare import protocol, run\n"
        "held_out = protocol.held_out_set()\n"
        "import inspect\n"      # intervals for the report's repeats, where the code has them
        "known = inspect.signature(run.predict_all).parameters\n"
        f"kw = {{k: v for k, v in (('repeats', {repeats}), ('ps_steps', {ps_steps}))\n"
        "      if k in known}\n"
        "if len(sys.argv) > 1:\n"
        "    p = next(Path(sys.argv[1]).glob('perfmodel/profiles/local.toml'))\n"
        "    kw['waits'] = parse_profile(tomllib.loads(p.read_text()), p)\n"
        "records = run.predict_all(held_out, load_cluster('local'), None,\n"
        f"                          steps={int(steps)}, seed={SEED},\n"
        "                          **kw)\n"
        "json.dump({r['key']: [r['step_time_s'], r['staleness_worker_means'],\n"
        "                      r['speed'], r.get('staleness_intervals')]\n"
        "           for r in records}, sys.stdout)\n")
    done = subprocess.run([sys.executable, "-c", code, *([str(waits)] if waits else [])],
                          cwd=REPO, check=True, capture_output=True, text=True,
                          env={**os.environ, "XDG_DATA_HOME": str(home)})
    return json.loads(done.stdout)


def _staleness(m: dict, by_worker: dict, speed: list, intervals: dict | None) -> dict:
    """The report's worst speed class: its mean staleness predicted now (and, with today's
    code, its interval) beside the measured one; {} where the report counted none."""
    if not m.get("staleness_headline_error") or not m.get("staleness_worst_speed") \
            or not by_worker or not float(m["staleness_worst_speed_measured"] or 0):
        return {}
    s = float(m["staleness_worst_speed"])
    cls = [v for w, v in by_worker.items() if (speed[int(w)] if int(w) < len(speed) else 1.0)
           == s]
    out = {"staleness_speed": s, "staleness_predicted": float(np.mean(cls)),
           "staleness_measured": float(m["staleness_worst_speed_measured"])}
    band = (intervals or {}).get(f"speed {s:g}")
    return out | ({"staleness_interval": band} if band else {})


def medians(rows: list[dict], field: str) -> str:
    parts = []
    for mode in ("real", "timed-wait"):
        errors = [abs(r[field]) for r in rows if r["mode"] == mode]
        if errors:
            parts.append(f"{mode} {100 * float(np.median(errors)):.1f} % "
                         f"(max {100 * max(errors):.1f} %)")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="reports/local-*-heldout-N folders")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--after", type=Path, help="exploration: this store's set A as the "
                        "report's closing set A (perfmodel compare --bracket)")
    args = parser.parse_args()
    if args.after and len(args.reports) != 1:
        parser.error("--after takes one report")
    everything = {}
    for report in args.reports:
        rows = replay(report, args.after)
        everything[report.name] = rows
        print(f"\n{report.name}: step time, predicted now (ms) / measured then (ms), error now "
              f"[the report's]")
        for r in rows:
            print(f"  {r['key']:26s} {1e3 * r['predicted_s']:8.2f} / {1e3 * r['measured_s']:8.2f}"
                  f"  {100 * r['error']:+6.1f} %  [{100 * r['report_error']:+6.1f} %]")
        for r in rows:
            if "staleness_speed" in r:
                band = r.get("staleness_interval")
                print(f"  {r['key']:26s} staleness, speed {r['staleness_speed']:g}: "
                      f"{r['staleness_predicted']:.2f} / {r['staleness_measured']:.2f}  "
                      f"{100 * (r['staleness_predicted'] / r['staleness_measured'] - 1):+6.1f} %"
                      + (f"  [90 %: {band[0]:.2f}-{band[1]:.2f}]" if band else ""))
        print(f"  medians now: {medians(rows, 'error')}")
        print(f"  the report:  {medians(rows, 'report_error')}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
