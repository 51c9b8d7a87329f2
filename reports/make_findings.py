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
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit_accuracy import (
    RUNS_FILE,
    held_out_check,
    observed,
    profile_values,
    unstable,
)
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import MITIGATIONS, load_accuracy_model
from perfmodel.cluster import load_cluster
from perfmodel.predict import predict
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.workload import load_workload

REPO = Path(__file__).resolve().parent.parent

GIB = 2**30
CLUSTERS = ("a100", "a10g")
SPEEDUP_WORKERS = (1, 2, 4, 8, 16, 32)
SPEEDUP_WORKLOADS = ("resnet50", "bert-large")
MEMORY_WORKLOADS = ("gpt2-xl", "bert-large", "resnet50")
MEMORY_WORKERS = (8, 64)
ASYNC_WORKERS = (4, 8, 16, 32)
MEASURE_RUNS = (   # (workers, steps, flags): about 200 updates each, the default setting's budget
    (2, 98, ["--mode", "async"]), (3, 65, ["--mode", "async"]),
    (2, 98, ["--mode", "async", "--staleness-aware-lr"]),
    (2, 98, ["--mode", "ssp", "--staleness-bound", "0"]))
MEASURE_WARMUP = 2
STUDY = {"ddp_speedup": "2–3x", "fsdp_memory": "4–6x", "async_saving": "up to 28 %",
         "accuracy_loss": "4–17 %"}


def scenario(cluster: str, workload: str, workers: int, **changes: Any) -> Scenario:
    w = load_workload(workload)
    return Scenario(cluster=load_cluster(cluster), workload=w, workers=workers,
                    batch_size=changes.pop("batch_size", w.batch_size), **changes)


# ---------------------------------------------------------------- 1. DDP speedup


def ddp_speedup(rows: list[dict]) -> tuple[str, dict]:
    curves = {}
    for cluster in CLUSTERS:
        for workload in SPEEDUP_WORKLOADS:
            sp = [predict("ddp", scenario(cluster, workload, n)).speedup
                  for n in SPEEDUP_WORKERS]
            curves[(cluster, workload)] = sp
            for n, s in zip(SPEEDUP_WORKERS, sp, strict=True):
                rows.append(_row("ddp_speedup", cluster, workload, n, "ddp", "speedup", s))
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
                rows.append(_row("fsdp_memory", cluster, workload, n, "ddp/fsdp",
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
                rows.append(_row("async_saving", cluster, "resnet50", n, label,
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
                rows.append(_row("accuracy_penalty", "harness", "mlp", name,
                                 f"{s.name} {mitigation}", "penalty_points", seen))
                model_cell = ("U" if cost.divergence_risk == "unstable"
                              else f"{cost.penalty_points:.1f}")
                cells.append(f"{seen:.1f}{' U' if shaky else ''} / {model_cell}"
                             + (f" ({len(mine)} seeds)" if len(mine) > 1 else ""))
            label = f"**{name}**" if data["profiles"][name]["held_out"] else name
            lines.append(f"| {label} | {np.mean(taus):.1f} | " + " | ".join(cells) + " |")
    lines.append("\nBold profiles were held out of the fit.")
    return "\n".join(lines), {"points": points, "data": data, "model": model}


def longer_budgets(model) -> str:
    """The model's staleness-aware penalty at the fitted budget and at ten times it."""
    lines = ["| setting | N | mean τ | penalty at U | penalty at 10 U |", "|---|---|---|---|---|"]
    for s in model.settings:
        for n in (4, 8, 16, 64):
            taus = np.full(64, n - 1)
            cost = [staleness_cost(taus, mitigation="staleness-aware", optimizer=s.optimizer,
                                   lr=s.lr, updates=u, model=model)
                    for u in (s.budget_updates, 10 * s.budget_updates)]
            lines.append(f"| {s.name} (U = {s.budget_updates}) | {n} | {n - 1} | "
                         + " | ".join(_penalty(c) for c in cost) + " |")
    return "\n".join(lines)


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
        rows.append(_row("mitigation", cluster, "resnet50", workers, label, "time_saving",
                         1 - x_sync / x))
        lines.append(f"| {label} | {x:,.0f} | {round(100 * (1 - x_sync / x))} % | "
                     f"{costs[0].mean_staleness:.1f} | " + " | ".join(
                         _penalty(c) for c in costs) + f" | {_time(costs[-1])} |")
    return "\n".join(lines), table


def _penalty(c) -> str:
    return "unstable" if c.divergence_risk == "unstable" else f"{c.penalty_points:.1f} pts"


def _time(c) -> str:
    t = c.time_to_target_s
    return "never" if t is None or not math.isfinite(t) else f"{t:.2f} s"


# ---------------------------------------------------------------- 6. measured PS runs


def run_measurements(db: Path | None) -> None:
    jobs = [("ps", w, ["--steps", str(steps), "--oversubscribe", *flags])
            for w, steps, flags in MEASURE_RUNS] + list(LOCAL_RUNS)
    for kind, workers, flags in jobs:
        cmd = [sys.executable, "-m", "perfmodel", "measure", kind, "--workers", str(workers),
               "--workload", "mlp", "--warmup-steps", str(MEASURE_WARMUP), *flags, "--json"]
        if db is not None:
            cmd += ["--db", str(db)]
        print("running:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def measured_ps(db: Path | None, rows: list[dict]) -> tuple[str, list]:
    """Every real async/ssp mlp PS run in the store against the model's prediction from its
    own measured staleness: inside the band where the model predicts a stable run, and
    unstable by the harness's own criterion (calibration/fit_accuracy.py) where it does not."""
    from measure.store import Store

    store, model = Store(db), load_accuracy_model()
    found, lines = [], [
        "| run | workers | protocol | updates | mean τ | measured accuracy | predicted | "
        "agrees |", "|---|---|---|---|---|---|---|---|"]
    for row in store.list_runs(kind="ps", workload="mlp", status="ok"):
        run = store.get_run(row.id)
        options = (row.config.get("options") or {}).get("ps", {})
        evals = sorted((e for e in run.table("evals") if e.get("accuracy") is not None
                        and math.isfinite(e["accuracy"])), key=lambda e: e["step"])
        mode = options.get("mode")
        if mode not in ("async", "ssp") or not evals or row.config.get(
                "compute_mode", "real") != "real":
            continue
        mitigation = ("staleness-aware" if options.get("staleness_aware_lr") else
                      "dc" if options.get("delay_compensation") else "none")
        protocol = (f"ssp s={options.get('staleness_bound')}" if mode == "ssp"
                    else "async" + ("" if mitigation == "none" else f" {mitigation}"))
        taus = np.array([u["staleness"] for u in run.table("updates")], dtype=float)
        final = evals[-1]["accuracy"]
        cost = staleness_cost(taus, mitigation=mitigation, updates=len(taus), model=model)
        seen_unstable = unstable({"diverged": False, "accuracy": [e["accuracy"] for e in evals],
                                  "loss": [e["loss"] for e in evals]})
        if cost.divergence_risk == "unstable":
            agrees = seen_unstable
            predicted = "unstable"
        else:
            agrees = abs(final - cost.accuracy) <= cost.band
            predicted = f"{100 * cost.accuracy:.1f} % ± {100 * cost.band:.1f}"
        found.append((row.id, row.workers, protocol, len(taus), float(taus.mean()), final,
                      cost.accuracy, cost.band, agrees, cost.divergence_risk, seen_unstable))
        rows.append(_row("measured_ps", "local", "mlp", row.workers, protocol, "accuracy",
                         final))
        lines.append(f"| {row.id} | {row.workers} | {protocol} | {len(taus)} | "
                     f"{taus.mean():.2f} | {100 * final:.1f} %"
                     f"{' (unstable)' if seen_unstable else ''} | {predicted} | "
                     f"{'yes' if agrees else 'NO'} |")
    return "\n".join(lines), found


# ---------------------------------------------------------------- 7. measured local runs


LOCAL_RUNS = (("ddp", 1, ["--steps", "20"]), ("ddp", 2, ["--steps", "20"]),
              ("fsdp", 2, ["--steps", "20"]),
              ("ps", 2, ["--mode", "sync", "--steps", "98", "--oversubscribe"]))


def measured_local(db: Path | None, rows: list[dict]) -> str:
    """Latest real mlp runs in the store against the `local` profile's predictions."""
    from measure.store import Store

    store = Store(db)

    def latest(kind: str, workers: int, mode: str | None = None):
        found = [r for r in store.list_runs(kind=kind, workload="mlp", status="ok")
                 if r.workers == workers and r.config.get("compute_mode", "real") == "real"
                 and (mode is None or (r.config.get("options") or {}).get("ps", {}).get(
                     "mode") == mode)
                 and not ((r.config.get("options") or {}).get("ps", {}).get(
                     "staleness_aware_lr"))]
        return store.get_run(found[-1].id) if found else None

    def throughput(run) -> float:
        return max(s["value"] for s in run.table("summaries")
                   if s["key"] == "throughput_samples_per_s")

    def peak(run) -> float:
        return max(m["peak_bytes"] for m in run.table("memory"))

    ddp1, ddp2, fsdp2 = latest("ddp", 1), latest("ddp", 2), latest("fsdp", 2)
    sync, asyn = latest("ps", 2, "sync"), latest("ps", 2, "async")
    sc = scenario("local", "mlp", 2)
    lines = ["| finding | measured (mlp, 2 workers, this machine) | predicted (`local` "
             "profile) |", "|---|---|---|"]
    if ddp1 and ddp2:
        seen = throughput(ddp2) / throughput(ddp1)
        rows.append(_row("ddp_speedup", "local", "mlp", 2, "measured", "speedup", seen))
        lines.append(f"| DDP speedup | {seen:.2f}x | {predict('ddp', sc).speedup:.2f}x |")
    if ddp2 and fsdp2:
        seen = peak(ddp2) / peak(fsdp2)
        d, f = (make_strategy(k).memory(sc)["worker"] for k in ("ddp", "fsdp"))
        tensors = (d.peak_bytes - d.framework_bytes) / (f.peak_bytes - f.framework_bytes)
        rows.append(_row("fsdp_memory", "local", "mlp", 2, "measured", "peak_reduction", seen))
        lines.append(f"| FSDP peak-memory reduction (tensors, as MemTracker counts them) | "
                     f"{seen:.2f}x | {tensors:.2f}x ({d.peak_bytes / f.peak_bytes:.2f}x with "
                     "the profile's fixed framework memory) |")
    if sync and asyn:
        seen = 1 - throughput(sync) / throughput(asyn)
        x_s, x_a = (predict(k, sc).summary.throughput_samples_per_s
                    for k in ("sync-ps", "async-ps"))
        rows.append(_row("async_saving", "local", "mlp", 2, "measured", "time_saving", seen))
        lines.append(f"| async-vs-sync PS time saving | {100 * seen:.0f} % | "
                     f"{100 * (1 - x_s / x_a):.0f} % |")
    if len(lines) == 2:
        return ("No local mlp DDP/FSDP/PS runs in the store: run `python "
                "reports/make_findings.py --measure` to add them.")
    return "\n".join(lines)


# ---------------------------------------------------------------- figures


def figures(out: Path, sections: dict[str, tuple[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (cluster, workload), sp in sections["speedup"][1].items():
        ax.plot(SPEEDUP_WORKERS, sp, marker="o", label=f"{cluster} {workload}")
    ax.plot(SPEEDUP_WORKERS, SPEEDUP_WORKERS, color="grey", ls=":", label="linear")
    ax.axhspan(2, 3, color="tab:orange", alpha=0.15, label="study: 2–3x")
    _log_axes(ax, "workers", "DDP speedup over one worker")
    _save(fig, out / "ddp_speedup.png")

    fig, axes = plt.subplots(1, len(CLUSTERS), figsize=(12, 4.5), sharey=False)
    parts = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
             "comm_buffers_bytes", "framework_bytes")
    for ax, cluster in zip(axes, CLUSTERS, strict=True):
        labels, bottoms = [], None
        mems = [(w, m) for (c, w, n), m in sections["memory"][1].items()
                if c == cluster and n == MEMORY_WORKERS[0]]
        x = np.arange(2 * len(mems))
        bottoms = np.zeros(len(x))
        for part in parts:
            vals = np.array([getattr(m, part) / GIB for _, pair in mems for m in pair])
            ax.bar(x, vals, bottom=bottoms, label=part.removesuffix("_bytes"))
            bottoms += vals
        labels = [f"{w}\n{s}" for w, _ in mems for s in ("DDP", "FSDP")]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("peak GiB per device")
        ax.set_title(f"{cluster}, {MEMORY_WORKERS[0]} workers (spec-derived)")
    axes[0].legend(fontsize=8)
    _save(fig, out / "fsdp_memory.png")

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (cluster, label), sv in sections["saving"][1].items():
        ax.plot(ASYNC_WORKERS, [100 * v for v in sv], marker="o", label=f"{cluster}: {label}")
    ax.axhline(28, color="tab:orange", ls="--", label="study: up to 28 %")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("async-ps time saving vs sync-ps (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out / "async_saving.png")

    acc = sections["accuracy"][1]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    model, data = acc["model"], acc["data"]
    s = model.setting("momentum", 0.01)
    u = np.linspace(0, s.budget_updates, 101)
    ax1.plot(u, 100 * s.curve.accuracy(u), color="black", label="synchronous (fitted)")
    for i, name in enumerate(("homo-8", "homo-16", "homo-64")):
        run = next((r for r in data["runs"] if r["lr"] == s.lr and r["profile"] == name
                    and r["mitigation"] == "staleness-aware"), None)
        if run is None:
            continue
        taus = profile_values(data["profiles"][name])
        cost = staleness_cost(taus, optimizer="momentum", lr=s.lr, model=model,
                              mitigation="staleness-aware")
        color = f"C{i}"
        ax1.plot(run["eval_updates"], [100 * a for a in run["accuracy"]], "o", color=color,
                 label=f"harness {name} (mean τ {cost.mean_staleness:.1f})")
        if cost.divergence_risk != "unstable":
            ax1.plot(u, 100 * s.curve.accuracy(u * cost.worth), "--", color=color)
    ax1.set_xlabel("updates (batch 64)")
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_title("mlp on digits, momentum lr 0.01, staleness-aware: harness (dots) vs "
                  "model (dashed)", fontsize=9)
    ax1.legend(fontsize=8)
    pairs = sorted({(p[0], p[1]) for p in acc["points"] if p[1] != "dc"})
    for j, (setting, mitigation) in enumerate(pairs):
        pts = sorted((p for p in acc["points"] if p[0] == setting and p[1] == mitigation),
                     key=lambda p: p[2])
        steady = [p for p in pts if not p[6]]
        ax2.scatter([p[2] for p in steady], [p[3] for p in steady], color=f"C{j}",
                    label=f"{setting}, {mitigation}")
        ax2.scatter([p[2] for p in pts if p[6]], [p[3] for p in pts if p[6]], marker="x",
                    color=f"C{j}")
        ax2.scatter([p[2] for p in pts if p[5]], [p[3] for p in pts if p[5]], s=130,
                    facecolors="none", edgecolors="black")
        modelled = [p for p in pts if not p[7]]
        ax2.plot([p[2] for p in modelled], [p[4] for p in modelled], "--", color=f"C{j}")
    ax2.axhspan(4, 17, color="tab:orange", alpha=0.15, label="study: 4–17 %")
    ax2.set_xscale("symlog", linthresh=1)
    ax2.set_xlabel("mean staleness τ")
    ax2.set_ylabel("accuracy penalty at the setting's budget (points)")
    ax2.set_title("observed (dots; x = unstable; circled = held out)\nvs model (dashed, "
                  "where it predicts a stable run)", fontsize=9)
    ax2.legend(fontsize=7)
    _save(fig, out / "accuracy_penalty.png")

    found = sections["measured"][1]
    if found:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        x = np.arange(len(found))
        stable = [i for i, f in enumerate(found) if f[9] != "unstable"]
        ax.errorbar(x[stable], [100 * found[i][6] for i in stable],
                    yerr=[100 * found[i][7] for i in stable], fmt="s", capsize=4,
                    label="predicted ± band")
        shaky = [i for i, f in enumerate(found) if f[9] == "unstable"]
        ax.scatter(x[shaky], [100 * found[i][5] for i in shaky], s=200, marker="s",
                   facecolors="none", edgecolors="tab:grey", label="predicted unstable")
        ax.plot(x, [100 * f[5] for f in found], "o", color="tab:red", label="measured")
        ax.set_xticks(x, [f"run {f[0]}\n{f[1]} workers\n{f[2]}" for f in found], fontsize=8)
        ax.set_ylabel("test accuracy (%)")
        ax.legend()
        _save(fig, out / "measured_ps.png")


def _log_axes(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---------------------------------------------------------------- the report


def write_report(out: Path, sections: dict[str, tuple[str, Any]]) -> None:
    figures(out, sections)
    sp = sections["speedup"][1]
    mem = sections["memory"][1]
    sav = sections["saving"][1]
    acc = sections["accuracy"][1]
    model = acc["model"]
    found = sections["measured"][1]
    i4, i8 = SPEEDUP_WORKERS.index(4), SPEEDUP_WORKERS.index(8)
    ratios = {k: d.peak_bytes / f.peak_bytes for k, (d, f) in mem.items()}
    prov = model.provenance
    inside = sum(f[8] for f in found)
    text = f"""# The study's findings, reproduced with perfmodel

Generated by `python reports/make_findings.py{' --measure' if found else ''}` — do not edit
by hand. Cluster numbers come from the shipped **spec-derived** `a100` (p4d: 8x A100 40GB,
NVSwitch, 400 Gbit/s EFA) and `a10g` (g5.12xlarge: 4x A10G, PCIe, 40 Gbit/s) profiles: no
cluster was measured, so absolute numbers are first estimates; comparisons between strategies
share those assumptions. Accuracy numbers come from real training: the staleness harness
(`measure/staleness_harness.py`, {prov.get('runs', '?')} runs of mlp on scikit-learn's digits,
torch {prov.get('torch_version', '?')}, fitted {prov.get('date', '?')}) and real local
parameter-server runs. Every number below is in `findings.csv`.

## 1. DDP speedup — study: {STUDY['ddp_speedup']}

DDP throughput over one worker of the same cluster and per-worker batch (ResNet-50 batch 64,
BERT-large batch 8; `perfmodel predict --strategy ddp`):

{sections["speedup"][0]}

![DDP speedup](ddp_speedup.png)

At 4 workers the model predicts {sp[("a100", "resnet50")][i4]:.1f}x (a100) and
{sp[("a10g", "resnet50")][i4]:.1f}x (a10g) for ResNet-50, {sp[("a100", "bert-large")][i8]:.1f}x
and {sp[("a10g", "bert-large")][i8]:.1f}x for BERT-large at 8: near-linear, well above the
study's 2–3x. Why they differ: inside an NVLink/NVSwitch node (300 GB/s per GPU) DDP's
bucketed all-reduce hides almost entirely behind backward, and the spec-derived profiles
assume dedicated GPUs with 2 % step jitter. The study's 2–3x is what one sees when
communication is exposed — PCIe and commodity Ethernet (a single TCP flow on EC2 is capped at
5 Gbit/s, which gloo hits), small per-GPU batches, or framework overheads the spec-derived
profiles do not carry (calibrate with `perfmodel calibrate` to bring them in). The a10g
numbers drop once the ring leaves a 4-GPU node and crosses the 40 Gbit/s NIC.

## 2. FSDP peak-memory reduction — study: {STUDY['fsdp_memory']}

Peak bytes per device, DDP against FSDP full-shard (`perfmodel/memory.py`, ZeRO's accounting):

{sections["memory"][0]}

![FSDP memory](fsdp_memory.png)

FSDP divides the model state (params, grads, fp32 master weights and Adam moments: 16Ψ for
mixed-precision Adam) by N, so the model-state column grows with N; the peak reduction is
{min(ratios.values()):.1f}–{max(ratios.values()):.1f}x, because what FSDP does not shard stays:
activations (batch × per-sample bytes, never sharded), the unsharded units in flight, and the
framework's fixed ~1 GiB. The study's 4–6x sits between our batch-size-limited and
model-state-limited cases: gpt2-xl at batch 1 reduces far more, ResNet-50 (25M parameters,
activation-dominated) barely. Activation checkpointing (not modelled) would move every row
toward the model-state column.

## 3. Asynchronous vs synchronous PS: time saving — study: {STUDY['async_saving']}

Time for the same samples, 1 − X_sync / X_async (ResNet-50 batch 64, `sync-ps` vs `async-ps`):

{sections["saving"][0]}

![async saving](async_saving.png)

{_saving_text(sav)}

## 4. What staleness costs in accuracy — study: {STUDY['accuracy_loss']}

Real training in the staleness harness (`measure/staleness_harness.py`: mlp on digits, batch
64, each update's gradient computed on the parameters of τ versions ago, τ drawn from the
simulator's async-ps staleness for 2–64 workers, homogeneous or with a quarter of the
workers at 0.25 speed), at the workload's own momentum SGD (lr 0.05, momentum 0.9) and at a
5x smaller rate, each against synchronous runs (3 seeds) after the same number of updates.
The model (`perfmodel/accuracy/`) is fitted on the profiles not in bold: effective updates
Σ (lr_i/α₀)^κ / (1 + β·τ_i) on a stretched-exponential learning curve, and an instability
threshold on mean(lr_i·(2τ_i + 1)) / (1 − momentum) (delayed gradient descent is stable only
below ≈ π/(2τ + 1), Levin & May 1976).

{sections["accuracy"][0]}

![accuracy penalty](accuracy_penalty.png)

{_accuracy_text(acc, model)}

The model's penalty for the staleness-aware rate at the fitted budget U and at 10 U (same
profiles, constant τ = N − 1):

{longer_budgets(model)}

The penalty depends on the budget: a stale run that is merely slow catches up as the
synchronous run saturates, and at long budgets the staleness-aware penalty falls toward the
study's 4–17 %; an unstable run never does. These numbers are for a small MLP on digits;
deeper networks and adaptive optimizers are more sensitive to staleness (Dai et al. 2019).

## 5. Mitigated protocols: the gain they give back

a10g, ResNet-50, 8 workers, exponential step times (where asynchrony pays most):

{sections["mitigation"][0]}

{_mitigation_text(sections["mitigation"][1])}

## 6. Measured on this machine

Real runs where a 2-core CPU machine can make them (gloo, one thread per rank; the `local`
profile is {_local_source()}):

{sections["local"][0]}

Two ranks on two shared cores cannot show GPU-cluster scaling: ranks (and a PS server)
compete for the same cores with each other and with other jobs, so these rows check the
mechanisms, not the study's magnitudes. PyTorch's MemTracker counts tensors only, so the
memory row compares it with the model's tensor parts (the fixed framework memory of a real
device is left out of both). On this machine the parameter server itself binds: every async
update makes the server apply and re-send all 3.2M parameters, where sync PS does that once
per N gradients, so async can be slower than sync here whatever the model's uncalibrated
`local` profile says; a calibrated `local` profile (`perfmodel calibrate`) carries the
measured server rate.

## 7. Measured local async PS runs against the predicted band

{_measured_text(sections["measured"][0], found, inside)}

## Reproduce

    python -m calibration.fit_accuracy        # harness runs + fit (about an hour, one core)
    python reports/make_findings.py --measure  # real PS runs, then this report
"""
    (out / "report.md").write_text(text)


def _budgets(model) -> str:
    return ", ".join(f"{s.budget_updates} updates at {s.name}" for s in model.settings)


def _local_source() -> str:
    prov = load_cluster("local").provenance
    return ("spec-derived (not calibrated on this machine)" if prov.source == "spec"
            else f"calibrated here on {prov.date}")


def _accuracy_text(acc: dict, model) -> str:
    check = held_out_check(acc["data"], model)
    stable = [r for r in check if not (r["predicted_unstable"] or r["observed_unstable"])]
    errors = [abs(r["predicted_penalty_points"] - r["observed_penalty_points"]) for r in stable]
    agree = sum(r["predicted_unstable"] == r["observed_unstable"] for r in check)
    within = sum(e <= 2.0 for e in errors)
    rows = "\n".join(
        f"| {r['optimizer']} lr {r['lr']:g} | {r['profile']} | {r['mitigation']} | "
        f"{r['seeds']} | {r['observed_penalty_points']:.1f} ± {r['observed_spread_points']:.1f}"
        f" | {r['predicted_penalty_points']:.1f} |" for r in stable)
    return f"""What the runs show:

- **Instability, not slow learning, is the main cost of a fixed rate.** At lr 0.05 one
  stale step (2 workers, τ ≈ 1) already makes test accuracy swing by tens of points, and
  every fixed-rate profile from 2 workers up is unstable; at lr 0.01 only τ ≤ 1 stays
  stable. Heavy momentum compounds staleness (asynchrony acts like extra momentum,
  Mitliagkas et al. 2016); this is the divergence Zhang et al. 2016 saw with fixed rates.
- **The staleness-aware rate α₀/τ keeps large-N runs stable** but makes each update worth
  far less: its penalty grows steadily with N.
- **DC-ASGD with the server's λ = 0.04 changes nothing measurable** here: λ·g⊙g is a
  vanishing fraction of the step, so its runs track the unmitigated ones.

Held-out check ({len(check)} held-out profile × mitigation groups): stable-or-unstable
predicted correctly for {agree} of {len(check)}; where both model and runs are stable, the
penalty error is {_span(errors)} points: {within} of {len(errors)} within the issue's 2 points,
so that target is **not met**. The staleness-aware runs were repeated with 3 seeds; their
seed-to-seed spread (±, one SD) is as large as the model's error, and every error is within
2 points plus two standard errors of the 3-seed mean (what `tests/test_accuracy_model.py`
asserts). Checking 2 points would take tens of seeds per profile at these budgets:

| setting | profile | mitigation | seeds | observed penalty | model |
|---|---|---|---|---|---|
{rows}"""


def _saving_text(sav: dict) -> str:
    steady = [v for (c, label), sv in sav.items() if label.startswith("jitter CV") for v in sv]
    slow = [v for (c, label), sv in sav.items() if "straggler" in label for v in sv]
    expo = [v for (c, label), sv in sav.items() if "exponential" in label for v in sv]
    return (f"Even with dedicated GPUs (2 % jitter) async saves {_pct_span(steady)}: sync PS "
            "runs push-all, apply, pull-all in lock step and leaves the server link idle "
            "while the workers compute, which async pipelines; the saving shrinks at 32 "
            "workers, where the one server link saturates under both. A straggler at half "
            f"speed makes it {_pct_span(slow)}, and exponential step times (CV 1, where a "
            f"synchronous step waits for E[max] = H_N/μ) {_pct_span(expo)}. The study's "
            "\"up to 28 %\" sits in the dedicated-GPU and one-straggler range; only "
            "strongly variable workers go beyond it.")


def _mitigation_text(table: list) -> str:
    by = {label: (x, saving, costs) for label, x, saving, costs in table}
    sync_t = by["sync-ps"][2][-1].time_to_target_s
    aware = by["async-ps staleness-aware"]
    ssp0, ssp3 = by["ssp-ps s=0"], by["ssp-ps s=3"]
    return (f"Plain async is {100 * by['async-ps'][1]:.0f} % faster per sample but unstable at "
            f"both rates with 8 workers. The staleness-aware rate keeps the "
            f"{100 * aware[1]:.0f} % throughput gain and stays stable at lr 0.01, but each "
            f"update is worth {aware[2][-1].worth:.2f} of a synchronous one, so it reaches 95 % "
            f"in {aware[2][-1].time_to_target_s:.1f} s against sync-ps's {sync_t:.1f} s. "
            f"Bounded staleness gives the gain back as the bound tightens (s = 3: "
            f"{round(100 * ssp3[1])} %, s = 0: {round(100 * ssp0[1])} %) while its version "
            f"staleness stays at {ssp0[2][0].mean_staleness:.1f} (SSP bounds clock "
            "differences, not how many updates land between a pull and its push), and DC-ASGD "
            "costs the server four plain applies per update for no accuracy gain at λ = 0.04. "
            "That is the study's finding: the mitigated protocols spend the asynchronous gain "
            "on synchronisation or on slower progress.")


def _pct_span(values: list) -> str:
    return f"{100 * min(values):.0f}–{100 * max(values):.0f} %"


def _span(values: list) -> str:
    return f"{min(values):.1f} to {max(values):.1f}" if values else "(none)"


def _measured_text(table: str, found: list, inside: int) -> str:
    if not found:
        return ("No async mlp parameter-server runs in the store: run "
                "`python reports/make_findings.py --measure` to add them.")
    near = [f for f in found if not f[8] and f[9] == "near"]
    marginal = (f" The disagreeing run{'s' if len(near) > 1 else ''} "
                f"({', '.join(str(f[0]) for f in near)}) sat at \"near\" risk, just under the "
                "instability threshold, where the stable/unstable split is least reliable: "
                "it did not oscillate, but learned far more slowly than a stable run."
                if near else "")
    return (f"Real runs (`perfmodel measure ps --workload mlp`, async and ssp, gloo on this "
            f"2-core machine, one thread per rank, the workload's momentum lr 0.05), each "
            f"predicted from its own measured staleness and number of updates. Where the model "
            f"predicts a stable run the measured accuracy must fall in the band (± 2 × (seed "
            f"spread ⊕ fit residual)); where it predicts an unstable one, the run's own "
            f"evaluations must show it (test accuracy falling 0.2 below its best, or the loss "
            f"blowing up: the harness's criterion). {inside} of {len(found)} agree.{marginal}"
            f"\n\n{table}\n\n![measured](measured_ps.png)")


def _row(finding: str, cluster: str, workload: str, workers: Any, config: str, metric: str,
         value: float) -> dict:
    return {"finding": finding, "cluster": cluster, "workload": workload, "workers": workers,
            "config": config, "metric": metric, "value": round(float(value), 6),
            "study": STUDY.get(finding, "")}


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
