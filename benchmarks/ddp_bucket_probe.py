"""A 2-rank DDP mlp step at batch 64 with more and more gradient buckets, beside the model.

An exploration tool, not evidence (docs/model.md, "What an overlapped bucket costs on a
CPU host"). Round by round, interleaved, on an otherwise idle host: `perfmodel measure ddp
--workers 2 --workload mlp --batch-size 64 --bucket-cap-MiB CAP` at each cap of CAPS_MiB,
every bucket the cap's size, the first too (the mlp's 12.9 MB of gradients, its hidden
layers' weights 4.2 MB each: 1 bucket at 25 MiB, 2 at 8.5, 4 at 4 and at 1). `read` prints,
per cap, the buckets, the median step and compute over the rounds and their excess over the
first cap's, beside the model's for the same runs, from a profile (`--profile FILE`, e.g. a
report's profile.toml as it was fitted, or `--set-a STORE`: a report's set A refitted with
the calibration checked out now), and one more bucket's cost both ways (least squares of
the excess on the extra buckets).

    python benchmarks/ddp_bucket_probe.py run --db /tmp/probe.sqlite --rounds 5
    python benchmarks/ddp_bucket_probe.py read --db /tmp/probe.sqlite \
        --set-a reports/local-2026-12-07-heldout-62/pooled/report-62-set-a.sqlite

Session 42's probe (2026-12-07 20:33-20:37, nothing else running) is kept in
benchmarks/results/ddp-bucket-probe-2026-12-07.sqlite.
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CAPS_MiB = (25.0, 8.5, 4.0, 1.0)
BATCH = 64


def run(db: Path, rounds: int, settle_max_s: float) -> None:
    cli = [sys.executable, "-m", "perfmodel", "measure", "ddp", "--workload", "mlp",
           "--workers", "2", "--batch-size", str(BATCH), "--steps", "40", "--db", str(db),
           "--settle-max-s", str(settle_max_s)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    for r in range(1, rounds + 1):
        for cap in CAPS_MiB:
            subprocess.run([*cli, "--bucket-cap-MiB", f"{cap:g}"], cwd=REPO, env=env,
                           check=True, stdout=subprocess.DEVNULL)
        print(f"round {r} of {rounds}, 1-min load {os.getloadavg()[0]:.2f}", flush=True)


def measured(db: Path) -> dict[float, dict[str, list[float]]]:
    """cap -> {'step', 'compute', 'buckets'}: each run's median over ranks, seconds."""
    from measure.store import Store

    store, out = Store(db), {}
    for row in store.list_runs(kind="ddp", status="ok"):
        values: dict[str, list[float]] = {}
        for s in store.get_run(row.id).table("summaries"):
            values.setdefault(s["key"], []).append(s["value"])
        cap = float(values["bucket_cap_MiB"][0])
        got = out.setdefault(cap, {"step": [], "compute": [], "buckets": []})
        got["step"].append(st.median(values["mean_step_s"]))
        got["compute"].append(st.median(values["mean_compute_s"]))
        got["buckets"].append(st.median(values["bucket_count"]))
    return out


def modelled(profile: Path, caps) -> dict[float, tuple[float, float]]:
    """cap -> the model's (step, compute) seconds for the probe's run, from `profile`."""
    from perfmodel.cluster import parse_profile
    from perfmodel.predict import predict
    from perfmodel.sim.ddp import HARNESS_COMM_HOOK
    from perfmodel.sim.scenario import Scenario
    from perfmodel.workload import load_workload

    cluster = parse_profile(tomllib.loads(profile.read_text()), profile)
    out = {}
    for cap in caps:
        scenario = Scenario(cluster=cluster, workload=load_workload("mlp"), workers=2,
                            batch_size=BATCH, steps=42, warmup_steps=2, seed=0)
        p = predict("ddp", scenario, bucket_cap_MiB=cap, first_bucket_MiB=cap,
                    comm_hook=HARNESS_COMM_HOOK)
        out[cap] = (p.summary.step_time_s.mean, p.summary.compute_s)
    return out


def per_bucket_ms(buckets: list[float], excess_ms: list[float]) -> float:
    """Least squares through the origin of the excess over the extra buckets."""
    x, y = np.asarray(buckets, float) - buckets[0], np.asarray(excess_ms, float)
    return float(x @ y / (x @ x)) if x @ x > 0 else float("nan")


def refitted(set_a: Path, home: Path) -> Path:
    """The profile 'local' fitted from `set_a` alone by today's calibration, in data home
    `home` (benchmarks/replay_reports.py `calibrate`)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from replay_reports import calibrate

    calibrate(set_a, home)
    return next(home.glob("perfmodel/profiles/local.toml"))


def read(db: Path, profile: Path | None) -> None:
    got = measured(db)
    if not got:
        raise SystemExit(f"{db}: no DDP run")
    caps = sorted(got, reverse=True)
    model = modelled(profile, caps) if profile else {}
    base = {k: st.median(got[caps[0]][k]) for k in ("step", "compute")}
    print("cap MiB  buckets  runs  step ms (excess)  compute ms (excess)"
          + ("   model step (excess)  model compute (excess)" if model else ""))
    rows = []
    for cap in caps:
        g = got[cap]
        step, comp, n = st.median(g["step"]), st.median(g["compute"]), st.median(g["buckets"])
        line = (f"{cap:7g}  {n:7.0f}  {len(g['step']):4d}  {step * 1e3:6.1f} "
                f"({(step - base['step']) * 1e3:+5.1f})  {comp * 1e3:6.1f} "
                f"({(comp - base['compute']) * 1e3:+5.1f})")
        row = [n, (step - base["step"]) * 1e3, (comp - base["compute"]) * 1e3]
        if model:
            ms, mc = model[cap]
            m0s, m0c = model[caps[0]]
            line += (f"   {ms * 1e3:6.1f} ({(ms - m0s) * 1e3:+5.1f})  {mc * 1e3:6.1f} "
                     f"({(mc - m0c) * 1e3:+5.1f})")
            row += [(ms - m0s) * 1e3, (mc - m0c) * 1e3]
        rows.append(row)
        print(line)
    cols = list(zip(*rows, strict=True))
    names = ["step", "compute", "model step", "model compute"][:len(cols) - 1]
    print("one more bucket, ms: " + ", ".join(
        f"{name} {per_bucket_ms(list(cols[0]), list(col)):.2f}"
        for name, col in zip(names, cols[1:], strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--db", type=Path, required=True)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--settle-max-s", type=float, default=20.0)
    d = sub.add_parser("read")
    d.add_argument("--db", type=Path, required=True)
    model = d.add_mutually_exclusive_group()
    model.add_argument("--profile", type=Path, help="a profile file as fitted")
    model.add_argument("--set-a", type=Path, help="a set A store, refitted now")
    args = parser.parse_args()
    if args.command == "run":
        run(args.db, args.rounds, args.settle_max_s)
    elif args.set_a:
        with tempfile.TemporaryDirectory() as tmp:
            read(args.db, refitted(args.set_a, Path(tmp)))
    else:
        read(args.db, args.profile)


if __name__ == "__main__":
    main()
