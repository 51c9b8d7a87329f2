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

Over repeats: the median and its noise floor: the spread (max − min) / median and a robust
SD, 1.4826 x MAD / median (measure/protocol.py `noise_floor`). A failed run is
left out and listed, never averaged in. Error = (predicted − measured) / measured.
Staleness distributions are compared by the Wasserstein-1 distance (earth mover's distance,
scipy.stats.wasserstein_distance) between predicted and measured values, in versions: the
mean number of versions each update's staleness must move to turn one distribution into the
other (0: the same distribution).

Headlines count a quantity only where it can be wrong (`counts`): staleness for SSP and for
asynchronous PS with workers of different speeds (a synchronous PS is 0 by construction, and
an asynchronous PS with one gradient in flight per worker has a mean staleness of N − 1
whatever its implementation); for asynchronous PS the pooled mean is N − 1 even with
stragglers, so what is compared there is each worker's own mean staleness. Peak memory is
counted only where the model's memory differs from a calibration (set A) run's
(`memory_twin`): an identical one is in-sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import scipy.stats

from measure.cpu_meter import cpu_use, thread_cores
from measure.protocol import noise_floor
from perfmodel import strategies as strategy_records

LARGE_ERROR = 0.15                  # errors beyond this get a diagnosis in the report
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "other")
QUANTITIES = ("throughput", "step_time", "peak_memory", "staleness_mean")
# a PS server's phases per update (measure/runs/ps.py `record_update`), and the model's
# counterpart of each (perfmodel/compare/run.py `model_server_phases`)
SERVER_PHASES = {"recv_s": "receive (wait + push)", "update_s": "apply + pack",
                 "reply_s": "reply (pull)"}
_RECORDED = ("recv_s", "apply_s", "pack_s", "reply_s")


class CountedStaleness(NamedTuple):
    """The staleness a headline counts for one PS row (`Comparison.staleness_counted`)."""

    error: float
    predicted: float
    measured: float
    interval: tuple[float, float] | None    # 90 % for the median of the runs, if any


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


def steady_staleness_by_worker(updates: Sequence[Any], warmup_steps: int
                               ) -> dict[int, float]:
    """Each worker's mean staleness over the steady window (see `steady_staleness`)."""
    if not updates:
        return {}
    worker, step, time_s, tau = _columns(updates)
    keep = steady_mask(worker, step, time_s, warmup_steps)
    return {int(w): float(tau[keep & (worker == w)].mean())
            for w in np.unique(worker[keep])}


def server_phases(updates: Sequence[dict[str, Any]], warmup_steps: int) -> dict[str, float]:
    """The mean of each server phase (SERVER_PHASES, seconds) over the steady window's
    updates: the server's time per update, phase by phase (a mean, not a median: an SSP
    update releases no reply most of the time and several at once now and then); {} where
    the run did not record them (runs before the phases were)."""
    rows = [u for u in updates if all(u.get(k) is not None for k in _RECORDED)]
    if not rows:
        return {}
    worker, step, time_s, _ = _columns(rows)
    keep = steady_mask(worker, step, time_s, warmup_steps)
    if not keep.any():
        return {}
    phase = {k: np.array([u[k] for u in rows], dtype=float)[keep] for k in _RECORDED}
    phase["update_s"] = phase["apply_s"] + phase["pack_s"]
    return {k: float(np.mean(phase[k])) for k in SERVER_PHASES}


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
    staleness_by_worker: dict[int, float] = field(default_factory=dict)
    memory_method: str = ""
    own_cores: float | None = None      # cores the run's processes kept busy (cpu_use)
    host_cores: float | None = None     # cores busy on the whole host over the same steps
    server_phases: dict[str, float] = field(default_factory=dict)   # PS: `server_phases`
    thread_cores: float | None = None   # of own_cores, the training threads' (thread_cores)


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
    peak, parts, method = None, None, ""
    memory = [m for m in run.table("memory") if not (ps and m["rank"] == 0)]
    if memory and not timed_wait:
        top = max(memory, key=lambda m: m["peak_bytes"] or 0)
        peak = float(top["peak_bytes"])
        parts = {p: float(top.get(f"{p}_bytes") or 0) for p in MEMORY_PARTS}
        method = str(top.get("method") or "")
    staleness = steady_staleness(run.table("updates"), warmup_steps) if ps else np.zeros(0)
    by_worker = steady_staleness_by_worker(run.table("updates"), warmup_steps) if ps else {}
    own_cores, host_cores = cpu_use(run.table("summaries"))
    return MeasuredRun(run_id=run.row.id, throughput_samples_per_s=throughput,
                       step_time_s=float(wall.mean()), compute_s=float(compute.mean()),
                       comm_wait_s=float(comm.mean()), peak_memory_bytes=peak,
                       memory_parts=parts, staleness=tuple(float(v) for v in staleness),
                       per_rank=per_rank, staleness_by_worker=by_worker,
                       memory_method=method, own_cores=own_cores, host_cores=host_cores,
                       thread_cores=thread_cores(run.table("summaries")),
                       server_phases=server_phases(run.table("updates"), warmup_steps)
                       if ps else {})


@dataclass(frozen=True, kw_only=True)
class Quantity:
    """One quantity of one configuration: predicted, measured median and its spread."""

    predicted: float | None
    measured: float | None = None       # median over the successful repeats
    low: float | None = None            # min over repeats
    high: float | None = None           # max over repeats
    interval: tuple[float, float] | None = None     # the prediction interval, if stated
    values: tuple[float, ...] = ()      # every successful repeat's value (the noise floor)

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
    def robust_sd(self) -> float | None:
        """1.4826 x MAD / median over repeats: a robust relative SD (measure/protocol.py)."""
        floor = noise_floor(self.values)
        return None if floor is None else floor.robust_sd_rel

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
                        high=max(v), interval=interval, values=tuple(v))


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
    speed: tuple[float, ...] = ()       # relative worker speeds; () = all 1
    # worker -> (predicted, measured median over repeats) mean staleness; {} = not recorded
    staleness_per_worker: dict[int, tuple[float | None, float | None]] = field(
        default_factory=dict)
    memory_method: str = ""             # how the measured peak was taken (the tracker)
    memory_twin: str = ""               # the set-A run whose modelled memory is the same
    # medians over repeats of the cores the run's own processes and the whole host kept busy
    # during the timed steps (cpu_use); None where not recorded
    own_cores: float | None = None
    host_cores: float | None = None
    thread_cores: float | None = None   # of own_cores, the training threads' (thread_cores)
    # PS: phase -> (model, measured median over repeats) seconds per update (SERVER_PHASES)
    server_phases: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # PS predicted over several seeds: the pooled mean staleness's (min, max) over them
    staleness_seed_range: tuple[float, float] | None = None
    # ... and each speed class's 90 % interval for the median over the runs (run.py
    # `staleness_intervals`: from the seeds' own spread); {} = none
    staleness_speed_intervals: dict[float, tuple[float, float] | None] = field(
        default_factory=dict)

    @property
    def other_cores(self) -> float | None:
        """Cores other work kept busy beside the run (host − own, at least 0)."""
        if self.own_cores is None or self.host_cores is None:
            return None
        return max(self.host_cores - self.own_cores, 0.0)

    @property
    def staleness_can_be_wrong(self) -> str:
        """Why this configuration's staleness says something about the model ('' = it
        cannot be wrong: not a PS, a synchronous PS, or homogeneous asynchronous PS)."""
        rec = strategy_records.get(self.strategy)
        if not rec.is_ps or rec.synchronous:
            return ""
        if rec.ps_mode == "ssp":
            return "SSP: the bound holds fast workers back"
        if len(set(self.speed)) > 1:
            return "asynchronous, workers of different speeds: staleness differs by speed"
        return ""

    @property
    def staleness_worst_worker(self) -> tuple[int, float, float, float] | None:
        """(worker, predicted, measured, error) of the worker whose mean staleness the model
        misses most; None without per-worker means."""
        found = [(w, p, m, relative_error(p, m)) for w, (p, m) in
                 sorted(self.staleness_per_worker.items())]
        found = [f for f in found if f[3] is not None]
        return max(found, key=lambda f: abs(f[3])) if found else None

    @property
    def staleness_by_speed(self) -> dict[float, tuple[float, float]]:
        """speed -> (predicted, measured) mean staleness over the workers of that speed.
        Workers of one speed are exchangeable in the configuration: after a synchronisation
        releases them all, which of them pushes first follows the order the server replied
        in (by worker index, in the model and in measure/runs/ps.py), reshuffled by step-time
        noise, which the model carries only as its calibrated jitter. So one of them's own
        mean tests how often that order reshuffles; the mean over the class tests how long
        the bound holds them (seen: SSP's fast workers 0.45/1.36/2.18 predicted,
        0.82/1.55/1.91 measured; as a class 1.33 against 1.43)."""
        groups: dict[float, list[tuple[float, float]]] = {}
        for w, (p, m) in self.staleness_per_worker.items():
            if p is not None and m is not None:
                speed = self.speed[w] if w < len(self.speed) else 1.0
                groups.setdefault(speed, []).append((p, m))
        return {s: (float(np.mean([p for p, _ in g])), float(np.mean([m for _, m in g])))
                for s, g in sorted(groups.items())}

    @property
    def staleness_worst_speed(self) -> tuple[float, float, float, float] | None:
        """(speed, predicted, measured, error) of the speed class whose mean staleness the
        model misses most; None without per-worker means."""
        found = [(s, p, m, relative_error(p, m)) for s, (p, m) in
                 self.staleness_by_speed.items()]
        found = [f for f in found if f[3] is not None]
        return max(found, key=lambda f: abs(f[3])) if found else None

    @property
    def staleness_counted(self) -> CountedStaleness | None:
        """The staleness a headline counts: the worst speed class's mean, and under SSP the
        pooled mean where it misses more; None where staleness cannot be wrong or was not
        recorded (`counts` says why)."""
        if not self.staleness_can_be_wrong:
            return None
        q, worst = self.quantities["staleness_mean"], self.staleness_worst_speed
        found = []
        if worst is not None:
            found.append(CountedStaleness(worst[3], worst[1], worst[2],
                                          self.staleness_speed_intervals.get(worst[0])))
        if strategy_records.get(self.strategy).ps_mode == "ssp" and q.error is not None:
            found.append(CountedStaleness(q.error, q.predicted, q.measured, q.interval))
        return max(found, key=lambda f: abs(f.error)) if found else None

    @property
    def staleness_inside(self) -> bool | None:
        """Whether the counted staleness's measured value lies in its interval."""
        counted = self.staleness_counted
        if counted is None or counted.interval is None:
            return None
        low, high = counted.interval
        return low <= counted.measured <= high

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
    intervals = predicted.get("staleness_intervals") or {}
    meas_tau = tuple(v for m in measured for v in m.staleness)
    q = {
        "throughput": Quantity.of(predicted["throughput_samples_per_s"],
                                  [m.throughput_samples_per_s for m in measured], thr_iv),
        "step_time": Quantity.of(predicted["step_time_s"], [m.step_time_s for m in measured],
                                 step_iv),
        "peak_memory": Quantity.of(None if timed else predicted["peak_memory_bytes"],
                                   [m.peak_memory_bytes for m in measured]),
        "staleness_mean": Quantity.of(
            _predicted_staleness(predicted, pred_tau) if ps else None,
            [float(np.mean(m.staleness)) for m in measured if m.staleness] if ps else [],
            _pair(intervals.get("pooled"))),
    }
    pred_w = {int(w): float(v) for w, v in
              (predicted.get("staleness_worker_means") or {}).items()}
    meas_w: dict[int, list[float]] = {}
    for m in measured:
        for w, v in m.staleness_by_worker.items():
            meas_w.setdefault(w, []).append(v)
    per_worker = {w: (pred_w.get(w), float(np.median(meas_w[w])) if w in meas_w else None)
                  for w in sorted(set(pred_w) | set(meas_w))} if ps else {}
    methods = sorted({m.memory_method for m in measured if m.memory_method})
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
        per_rank={} if best is None else best.per_rank,
        speed=tuple(float(v) for v in predicted.get("speed") or ()),
        staleness_per_worker=per_worker, memory_method="; ".join(methods),
        own_cores=_median_of(m.own_cores for m in measured),
        host_cores=_median_of(m.host_cores for m in measured),
        thread_cores=_median_of(m.thread_cores for m in measured),
        server_phases=_phases(predicted.get("server_phases_s") or {}, measured) if ps else {},
        staleness_seed_range=seed_range(predicted),
        staleness_speed_intervals={float(k.split()[1]): _pair(v) for k, v in intervals.items()
                                   if k.startswith("speed ")})


def _pair(v) -> tuple[float, float] | None:
    return None if v is None else (float(v[0]), float(v[1]))


def seed_range(predicted: dict[str, Any]) -> tuple[float, float] | None:
    """The pooled mean staleness's (min, max) over the seeds a record was predicted at."""
    found = (predicted.get("seed_range") or {}).get("staleness_mean")
    return (float(found[0]), float(found[1])) if found else None


def _predicted_staleness(predicted: dict[str, Any], values: tuple[float, ...]) -> float | None:
    """The predicted pooled mean staleness: the record's own (over several seeds, the median
    of each seed's mean, as the measured side takes the median of each run's), else the
    mean of its values."""
    if predicted.get("staleness_mean") is not None:
        return float(predicted["staleness_mean"])
    return float(np.mean(values)) if values else None


def _phases(model: dict[str, float], measured: Sequence[MeasuredRun]
            ) -> dict[str, tuple[float | None, float | None]]:
    seen = [m.server_phases for m in measured if m.server_phases]
    if not seen and not model:
        return {}
    return {k: (model.get(k), _median_of(s[k] for s in seen)) for k in SERVER_PHASES}


def _median_of(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


@dataclass(frozen=True, kw_only=True)
class Headline:
    """Summary of one quantity over the configurations where it can be wrong (`counts`)."""

    quantity: str
    count: int
    median_abs: float | None
    max_abs: float | None
    worst: str                          # key of the configuration with the largest error
    inside: int                         # measured medians inside their prediction interval
    with_interval: int
    noise_median: float | None          # median run-to-run spread, (max − min) / median
    half_width_median: float | None = None  # median interval half-width / prediction
    worst_error: float | None = None    # the signed error of `worst`
    left_out: tuple[str, ...] = ()      # configurations whose value here cannot be wrong
    noise_robust_sd_median: float | None = None     # median of 1.4826 x MAD / median


def counts(r: Comparison, quantity: str) -> tuple[float | None, str]:
    """(the error a headline counts for `r`, why it is left out when it is None)."""
    q = r.quantities[quantity]
    if quantity == "staleness_mean":
        if q.predicted is None and q.measured is None:
            return None, ""
        if not r.staleness_can_be_wrong:
            return None, "cannot be wrong (synchronous, or asynchronous with equal workers)"
        counted = r.staleness_counted   # asynchronous: the pooled mean is N − 1 regardless
        if counted is None:
            return None, ("not measured" if strategy_records.get(r.strategy).ps_mode == "ssp"
                          else "per-worker staleness not recorded")
        return counted.error, ""
    if quantity == "peak_memory" and r.memory_twin and q.error is not None:
        return None, f"memory the same as set A's {r.memory_twin} (in-sample)"
    return q.error, ""


def half_width(q: Quantity) -> float | None:
    """The prediction interval's half-width relative to the prediction."""
    if q.interval is None or not q.predicted:
        return None
    return (q.interval[1] - q.interval[0]) / 2 / abs(q.predicted)


def headline(rows: Sequence[Comparison], quantity: str, mode: str | None = None) -> Headline:
    chosen = [r for r in rows if mode is None or r.mode == mode]
    pairs, left = [], []
    for r in chosen:
        err, why = counts(r, quantity)
        if err is not None:
            pairs.append((r.key, r.quantities[quantity], err))
        elif why:
            left.append(f"{r.key}: {why}")
    errors = np.array([abs(e) for _, _, e in pairs])
    spreads = [qq.spread for _, qq, _ in pairs if qq.spread is not None]
    robust = [qq.robust_sd for _, qq, _ in pairs if qq.robust_sd is not None]
    if quantity == "staleness_mean":       # the counted quantity's own interval (`counts`)
        by_key = {r.key: r for r in chosen}
        counted = [by_key[k].staleness_counted for k, _, _ in pairs]
        flags = [f for k, _, _ in pairs if (f := by_key[k].staleness_inside) is not None]
        widths = [(c.interval[1] - c.interval[0]) / 2 / abs(c.predicted) for c in counted
                  if c is not None and c.interval is not None and c.predicted]
    else:
        flags = [qq.inside for _, qq, _ in pairs if qq.inside is not None]
        widths = [w for _, qq, _ in pairs if (w := half_width(qq)) is not None]
    worst = int(errors.argmax()) if pairs else None
    return Headline(
        quantity=quantity, count=len(pairs),
        median_abs=float(np.median(errors)) if pairs else None,
        max_abs=float(errors.max()) if pairs else None,
        worst=pairs[worst][0] if pairs else "",
        inside=sum(flags), with_interval=len(flags),
        noise_median=float(np.median(spreads)) if spreads else None,
        half_width_median=float(np.median(widths)) if widths else None,
        worst_error=float(pairs[worst][2]) if pairs else None, left_out=tuple(left),
        noise_robust_sd_median=float(np.median(robust)) if robust else None)
