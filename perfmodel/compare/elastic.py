"""Membership changes in the comparison: recovery time, goodput and PS update rates,
predicted by the membership model (perfmodel/sim/elastic.py) and measured by real runs
(measure/elastic_launch.py).

Calibration and held-out runs are disjoint here too:
- `CALIBRATION` (one elastic DDP run: one kill, checkpoint every 10 steps) gives the costs
  the model takes as parameters: detection, restart and checkpoint write
  (measure.elastic_launch.measured_costs, medians of its records).
- `HELD_OUT` is predicted from those costs plus the calibrated profile (step times, PS
  rates), and only then measured: a DDP run with two kills and another checkpoint interval,
  and an asynchronous PS run that a worker leaves and a standby joins.

How a DDP run with kills is predicted (`predict_gang`): the gang job of
perfmodel/sim/elastic.py at the model's steady rate, checkpointing every `checkpoint_every`
steps of training. The i-th kill happens when progress reaches `at_step + 1` steps, plus half
the launcher's poll interval (it looks every measure.launch.POLL_S for the step, then kills);
the rank's node rejoins at once (the same machine), so the job detects, restarts with both
ranks and redoes the steps since its last checkpoint. The kill times are found one at a time,
each from the simulation with the kills before it. Read off the result: each recovery (kill
-> the progress at the kill regained), the time to finish all steps from the moment every
rank was first ready, and goodput = useful samples / that time.

A PS run is predicted from the step-level PS model through the rate table of
perfmodel.goodput: updates/s with both workers, with one (the leaver gone) and with both
again; the joiner's first gradient after its parameters were sent = the parameter pull over
the server's link (perfmodel.goodput.job_for) plus one worker step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from perfmodel.errors import PerfmodelError
from perfmodel.goodput import RECOVERY_SPREAD_CV, RateTable, job_for
from perfmodel.sim.elastic import ElasticConfig, ElasticResult, Job, MembershipEvent, Rate
from perfmodel.sim.elastic import simulate as simulate_membership
from perfmodel.uncertainty import prediction_interval
from perfmodel.workload import load_workload

POLL_S = 0.2                    # measure.launch.POLL_S: the killer's look interval
COVERAGE = 0.9


@dataclass(frozen=True, kw_only=True)
class ElasticItem:
    key: str
    what: str
    kind: str                           # "elastic_ddp" or "elastic_ps"
    workload: str = "mlp"
    workers: int = 2                    # ps: standby included
    steps: int = 40
    checkpoint_every: int = 10          # ddp
    kills: tuple[tuple[int, int], ...] = ()     # ddp: (rank, at_step) per attempt
    leave: tuple[int, int] = (0, 8)     # ps: (worker, after its own steps)
    join_after: int = 12                # ps: updates after the leave before a standby joins
    standby: int = 1                    # ps

    @property
    def batch(self) -> int:
        return load_workload(self.workload).batch_size

    @property
    def active(self) -> int:
        return self.workers - (self.standby if self.kind == "elastic_ps" else 0)

    @property
    def processes(self) -> int:
        return self.workers + (1 if self.kind == "elastic_ps" else 0)

    def config(self, seed: int, timeout_s: float) -> dict[str, Any]:
        """config.json of its run (as `perfmodel measure elastic` writes it)."""
        if self.kind == "elastic_ddp":
            options = {"elastic_ddp": {"checkpoint_every": self.checkpoint_every}}
        else:
            options = {"ps": {"mode": "async"},
                       "elastic_ps": {"leave_worker": self.leave[0],
                                      "leave_after_steps": self.leave[1],
                                      "standby": self.standby,
                                      "join_after_updates": self.join_after}}
        return {"kind": self.kind, "workers": self.workers, "workload": self.workload,
                "batch_size": self.batch, "steps": self.steps, "warmup_steps": 0,
                "seed": seed, "speed": [], "options": options, "timeout_s": timeout_s,
                "threads_per_worker": 1}

    @property
    def label(self) -> str:
        if self.kind == "elastic_ddp":
            kills = ", ".join(f"rank {r} after step {s}" for r, s in self.kills)
            return (f"elastic ddp {self.workload} x{self.workers}, {self.steps} steps, "
                    f"checkpoint every {self.checkpoint_every}, kill {kills}")
        return (f"async ps {self.workload} x{self.active} (+{self.standby} standby): worker "
                f"{self.leave[0]} leaves after {self.leave[1]} steps, a standby joins "
                f"{self.join_after} updates later")


CALIBRATION = ElasticItem(
    key="elastic-ddp-cal", kind="elastic_ddp", steps=30, checkpoint_every=10,
    kills=((1, 12),), what="calibrates detection, restart and checkpoint write")
HELD_OUT = (
    ElasticItem(key="elastic-ddp-2kills", kind="elastic_ddp", steps=40, checkpoint_every=8,
                kills=((1, 9), (0, 25)), what="two kills, another checkpoint interval"),
    ElasticItem(key="elastic-ps-leave-join", kind="elastic_ps", workers=3, steps=20,
                leave=(0, 8), join_after=12, what="a PS worker leaves, a standby joins"),
)
COST_NAMES = ("detection_s", "restart_s", "checkpoint_write_s")


def check_costs(costs: dict[str, float]) -> dict[str, float]:
    missing = [k for k in COST_NAMES if k not in costs]
    if missing:
        raise PerfmodelError(f"the elastic calibration run recorded no {', '.join(missing)}; "
                             "it must recover from its kill (see its records)")
    return {k: float(costs[k]) for k in COST_NAMES}


# ---------------------------------------------------------------- the gang job's timeline


def progress_knots(result: ElasticResult) -> tuple[np.ndarray, np.ndarray]:
    """(times, useful samples done) at every segment boundary; a loss is a drop at its time
    (two knots at one time)."""
    t, p = [0.0], [0.0]
    losses = sorted(result.losses, key=lambda x: x.time_s)
    done, i = 0.0, 0
    for seg in result.segments:
        while i < len(losses) and losses[i].time_s <= seg.start_s + 1e-12:
            done -= losses[i].samples
            t.append(seg.start_s)
            p.append(done)
            i += 1
        done += seg.samples_per_s * seg.duration_s
        t.append(seg.end_s)
        p.append(done)
    return np.array(t), np.array(p)


def time_to_reach(knots: tuple[np.ndarray, np.ndarray], samples: float,
                  after_s: float = 0.0) -> float:
    """First time >= after_s at which progress reaches `samples` (inf if it never does)."""
    t, p = knots
    for k in range(1, len(t)):
        if t[k] < after_s or p[k] < samples - 1e-9:
            continue
        a_t, a_p = max(t[k - 1], after_s), p[k - 1]
        if p[k] == a_p or a_p >= samples:
            return max(t[k], after_s) if a_p < samples else a_t
        return t[k - 1] + (samples - p[k - 1]) / (p[k] - p[k - 1]) * (t[k] - t[k - 1])
    return math.inf


def predict_gang(item: ElasticItem, *, step_s: float, costs: dict[str, float]
                 ) -> dict[str, Any]:
    """Recoveries, time to finish and goodput of an elastic DDP run (module docstring)."""
    per_step = item.workers * item.batch
    rate = Rate(per_step / step_s, step_s)
    job = Job(scheduling="gang", workers=item.workers, batch_size=item.batch)
    run_s = (item.steps * step_s + item.steps // item.checkpoint_every
             * costs["checkpoint_write_s"]
             + len(item.kills) * (costs["detection_s"] + costs["restart_s"]
                                  + (item.checkpoint_every + 2) * step_s + POLL_S)) * 2 + 1

    def run(events: tuple[MembershipEvent, ...]) -> ElasticResult:
        config = ElasticConfig(run_s=run_s, events=events,
                               checkpoint_interval_s=item.checkpoint_every * step_s,
                               checkpoint_write_s=costs["checkpoint_write_s"],
                               detection_s=costs["detection_s"], restart_s=costs["restart_s"])
        return simulate_membership(job, config, events, lambda members: rate)

    events: tuple[MembershipEvent, ...] = ()
    kills = []
    for rank, at_step in item.kills:
        knots = progress_knots(run(events))
        after = kills[-1]["time_s"] if kills else 0.0
        t = time_to_reach(knots, (at_step + 1) * per_step, after) + POLL_S / 2
        kills.append({"rank": rank, "at_step": at_step, "time_s": t})
        events += (MembershipEvent("fail", rank, t), MembershipEvent("join", rank, t))
    result = run(events)
    knots = progress_knots(result)
    recoveries = []
    for k in kills:
        before = float(np.interp(k["time_s"] - 1e-9, *knots))
        back = time_to_reach(knots, before, k["time_s"] + 1e-9)
        loss = next(x for x in result.losses if abs(x.time_s - k["time_s"]) < 1e-6)
        point = back - k["time_s"]
        iv = prediction_interval(point, network_rms_rel=0.0, compute_rms_rel=0.0,
                                 run_spread_cv=RECOVERY_SPREAD_CV, coverage=COVERAGE)
        recoveries.append({**k, "recovery_s": point, "low_s": iv.low_s, "high_s": iv.high_s,
                           "lost_steps": loss.samples / per_step})
    total = time_to_reach(knots, item.steps * per_step)
    t, p = knots
    keep = t < total
    return {"step_s": step_s, "costs": costs, "kills": kills, "recoveries": recoveries,
            "total_s": total, "goodput_samples_per_s": item.steps * per_step / total,
            "progress": {"t_s": [float(x) for x in t[keep]] + [total],
                         "steps": [float(x) / per_step for x in p[keep]] + [item.steps]},
            "restart_time_s": sum(s.duration_s for s in result.segments
                                  if s.state in ("detecting", "restarting"))}


def goodput_interval(pred: dict[str, Any], item: ElasticItem, step_low_s: float,
                     step_high_s: float) -> tuple[float, float]:
    """Goodput bounds: the training time scaled by the step-time interval, each recovery at
    its own interval bound (all low together, all high together: a wide band)."""
    rec = pred["recoveries"]
    recovering = sum(r["recovery_s"] for r in rec)
    training = pred["total_s"] - recovering
    s = pred["step_s"]
    fast = training * step_low_s / s + sum(r["low_s"] for r in rec)
    slow = training * step_high_s / s + sum(r["high_s"] for r in rec)
    samples = item.steps * item.workers * item.batch
    return samples / slow, samples / fast


# ---------------------------------------------------------------- PS membership


def predict_ps(item: ElasticItem, scenario, options: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """Updates/s before the leave, while gone, after the join; the joiner's pull."""
    table = RateTable("async-ps", scenario, options or {})
    full = table(tuple(range(item.active)))
    gone = table(tuple(range(item.active - 1)))
    job = job_for("async-ps", scenario, options or {}, ElasticConfig(run_s=1.0))
    b = item.batch
    return {"update_rate_before_per_s": full.samples_per_s / b,
            "update_rate_gone_per_s": gone.samples_per_s / b,
            "update_rate_after_per_s": full.samples_per_s / b,
            "gone_over_before": gone.samples_per_s / full.samples_per_s,
            "join_s": job.join_s + full.step_s}     # pull, then one step to its first push


# ---------------------------------------------------------------- measured


def measured_gang(item: ElasticItem, records: list[dict], recoveries: list) -> dict[str, Any]:
    """What a finished elastic DDP run shows: recoveries, time from every rank first ready to
    the last step's end, goodput, and rank 0's progress over that time."""
    ready = [r["time"] for r in records if r.get("type") == "elastic"
             and r.get("event") == "ready" and r.get("attempt") == 0]
    steps = [r for r in records if r.get("type") == "step" and r.get("end_time")]
    last = [r["end_time"] for r in steps if r["step"] == item.steps - 1]
    if not ready or not last:
        raise PerfmodelError("the elastic run left no first-ready or last-step record")
    t0 = max(ready)
    total = max(last) - t0
    per_step = item.workers * item.batch
    rank0 = sorted((r["end_time"] - t0, r["step"] + 1) for r in steps if r["rank"] == 0)
    return {"total_s": total, "goodput_samples_per_s": item.steps * per_step / total,
            "recoveries": [{k: v for k, v in (asdict(r) if not isinstance(r, dict) else r)
                            .items()} for r in recoveries],
            "progress": {"t_s": [a for a, _ in rank0], "steps": [b for _, b in rank0]}}


def measured_ps(records: list[dict]) -> dict[str, Any]:
    found = [r for r in records if r.get("type") == "elastic" and r.get("event") == "membership"]
    if not found:
        raise PerfmodelError("the elastic PS run left no membership record")
    m = found[-1]
    keys = ("update_rate_before_per_s", "update_rate_gone_per_s", "update_rate_after_per_s",
            "join_s")
    out = {k: float(m[k]) for k in keys if m.get(k) is not None}
    if "update_rate_before_per_s" in out and "update_rate_gone_per_s" in out:
        out["gone_over_before"] = out["update_rate_gone_per_s"] / out["update_rate_before_per_s"]
    return out


# ---------------------------------------------------------------- rows of the report


def rows_for(item: ElasticItem, predicted: dict[str, Any], measured: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    """One row per quantity: predicted (with its interval where there is one), each run's
    measurement, their median, the relative error and whether the median is inside."""
    out = []

    def add(quantity: str, unit: str, point: float, values: list[float],
            band: tuple[float, float] | None = None) -> None:
        values = [v for v in values if v is not None and math.isfinite(v)]
        med = float(np.median(values)) if values else None
        err = (point - med) / med if med else None
        inside = None if band is None or med is None else band[0] <= med <= band[1]
        out.append({"key": item.key, "quantity": quantity, "unit": unit, "predicted": point,
                    "low": band[0] if band else None, "high": band[1] if band else None,
                    "measured": values, "median": med, "error_rel": err, "inside": inside})

    if item.kind == "elastic_ddp":
        for i, rec in enumerate(predicted["recoveries"]):
            vals = [m["recoveries"][i]["recovery_s"] for m in measured
                    if len(m["recoveries"]) > i]
            add(f"recovery {i + 1} (kill rank {rec['rank']} after step {rec['at_step']})",
                "s", rec["recovery_s"], vals, (rec["low_s"], rec["high_s"]))
            add(f"lost steps {i + 1}", "steps", rec["lost_steps"],
                [m["recoveries"][i]["lost_steps"] for m in measured
                 if len(m["recoveries"]) > i])
        add("time to finish", "s", predicted["total_s"], [m["total_s"] for m in measured])
        add("goodput", "samples/s", predicted["goodput_samples_per_s"],
            [m["goodput_samples_per_s"] for m in measured],
            tuple(predicted["goodput_interval"]) if predicted.get("goodput_interval") else None)
    else:
        for name, unit in (("update_rate_before_per_s", "updates/s"),
                           ("update_rate_gone_per_s", "updates/s"),
                           ("update_rate_after_per_s", "updates/s"),
                           ("gone_over_before", "ratio"), ("join_s", "s")):
            add(name.removesuffix("_per_s").replace("_", " "), unit, predicted[name],
                [m.get(name) for m in measured])
    return out
