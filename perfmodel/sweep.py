"""A grid of predictions (strategies x worker counts) as rows, a CSV and a plot."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.predict import Prediction, predict
from perfmodel.sim.scenario import Scenario

GIB = 2**30


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRow:
    strategy: str
    workers: int
    throughput_samples_per_s: float
    speedup_vs_1_worker: float
    step_time_s: float
    compute_s: float
    comm_exposed_s: float
    wait_s: float
    peak_memory_GiB: float
    oom: bool
    staleness_mean: float

    @staticmethod
    def of(p: Prediction) -> SweepRow:
        s, worker = p.summary, p.memory["worker"]
        oom = any(m.oom for m in p.memory.values())
        return SweepRow(
            strategy=p.strategy, workers=p.scenario.workers,
            throughput_samples_per_s=s.throughput_samples_per_s,
            speedup_vs_1_worker=p.speedup, step_time_s=s.step_time_s.mean,
            compute_s=s.compute_s, comm_exposed_s=s.comm_exposed_s, wait_s=s.wait_s,
            peak_memory_GiB=worker.peak_bytes / GIB, oom=oom,
            staleness_mean=s.staleness.mean)


def run_sweep(scenarios: Iterable[Scenario], strategies: Iterable[str],
              options: dict[str, dict[str, Any]] | None = None,
              progress: Callable[[], None] = lambda: None) -> list[SweepRow]:
    """Predict every (strategy, scenario) pair, strategy-major; `options` maps a strategy
    to its options."""
    rows = []
    for strategy in strategies:
        for scenario in scenarios:
            rows.append(SweepRow.of(predict(strategy, scenario, **(options or {}).get(
                strategy, {}))))
            progress()
    return rows


def write_csv(rows: list[SweepRow], path: Path) -> None:
    fields = list(SweepRow.__dataclass_fields__)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: getattr(r, k) for k in fields})


def write_json(rows: list[SweepRow], path: Path, meta: dict[str, Any]) -> None:
    data = {"meta": meta, "rows": [{k: getattr(r, k) for k in SweepRow.__dataclass_fields__}
                                   for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")


def plot(rows: list[SweepRow], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    for strategy in dict.fromkeys(r.strategy for r in rows):
        mine = [r for r in rows if r.strategy == strategy]
        xs = [r.workers for r in mine]
        ax1.plot(xs, [r.throughput_samples_per_s for r in mine], marker="o", label=strategy)
        ax2.plot(xs, [r.speedup_vs_1_worker / r.workers for r in mine], marker="o",
                 label=strategy)
        ax3.plot(xs, [r.peak_memory_GiB for r in mine], marker="o", label=strategy)
        oom = [r for r in mine if r.oom]
        ax3.scatter([r.workers for r in oom], [r.peak_memory_GiB for r in oom], marker="x",
                    s=80, color="red", zorder=5)
    for ax, ylabel in ((ax1, "throughput (samples/s)"), (ax2, "scaling efficiency "
                       "(speedup / workers)"), (ax3, "peak memory per device (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log")
    ax1.legend()
    if any(r.oom for r in rows):
        ax3.set_title("x = out of memory", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
