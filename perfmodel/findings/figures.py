"""The findings report's figures (matplotlib, Agg, PNG at 100 dpi)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibration.fit_accuracy import profile_values
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.findings.common import (
    ASYNC_WORKERS,
    CLUSTERS,
    GIB,
    MEMORY_WORKERS,
    SPEEDUP_WORKERS,
)
from perfmodel.findings.records import (
    AccuracyPenalty,
    Findings,
    MeasuredPs,
    Memory,
    Saving,
    Speedup,
)

MEMORY_PARTS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                "comm_buffers_bytes", "framework_bytes")


def write_figures(out: Path, findings: Findings) -> list[Path]:
    """Write every figure of `findings` into `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [speedup_figure(out / "ddp_speedup.png", findings.speedup),
             memory_figure(out / "fsdp_memory.png", findings.memory),
             saving_figure(out / "async_saving.png", findings.saving),
             accuracy_figure(out / "accuracy_penalty.png", findings.accuracy)]
    if findings.measured is not None and findings.measured.runs:
        paths.append(measured_figure(out / "measured_ps.png", findings.measured))
    return paths


def speedup_figure(path: Path, speedup: Speedup) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (cluster, workload), sp in speedup.curves.items():
        ax.plot(SPEEDUP_WORKERS, sp, marker="o", label=f"{cluster} {workload}")
    ax.plot(SPEEDUP_WORKERS, SPEEDUP_WORKERS, color="grey", ls=":", label="linear")
    ax.axhspan(2, 3, color="tab:orange", alpha=0.15, label="study: 2–3x")
    _log_axes(ax, "workers", "DDP speedup over one worker")
    return _save(fig, path)


def memory_figure(path: Path, memory: Memory) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CLUSTERS), figsize=(12, 4.5), sharey=False)
    for ax, cluster in zip(axes, CLUSTERS, strict=True):
        mems = [(w, pair) for (c, w, n), pair in memory.pairs.items()
                if c == cluster and n == MEMORY_WORKERS[0]]
        x = np.arange(2 * len(mems))
        bottoms = np.zeros(len(x))
        for part in MEMORY_PARTS:
            vals = np.array([getattr(m, part) / GIB for _, pair in mems
                             for m in (pair.ddp, pair.fsdp)])
            ax.bar(x, vals, bottom=bottoms, label=part.removesuffix("_bytes"))
            bottoms += vals
        labels = [f"{w}\n{s}" for w, _ in mems for s in ("DDP", "FSDP")]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("peak GiB per device")
        ax.set_title(f"{cluster}, {MEMORY_WORKERS[0]} workers (spec-derived)")
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def saving_figure(path: Path, saving: Saving) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (cluster, label), sv in saving.savings.items():
        ax.plot(ASYNC_WORKERS, [100 * v for v in sv], marker="o", label=f"{cluster}: {label}")
    ax.axhline(28, color="tab:orange", ls="--", label="study: up to 28 %")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("async-ps time saving vs sync-ps (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_figure(path: Path, acc: AccuracyPenalty) -> Path:
    """Left: harness learning curves against the model's; right: penalty against τ."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    model, data = acc.model, acc.runs
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
    pairs = sorted({(p.setting, p.mitigation) for p in acc.points if p.mitigation != "dc"})
    for j, (setting, mitigation) in enumerate(pairs):
        pts = sorted((p for p in acc.points if p.setting == setting
                      and p.mitigation == mitigation), key=lambda p: p.mean_staleness)
        steady = [p for p in pts if not p.observed_unstable]
        ax2.scatter([p.mean_staleness for p in steady], [p.observed_points for p in steady],
                    color=f"C{j}", label=f"{setting}, {mitigation}")
        shaky = [p for p in pts if p.observed_unstable]
        ax2.scatter([p.mean_staleness for p in shaky], [p.observed_points for p in shaky],
                    marker="x", color=f"C{j}")
        held = [p for p in pts if p.held_out]
        ax2.scatter([p.mean_staleness for p in held], [p.observed_points for p in held],
                    s=130, facecolors="none", edgecolors="black")
        modelled = [p for p in pts if not p.model_unstable]
        ax2.plot([p.mean_staleness for p in modelled], [p.model_points for p in modelled],
                 "--", color=f"C{j}")
    ax2.axhspan(4, 17, color="tab:orange", alpha=0.15, label="study: 4–17 %")
    ax2.set_xscale("symlog", linthresh=1)
    ax2.set_xlabel("mean staleness τ")
    ax2.set_ylabel("accuracy penalty at the setting's budget (points)")
    ax2.set_title("observed (dots; x = unstable; circled = held out)\nvs model (dashed, "
                  "where it predicts a stable run)", fontsize=9)
    ax2.legend(fontsize=7)
    return _save(fig, path)


def measured_figure(path: Path, measured: MeasuredPs) -> Path:
    import matplotlib.pyplot as plt

    found = measured.runs
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    x = np.arange(len(found))
    stable = [i for i, f in enumerate(found) if f.divergence_risk != "unstable"]
    ax.errorbar(x[stable], [100 * found[i].predicted_accuracy for i in stable],
                yerr=[100 * found[i].band for i in stable], fmt="s", capsize=4,
                label="predicted ± band")
    shaky = [i for i, f in enumerate(found) if f.divergence_risk == "unstable"]
    ax.scatter(x[shaky], [100 * found[i].accuracy for i in shaky], s=200, marker="s",
               facecolors="none", edgecolors="tab:grey", label="predicted unstable")
    ax.plot(x, [100 * f.accuracy for f in found], "o", color="tab:red", label="measured")
    ax.set_xticks(x, [f"run {f.run_id}\n{f.workers} workers\n{f.protocol}" for f in found],
                  fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.legend()
    return _save(fig, path)


def _log_axes(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
