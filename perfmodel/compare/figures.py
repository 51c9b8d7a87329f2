"""The report's figures (matplotlib, Agg backend, PNG). Each function draws one figure from
the comparison rows and returns the numbers it plotted, which the report keeps in
comparisons.json so that a figure can be checked against the table.

- scatter.png: predicted against measured median (bars: min–max over repeats), y = x and
  ±15 % lines (both in the legend), one panel per quantity; hollow markers are timed-wait
  runs; staleness only where it can be wrong, one point per worker's mean.
- scaling.png: throughput against workers per strategy: the model's line (timed-wait
  settings, the configuration's workload and options) over the measured points.
- memory.png: peak memory per worker by part, predicted beside measured.
- staleness.png: staleness histograms, predicted (line) over measured (bars); W1 (the
  Wasserstein-1 distance between them, in versions) explained under the panels.
- timeline.png: one configuration's simulated steady steps per worker (compute, exposed
  communication, waiting) and the transfers on its links, beside its measured breakdown.
- torch_memory.png: perfmodel against PyTorch's FakeTensorMode estimate at 8–64 ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from perfmodel import strategies as strategy_records  # noqa: E402
from perfmodel.compare.matching import LARGE_ERROR, MEMORY_PARTS, Comparison  # noqa: E402

DPI = 90
MiB, GiB = 2**20, 2**30
PART_COLORS = dict(zip(MEMORY_PARTS, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8c8c8c"),
                       strict=True))


def _color(strategy: str) -> str:
    return strategy_records.get(strategy).color


SCATTER = (("throughput", "throughput (samples/s)", 1.0),
           ("step_time", "step time (ms)", 1e3),
           ("peak_memory", "peak memory per worker (MiB)", 1 / MiB),
           ("staleness_mean", "mean staleness (versions)", 1.0))


def _save(fig, path: Path, rect=(0, 0, 1, 1)) -> str:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path.name


def scatter(rows: Sequence[Comparison], out: Path) -> dict[str, Any]:
    fig, axes = plt.subplots(2, 2, figsize=(10, 8.5))
    plotted: dict[str, list] = {}
    for ax, (q, title, scale) in zip(axes.flat, SCATTER, strict=True):
        points = []
        for r in rows:
            v = r.quantities[q]
            if v.predicted is None or v.measured is None:
                continue
            if q == "staleness_mean":
                points += _staleness_points(ax, r)
                continue
            points.append([r.key, v.measured, v.predicted])
            x, y = v.measured * scale, v.predicted * scale
            err = [[x - v.low * scale], [v.high * scale - x]]
            ax.errorbar(x, y, xerr=err, fmt="o", color=_color(r.strategy), ms=7,
                        mfc="none" if r.mode == "timed-wait" else _color(r.strategy), capsize=3)
        plotted[q] = points
        ax.set_title(title)
        ax.set_xlabel("measured (median of repeats)")
        ax.set_ylabel("predicted")
        if points:
            values = np.array([[p[1], p[2]] for p in points]) * scale
            lo, hi = values.min() * 0.8, values.max() * 1.2
            if lo == hi:
                lo, hi = lo - 1, hi + 1
            line = np.linspace(lo, hi, 2)
            ax.plot(line, line, "k-", lw=1, label="y = x")
            ax.plot(line, line * (1 + LARGE_ERROR), "k:", lw=0.8,
                    label=f"±{LARGE_ERROR:.0%}")
            ax.plot(line, line * (1 - LARGE_ERROR), "k:", lw=0.8)
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        else:
            ax.text(0.5, 0.5, "no configuration where it can be wrong" if q ==
                    "staleness_mean" else "no configuration", ha="center",
                    transform=ax.transAxes)
    axes.flat[3].set_title("staleness where it can be wrong (SSP, async\nwith stragglers): "
                           "per-worker means, else pooled", fontsize=10)
    handles = [plt.Line2D([], [], marker="o", ls="", color=r.color, label=r.name)
               for r in strategy_records.REGISTRY.values()]
    handles.append(plt.Line2D([], [], marker="o", ls="", color="k", mfc="none",
                              label="timed-wait"))
    handles.append(plt.Line2D([], [], color="k", lw=1, label="y = x: perfect prediction"))
    handles.append(plt.Line2D([], [], color="k", ls=":", lw=0.8,
                              label=f"±{LARGE_ERROR:.0%}: beyond it a configuration is "
                                    f"diagnosed"))
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=9)
    return {"file": _save(fig, out / "scatter.png", rect=(0, 0.08, 1, 1)), "points": plotted}


def _staleness_points(ax, r: Comparison) -> list[list]:
    """Staleness points of one configuration where it can be wrong: one per worker with
    per-worker means, else the pooled mean (SSP only); nothing where it cannot be wrong."""
    if not r.staleness_can_be_wrong:
        return []
    color = _color(r.strategy)
    mfc = "none" if r.mode == "timed-wait" else color
    pairs = [(f"{r.key} worker {w}", m, p) for w, (p, m) in
             sorted(r.staleness_per_worker.items()) if p is not None and m is not None]
    if not pairs and strategy_records.get(r.strategy).ps_mode == "ssp":
        v = r.quantities["staleness_mean"]
        pairs = [(r.key, v.measured, v.predicted)]
        ax.errorbar(v.measured, v.predicted, xerr=[[v.measured - v.low], [v.high - v.measured]],
                    fmt="o", color=color, ms=7, mfc=mfc, capsize=3)
        return [list(p) for p in pairs]
    for _, m, p in pairs:
        ax.plot(m, p, "o", color=color, ms=6, mfc=mfc)
    return [list(p) for p in pairs]


def scaling(rows: Sequence[Comparison], curves: dict[str, dict[str, Any]],
            out: Path) -> dict[str, Any]:
    """`curves`: strategy -> {"workers": [...], "throughput": [...], "label": str}, the
    model's line; measured points are the rows of that strategy and workload."""
    names = [s for s in strategy_records.REGISTRY if s in curves]
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(3.6 * max(len(names), 1), 3.8),
                             squeeze=False)
    plotted = {}
    for ax, s in zip(axes[0], names, strict=False):
        c = curves[s]
        ax.plot(c["workers"], c["throughput"], "-", color=_color(s), label="predicted (model)")
        pts = []
        for r in rows:
            if r.key not in c["keys"] or r.quantities["throughput"].measured is None:
                continue
            q = r.quantities["throughput"]
            pts.append([r.key, r.workers, q.measured])
            ax.errorbar(r.workers, q.measured, yerr=[[q.measured - q.low], [q.high - q.measured]],
                        fmt="o", color=_color(s), mfc="none" if r.mode == "timed-wait" else
                        _color(s), capsize=3)
        plotted[s] = {"model": [list(c["workers"]), list(c["throughput"])], "measured": pts}
        ax.set_title(f"{s}: {c['label']}", fontsize=9)
        ax.plot([], [], "o", color=_color(s), label="measured (filled: real compute)")
        ax.plot([], [], "o", color=_color(s), mfc="none", label="measured (hollow: timed-wait)")
        ax.legend(fontsize=7, title="line = predicted, circle = measured", title_fontsize=7,
                  loc="lower right")
        ax.set_xlabel("workers")
        ax.set_ylabel("throughput (samples/s)")
        ax.set_ylim(bottom=0)
    return {"file": _save(fig, out / "scaling.png"), "curves": plotted}


def memory(rows: Sequence[Comparison], out: Path) -> dict[str, Any]:
    chosen = [r for r in rows if r.measured_memory_parts and r.predicted_memory_parts]
    fig, ax = plt.subplots(figsize=(max(7.5, 1.2 * len(chosen) + 3.5), 4.5))
    plotted = {}
    for i, r in enumerate(chosen):
        for j, (who, parts) in enumerate((("predicted", r.predicted_memory_parts),
                                          ("measured", r.measured_memory_parts))):
            bottom = 0.0
            for part in MEMORY_PARTS:
                h = parts.get(part, 0.0) / MiB
                ax.bar(i + (j - 0.5) * 0.38, h, 0.36, bottom=bottom, color=PART_COLORS[part],
                       hatch="//" if who == "measured" else None, edgecolor="white")
                bottom += h
            plotted.setdefault(r.key, {})[who] = {p: parts.get(p, 0.0) for p in MEMORY_PARTS}
    ax.set_xticks(range(len(chosen)), [r.key for r in chosen], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylabel("peak memory per worker (MiB)")
    ax.set_title("model (left) and measured (right, hatched)", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PART_COLORS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="grey",
                                 hatch="//"))
    ax.legend(handles=handles, labels=[*PART_COLORS, "measured (hatched)"], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return {"file": _save(fig, out / "memory.png"), "bars": plotted}


def staleness(rows: Sequence[Comparison], out: Path) -> dict[str, Any]:
    chosen = [r for r in rows if r.measured_staleness and r.predicted_staleness
              and max(r.measured_staleness + r.predicted_staleness) > 0]
    n = max(len(chosen), 1)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    plotted = {}
    for ax, r in zip(axes[0], chosen, strict=False):
        top = int(max(r.measured_staleness + r.predicted_staleness))
        bins = np.arange(-0.5, top + 1.5)
        m, _ = np.histogram(r.measured_staleness, bins)
        p, _ = np.histogram(r.predicted_staleness, bins)
        m_share, p_share = m / m.sum(), p / p.sum()
        ax.bar(bins[:-1] + 0.5, m_share, 0.8, color="#bbbbbb", label="measured")
        ax.step(bins[:-1] + 0.5, p_share, where="mid", color=_color(r.strategy), lw=2,
                label="model")
        ax.set_title(f"{r.key}\nW1 = {r.staleness_w1:.2f} versions", fontsize=9)
        ax.set_xlabel("staleness (versions)")
        ax.set_ylabel("share of updates")
        ax.legend(fontsize=8)
        plotted[r.key] = {"measured": m_share.tolist(), "model": p_share.tolist()}
    if not chosen:
        axes[0][0].text(0.5, 0.5, "no asynchronous configuration", ha="center")
    fig.text(0.5, 0.01, "W1: Wasserstein-1 (earth mover's) distance between the model's and "
             "the measured distribution, in versions:\nhow far each update's staleness must "
             "move on average to turn one into the other (0 = the same).", ha="center",
             fontsize=8)
    return {"file": _save(fig, out / "staleness.png", rect=(0, 0.1, 1, 1)),
            "histograms": plotted}


def timeline(row: Comparison, tl: dict[str, Any], out: Path) -> dict[str, Any]:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 3.8),
                                 gridspec_kw={"width_ratios": [3, 1.1]})
    t0 = tl["window"][0]
    colors = {"compute": "#4c72b0", "exposed comm": "#c44e52", "wait": "#cccccc"}
    workers = sorted({int(s[0]) for s in tl["steps"]})
    for w, start, comp, exposed, wait in tl["steps"]:
        x = (start - t0) * 1e3
        for name, width in (("compute", comp), ("exposed comm", exposed), ("wait", wait)):
            ax.barh(w, width * 1e3, left=x, color=colors[name], edgecolor="white", height=0.7)
            x += width * 1e3
    link_row = (max(workers) + 1) if workers else 0
    kinds = sorted({c[0] for c in tl["comms"]})
    palette = dict(zip(kinds, plt.cm.Set2.colors, strict=False))
    for kind, _worker, start, end in tl["comms"]:
        ax.barh(link_row, (end - start) * 1e3, left=(start - t0) * 1e3, color=palette[kind],
                edgecolor="k", lw=0.3, height=0.7)
    ax.set_yticks([*workers, link_row], [f"worker {w}" for w in workers] + ["link(s)"])
    ax.set_xlabel("ms (simulated)")
    ax.set_title(f"model: {row.label}", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles += [plt.Rectangle((0, 0), 1, 1, color=palette[k]) for k in kinds]
    ax.legend(handles, [*colors, *kinds], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    p, m = row.predicted_breakdown, row.measured_breakdown
    bars = {"model": [p["compute_s"], p["comm_exposed_s"] + p["wait_s"]]}
    if m:
        bars["measured"] = [m["compute_s"], m["comm_wait_s"]]
    for i, (comp, comm) in enumerate(bars.values()):
        bx.bar(i, comp * 1e3, color=colors["compute"])
        bx.bar(i, comm * 1e3, bottom=comp * 1e3, color=colors["exposed comm"])
    bx.set_xticks(range(len(bars)), list(bars))
    bx.set_ylabel("ms per step (mean)")
    bx.set_title("step: compute + comm/wait", fontsize=9)
    return {"file": _save(fig, out / "timeline.png"), "key": row.key,
            "breakdown_ms": {k: [v * 1e3 for v in vals] for k, vals in bars.items()}}


def torch_memory(points: Sequence[dict[str, Any]], out: Path) -> dict[str, Any]:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: dict[str, list] = {}
    for p in points:
        series.setdefault(p["label"], []).append(p)
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda p: p["ranks"])
        ranks = [p["ranks"] for p in pts]
        color = f"C{i}"
        ax.plot(ranks, [p["model_bytes"] / GiB for p in pts], "-x", color=color, ms=8,
                label=f"{label}: perfmodel")
        ax.plot(ranks, [p["torch_bytes"] / GiB for p in pts], "o", color=color, mfc="none",
                ms=8, label=f"{label}: PyTorch estimate")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("peak memory per rank (GiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("GPT-2 XL per-rank peak: model vs PyTorch's FakeTensorMode tracker", fontsize=9)
    return {"file": _save(fig, out / "torch_memory.png"),
            "points": [[p["label"], p["ranks"], p["model_bytes"], p["torch_bytes"]]
                       for p in points]}


def draw_all(rows: Sequence[Comparison], out: Path, *, curves: dict[str, dict[str, Any]],
             timeline_row: Comparison | None, timeline_data: dict[str, Any] | None,
             torch_points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure; returns {figure name: what it plotted}."""
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("scatter", lambda: scatter(rows, out)),
        ("scaling", lambda: scaling(rows, curves, out)),
        ("memory", lambda: memory(rows, out)),
        ("staleness", lambda: staleness(rows, out)),
    ]
    if timeline_row is not None and timeline_data is not None:
        jobs.append(("timeline", lambda: timeline(timeline_row, timeline_data, out)))
    if torch_points:
        jobs.append(("torch_memory", lambda: torch_memory(torch_points, out)))
    return {name: draw() for name, draw in jobs}
