"""The steps of one comparison: predict set B, measure it, and pair runs with predictions.

Predictions come first and are plain JSON-able dicts (`predicted_record`), written to the
report folder before any run starts, so nothing measured can leak into them. Runs are
interleaved (every configuration once, then every one again, ...) so that a change in the
machine's load over the session spreads over all configurations instead of hitting one.
The 1-minute load average before each run is kept: this machine's 2 cores may be shared.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from measure import session
from measure.protocol import RunProtocol
from measure.session import Progress
from perfmodel import strategies as strategy_records
from perfmodel.cluster import ClusterProfile
from perfmodel.compare.anchor import anchor_config
from perfmodel.compare.matching import (
    MEMORY_PARTS,
    Comparison,
    compare,
    steady_staleness,
    steady_staleness_by_worker,
    steady_throughput,
)
from perfmodel.compare.protocol import (
    MODEL_SEEDS,
    WARMUP_STEPS,
    HeldOut,
    model_options,
    run_config,
    scenario_for,
    timed_steps,
    with_waits_of,
)
from perfmodel.errors import PerfmodelError
from perfmodel.predict import Prediction, predict
from perfmodel.sim import ps as ps_sim
from perfmodel.uncertainty import CalibrationErrors, interval_for, median_of_runs_interval

TIMELINE_STEPS = 2          # steady steps drawn in the timeline figure


def predicted_record(h: HeldOut, p: Prediction, errors: CalibrationErrors | None,
                     more: Sequence[Prediction] = (), *, repeats: int = 1) -> dict[str, Any]:
    """Everything the report needs from one prediction, as plain JSON-able values; with
    `more` (the same configuration at other seeds), the throughput, step time, its interval
    and the staleness are the medians over all of them (`over_seeds`). The interval is for
    the median of `repeats` runs, as the measured side takes."""
    if more:
        return over_seeds(predicted_record(h, p, errors, repeats=repeats), [p, *more], h,
                          errors, repeats=repeats)
    s = p.summary
    worker = p.memory["worker"]
    other = worker.comm_buffers_bytes + worker.framework_bytes + worker.overhead_bytes
    parts = {"params": worker.params_bytes, "grads": worker.grads_bytes,
             "optimizer": worker.optimizer_bytes, "activations": worker.activations_bytes,
             "other": other}
    throughput, step_s, tau, by_worker = _point(h, p)
    return {
        "key": h.key, "label": h.label, "what": h.what, "strategy": h.strategy,
        "kind": h.kind, "mode": h.mode, "workload": h.workload, "workers": h.workers,
        "batch_size": h.batch, "speed": list(h.speed), "link_rate_Gbps": h.link_rate_Gbps,
        "model_options": p.options, "seed": p.scenario.seed, "steps": p.scenario.steps,
        "throughput_samples_per_s": throughput,
        "step_time_s": step_s,
        "breakdown": {"compute_s": s.compute_s, "comm_exposed_s": s.comm_exposed_s,
                      "wait_s": s.wait_s},
        "step_time_interval_s": _interval(step_interval(p, errors, step_s, repeats=repeats)),
        "peak_memory_bytes": worker.peak_bytes,
        "memory_parts": {k: float(parts[k]) for k in MEMORY_PARTS},
        "staleness_values": [float(v) for v in tau],
        "staleness_mean": float(tau.mean()) if tau.size else None,
        "staleness_worker_means": {str(w): v for w, v in by_worker.items()},
        "timeline": timeline(p),
        "server_phases_s": model_server_phases(p) if h.kind == "ps" else {},
    }


def _point(h: HeldOut, p: Prediction) -> tuple[float, float, np.ndarray, dict[int, float]]:
    """(throughput, step time, steady staleness values, per-worker mean staleness) of one
    prediction; a PS's throughput counted over its updates while every worker pushes
    (matching.steady_throughput, as the measured side), its staleness over the steady
    window; no staleness elsewhere."""
    s = p.summary
    if h.kind != "ps":
        return s.throughput_samples_per_s, s.step_time_s.mean, np.zeros(0), {}
    thr = (steady_throughput(p.result.updates, WARMUP_STEPS, h.batch)
           or s.throughput_samples_per_s)
    return (thr, s.step_time_s.mean, steady_staleness(p.result.updates, WARMUP_STEPS),
            steady_staleness_by_worker(p.result.updates, WARMUP_STEPS))


def _interval(iv) -> dict[str, float] | None:
    return None if iv is None else {"low": iv.low_s, "high": iv.high_s, "coverage": iv.coverage}


def over_seeds(record: dict[str, Any], runs: Sequence[Prediction], h: HeldOut,
               errors: CalibrationErrors | None, *, repeats: int = 1) -> dict[str, Any]:
    """`record` (the first seed's) with the medians over `runs` (one PS configuration at
    several seeds) in place of its point predictions, as the measured side takes the median
    over repeats: throughput, step time (and the interval around it), the pooled mean
    staleness and each worker's mean; the staleness distribution pools every seed's values.
    `seed_range` keeps each quantity's min and max over the seeds. The step's breakdown, the
    timeline, the memory and the server phases stay the first seed's."""
    points = [_point(h, p) for p in runs]
    thr = [x[0] for x in points]
    step = [x[1] for x in points]
    means = [float(x[2].mean()) for x in points if x[2].size]
    workers = sorted({w for x in points for w in x[3]})
    by_worker = {w: [x[3][w] for x in points if w in x[3]] for w in workers}
    out = dict(record)
    out["throughput_samples_per_s"] = float(np.median(thr))
    out["step_time_s"] = float(np.median(step))
    out["step_time_interval_s"] = _interval(step_interval(runs[0], errors, out["step_time_s"],
                                                          repeats=repeats))
    out["staleness_values"] = [float(v) for x in points for v in x[2]]
    out["staleness_mean"] = float(np.median(means)) if means else None
    out["staleness_worker_means"] = {str(w): float(np.median(v)) for w, v in by_worker.items()}
    out["staleness_intervals"] = staleness_intervals(points, h, repeats)
    out["seeds"] = [p.scenario.seed for p in runs]
    out["seed_range"] = {
        "throughput_samples_per_s": [min(thr), max(thr)], "step_time_s": [min(step), max(step)],
        "staleness_mean": [min(means), max(means)] if means else None,
        "staleness_worker_means": {str(w): [min(v), max(v)] for w, v in by_worker.items()}}
    return out


def staleness_intervals(points, h: HeldOut, repeats: int) -> dict[str, list[float]]:
    """90 % intervals for the median of `repeats` runs (uncertainty.median_of_runs_interval)
    from the seeds' spread: "pooled" for the pooled mean staleness, and each speed class's
    mean ("speed 0.5"); only from seeds where every worker pushed in the steady window."""
    full = [x for x in points if x[2].size and len(x[3]) == h.workers]
    if h.kind != "ps" or len(full) < 2:
        return {}
    speeds = [h.speed[w] if w < len(h.speed) else 1.0 for w in range(h.workers)]
    out = {"pooled": list(median_of_runs_interval([[x[2].mean()] for x in full], repeats))}
    for s in sorted(set(speeds)):
        cols = [w for w in range(h.workers) if speeds[w] == s]
        out[f"speed {s:g}"] = list(median_of_runs_interval(
            [[x[3][w] for w in cols] for x in full], repeats))
    return out


def model_server_phases(p: Prediction) -> dict[str, float]:
    """The model's counterpart of each measured server phase (matching.SERVER_PHASES) for
    one server holding the whole model, before any core-sharing stretch or queueing: a
    push and a pull alone (perfmodel/sim/ps.py `message_s`: a serial server's measured
    messages, else a one-way transfer on the server's link), and the apply with its pack
    (perfmodel/sim/ps.py `server_apply_s`)."""
    cluster, wl = p.scenario.cluster, p.scenario.workload
    return {"recv_s": ps_sim.message_s(cluster, "push", wl.params * wl.precision_spec.grad_bytes),
            "update_s": ps_sim.server_apply_s(cluster, wl, wl.params),
            # a synchronous server replies to each of its workers in turn, per version
            "reply_s": ps_sim.message_s(cluster, "pull", wl.params * wl.precision_spec.param_bytes)
            * (p.scenario.workers if strategy_records.get(p.strategy).synchronous else 1)}


def step_interval(p: Prediction, errors: CalibrationErrors | None,
                  point_s: float | None = None, *, repeats: int = 1):
    """The step time's prediction interval from the calibration's errors (None without):
    step-level when the profile has the fitted runs' step residual (perfmodel/uncertainty.py),
    the communication-only one for a timed wait, whose compute is the model's own; around
    `point_s` where given (a median over seeds), else `p`'s own step; for the median of
    `repeats` runs (perfmodel/uncertainty.py)."""
    if errors is None:
        return None
    s = p.summary
    return interval_for(s.step_time_s.mean if point_s is None else point_s, errors,
                        compute_share=s.compute_s / s.step_time_s.mean,
                        compute_exact=p.scenario.cluster.timed_wait, repeats=repeats)[0]


def timeline(p: Prediction) -> dict[str, Any]:
    """Two steady steps of the simulation: each worker's compute / exposed comm / wait, and
    the transfers on the links in that window (for the timeline figure)."""
    steps = [r for r in p.result.steps if r.step >= WARMUP_STEPS]
    if not steps:
        return {"window": [0.0, 0.0], "steps": [], "comms": []}
    if p.scenario.workers == 1 or strategy_records.get(p.strategy).synchronous:
        first = min(r.step for r in steps)
        chosen = [r for r in steps if first <= r.step < first + TIMELINE_STEPS]
        t0, t1 = min(r.start_s for r in chosen), max(r.end_s for r in chosen)
    else:                       # async: a window as long as two mean steps
        t0 = min(r.start_s for r in steps)
        t1 = t0 + TIMELINE_STEPS * float(np.mean([r.end_s - r.start_s for r in steps]))
        chosen = [r for r in steps if r.start_s < t1 and r.end_s > t0]
    comms = [c for c in p.result.comms if c.end_s > t0 and c.start_s < t1
             and c.link in ("", "intra_node", "inter_node", "server0")]
    return {"window": [t0, t1],
            "steps": [[r.worker, r.start_s, r.compute_s, r.comm_exposed_s, r.wait_s]
                      for r in chosen],
            "comms": [[c.kind, c.worker, c.start_s, c.end_s] for c in comms]}



def predict_all(held_out: tuple[HeldOut, ...], profile: ClusterProfile,
                errors: CalibrationErrors | None, *, steps: int, seed: int,
                cpu: bool = True, repeats: int = 1,
                ps_steps: int | None = None,
                waits: ClusterProfile | None = None) -> list[dict[str, Any]]:
    """Every held-out configuration's predicted record, `steps` timed steps a run
    (`ps_steps` for a PS row where given: protocol.PS_STEPS); intervals for the median of
    `repeats` runs. `waits`: the profile whose waits the timed-wait runs slept, where it is
    not `profile` (protocol.with_waits_of)."""
    out = []
    for h in held_out:
        seeds = range(seed, seed + (MODEL_SEEDS if h.kind == "ps" else 1))
        n = timed_steps(h, steps, ps_steps)
        used = with_waits_of(profile, waits) if waits is not None and h.timed_wait else profile
        p, *more = [predict(h.strategy, scenario_for(h, used, steps=n, seed=s),
                            **model_options(h, cpu=cpu)) for s in seeds]
        out.append(predicted_record(h, p, errors, more, repeats=repeats))
    return out


@dataclass
class Measurements:
    """Run ids per configuration key, what failed, what was skipped, and the machine load."""

    ok: dict[str, list[int]] = field(default_factory=dict)
    failed: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    load: dict[int, float] = field(default_factory=dict)     # run id -> 1-min load average
    protocol: dict[int, dict] = field(default_factory=dict)  # run id -> measure/protocol.py
    anchor: list[int] = field(default_factory=list)         # the drift anchor's ok runs


def measure_all(held_out: tuple[HeldOut, ...], profile: ClusterProfile, store, *,
                repeats: int, steps: int, seed: int, max_time_s: float | None,
                progress: Progress, protocol: RunProtocol | None = None,
                anchor=None, ps_steps: int | None = None) -> Measurements:
    """Run every configuration `repeats` times, interleaved, `steps` timed steps a run
    (`ps_steps` for a PS row where given); store each run at once
    (measure/session.py), each after the `protocol`'s wait for a quiet machine and with its
    ranks pinned where there are cores enough (measure/protocol.py). `anchor`: a set-A
    measurement (calibration/suite.py) run again at the start of every round, the drift
    anchor (perfmodel/compare/anchor.py).

    `progress.start(label, total)` starts one run's progress and returns its update callback;
    `progress.finish(line)` reports the run. A failed run is stored, listed and not retried;
    Ctrl-C stores the run and raises KeyboardInterrupt.
    """
    found = Measurements()
    for repeat in range(1, repeats + 1):
        if anchor is not None:
            _run_anchor(anchor, repeat, repeats, store, found, progress=progress,
                        max_time_s=max_time_s, protocol=protocol)
        for h in held_out:
            if h.key in found.skipped:
                continue
            if h.link_rate_Gbps and os.geteuid() != 0:
                found.skipped[h.key] = ("the link-rate cap needs root (network namespaces and "
                                        "tc); this session is not root")
                continue
            n = timed_steps(h, steps, ps_steps)
            config = run_config(h, profile, steps=n, seed=seed, repeat=repeat)
            label = f"{h.key} ({repeat}/{repeats})"
            update = progress.start(label, n)
            load = os.getloadavg()[0]
            try:
                stored = session.run(config, h.processes, store,
                                     link_rate_Gbps=h.link_rate_Gbps or None, progress=update,
                                     oversubscribe=h.timed_wait and not h.link_rate_Gbps,
                                     timeout_s=max_time_s, protocol=protocol)
            except PerfmodelError as e:
                found.skipped[h.key] = str(e)
                progress.finish(f"{h.key}: skipped: {e}")
                continue
            seen = store.get_run(stored.run_id).row.config.get("protocol") or {}
            found.load[stored.run_id] = (seen["load_after"] if seen.get("load_after")
                                         is not None else load)
            if seen:
                found.protocol[stored.run_id] = seen
            if stored.ok:
                found.ok.setdefault(h.key, []).append(stored.run_id)
            else:
                found.failed.setdefault(h.key, []).append((stored.run_id, stored.reason))
            progress.finish(stored.outcome(label))
            if stored.interrupted:
                raise KeyboardInterrupt
    return found


def _run_anchor(m, repeat: int, repeats: int, store, found: Measurements, *,
                progress: Progress, max_time_s: float | None,
                protocol: RunProtocol | None) -> None:
    """One run of the drift anchor, stored like the others; its id joins `found.anchor`."""
    label = f"drift anchor: {m.label.split(' (')[0]} ({repeat}/{repeats})"
    update = progress.start(label, int(m.config.get("steps") or 0))
    stored = session.run(anchor_config(m, repeat), m.nproc, store, progress=update,
                         oversubscribe=m.oversubscribe, timeout_s=max_time_s,
                         protocol=protocol)
    seen = store.get_run(stored.run_id).row.config.get("protocol") or {}
    if seen:
        found.protocol[stored.run_id] = seen
    if stored.ok:
        found.anchor.append(stored.run_id)
    progress.finish(stored.outcome(label))
    if stored.interrupted:
        raise KeyboardInterrupt


def collect(store, predictions: list[dict[str, Any]], ok: dict[str, list[int]],
            failed: dict[str, list[tuple[int, str]]]) -> list[Comparison]:
    """Pair each prediction with its runs. A run stored as ok but without step records is
    treated as failed."""
    rows = []
    for pred in predictions:
        key = pred["key"]
        runs, bad = [], list(failed.get(key, []))
        for run_id in ok.get(key, []):
            run = store.get_run(run_id)
            if run.row.status != "ok":
                bad.append((run_id, run.row.reason or "failed"))
            elif not [s for s in run.table("steps")]:
                bad.append((run_id, "no step records"))
            else:
                runs.append(run)
        rows.append(compare(key, pred, runs, bad, warmup_steps=WARMUP_STEPS))
    return rows
