"""The gloo FSDP timed wait at several rank counts: real runs beside the model's step.

An exploration tool, not evidence (docs/model.md, "The FSDP timed wait's floor"). It runs a
report's held-out FSDP timed wait (fsdp-grad-op-mlp-tw4: its config, sleeps included, from
the report's heldout-runs/ store) with the worker count changed, the rank counts
interleaved round by round on this host, into a store of its own; then it fits the
report's set A (benchmarks/replay_reports.py `calibrate`) and prints, per run, the measured
step beside the model's step, its node floor's parts (sleeps, collectives, a rank's copy
CPU) and the event model's step without the floor.

    python benchmarks/fsdp_ranks_probe.py run reports/local-2026-12-07-heldout-57 \
        --ranks 4,6,3 --rounds 2 --db /tmp/probe.sqlite
    python benchmarks/fsdp_ranks_probe.py compare reports/local-2026-12-07-heldout-57 \
        --db /tmp/probe.sqlite

Run it on an otherwise idle host (its timings are what it is for) with
GLOO_SOCKET_IFNAME=lo; session 38's probe (2026-12-07 09:56, 57's set A) is kept in
reports/local-2026-12-07-heldout-58/probe/.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

ITEM = "fsdp-grad-op-mlp-tw4"
MODEL = r'''
import json, sys, dataclasses
import perfmodel.sim.fsdp as F
from perfmodel.cluster import load_cluster
from perfmodel.compare import protocol, run
seen, off = {}, [False]
floor = F.node_cpu_floor_s
def spy(cluster, ranks, idle_s, collectives_s, own_cpu_s, *a, **k):
    value = floor(cluster, ranks, idle_s, collectives_s, own_cpu_s, *a, **k)
    seen.update(sleeps_s=idle_s, collectives_s=collectives_s, own_s=own_cpu_s, floor_s=value)
    return 0.0 if off[0] else value
F.node_cpu_floor_s = spy
item = next(h for h in protocol.held_out_set() if h.key == sys.argv[1])
out = {}
for n in json.loads(sys.argv[2]):
    h = dataclasses.replace(item, workers=n)
    off[0] = False
    step = run.predict_all([h], load_cluster("local"), None, steps=40, seed=0)[0]
    off[0] = True
    event = run.predict_all([h], load_cluster("local"), None, steps=40, seed=0)[0]
    out[n] = dict(seen, step_s=step["step_time_s"], event_s=event["step_time_s"])
print(json.dumps(out))
'''


def base_config(report: Path) -> dict:
    """The report's first held-out FSDP timed-wait run's config, without its bookkeeping."""
    stores = sorted((report / "heldout-runs").glob("*.sqlite"))
    if not stores:
        raise SystemExit(f"{report}: no heldout-runs/*.sqlite (reports 55 on keep them)")
    con = sqlite3.connect(stores[0])
    for (text,) in con.execute("SELECT config_json FROM runs WHERE status = 'ok' ORDER BY id"):
        config = json.loads(text)
        if (config.get("compare") or {}).get("item") == ITEM:
            return {k: v for k, v in config.items() if k not in ("protocol", "compare")}
    raise SystemExit(f"{report}: no {ITEM} run in {stores[0]}")


def run_probe(report: Path, ranks: list[int], rounds: int, db: Path) -> None:
    from measure import session
    from measure.store import Store

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    config, store = base_config(report), Store(db)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, rounds + 1):
            for n in ranks:
                load = os.getloadavg()[0]
                done = session.run(config | {"workers": n, "probe": {"round": r}}, n, store,
                                   oversubscribe=True, run_root=Path(tmp))
                print(f"round {r}, {n} ranks: run {done.run_id}, 1-min load before "
                      f"{load:.2f}", flush=True)


def model(report: Path, ranks: list[int]) -> dict[str, dict]:
    """The model's step, floor parts and event step per rank count, from the report's set A."""
    import replay_reports

    stores = [p for p in sorted((report / "pooled").glob("*.sqlite"))
              if not p.stem.endswith("-after")]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        replay_reports.calibrate(stores[0], home)
        done = subprocess.run([sys.executable, "-c", MODEL, ITEM, json.dumps(ranks)],
                              cwd=REPO, check=True, capture_output=True, text=True,
                              env={**os.environ, "XDG_DATA_HOME": str(home),
                                   "PYTHONPATH": str(REPO)})
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(con: sqlite3.Connection, run_id: int, key: str) -> float:
    values = [v for (v,) in con.execute(
        "SELECT value FROM summaries WHERE run_id = ? AND key = ?", (run_id, key))]
    return float(statistics.median(values))


def compare(report: Path, db: Path) -> None:
    con = sqlite3.connect(db)
    runs = list(con.execute("SELECT id, workers FROM runs WHERE status = 'ok' ORDER BY id"))
    predicted = model(report, sorted({int(n) for _, n in runs}))
    print("run ranks  measured ms (compute + comm)  model step ms  event ms   sleeps  "
          "collectives  copy CPU a rank")
    for run_id, n in runs:
        m, step = predicted[str(n)], summary(con, run_id, "mean_step_s")
        compute = summary(con, run_id, "mean_compute_s")
        comm = summary(con, run_id, "mean_comm_wait_s")
        print(f"{run_id:>3} {n:>5}  {step * 1e3:7.1f} ({compute * 1e3:5.1f} + {comm * 1e3:5.1f})"
              f"    {m['step_s'] * 1e3:7.1f} {m['step_s'] / step - 1:+6.1%}"
              f"  {m['event_s'] * 1e3:7.1f}  {m['sleeps_s'] * 1e3:6.1f}  "
              f"{m['collectives_s'] * 1e3:9.1f}  {m['own_s'] * 1e3:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "compare"))
    parser.add_argument("report", type=Path)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--ranks", default="4,6,3", help="rank counts, in run order")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.what == "run":
        run_probe(args.report, [int(x) for x in args.ranks.split(",")], args.rounds, args.db)
    else:
        compare(args.report, args.db)


if __name__ == "__main__":
    main()
