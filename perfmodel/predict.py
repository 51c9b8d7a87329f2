"""One prediction: run a strategy's simulation and summarise its records.

Summaries are derived from the frozen records (perfmodel/sim/records.py) over the steady
window: every worker's warm-up steps are left out, and throughput counts the steps that end
between the moment all workers have warmed up and the moment the first worker finishes.

A measured profile also gives an interval around the mean step time, from its calibration
residuals and run-to-run spread (perfmodel/uncertainty.py; log-normal, 90 % by default),
with the compute share c = compute_s / step and the rest, 1 − c, charged to the network
model (communication, waiting and the server's apply all come from measured rates). A
spec-derived profile has no residuals: its predictions carry no interval, and say so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np

from perfmodel.memory import MemoryBreakdown
from perfmodel.sim.engine import quiet_gc
from perfmodel.sim.records import LazyRecords, SimResult
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.stats import quantile
from perfmodel.uncertainty import PredictionInterval, interval_for


@dataclass(frozen=True, kw_only=True, slots=True)
class Spread:
    mean: float
    p50: float
    p95: float
    max: float

    @staticmethod
    def of(values: np.ndarray) -> Spread:
        if values.size == 0:
            return Spread(mean=0.0, p50=0.0, p95=0.0, max=0.0)
        ordered = np.sort(values)
        return Spread(mean=float(values.mean()), p50=quantile(ordered, 0.5),
                      p95=quantile(ordered, 0.95), max=float(ordered[-1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """What a simulation says about the steady state, derived from its records."""

    throughput_samples_per_s: float
    step_time_s: Spread
    compute_s: float                 # per step, mean over workers and steps
    comm_exposed_s: float
    wait_s: float
    staleness: Spread
    staleness_per_worker: tuple[float, ...]
    staleness_values: tuple[int, ...]   # every counted update's staleness, for histograms
    steps_counted: int


# every field of a record, in its class's order, as a tuple read in C (a 4096-worker run
# has 80,000 of each); LazyRecords already holds these tuples
_STEP_FIELDS = attrgetter("worker", "step", "start_s", "end_s", "compute_s", "comm_exposed_s",
                          "wait_s")
_UPDATE_FIELDS = attrgetter("worker", "step", "version_read", "version_applied", "time_s")


def _field_array(records: Sequence, fields: attrgetter, width: int) -> np.ndarray:
    """(records x width) float array of every record's `fields` (all of them, in order).
    np.fromiter into a record dtype is ~2x faster than np.array of a list of tuples."""
    rows = records.rows if isinstance(records, LazyRecords) else map(fields, records)
    dtype = np.dtype([(f"f{i}", float) for i in range(width)])
    return np.fromiter(rows, dtype, len(records)).view(float).reshape(-1, width)


def summarise(result: SimResult, scenario: Scenario) -> Summary:
    rec = _field_array(result.steps, _STEP_FIELDS, 7)
    worker, step, start, end, compute, comm, wait = rec.T
    warm = step >= scenario.warmup_steps
    if not warm.any():
        raise ValueError("simulation produced no steps after warm-up")
    worker, start, end = worker[warm].astype(int), start[warm], end[warm]
    # Each worker's own rate over its counted steps (steps / the span they cover), summed:
    # the long-run rate of every worker, however unequal. A common window (all workers
    # active) held few steps beside a 10x straggler, and counting whole steps in it moved
    # the rate by up to ~10 % between otherwise equal runs (DC-ASGD came out faster than
    # plain async).
    first = np.full(scenario.workers, np.inf)
    last = np.full(scenario.workers, -np.inf)
    np.minimum.at(first, worker, start)
    np.maximum.at(last, worker, end)
    counts = np.bincount(worker, minlength=scenario.workers)
    active = counts > 0
    throughput = scenario.batch_size * float(np.sum(counts[active]
                                                    / (last[active] - first[active])))
    durations = end - start
    upd = _field_array(result.updates, _UPDATE_FIELDS, 5)
    upd = upd[upd[:, 1] >= scenario.warmup_steps]
    stale, who = upd[:, 3] - upd[:, 2], upd[:, 0].astype(int)    # exact: versions < 2**53
    counts = np.bincount(who, minlength=scenario.workers)
    sums = np.bincount(who, weights=stale, minlength=scenario.workers)
    per_worker = np.divide(sums, counts, out=np.zeros(scenario.workers), where=counts > 0)
    return Summary(
        throughput_samples_per_s=throughput,
        step_time_s=Spread.of(durations),
        compute_s=float(compute[warm].mean()),
        comm_exposed_s=float(comm[warm].mean()),
        wait_s=float(wait[warm].mean()),
        staleness=Spread.of(stale),
        staleness_per_worker=tuple(per_worker.tolist()),
        staleness_values=tuple(map(int, stale.tolist())),
        steps_counted=int(warm.sum()),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    strategy: str
    options: dict[str, Any]
    scenario: Scenario
    summary: Summary
    baseline_throughput_samples_per_s: float   # one worker, no communication (DDP at N=1)
    memory: dict[str, MemoryBreakdown]
    result: SimResult
    wall_s: float                              # host seconds spent simulating
    interval: PredictionInterval | None = None  # around the mean step time (measured profiles)
    interval_source: str = ""                  # where the interval comes from, or why none
    hardware: Any = None                       # PS: psnet.Hardware (servers counted); else None

    @property
    def throughput_per_device(self) -> float:
        """Samples/s per device occupied, PS servers on their own devices included."""
        devices = self.scenario.workers if self.hardware is None else self.hardware.devices
        return self.summary.throughput_samples_per_s / devices

    @property
    def speedup(self) -> float:
        return self.summary.throughput_samples_per_s / self.baseline_throughput_samples_per_s

    def to_json(self, host_timings: bool = False) -> dict[str, Any]:
        """The prediction as JSON: the same bytes for the same inputs and seed. The host's
        wall time and event rate (they differ run to run) only with `host_timings`."""
        out = self._model_json()
        if host_timings:
            out["simulation"]["wall_s"] = self.wall_s
            out["simulation"]["events_per_s"] = self.result.events / max(self.wall_s, 1e-9)
        return out

    def _model_json(self) -> dict[str, Any]:
        s, sc = self.summary, self.scenario
        prov = sc.cluster.provenance
        return {
            "strategy": self.strategy,
            "options": self.options,
            "cluster": sc.cluster.name,
            "workload": sc.workload.name,
            "workers": sc.workers,
            "batch_size": sc.batch_size,
            "seed": sc.seed,
            "throughput_samples_per_s": s.throughput_samples_per_s,
            "step_time_s": {"mean": s.step_time_s.mean, "p50": s.step_time_s.p50,
                            "p95": s.step_time_s.p95},
            "step_time_interval_s": None if self.interval is None else {
                "low": self.interval.low_s, "high": self.interval.high_s,
                "coverage": self.interval.coverage, "source": self.interval_source},
            "step_time_interval_reason": (None if self.interval is not None
                                          else self.interval_source),
            "breakdown": {"compute_s": s.compute_s, "comm_exposed_s": s.comm_exposed_s,
                          "wait_s": s.wait_s},
            "speedup_vs_1_worker": self.speedup,
            "speedup_baseline": "one worker of the same cluster and batch, no communication",
            "memory": {role: _memory_json(m) for role, m in self.memory.items()},
            "staleness": {"mean": s.staleness.mean, "p50": s.staleness.p50,
                          "p95": s.staleness.p95, "max": s.staleness.max,
                          "per_worker_mean": list(s.staleness_per_worker)},
            "provenance": {k: v for k, v in asdict(prov).items() if v not in ("", 0, ())},
            **({} if self.hardware is None else {
                "hardware": self.hardware.to_json(),
                "throughput_per_gpu_including_servers_samples_per_s":
                    self.throughput_per_device}),
            "simulation": {"events": self.result.events,
                           "steps_per_worker": sc.steps, "warmup_steps": sc.warmup_steps,
                           "notes": list(self.result.notes)},
        }


def _memory_json(m: MemoryBreakdown) -> dict[str, Any]:
    parts = {k: v for k, v in asdict(m).items() if k != "capacity_bytes"}
    return {"peak_bytes": m.peak_bytes, "capacity_bytes": m.capacity_bytes, "oom": m.oom,
            "parts": parts}


def baseline_throughput(scenario: Scenario) -> float:
    """One worker at nominal speed training alone: the reference for speedup."""
    single = replace(scenario, workers=1, speed=())
    return summarise(make_strategy("ddp").simulate(single), single).throughput_samples_per_s


def predict(strategy: str, scenario: Scenario, **options: Any) -> Prediction:
    model = make_strategy(strategy, **options)
    memory = dict(model.memory(scenario))
    hardware = model.hardware(scenario) if hasattr(model, "hardware") else None
    # The collector stays off from the simulation to the summary: turning the records into
    # arrays makes hundreds of thousands of objects, and its scans of them cost 0.3-0.4 s
    # at 4096 PS workers. No output depends on it.
    with quiet_gc():
        start = time.perf_counter()
        result = model.simulate(scenario)
        wall = time.perf_counter() - start
        summary = summarise(result, scenario)
        baseline = baseline_throughput(scenario)
    interval, source = step_time_interval(scenario, summary)
    return Prediction(
        strategy=strategy, options=asdict(model.options), scenario=scenario,
        summary=summary, baseline_throughput_samples_per_s=baseline,
        memory=memory, result=result, wall_s=wall, interval=interval, interval_source=source,
        hardware=hardware)


def step_time_interval(scenario: Scenario, summary: Summary
                       ) -> tuple[PredictionInterval | None, str]:
    """(interval around the mean step time, where it comes from), or (None, why there is none)."""
    cluster = scenario.cluster
    if cluster.provenance.source != "measured":
        return None, (f"'{cluster.name}' is a spec-derived profile: nothing was measured, so "
                      f"there is no interval; calibrate it on the cluster with `perfmodel "
                      f"calibrate --cluster {cluster.name}`")
    errors = cluster.calibration_errors
    if errors is None:
        return None, (f"{cluster.path} lacks calibration.network_rms_rel, compute_rms_rel or "
                      f"run_spread_cv: its calibration did not measure the network, compute "
                      f"and a repeated run, so there is no interval")
    point = summary.step_time_s.mean
    interval, how = interval_for(point, errors, compute_share=summary.compute_s / point)
    source = f"{how} ({cluster.path.name})"
    return interval, source
