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
    """Per cluster: DDP and FSDP peak per device by part, the device's capacity (solid) and
    what tensors may use (dashed, cluster.py's usable-memory rule); a bar above the dashed
    line does not fit and is marked. One y scale for every panel, so an A10G's 24 GiB and an
    A100's 80 GiB look as different as they are."""
    import matplotlib.pyplot as plt

    from perfmodel.cluster import load_cluster

    devices = {c: load_cluster(c).device for c in CLUSTERS}
    top = max(d.memory_GiB for d in devices.values()) * 1.12
    fig, axes = plt.subplots(1, len(CLUSTERS), figsize=(12, 4.8), sharey=True)
    for ax, cluster in zip(axes, CLUSTERS, strict=True):
        dev = devices[cluster]
        usable = dev.usable_memory_bytes / GIB
        mems = [(w, pair) for (c, w, n), pair in memory.pairs.items()
                if c == cluster and n == MEMORY_WORKERS[0]]
        x = np.arange(2 * len(mems))
        bottoms = np.zeros(len(x))
        for part in MEMORY_PARTS:
            vals = np.array([getattr(m, part) / GIB for _, pair in mems
                             for m in (pair.ddp, pair.fsdp)])
            ax.bar(x, vals, bottom=bottoms, label=part.removesuffix("_bytes"))
            bottoms += vals
        for xi, total in zip(x, bottoms, strict=True):
            if total > usable:
                ax.bar(xi, total, fill=False, edgecolor="red", lw=2, hatch="xx")
                ax.text(xi, total + 0.8, "does not fit", ha="center", fontsize=8,
                        color="red")
        ax.axhline(dev.memory_GiB, color="black", lw=1.5,
                   label=f"device capacity {dev.memory_GiB:g} GiB")
        ax.axhline(usable, color="black", ls="--", lw=1,
                   label=f"usable by tensors {usable:.1f} GiB")
        labels = [f"{w}\n{s}" for w, _ in mems for s in ("DDP", "FSDP")]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylim(0, top)
        ax.set_title(f"{cluster} ({dev.name}, "
                     f"{dev.memory_GiB:g} GiB), {MEMORY_WORKERS[0]} workers (spec-derived)",
                     fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("peak GiB per device")
    return _save(fig, path)


def saving_figure(path: Path, saving: Saving) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for (cluster, label), sv in saving.savings.items():
        ax.plot(ASYNC_WORKERS, [100 * v for v in sv], marker="o", label=f"{cluster}: {label}")
    ax.axhline(28, color="tab:orange", ls="--", label="study: up to 28 %")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("async-ps time saving vs sync-ps (%)")
    ax.set_title("async PS against sync PS: time saved per sample", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def accuracy_figure(path: Path, acc: AccuracyPenalty) -> Path:
    """Left: harness learning curves against the model's; then the penalty against τ, one
    panel per mitigation (the learning rates in colour), so no two series share a panel's
    points."""
    import matplotlib.pyplot as plt

    mitigations = sorted({p.mitigation for p in acc.points if p.mitigation != "dc"})
    fig, axes = plt.subplots(1, 1 + len(mitigations), figsize=(6 + 5 * len(mitigations), 6.2),
                             gridspec_kw={"width_ratios": [1.15] + [1] * len(mitigations)})
    ax1 = axes[0]
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
        ax1.plot(run["eval_updates"], [100 * a for a in run["accuracy"]], "o", ms=4,
                 color=color, label=f"harness {name} (mean τ {cost.mean_staleness:.1f})")
        if cost.divergence_risk != "unstable":
            ax1.plot(u, 100 * s.curve.accuracy(u * cost.worth), "--", color=color)
    ax1.set_xlabel("updates (batch 64)")
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_title("momentum lr 0.01, staleness-aware:\nharness (dots) vs model (dashed)",
                  fontsize=10)
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    settings = sorted({p.setting for p in acc.points if p.mitigation != "dc"})
    for ax, mitigation in zip(axes[1:], mitigations, strict=True):
        for j, setting in enumerate(settings):
            pts = sorted((p for p in acc.points if p.setting == setting
                          and p.mitigation == mitigation), key=lambda p: p.mean_staleness)
            steady = [p for p in pts if not p.observed_unstable]
            ax.scatter([p.mean_staleness for p in steady], [p.observed_points for p in steady],
                       color=f"C{j}", s=30, label=f"{setting}: observed")
            shaky = [p for p in pts if p.observed_unstable]
            ax.scatter([p.mean_staleness for p in shaky], [p.observed_points for p in shaky],
                       marker="x", s=40, color=f"C{j}")
            held = [p for p in pts if p.held_out]
            ax.scatter([p.mean_staleness for p in held], [p.observed_points for p in held],
                       s=140, facecolors="none", edgecolors="black", lw=0.8)
            modelled = [p for p in pts if not p.model_unstable]
            ax.plot([p.mean_staleness for p in modelled], [p.model_points for p in modelled],
                    "--", color=f"C{j}", label=f"{setting}: model")
        ax.axhspan(4, 17, color="tab:orange", alpha=0.15, label="study: 4–17 %")
        ax.scatter([], [], marker="x", color="grey", label="observed unstable")
        ax.scatter([], [], s=140, facecolors="none", edgecolors="black", label="held out")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("mean staleness τ")
        ax.set_ylabel("accuracy penalty at the budget (points)")
        ax.set_ylim(-3, 100)
        ax.set_title(f"mitigation: {mitigation}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return _save(fig, path)


def measured_figure(path: Path, measured: MeasuredPs) -> Path:
    import matplotlib.pyplot as plt

    found = measured.runs
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(found) + 3), 5))
    x = np.arange(len(found))
    stable = [i for i, f in enumerate(found) if f.divergence_risk != "unstable"]
    ax.errorbar(x[stable], [100 * found[i].predicted_accuracy for i in stable],
                yerr=[100 * found[i].band for i in stable], fmt="s", capsize=4,
                label="predicted ± band")
    shaky = [i for i, f in enumerate(found) if f.divergence_risk == "unstable"]
    ax.scatter(x[shaky], [100 * found[i].accuracy for i in shaky], s=200, marker="s",
               facecolors="none", edgecolors="tab:grey", label="predicted unstable")
    ax.plot(x, [100 * f.accuracy for f in found], "o", color="tab:red", label="measured")
    ax.set_xticks(x, [f"run {f.run_id}, {f.workers} workers, {f.protocol}" for f in found],
                  fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Real async/SSP PS runs (mlp): measured accuracy against the predicted band",
                 fontsize=10)
    ax.legend(fontsize=8)
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
