"""Reproduce the study's findings with perfmodel: reports/findings/ (report.md, figures, CSV).

    python reports/make_findings.py [--measure] [--db PATH] [--out reports/findings]

The findings (DESIGN.md): DDP gives 2–3x throughput; FSDP cuts peak memory 4–6x; asynchronous
PS saves up to 28 % of training time against synchronous PS but loses 4–17 % accuracy; a
staleness-mitigating protocol spends its gain on synchronisation. Each is predicted on the
shipped, spec-derived a100 and a10g profiles (perfmodel.predict), the accuracy side from the
fitted accuracy model and the harness runs it was fitted on (perfmodel/accuracy/,
tests/fixtures/accuracy_runs_mlp.json), and checked on real local runs where this machine can
run them: `--measure` first runs real async parameter-server jobs (`perfmodel measure ps`,
mlp on digits, 2 and 3 workers) into the store, then every async mlp PS run in the store is
compared with the accuracy band the model predicts from its own measured staleness.
No torch is imported here; `--measure` runs torch in subprocesses.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from findings_common import (
    ASYNC_WORKERS,
    CLUSTERS,
    GIB,
    MEMORY_WORKERS,
    MEMORY_WORKLOADS,
    REPO,
    SPEEDUP_WORKERS,
    SPEEDUP_WORKLOADS,
    csv_row,
    penalty_text,
    scenario,
)
from findings_measured import measured_local, measured_ps, run_measurements
from findings_text import write_report

from calibration.fit_accuracy import (
    RUNS_FILE,
    observed,
    profile_values,
    unstable,
)
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import MITIGATIONS, load_accuracy_model
from perfmodel.predict import predict
from perfmodel.sim.strategy import make_strategy

# ---------------------------------------------------------------- 1. DDP speedup


def ddp_speedup(rows: list[dict]) -> tuple[str, dict]:
    curves = {}
    for cluster in CLUSTERS:
        for workload in SPEEDUP_WORKLOADS:
            sp = [predict("ddp", scenario(cluster, workload, n)).speedup
                  for n in SPEEDUP_WORKERS]
            curves[(cluster, workload)] = sp
            for n, s in zip(SPEEDUP_WORKERS, sp, strict=True):
                rows.append(csv_row("ddp_speedup", cluster, workload, n, "ddp", "speedup", s))
    lines = ["| cluster | workload | " + " | ".join(f"N={n}" for n in SPEEDUP_WORKERS) + " |",
             "|---|---|" + "---|" * len(SPEEDUP_WORKERS)]
    lines += [f"| {c} | {w} | " + " | ".join(f"{s:.2f}x" for s in sp) + " |"
              for (c, w), sp in curves.items()]
    return "\n".join(lines), curves


# ---------------------------------------------------------------- 2. FSDP memory


def fsdp_memory(rows: list[dict]) -> tuple[str, dict]:
    out, lines = {}, ["| cluster | workload | N | batch | DDP GiB | FSDP GiB | reduction | "
                      "model state only | reduction at batch 1 |", "|---|---|---|---|---|---|"
                      "---|---|---|"]
    for cluster in CLUSTERS:
        for workload in MEMORY_WORKLOADS:
            for n in MEMORY_WORKERS:
                sc = scenario(cluster, workload, n)
                ddp = make_strategy("ddp").memory(sc)["worker"]
                fsdp = make_strategy("fsdp").memory(sc)["worker"]
                one = replace(sc, batch_size=1)
                ddp1 = make_strategy("ddp").memory(one)["worker"]
                fsdp1 = make_strategy("fsdp").memory(one)["worker"]
                ratio = ddp.peak_bytes / fsdp.peak_bytes
                state = ddp.model_state_bytes / fsdp.model_state_bytes
                out[(cluster, workload, n)] = (ddp, fsdp)
                rows.append(csv_row("fsdp_memory", cluster, workload, n, "ddp/fsdp",
                                 "peak_reduction", ratio))
                lines.append(f"| {cluster} | {workload} | {n} | {sc.batch_size} | "
                             f"{ddp.peak_bytes / GIB:.1f} | {fsdp.peak_bytes / GIB:.1f} | "
                             f"{ratio:.1f}x | {state:.0f}x | "
                             f"{ddp1.peak_bytes / fsdp1.peak_bytes:.1f}x |")
    return "\n".join(lines), out


# ---------------------------------------------------------------- 3. async vs sync


VARIATIONS = {"jitter CV 0.02 (profile)": {}, "exponential jitter (CV 1)": {"jitter":
              "exponential"}, "1 straggler at 0.5": "straggler"}


def async_saving(rows: list[dict]) -> tuple[str, dict]:
    out = {}
    for cluster in CLUSTERS:
        for label, change in VARIATIONS.items():
            savings = []
            for n in ASYNC_WORKERS:
                extra = ({"speed": (1.0,) * (n - 1) + (0.5,)} if change == "straggler"
                         else dict(change))
                sc = scenario(cluster, "resnet50", n, **extra)
                x_sync = predict("sync-ps", sc).summary.throughput_samples_per_s
                x_async = predict("async-ps", sc).summary.throughput_samples_per_s
                savings.append(1 - x_sync / x_async)
                rows.append(csv_row("async_saving", cluster, "resnet50", n, label,
                                 "time_saving", savings[-1]))
            out[(cluster, label)] = savings
    lines = ["| cluster | variation | " + " | ".join(f"N={n}" for n in ASYNC_WORKERS) + " |",
             "|---|---|" + "---|" * len(ASYNC_WORKERS)]
    lines += [f"| {c} | {v} | " + " | ".join(f"{100 * s:.0f} %" for s in sv) + " |"
              for (c, v), sv in out.items()]
    return "\n".join(lines), out


# ---------------------------------------------------------------- 4. accuracy penalty


def accuracy_penalty(rows: list[dict]) -> tuple[str, dict]:
    """Observed harness penalties at the budget (mean over seeds) against the model's."""
    data = json.loads(RUNS_FILE.read_text())
    model = load_accuracy_model()
    points, lines = [], []
    for s in model.settings:
        budget = s.budget_updates
        runs = [r for r in data["runs"] if r["optimizer"] == s.optimizer
                and math.isclose(r["lr"], s.lr)]
        sync = float(np.mean([observed(r, budget) for r in runs if r["profile"] == "sync"]))
        lines += [f"\n{s.name}, {budget} updates (synchronous: {100 * sync:.1f} %); observed "
                  "penalty / model, in points; U = unstable\n",
                  "| profile | mean τ | " + " | ".join(MITIGATIONS) + " |",
                  "|---|---|" + "---|" * len(MITIGATIONS)]
        for name in sorted(data["profiles"], key=lambda n: (data["profiles"][n]["workers"], n)):
            taus = profile_values(data["profiles"][name])
            cells = []
            for mitigation in MITIGATIONS:
                mine = [r for r in runs if r["profile"] == name and r["mitigation"] == mitigation]
                if not mine:
                    cells.append("–")
                    continue
                cost = staleness_cost(taus, mitigation=mitigation, optimizer=s.optimizer,
                                      lr=s.lr, updates=budget, model=model)
                seen = 100 * (sync - float(np.mean([observed(r, budget) for r in mine])))
                shaky = 2 * sum(unstable(r) for r in mine) >= len(mine)
                held = data["profiles"][name]["held_out"]
                points.append((s.name, mitigation, cost.mean_staleness, seen,
                               cost.penalty_points, held, shaky,
                               cost.divergence_risk == "unstable"))
                rows.append(csv_row("accuracy_penalty", "harness", "mlp", name,
                                 f"{s.name} {mitigation}", "penalty_points", seen))
                model_cell = ("U" if cost.divergence_risk == "unstable"
                              else f"{cost.penalty_points:.1f}")
                cells.append(f"{seen:.1f}{' U' if shaky else ''} / {model_cell}"
                             + (f" ({len(mine)} seeds)" if len(mine) > 1 else ""))
            label = f"**{name}**" if data["profiles"][name]["held_out"] else name
            lines.append(f"| {label} | {np.mean(taus):.1f} | " + " | ".join(cells) + " |")
    lines.append("\nBold profiles were held out of the fit.")
    return "\n".join(lines), {"points": points, "data": data, "model": model}


# ---------------------------------------------------------------- 5. mitigations


PROTOCOLS = (("sync-ps", "sync-ps", {}, "none"), ("async-ps", "async-ps", {}, "none"),
             ("async-ps staleness-aware", "async-ps", {"staleness_aware_lr": True},
              "staleness-aware"),
             ("async-ps dc", "async-ps", {"delay_compensation": True}, "dc"),
             ("ssp-ps s=3", "ssp-ps", {"staleness_bound": 3}, "none"),
             ("ssp-ps s=1", "ssp-ps", {"staleness_bound": 1}, "none"),
             ("ssp-ps s=0", "ssp-ps", {"staleness_bound": 0}, "none"))


def mitigations(rows: list[dict], cluster: str = "a10g", workers: int = 8) -> tuple[str, list]:
    sc = scenario(cluster, "resnet50", workers, jitter="exponential")
    model = load_accuracy_model()
    table, lines = [], [
        "| protocol | samples/s | time saving vs sync-ps | mean τ | penalty, momentum lr 0.05 "
        "| penalty, momentum lr 0.01 | to 95 %, momentum lr 0.01 |",
        "|---|---|---|---|---|---|---|"]
    x_sync = None
    for label, strategy, options, mitigation in PROTOCOLS:
        p = predict(strategy, sc, **options)
        x = p.summary.throughput_samples_per_s
        x_sync = x if x_sync is None else x_sync
        costs = [staleness_cost(p.summary.staleness_values, mitigation=mitigation,
                                optimizer=s.optimizer, lr=s.lr, samples_per_s=x,
                                batch_size=sc.batch_size, model=model) for s in model.settings]
        table.append((label, x, 1 - x_sync / x, costs))
        rows.append(csv_row("mitigation", cluster, "resnet50", workers, label, "time_saving",
                         1 - x_sync / x))
        lines.append(f"| {label} | {x:,.0f} | {round(100 * (1 - x_sync / x))} % | "
                     f"{costs[0].mean_staleness:.1f} | " + " | ".join(
                         penalty_text(c) for c in costs) + f" | {_time(costs[-1])} |")
    return "\n".join(lines), table


def _time(c) -> str:
    t = c.time_to_target_s
    return "never" if t is None or not math.isfinite(t) else f"{t:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "findings")
    parser.add_argument("--db", type=Path, default=None,
                        help="measurement store [$PERFMODEL_DB or the user's default]")
    parser.add_argument("--measure", action="store_true",
                        help="first run real async PS jobs (mlp, 2-3 workers) into the store")
    args = parser.parse_args(argv)
    if args.measure:
        run_measurements(args.db)
    rows: list[dict] = []
    sections = {"speedup": ddp_speedup(rows), "memory": fsdp_memory(rows),
                "saving": async_saving(rows), "accuracy": accuracy_penalty(rows),
                "mitigation": mitigations(rows), "measured": measured_ps(args.db, rows),
                "local": (measured_local(args.db, rows), None)}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "findings.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_report(args.out, sections)
    print(f"wrote {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
