"""Sections 4-5 of the findings report: what staleness costs in accuracy (the recorded
staleness-harness runs against the fitted accuracy model, perfmodel/accuracy/), and the
mitigated protocols' throughput against that cost."""

from __future__ import annotations

import json
import math

import numpy as np

from calibration.fit_accuracy import RUNS_FILE, observed, profile_values, unstable
from perfmodel.accuracy.cost import StalenessCost, staleness_cost
from perfmodel.accuracy.model import MITIGATIONS, load_accuracy_model
from perfmodel.findings.common import penalty_text, scenario
from perfmodel.findings.records import (
    AccuracyPenalty,
    AccuracyPoint,
    CsvRow,
    Mitigations,
    ProtocolResult,
)
from perfmodel.predict import predict

# ---------------------------------------------------------------- 4. accuracy penalty


def accuracy_penalty() -> AccuracyPenalty:
    """Observed harness penalties at the budget (mean over seeds) against the model's."""
    data = json.loads(RUNS_FILE.read_text())
    model = load_accuracy_model()
    points, lines, rows = [], [], []
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
            held = data["profiles"][name]["held_out"]
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
                points.append(AccuracyPoint(
                    setting=s.name, mitigation=mitigation, mean_staleness=cost.mean_staleness,
                    observed_points=seen, model_points=cost.penalty_points, held_out=held,
                    observed_unstable=shaky,
                    model_unstable=cost.divergence_risk == "unstable"))
                rows.append(CsvRow(finding="accuracy_penalty", cluster="harness",
                                   workload="mlp", workers=name, config=f"{s.name} {mitigation}",
                                   metric="penalty_points", value=seen))
                model_cell = ("U" if cost.divergence_risk == "unstable"
                              else f"{cost.penalty_points:.1f}")
                cells.append(f"{seen:.1f}{' U' if shaky else ''} / {model_cell}"
                             + (f" ({len(mine)} seeds)" if len(mine) > 1 else ""))
            label = f"**{name}**" if held else name
            lines.append(f"| {label} | {np.mean(taus):.1f} | " + " | ".join(cells) + " |")
    lines.append("\nBold profiles were held out of the fit.")
    return AccuracyPenalty(table="\n".join(lines), points=tuple(points), runs=data,
                           model=model, rows=tuple(rows))


# ---------------------------------------------------------------- 5. mitigations

# (label, strategy, options, the accuracy model's mitigation)
PROTOCOLS = (("sync-ps", "sync-ps", {}, "none"), ("async-ps", "async-ps", {}, "none"),
             ("async-ps staleness-aware", "async-ps", {"staleness_aware_lr": True},
              "staleness-aware"),
             ("async-ps dc", "async-ps", {"delay_compensation": True}, "dc"),
             ("ssp-ps s=3", "ssp-ps", {"staleness_bound": 3}, "none"),
             ("ssp-ps s=1", "ssp-ps", {"staleness_bound": 1}, "none"),
             ("ssp-ps s=0", "ssp-ps", {"staleness_bound": 0}, "none"))
MITIGATION_CLUSTER, MITIGATION_WORKERS = "a10g", 8


def mitigations(cluster: str = MITIGATION_CLUSTER,
                workers: int = MITIGATION_WORKERS) -> Mitigations:
    sc = scenario(cluster, "resnet50", workers, jitter="exponential")
    model = load_accuracy_model()
    protocols, rows, lines = [], [], [
        "| protocol | samples/s | time saving vs sync-ps | mean τ | penalty, momentum lr 0.05 "
        "| penalty, momentum lr 0.01 | to 95 %, momentum lr 0.01 |",
        "|---|---|---|---|---|---|---|"]
    x_sync = None
    for label, strategy, options, mitigation in PROTOCOLS:
        p = predict(strategy, sc, **options)
        x = p.summary.throughput_samples_per_s
        x_sync = x if x_sync is None else x_sync
        costs = tuple(staleness_cost(p.summary.staleness_values, mitigation=mitigation,
                                     optimizer=s.optimizer, lr=s.lr, samples_per_s=x,
                                     batch_size=sc.batch_size, model=model)
                      for s in model.settings)
        protocols.append(ProtocolResult(label=label, samples_per_s=x, saving=1 - x_sync / x,
                                        costs=costs))
        rows.append(CsvRow(finding="mitigation", cluster=cluster, workload="resnet50",
                           workers=workers, config=label, metric="time_saving",
                           value=1 - x_sync / x))
        lines.append(f"| {label} | {x:,.0f} | {round(100 * (1 - x_sync / x))} % | "
                     f"{costs[0].mean_staleness:.1f} | " + " | ".join(
                         penalty_text(c) for c in costs) + f" | {_time(costs[-1])} |")
    return Mitigations(table="\n".join(lines), protocols=tuple(protocols), rows=tuple(rows))


def _time(c: StalenessCost) -> str:
    t = c.time_to_target_s
    return "never" if t is None or not math.isfinite(t) else f"{t:.2f} s"
