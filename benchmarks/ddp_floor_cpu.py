"""A crowded DDP timed wait's node CPU a step, measured beside the model's count, by part.

An exploration tool, not evidence (docs/model.md, "The crowded DDP floor's CPU by rank
count"). The crowded-node floor (perfmodel/sim/cores.py `node_cpu_floor_s`) counts a
step's CPU work as the crowded sweeps' all-reduces on the share of the cores they keep busy
(gloo's threads) plus every rank's reducer passes (the training threads), times
compute.ddp_cpu_work_factor, fitted from set A's 6-rank runs. This prints, for every DDP
timed wait with more ranks than cores that a report kept (its held-out runs in
heldout-runs/, its set A in pooled/), each part measured (measure/cpu_meter.py: the
processes' CPU, of which the training threads') over the model's count of it with the
report's own profile (profile.toml, no refit), per run and as medians by rank count.

    python benchmarks/ddp_floor_cpu.py reports/local-2026-12-07-heldout-5[5-9]

Reports before 55 kept no held-out runs; reports made before the meter recorded the
training thread (session 31) print no split.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from measure.cpu_meter import cpu_use, thread_cores  # noqa: E402
from measure.store import Store  # noqa: E402
from perfmodel.cluster import parse_profile  # noqa: E402
from perfmodel.sim import cores  # noqa: E402
from perfmodel.sim.ddp import HARNESS_COMM_HOOK  # noqa: E402
from perfmodel.sim.scenario import Scenario  # noqa: E402
from perfmodel.sim.strategy import make_strategy  # noqa: E402
from perfmodel.workload import load_workload  # noqa: E402

FIELDS = ("gloo", "thread", "total")


def model_parts(cluster, workload: str, workers: int, batch: int
                ) -> tuple[float, float, float]:
    """(gloo's, the training threads') core-seconds a step as the floor counts them, before
    the fitted factor: DDP.floor_inputs split by cores.node_cpu_work_s; and the seconds a
    step the floor holds the cores idle (its sleeps before the first bucket and after the
    last, less what the Sleeper pays back: max(0, idle_s - paid_back_s * k))."""
    scenario = Scenario(cluster=cluster, workload=load_workload(workload), workers=workers,
                        batch_size=batch)
    f = make_strategy("ddp", comm_hook=HARNESS_COMM_HOOK).floor_inputs(scenario)
    return (cores.node_cpu_work_s(cluster, f.ranks, f.collectives_s, 0.0, workload),
            cores.node_cpu_work_s(cluster, f.ranks, 0.0, f.own_cpu_s, workload),
            cores.node_cpu_floor_s(cluster, f.ranks, f.idle_s, 0.0, 0.0, workload,
                                   paid_back_s=f.paid_back_s, beside_collectives=True))


def crowded_runs(report: Path):
    """(store name, run row, config, Run) of every crowded DDP timed wait the report kept."""
    stores = [*sorted((report / "heldout-runs").glob("*.sqlite")),
              *[p for p in sorted((report / "pooled").glob("*.sqlite"))
                if not p.stem.endswith("-after")]]
    for path in stores:
        store = Store(path)
        for row in store.list_runs(kind="ddp", status="ok"):
            if row.config.get("compute_mode") == "timed-wait":
                yield path.parent.name, row, row.config, store.get_run(row.id)


def report_rows(report: Path) -> list[dict]:
    profile = report / "profile.toml"
    cluster = parse_profile(tomllib.loads(profile.read_text()), profile).as_timed_wait()
    c = cluster.compute_cpu_cores_per_node
    rows = []
    for where, row, config, run in crowded_runs(report):
        workers = int(row.workers or 0)
        own, _ = cpu_use(run.table("summaries"))
        thread = thread_cores(run.table("summaries"))
        warm = int(config.get("warmup_steps") or 0)
        steps = [float(s["wall_s"]) for s in run.table("steps") if int(s["step"]) >= warm]
        if workers <= c or own is None or thread is None or not steps:
            continue
        step = float(np.mean(steps))
        gloo_m, thread_m, idle_m = model_parts(cluster, row.workload, workers,
                                               int(row.batch_size))
        item = (config.get("compare") or {}).get("item", "set A")
        rows.append({"report": report.name, "run": row.id, "where": where, "item": item,
                     "ranks": workers, "step_s": step,
                     "factor": cluster.compute.ddp_cpu_work_factor,
                     "gloo": (own - thread) * step / gloo_m,
                     "thread": thread * step / thread_m,
                     "total": own * step / (gloo_m + thread_m),
                     # the step less the node's CPU on all c cores: the time they sat idle
                     "idle_ms": (step - own * step / c) * 1e3, "idle_model_ms": idle_m * 1e3})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--runs", action="store_true", help="also print every run")
    args = parser.parse_args()
    rows = [r for report in args.reports for r in report_rows(report)]
    if not rows:
        raise SystemExit("no crowded DDP timed wait with a recorded CPU split in these reports")
    print("measured / model count, before the fitted factor (median of runs): "
          "gloo's threads, training threads, node; (idle: the step less the node's CPU "
          "spread over all its cores, against the floor's idle sleeps)")
    for report in args.reports:
        mine = [r for r in rows if r["report"] == report.name]
        if not mine:
            continue
        by = []
        for n in sorted({r["ranks"] for r in mine}):
            a = np.array([[r[f] for f in FIELDS] for r in mine if r["ranks"] == n])
            idle = [(r["idle_ms"], r["idle_model_ms"]) for r in mine if r["ranks"] == n]
            by.append(f"{n} ranks x{len(a)}: " + " / ".join(f"{v:.2f}" for v in np.median(a, 0))
                      + " (idle {:.1f} vs {:.1f} ms)".format(*np.median(idle, 0)))
        print(f"{report.name} (factor {mine[0]['factor']:.2f}): " + "; ".join(by))
        if args.runs:
            for r in mine:
                print(f"    run {r['run']:>3} {r['item']:<14} {r['ranks']} ranks "
                      f"step {r['step_s'] * 1e3:6.1f} ms  " +
                      " / ".join(f"{r[f]:.2f}" for f in FIELDS) +
                      f"  idle {r['idle_ms']:.1f} ms")
    for n in sorted({r["ranks"] for r in rows}):
        a = np.array([[r[f] for f in FIELDS] for r in rows if r["ranks"] == n])
        idle = np.median([r["idle_ms"] for r in rows if r["ranks"] == n])
        print(f"all, {n} ranks ({len(a)} runs): " + " / ".join(f"{v:.2f}" for v in np.median(a, 0))
              + f" (idle {idle:.1f} ms)")


if __name__ == "__main__":
    main()
