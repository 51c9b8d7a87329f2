"""Elasticity on top of a prediction: membership events in, goodput and lost time out.

`predict_elasticity(prediction, config)` runs the job-level membership model
(perfmodel/sim/elastic.py) for the prediction's strategy. The steady rate of each distinct
membership comes from the strategy's own simulation, run once per membership and cached; the
full membership reuses the plain prediction, so a run without events costs nothing extra and
reproduces the plain throughput. Goodput = useful samples per second of the whole run: work
that a restart threw away is not counted.

Checkpoint interval theory, for a gang-scheduled job failing at rate Λ (all workers together)
and a checkpoint that takes δ to write: the fraction of time wasted is ≈ δ/C + Λ·C/2 (writes,
plus half an interval lost per failure) + Λ·(detection + restart), minimised at Young's
C* = √(2δ/Λ) (Young 1974, "A first order approximation to the optimum checkpoint interval",
CACM 17(9)); Daly (2006, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22(3)) refines it for δ not small against the mean time between failures.

Also here: parsing event schedules ("fail:3@120,join:3@300" or a TOML file), checking them
against the job (workers that exist, a consistent join/leave order) and sampling failures at a
rate from an explicit numpy Generator.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel import strategies as strategy_records
from perfmodel.errors import PerfmodelError
from perfmodel.predict import Prediction, summarise
from perfmodel.sim.elastic import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_WRITE_S,
    DEFAULT_DETECTION_S,
    DEFAULT_RESTART_S,
    EVENT_KINDS,
    ElasticConfig,
    ElasticResult,
    Job,
    MembershipEvent,
    Rate,
    simulate,
)
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.tomlfile import Fields, load_toml
from perfmodel.uncertainty import PredictionInterval, prediction_interval

SERIES_BINS = 200               # points of the throughput-over-time series
DOWN_STATES = ("detecting", "restarting")
# Relative spread of one restart on a shared machine: process start, torch import, data load.
# Restarts seen here on 2 loaded cores: 13.5 and 14.6 s in one run, but 51 s against a 22 s
# forecast in a CI run at load 4-7 (torch import at restart took 19 s): a 2.3x swing, so
# log-normal with σ = 0.6, a 90 % interval of x/÷ exp(1.645 x 0.6) = 2.7.
RECOVERY_SPREAD_CV = 0.6
_EVENT = re.compile(r"^\s*(\w+)\s*:\s*(\d+)\s*@\s*([0-9.eE+-]+)\s*([smh]?)\s*$")
_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


# ---------------------------------------------------------------- input


def parse_events(text: str) -> tuple[MembershipEvent, ...]:
    """'fail:3@120,join:3@5m' -> events (times in s, or with an m/h suffix)."""
    events = []
    for item in text.split(","):
        m = _EVENT.match(item)
        if m is None or m.group(1) not in EVENT_KINDS:
            raise PerfmodelError(
                f"membership event '{item.strip()}' is not KIND:WORKER@TIME with KIND one of "
                f"{', '.join(EVENT_KINDS)} (example: fail:3@120,join:3@300)")
        try:
            time_s = float(m.group(3)) * _SECONDS[m.group(4)]
        except ValueError:
            raise PerfmodelError(f"membership event '{item.strip()}' has no valid time"
                                 ) from None
        events.append(MembershipEvent(m.group(1), int(m.group(2)), time_s))
    return tuple(events)


def load_events(path: Path) -> tuple[MembershipEvent, ...]:
    """A TOML file of [[events]] tables with kind, worker and time_s."""
    data = load_toml(Path(path))
    raw = data.get("events")
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise PerfmodelError(f"{path}: needs [[events]] tables with kind, worker and time_s")
    events = []
    for i, table in enumerate(raw):
        f = Fields(table, Path(path), f"events[{i}].")
        kind = f.str("kind")
        if kind not in EVENT_KINDS:
            raise PerfmodelError(f"{path}: events[{i}].kind '{kind}' is not one of "
                                 f"{', '.join(EVENT_KINDS)}")
        events.append(MembershipEvent(kind, f.integer("worker"), f.number("time_s")))
    return tuple(events)


def events_from(spec: str) -> tuple[MembershipEvent, ...]:
    """An inline schedule, or a path to a TOML schedule."""
    if spec.strip().endswith(".toml"):
        return load_events(Path(spec.strip()))
    return parse_events(spec)


def elastic_config(*, events: str | None = None, failure_rate_per_hour: float | None = None,
                   replace_after_s: float | None = 0.0, run_hours: float | None = None,
                   checkpoint_interval_s: float | None = None,
                   checkpoint_write_s: float | None = None, detection_s: float | None = None,
                   restart_s: float | None = None, min_workers: int | None = None,
                   sync_ps_on_departure: str | None = None, seed: int = 0
                   ) -> ElasticConfig | None:
    """The command line's elasticity options as a config; None when none was given (then
    `perfmodel predict` does no elasticity work at all). The run lasts `run_hours`, by
    default 24 h with a failure rate, else twice the last event's time but at least 1 h."""
    given = {k: v for k, v in locals().items() if k not in ("seed", "replace_after_s")
             and v is not None}
    if not given:
        return None
    schedule = events_from(events) if events is not None else ()
    if run_hours is not None:
        run_s = run_hours * 3600.0
    elif failure_rate_per_hour:
        run_s = 24 * 3600.0
    else:
        run_s = max(3600.0, 2 * max((e.time_s for e in schedule), default=0.0))
    return ElasticConfig(
        run_s=run_s, events=schedule, failure_rate_per_hour=failure_rate_per_hour or 0.0,
        replace_after_s=replace_after_s, seed=seed,
        detection_s=DEFAULT_DETECTION_S if detection_s is None else detection_s,
        restart_s=DEFAULT_RESTART_S if restart_s is None else restart_s,
        checkpoint_interval_s=(DEFAULT_CHECKPOINT_INTERVAL_S if checkpoint_interval_s is None
                               else checkpoint_interval_s),
        checkpoint_write_s=(DEFAULT_CHECKPOINT_WRITE_S if checkpoint_write_s is None
                            else checkpoint_write_s),
        min_workers=1 if min_workers is None else min_workers,
        sync_on_departure=sync_ps_on_departure or "drop")


def check_events(events: tuple[MembershipEvent, ...], workers: int
                 ) -> tuple[MembershipEvent, ...]:
    """Time-ordered events, checked against a pool of `workers`: workers that exist, no join
    of a worker already in the job, no leave or fail of one that is not. A worker whose first
    event is a join arrives late; late arrivals take the last worker numbers (with 16 workers
    and 2 late ones, 14 and 15), so `join:3@10` on 16 workers is an error, not a restart."""
    ordered = tuple(sorted(events, key=lambda e: e.time_s))     # stable: same-time order kept
    for e in ordered:
        if not 0 <= e.worker < workers:
            raise PerfmodelError(f"event {e} names worker {e.worker}, but the job has workers "
                                 f"0..{workers - 1}")
    first: dict[int, MembershipEvent] = {}
    for e in ordered:
        first.setdefault(e.worker, e)
    late = sorted(w for w, e in first.items() if e.kind == "join")
    for w in late:
        if w < workers - len(late):
            raise PerfmodelError(
                f"event {first[w]}: worker {w} is already in the job (a join needs a leave or "
                f"fail of it first; late arrivals take the last worker numbers, here "
                f"{workers - len(late)}..{workers - 1})")
    present = {w for w in range(workers) if w not in late}
    for e in ordered:
        if e.kind == "join":
            if e.worker in present:
                raise PerfmodelError(f"event {e}: worker {e.worker} is already in the job")
            present.add(e.worker)
        elif e.worker not in present:
            raise PerfmodelError(f"event {e}: worker {e.worker} is not in the job then")
        else:
            present.discard(e.worker)
    return ordered


def sample_failures(config: ElasticConfig, workers: int, rng: np.random.Generator
                    ) -> tuple[MembershipEvent, ...]:
    """Poisson failures of every worker at `failure_rate_per_hour`; each failed worker's
    replacement joins `replace_after_s` later (never, if None), then can fail again."""
    rate_per_s = config.failure_rate_per_hour / 3600.0
    events: list[MembershipEvent] = []
    if rate_per_s <= 0:
        return ()
    for w in range(workers):
        t = 0.0
        while True:
            t += rng.exponential(1.0 / rate_per_s)
            if t >= config.run_s:
                break
            events.append(MembershipEvent("fail", w, t))
            if config.replace_after_s is None:
                break
            t += config.replace_after_s
            if t >= config.run_s:
                break
            events.append(MembershipEvent("join", w, t))
    return tuple(sorted(events, key=lambda e: e.time_s))


# ---------------------------------------------------------------- rates per membership


class RateTable:
    """The steady rate of each distinct membership, simulated once with the strategy's own
    model and cached. Members are told apart only by their speed factor."""

    def __init__(self, strategy: str, scenario: Scenario, options: dict[str, Any],
                 full: Rate | None = None):
        self.strategy, self.scenario, self.options = strategy, scenario, options
        self.speeds = tuple(float(s) for s in scenario.speeds)
        self.cache: dict[tuple[float, ...], Rate] = {}
        if full is not None:
            self.cache[tuple(sorted(self.speeds))] = full

    def __call__(self, members: tuple[int, ...]) -> Rate:
        key = tuple(sorted(self.speeds[m] for m in members))
        if key not in self.cache:
            sub = replace(self.scenario, workers=len(key),
                          speed=() if all(s == 1.0 for s in key) else key)
            model = make_strategy(self.strategy, **self.options)
            s = summarise(model.simulate(sub), sub)
            self.cache[key] = Rate(s.throughput_samples_per_s, s.step_time_s.mean,
                                   s.staleness.mean)
        return self.cache[key]


def job_for(strategy: str, scenario: Scenario, options: dict[str, Any],
            config: ElasticConfig) -> Job:
    scheduling = strategy_records.get(strategy).scheduling
    join_s = config.join_s
    if join_s is None:          # pull every parameter over the server's link
        cluster = scenario.cluster
        link = getattr(cluster, cluster.server.link)
        nbytes = scenario.workload.param_bytes
        join_s = link.latency_s + nbytes * link.seconds_per_byte(nbytes)
    return Job(scheduling=scheduling, workers=scenario.workers,
               batch_size=scenario.batch_size, join_s=join_s,
               staleness_bound=int(options.get("staleness_bound") or 0))


# ---------------------------------------------------------------- summaries


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodputSummary:
    """Derived from an ElasticResult's segments and losses."""

    run_s: float
    throughput_samples_per_s: float     # the full membership's steady rate
    goodput_samples_per_s: float        # useful samples / run_s
    useful_samples: float
    lost_samples: float
    lost_work_s: float                  # training time whose work was thrown away
    time_lost_to_restarts_s: float      # detecting + restarting
    time_by_state_s: dict[str, float]
    restarts: int
    failures: int
    lost_work_per_failure_s: float
    staleness_mean: float               # update-weighted over the run
    series_t_s: tuple[float, ...]       # bin centres
    series_samples_per_s: tuple[float, ...]   # mean throughput in each bin


def summarise_elastic(result: ElasticResult, full: Rate,
                      bins: int = SERIES_BINS) -> GoodputSummary:
    seg = np.array([(s.start_s, s.end_s, s.samples_per_s, s.staleness)
                    for s in result.segments], dtype=float).reshape(-1, 4)
    start, end, rate, stale = seg.T
    trained = rate * (end - start)
    lost = sum(loss.samples for loss in result.losses)
    lost_s = sum(loss.seconds for loss in result.losses)
    by_state: dict[str, float] = {}
    for s in result.segments:
        by_state[s.state] = by_state.get(s.state, 0.0) + s.duration_s
    failures = sum(e.kind == "fail" for e in result.events)
    useful = float(trained.sum()) - lost
    edges = np.linspace(0.0, result.run_s, bins + 1)
    knots = np.concatenate([start[:1], end]) if len(start) else np.array([0.0, result.run_s])
    cumulative = np.concatenate([[0.0], np.cumsum(trained)]) if len(start) else np.zeros(2)
    per_bin = np.diff(np.interp(edges, knots, cumulative)) / np.diff(edges)
    total = trained.sum()
    return GoodputSummary(
        run_s=result.run_s,
        throughput_samples_per_s=full.samples_per_s,
        goodput_samples_per_s=useful / result.run_s,
        useful_samples=useful, lost_samples=lost, lost_work_s=lost_s,
        time_lost_to_restarts_s=sum(by_state.get(s, 0.0) for s in DOWN_STATES),
        time_by_state_s=by_state, restarts=result.restarts, failures=failures,
        lost_work_per_failure_s=lost_s / failures if failures else 0.0,
        staleness_mean=float((trained * stale).sum() / total) if total > 0 else 0.0,
        series_t_s=tuple(float(t) for t in (edges[:-1] + edges[1:]) / 2),
        series_samples_per_s=tuple(float(v) for v in per_bin))


def young_interval_s(checkpoint_write_s: float, failures_per_s: float) -> float:
    """Young (1974): C* = √(2δ/Λ), training time between checkpoints."""
    if failures_per_s <= 0:
        return math.inf
    return math.sqrt(2.0 * checkpoint_write_s / failures_per_s)


def daly_interval_s(checkpoint_write_s: float, failures_per_s: float) -> float:
    """Daly (2006), eq. 37: √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M,
    with M = 1/Λ the mean time between failures."""
    if failures_per_s <= 0:
        return math.inf
    m, d = 1.0 / failures_per_s, checkpoint_write_s
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


# ---------------------------------------------------------------- the entry point


@dataclass(frozen=True, kw_only=True, slots=True)
class Elasticity:
    config: ElasticConfig
    job: Job
    result: ElasticResult
    summary: GoodputSummary
    memberships_simulated: int

    def to_json(self) -> dict[str, Any]:
        s, cfg = self.summary, self.config
        job_rate_per_s = cfg.failure_rate_per_hour / 3600.0 * self.job.workers
        out = {
            "scheduling": self.job.scheduling,
            "run_s": s.run_s,
            "goodput_samples_per_s": s.goodput_samples_per_s,
            "throughput_samples_per_s": s.throughput_samples_per_s,
            "goodput_fraction": (s.goodput_samples_per_s / s.throughput_samples_per_s
                                 if s.throughput_samples_per_s > 0 else 0.0),
            "time_lost_to_restarts_s": s.time_lost_to_restarts_s,
            "lost_work_s": s.lost_work_s,
            "lost_samples": s.lost_samples,
            "lost_work_per_failure_s": s.lost_work_per_failure_s,
            "time_by_state_s": s.time_by_state_s,
            "restarts": s.restarts,
            "failures": s.failures,
            "events": [str(e) for e in self.result.events[:1000]],
            "staleness_mean": s.staleness_mean,
            "throughput_series": {"t_s": list(s.series_t_s),
                                  "samples_per_s": list(s.series_samples_per_s)},
            "parameters": {k: v for k, v in asdict(cfg).items() if k != "events"}
                          | {"join_s": self.job.join_s},
            "memberships_simulated": self.memberships_simulated,
        }
        if job_rate_per_s > 0 and self.job.scheduling == "gang":
            out["optimal_checkpoint_interval_s"] = {
                "young": young_interval_s(cfg.checkpoint_write_s, job_rate_per_s),
                "daly": daly_interval_s(cfg.checkpoint_write_s, job_rate_per_s)}
        return out


def render_elasticity(e: Elasticity) -> str:
    """Lines for `perfmodel predict`'s table."""
    s, cfg = e.summary, e.config
    what = (f"{len(cfg.events)} scheduled events" if cfg.events else
            f"{cfg.failure_rate_per_hour:g} failures/worker/hour (seed {cfg.seed}), "
            f"{s.failures} failures")
    states = ", ".join(f"{k} {v:,.0f} s" for k, v in s.time_by_state_s.items()
                       if k != "training")
    lines = [
        f"  elasticity       {e.job.scheduling}, {what} in {s.run_s / 3600:,.2f} h",
        f"  goodput          {s.goodput_samples_per_s:,.1f} samples/s "
        f"({s.goodput_samples_per_s / s.throughput_samples_per_s:.1%} of the throughput)"
        if s.throughput_samples_per_s > 0 else "  goodput          0",
        f"  lost             {s.time_lost_to_restarts_s:,.1f} s to restarts, "
        f"{s.lost_work_s:,.1f} s of work ({s.lost_samples:,.0f} samples), "
        f"{s.restarts} restarts" + (f"; {states}" if states else ""),
    ]
    best = e.to_json().get("optimal_checkpoint_interval_s")
    if best:
        lines.append(f"  checkpoint       every {cfg.checkpoint_interval_s:,.0f} s; "
                     f"goodput-optimal ≈ {best['daly']:,.0f} s (Daly), "
                     f"{best['young']:,.0f} s (Young)")
    xs = np.array(s.series_samples_per_s)
    if xs.size and xs.max() > 0:
        blocks = " ▁▂▃▄▅▆▇█"
        cols = np.array_split(xs, min(60, xs.size))
        spark = "".join(blocks[int(round(c.mean() / xs.max() * 8))] for c in cols)
        lines.append(f"  over time        {spark}")
    return "\n".join(lines)


def full_rate(prediction: Prediction) -> Rate:
    s = prediction.summary
    return Rate(s.throughput_samples_per_s, s.step_time_s.mean, s.staleness.mean)


def predict_elasticity(prediction: Prediction, config: ElasticConfig,
                       rates: RateTable | None = None) -> Elasticity:
    """The membership model for `prediction`'s strategy and scenario under `config`."""
    sc = prediction.scenario
    if config.min_workers > sc.workers:
        raise PerfmodelError(f"min_workers {config.min_workers} exceeds the {sc.workers} "
                             "workers of the job")
    if config.events:
        events = check_events(config.events, sc.workers)
    else:
        events = sample_failures(config, sc.workers, np.random.default_rng(config.seed))
    full = full_rate(prediction)
    if rates is None:
        rates = RateTable(prediction.strategy, sc, prediction.options, full)
    job = job_for(prediction.strategy, sc, prediction.options, config)
    result = simulate(job, config, events, rates)
    return Elasticity(config=config, job=job, result=result,
                      summary=summarise_elastic(result, full),
                      memberships_simulated=len(rates.cache) - 1)


def goodput_by_interval(prediction: Prediction, config: ElasticConfig,
                        intervals_s: list[float]) -> list[tuple[float, float]]:
    """(checkpoint interval, goodput) for each interval, the same failures for every one
    (common random numbers), to read off the goodput-optimal interval."""
    rates = RateTable(prediction.strategy, prediction.scenario, prediction.options,
                      full_rate(prediction))
    return [(c, predict_elasticity(prediction, replace(config, checkpoint_interval_s=c),
                                   rates).summary.goodput_samples_per_s)
            for c in intervals_s]


# ---------------------------------------------------------------- one recovery, for checks


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryPrediction:
    down_s: float               # detection + restart
    lost_work_s: float          # training time whose work was thrown away
    recovery_s: float           # failure -> the progress at the failure regained
    interval: PredictionInterval    # around recovery_s


def predict_recovery(*, step_s: float, checkpoint_every_steps: int, checkpoint_write_s: float,
                     detection_s: float, restart_s: float, failure_at_step: int,
                     spread_cv: float = RECOVERY_SPREAD_CV,
                     coverage: float = 0.9) -> RecoveryPrediction:
    """A gang job that fails once, during step `failure_at_step` (half-way through it),
    checkpointing every `checkpoint_every_steps` steps: the membership model's recovery time
    (detection + restart + redoing the lost work, with any checkpoint writes on the way) and
    a log-normal interval of relative spread `spread_cv` around it."""
    if not (step_s > 0 and checkpoint_every_steps >= 1 and failure_at_step >= 0):
        raise PerfmodelError("a recovery needs a positive step time, a checkpoint interval of "
                             "at least one step and a failure at step >= 0")
    every = checkpoint_every_steps
    t_fail = (failure_at_step + 0.5) * step_s + (failure_at_step // every) * checkpoint_write_s
    cycle_s = every * step_s + checkpoint_write_s
    config = ElasticConfig(run_s=2 * t_fail + detection_s + restart_s + 2 * cycle_s,
                           events=(MembershipEvent("fail", 0, t_fail),
                                   MembershipEvent("join", 0, t_fail)),   # the same node
                           checkpoint_interval_s=every * step_s,
                           checkpoint_write_s=checkpoint_write_s, detection_s=detection_s,
                           restart_s=restart_s)
    job = Job(scheduling="gang", workers=1, batch_size=1)
    result = simulate(job, config, config.events, lambda members: Rate(1.0 / step_s, step_s))
    lost = result.losses[0] if result.losses else None
    deficit = lost.samples if lost is not None else 0.0
    regained = t_fail + detection_s + restart_s
    for seg in (s for s in result.segments if s.start_s >= t_fail and s.samples_per_s > 0):
        if deficit <= seg.samples_per_s * seg.duration_s:
            regained = seg.start_s + deficit / seg.samples_per_s
            break
        deficit -= seg.samples_per_s * seg.duration_s
    recovery_s = regained - t_fail
    return RecoveryPrediction(
        down_s=sum(s.duration_s for s in result.segments if s.state in DOWN_STATES),
        lost_work_s=lost.seconds if lost is not None else 0.0, recovery_s=recovery_s,
        interval=prediction_interval(recovery_s, network_rms_rel=0.0, compute_rms_rel=0.0,
                                     run_spread_cv=spread_cv, coverage=coverage))
