"""A grid of predictions (strategies x worker counts) as rows, a CSV and a plot; with
membership events or a failure rate, goodput too and a plot of throughput over time."""

from __future__ import annotations

import csv
import json
import multiprocessing
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfmodel.predict import Prediction, predict
from perfmodel.sim.scenario import Scenario

if TYPE_CHECKING:       # sim/elastic.py is imported only when a sweep has elasticity options
    from perfmodel.sim.elastic import ElasticConfig

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
    # with elasticity options (perfmodel/goodput.py); None without
    goodput_samples_per_s: float | None = None
    goodput_fraction: float | None = None
    time_lost_to_restarts_s: float | None = None
    lost_work_s: float | None = None
    series_t_s: tuple[float, ...] = field(default=(), repr=False)    # throughput over time
    series_samples_per_s: tuple[float, ...] = field(default=(), repr=False)

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


def with_elasticity(row: SweepRow, p: Prediction, config: ElasticConfig) -> SweepRow:
    from perfmodel.goodput import predict_elasticity

    s = predict_elasticity(p, config).summary
    return replace(row, goodput_samples_per_s=s.goodput_samples_per_s,
                   goodput_fraction=(s.goodput_samples_per_s / s.throughput_samples_per_s
                                     if s.throughput_samples_per_s > 0 else 0.0),
                   time_lost_to_restarts_s=s.time_lost_to_restarts_s,
                   lost_work_s=s.lost_work_s, series_t_s=s.series_t_s,
                   series_samples_per_s=s.series_samples_per_s)


def sweep_point(strategy: str, scenario: Scenario, options: dict[str, Any],
                elastic: ElasticConfig | None) -> SweepRow:
    """One row of a sweep. A pure function of its arguments (each scenario carries its seed),
    so it gives the same row in this process or in a pool's worker."""
    p = predict(strategy, scenario, **options)
    row = SweepRow.of(p)
    return row if elastic is None else with_elasticity(row, p, elastic)


def pool_context() -> multiprocessing.context.BaseContext:
    """'fork' where the platform has it: the workers inherit the imported modules instead
    of importing them again (~0.3 s each), and nothing of ours holds a lock or runs a
    thread when the pool starts; 'spawn' elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_sweep(scenarios: Iterable[Scenario], strategies: Iterable[str],
              options: dict[str, dict[str, Any]] | None = None,
              progress: Callable[[], None] = lambda: None,
              elastic: ElasticConfig | None = None, jobs: int = 1,
              while_waiting: Callable[[], None] = lambda: None) -> list[SweepRow]:
    """Predict every (strategy, scenario) pair, strategy-major; `options` maps a strategy
    to its options. With `elastic`, each row also gets its goodput under those membership
    events (the same events or failure draws at every point: common random numbers).

    `jobs` > 1 runs the points in a pool of that many processes, largest simulations first
    (worker count x steps: the longest run starts at once instead of last); the rows come
    back in the same order and are the same rows as a serial run. `progress` is called once
    per finished point either way; `while_waiting` once, in this process, while the pool
    works (the command imports matplotlib there)."""
    scenarios = list(scenarios)
    points = [(s, sc) for s in strategies for sc in scenarios]
    opts = options or {}
    if jobs <= 1 or len(points) <= 1:
        rows = []
        for strategy, scenario in points:
            rows.append(sweep_point(strategy, scenario, opts.get(strategy, {}), elastic))
            progress()
        return rows
    order = sorted(range(len(points)),
                   key=lambda i: -points[i][1].workers * points[i][1].steps)   # stable
    found: list[SweepRow | None] = [None] * len(points)
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(points)), mp_context=pool_context())
    try:
        futures = {pool.submit(sweep_point, points[i][0], points[i][1],
                               opts.get(points[i][0], {}), elastic): i for i in order}
        while_waiting()
        for future in as_completed(futures):
            found[futures[future]] = future.result()
            progress()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)     # an error: do not finish the rest
        raise
    pool.shutdown(wait=True)
    assert all(row is not None for row in found)
    return found     # type: ignore[return-value]


def load_pyplot():
    """matplotlib.pyplot on the file-only Agg backend (~0.5-1 s to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


SERIES_FIELDS = ("series_t_s", "series_samples_per_s")


def write_csv(rows: list[SweepRow], path: Path) -> None:
    fields = [f for f in SweepRow.__dataclass_fields__ if f not in SERIES_FIELDS]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: getattr(r, k) for k in fields})


def write_json(rows: list[SweepRow], path: Path, meta: dict[str, Any]) -> None:
    data = {"meta": meta, "rows": [{k: (list(v) if isinstance(v := getattr(r, k), tuple)
                                        else v) for k in SweepRow.__dataclass_fields__}
                                   for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")


def plot(rows: list[SweepRow], path: Path, title: str) -> None:
    plt = load_pyplot()

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
    # from zero, with headroom: a few per cent must not look dramatic
    ax2.set_ylim(0, 1.1 * max([1.0] + [r.speedup_vs_1_worker / r.workers for r in rows]))
    ax3.set_ylim(0, 1.1 * max([r.peak_memory_GiB for r in rows] + [1e-9]))
    if any(r.oom for r in rows):
        ax3.set_title("x = out of memory", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_over_time(rows: list[SweepRow], path: Path, title: str) -> None:
    """Goodput against workers (throughput dotted), and throughput over the run at the
    largest worker count: where restarts stop a gang-scheduled job and a PS carries on."""
    plt = load_pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    top = max(r.workers for r in rows)
    for strategy in dict.fromkeys(r.strategy for r in rows):
        mine = [r for r in rows if r.strategy == strategy]
        xs = [r.workers for r in mine]
        line, = ax1.plot(xs, [r.goodput_samples_per_s for r in mine], marker="o",
                         label=strategy)
        ax1.plot(xs, [r.throughput_samples_per_s for r in mine], ls=":",
                 color=line.get_color())
        last = next(r for r in mine if r.workers == top)
        ax2.plot([t / 3600 for t in last.series_t_s], last.series_samples_per_s,
                 color=line.get_color(), label=strategy)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("workers")
    ax1.set_ylabel("goodput (samples/s; dotted: throughput)")
    ax2.set_xlabel("hours into the run")
    ax2.set_ylabel(f"throughput at {top} workers (samples/s)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
