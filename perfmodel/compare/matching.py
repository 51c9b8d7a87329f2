"""Runs to measured numbers, predictions to the same numbers, and the errors between them.

Measured, per run (measure/store.py tables), over the timed steps only:
- throughput: DDP/FSDP: the run's own summary (rank 0: samples over the slowest rank's
  time); PS: `steady_throughput` of the server's updates, the same rule as the prediction's;
- step time: the mean `wall_s` of every training rank's timed steps; its breakdown the mean
  `compute_s` and `comm_wait_s` (communication and waiting the loop stood still for);
- peak memory: the largest training rank's `peak_bytes` (MemTracker/FSDPMemTracker on CPU),
  with that rank's parts; not compared for timed-wait runs, whose model computes nothing;
- staleness (PS): every update of a timed step applied before the first worker's last
  update (`steady_mask`): at the very end fewer workers remain and staleness falls, a tail
  the server's own summary also leaves out; the same window is applied to the prediction.

Over repeats: the median and its spread (min and max, the noise floor). A failed run is
left out and listed, never averaged in. Error = (predicted − measured) / measured.
Staleness distributions are compared by the Wasserstein-1 distance (earth mover's distance,
scipy.stats.wasserstein_distance) between predicted and measured values, in versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.stats

LARGE_ERROR = 0.15                  # errors beyond this get a diagnosis in the report
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "other")
QUANTITIES = ("throughput", "step_time", "peak_memory", "staleness_mean")


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted − measured) / measured; 0 when both are 0; None when undefined."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / measured


def steady_mask(worker: np.ndarray, step: np.ndarray, time_s: np.ndarray,
                warmup_steps: int) -> np.ndarray:
    """Updates of timed steps applied strictly before the first worker's last update."""
    if worker.size == 0:
        return np.zeros(0, dtype=bool)
    cutoff = min(time_s[worker == w].max() for w in np.unique(worker))
    return (step >= warmup_steps) & (time_s < cutoff)


def _columns(updates: Sequence[Any]) -> tuple[np.ndarray, ...]:
    """(worker, step, time_s, staleness) of update rows (dicts) or UpdateRecords."""
    def get(u, k):
        return u[k] if isinstance(u, dict) else getattr(u, k)
    worker = np.array([get(u, "worker") for u in updates], dtype=int)
    step = np.array([get(u, "step") for u in updates], dtype=int)
    time_s = np.array([get(u, "time_s") for u in updates], dtype=float)
    tau = np.array([get(u, "version_applied") - get(u, "version_read") for u in updates],
                   dtype=float)
    return worker, step, time_s, tau


def steady_staleness(updates: Sequence[Any], warmup_steps: int) -> np.ndarray:
    """Staleness values of the steady window from update rows (dicts) or UpdateRecords."""
    if not updates:
        return np.zeros(0)
    worker, step, time_s, tau = _columns(updates)
    return tau[steady_mask(worker, step, time_s, warmup_steps)]


def steady_throughput(updates: Sequence[Any], warmup_steps: int, batch_size: int
                      ) -> float | None:
    """PS samples per second while every worker is still pushing: the updates applied after
    each worker's last warm-up update and up to the first worker's last update. The same
    rule for measured and predicted updates (a real run gives every worker the same number
    of steps, so a straggler ends alone; the model shares the steps out)."""
    if not updates:
        return None
    worker, step, time_s, _ = _columns(updates)
    cutoff = min(time_s[worker == w].max() for w in np.unique(worker))
    warm = [time_s[(worker == w) & (step < warmup_steps)] for w in np.unique(worker)]
    t0 = max((t.max() for t in warm if t.size), default=float(time_s.min()))
    counted = int(((time_s > t0) & (time_s <= cutoff)).sum())
    if cutoff <= t0 or counted == 0:
        return None
    return counted * batch_size / (cutoff - t0)


@dataclass(frozen=True, kw_only=True)
class MeasuredRun:
    run_id: int
    throughput_samples_per_s: float
    step_time_s: float
    compute_s: float
    comm_wait_s: float
    peak_memory_bytes: float | None
    memory_parts: dict[str, float] | None
    staleness: tuple[float, ...]
    per_rank: dict[int, tuple[float, float]]     # rank -> (mean compute_s, mean comm_wait_s)


def measured_run(run, *, ps: bool, timed_wait: bool, warmup_steps: int) -> MeasuredRun:
    """The measured numbers of one successful run (a measure.store.Run)."""
    steps = [s for s in run.table("steps") if not (ps and s["rank"] == 0)]
    if not steps:
        raise ValueError(f"run {run.row.id} has no step records")
    wall = np.array([s["wall_s"] for s in steps], dtype=float)
    compute = np.array([s["compute_s"] for s in steps], dtype=float)
    comm = np.array([s["comm_wait_s"] for s in steps], dtype=float)
    ranks = np.array([s["rank"] for s in steps])
    per_rank = {int(r): (float(compute[ranks == r].mean()), float(comm[ranks == r].mean()))
                for r in np.unique(ranks)}
    reported = [s["value"] for s in run.table("summaries")
                if s["key"] == "throughput_samples_per_s" and s["rank"] == 0]
    steady = (steady_throughput(run.table("updates"), warmup_steps, int(run.row.batch_size))
              if ps else None)
    if steady is not None:
        throughput = steady
    elif reported:
        throughput = float(reported[0])
    else:                       # each rank's own rate, summed
        throughput = float(sum(
            sum(s["samples"] or 0 for s in steps if s["rank"] == r)
            / sum(s["wall_s"] for s in steps if s["rank"] == r) for r in per_rank))
    peak, parts = None, None
    memory = [m for m in run.table("memory") if not (ps and m["rank"] == 0)]
    if memory and not timed_wait:
        top = max(memory, key=lambda m: m["peak_bytes"] or 0)
        peak = float(top["peak_bytes"])
        parts = {p: float(top.get(f"{p}_bytes") or 0) for p in MEMORY_PARTS}
    staleness = steady_staleness(run.table("updates"), warmup_steps) if ps else np.zeros(0)
    return MeasuredRun(run_id=run.row.id, throughput_samples_per_s=throughput,
                       step_time_s=float(wall.mean()), compute_s=float(compute.mean()),
                       comm_wait_s=float(comm.mean()), peak_memory_bytes=peak,
                       memory_parts=parts, staleness=tuple(float(v) for v in staleness),
                       per_rank=per_rank)


@dataclass(frozen=True, kw_only=True)
class Quantity:
    """One quantity of one configuration: predicted, measured median and its spread."""

    predicted: float | None
    measured: float | None = None       # median over the successful repeats
    low: float | None = None            # min over repeats
    high: float | None = None           # max over repeats
    interval: tuple[float, float] | None = None     # the prediction interval, if stated

    @property
    def error(self) -> float | None:
        return relative_error(self.predicted, self.measured)

    @property
    def spread(self) -> float | None:
        """(max − min) / median over repeats: the run-to-run noise of this measurement."""
        if self.measured in (None, 0) or self.low is None or self.high is None:
            return None
        return (self.high - self.low) / abs(self.measured)

    @property
    def inside(self) -> bool | None:
        if self.interval is None or self.measured is None:
            return None
        return self.interval[0] <= self.measured <= self.interval[1]

    @staticmethod
    def of(predicted: float | None, values: Sequence[float | None],
           interval: tuple[float, float] | None = None) -> Quantity:
        v = [float(x) for x in values if x is not None]
        if not v:
            return Quantity(predicted=predicted, interval=interval)
        return Quantity(predicted=predicted, measured=float(np.median(v)), low=min(v),
                        high=max(v), interval=interval)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One held-out configuration: its prediction, its runs and the errors."""

    key: str
    label: str
    what: str
    strategy: str
    mode: str                           # "real" or "timed-wait"
    workers: int
    run_ids: tuple[int, ...]
    failed: tuple[tuple[int, str], ...]     # (run id, reason): left out
    quantities: dict[str, Quantity]
    staleness_w1: float | None
    predicted_breakdown: dict[str, float]   # compute_s, comm_exposed_s, wait_s
    measured_breakdown: dict[str, float]    # compute_s, comm_wait_s (medians over repeats)
    predicted_memory_parts: dict[str, float] = field(default_factory=dict)
    measured_memory_parts: dict[str, float] | None = None
    predicted_staleness: tuple[float, ...] = ()
    measured_staleness: tuple[float, ...] = ()
    per_rank: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def diagnosis(self) -> str:
        """Which part of the step the model got wrong, where an error exceeds LARGE_ERROR."""
        errors = {q: self.quantities[q].error for q in ("step_time", "throughput")}
        big = {q: e for q, e in errors.items() if e is not None and abs(e) > LARGE_ERROR}
        if not big or not self.measured_breakdown:
            return ""
        p, m = self.predicted_breakdown, self.measured_breakdown
        parts = {"compute": (p["compute_s"], m["compute_s"]),
                 "communication + waiting": (p["comm_exposed_s"] + p["wait_s"],
                                             m["comm_wait_s"])}
        worst = max(parts, key=lambda k: abs(parts[k][0] - parts[k][1]))
        shown = ", ".join(f"{q.replace('_', ' ')} {e:+.0%}" for q, e in big.items())
        detail = "; ".join(f"{k}: model {a * 1e3:.1f} ms vs measured {b * 1e3:.1f} ms"
                           for k, (a, b) in parts.items())
        return f"{shown}: mostly {worst} ({detail})"


def compare(key: str, predicted: dict[str, Any], runs: Sequence, failed: Sequence,
            *, warmup_steps: int) -> Comparison:
    """A Comparison from a prediction (protocol's predicted dict) and the runs of its config.

    `runs` are successful measure.store.Run objects, `failed` (run id, reason) pairs.
    """
    ps = predicted["kind"] == "ps"
    timed = predicted["mode"] == "timed-wait"
    measured = [measured_run(r, ps=ps, timed_wait=timed, warmup_steps=warmup_steps)
                for r in runs]
    interval = predicted.get("step_time_interval_s")
    step_iv = (interval["low"], interval["high"]) if interval else None
    thr_iv = None
    if step_iv:
        t = predicted["throughput_samples_per_s"] * predicted["step_time_s"]
        thr_iv = (t / step_iv[1], t / step_iv[0])
    pred_tau = tuple(predicted.get("staleness_values") or ())
    meas_tau = tuple(v for m in measured for v in m.staleness)
    q = {
        "throughput": Quantity.of(predicted["throughput_samples_per_s"],
                                  [m.throughput_samples_per_s for m in measured], thr_iv),
        "step_time": Quantity.of(predicted["step_time_s"], [m.step_time_s for m in measured],
                                 step_iv),
        "peak_memory": Quantity.of(None if timed else predicted["peak_memory_bytes"],
                                   [m.peak_memory_bytes for m in measured]),
        "staleness_mean": Quantity.of(
            float(np.mean(pred_tau)) if ps and pred_tau else None,
            [float(np.mean(m.staleness)) for m in measured if m.staleness] if ps else []),
    }
    w1 = (float(scipy.stats.wasserstein_distance(pred_tau, meas_tau))
          if ps and pred_tau and meas_tau else None)
    best = min(measured, key=lambda m: abs(m.step_time_s - q["step_time"].measured)) \
        if measured else None
    return Comparison(
        key=key, label=predicted["label"], what=predicted["what"],
        strategy=predicted["strategy"], mode=predicted["mode"], workers=predicted["workers"],
        run_ids=tuple(m.run_id for m in measured), failed=tuple(failed), quantities=q,
        staleness_w1=w1, predicted_breakdown=dict(predicted["breakdown"]),
        measured_breakdown={} if not measured else {
            "compute_s": float(np.median([m.compute_s for m in measured])),
            "comm_wait_s": float(np.median([m.comm_wait_s for m in measured]))},
        predicted_memory_parts=dict(predicted.get("memory_parts") or {}),
        measured_memory_parts=None if best is None else best.memory_parts,
        predicted_staleness=pred_tau, measured_staleness=meas_tau,
        per_rank={} if best is None else best.per_rank)


@dataclass(frozen=True, kw_only=True)
class Headline:
    """Summary of one quantity over the configurations that have it."""

    quantity: str
    count: int
    median_abs: float | None
    max_abs: float | None
    worst: str                          # key of the configuration with the largest error
    inside: int                         # measured medians inside their prediction interval
    with_interval: int
    noise_median: float | None          # median run-to-run spread


def headline(rows: Sequence[Comparison], quantity: str, mode: str | None = None) -> Headline:
    chosen = [r for r in rows if mode is None or r.mode == mode]
    pairs = [(r.key, r.quantities[quantity]) for r in chosen
             if r.quantities[quantity].error is not None]
    errors = np.array([abs(qq.error) for _, qq in pairs])
    spreads = [qq.spread for _, qq in pairs if qq.spread is not None]
    flags = [qq.inside for _, qq in pairs if qq.inside is not None]
    return Headline(
        quantity=quantity, count=len(pairs),
        median_abs=float(np.median(errors)) if pairs else None,
        max_abs=float(errors.max()) if pairs else None,
        worst=pairs[int(errors.argmax())][0] if pairs else "",
        inside=sum(flags), with_interval=len(flags),
        noise_median=float(np.median(spreads)) if spreads else None)
