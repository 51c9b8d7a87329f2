"""The held-out protocol: calibration set A, the disjoint set B, and what each B item becomes.

Set A is the calibration suite of `perfmodel calibrate` (calibration/suite.py): collective
sweeps at 2 ranks, per-unit compute timings, DDP at 2 workers with each workload's default
batch and buckets, and a 1-worker synchronous parameter server. Its stored runs are fitted
by calibration/from_store.py into the profile every prediction here uses.

Set B (`held_out_set`) is data: perfmodel/data/heldout/local.toml, whose header says what
is fitted and what is held out. It varies what set A keeps fixed, one thing at a time: the
batch size, the DDP bucket size, the workload, FSDP full-shard and grad-op, every PS mode,
stragglers (speed factors), a slower link (measure/netem.py's rate cap, root only) and —
beyond the 2 cores of this machine — 4 and 8 workers in the timed-wait compute mode
(measure/timed_wait.py: each worker sleeps the calibrated compute time while communication,
synchronisation and PS queueing stay real, as on GPUs that leave the CPU free).
`check_disjoint` refuses a set B that shares a configuration with set A.

How a B item is predicted (`scenario_for`, `model_options`):
- the same workers, batch, speeds and steps as the run (steps = warm-up + timed steps);
- timed-wait runs: compute cannot be slowed by communication (overlap_slowdown = 1) or by
  sharing cores (a sleeping worker leaves its core free: compute_occupies_cores = False;
  a PS server's applies and the CPU copies of its messages still share them); the waits
  are the model's own unit times (`compute_wait`), so what is tested is communication,
  synchronisation and queueing. A timed-wait PS worker's steps stray as the calibration's
  crowded timed-wait run measured (compute.timed_wait_spread_ms: a sleep on a crowded host
  ends when the scheduler gives the core back): log-normal jitter whose SD is that spread
  at the worker's nominal step, since which worker reaches the serial server first decides
  an SSP run's staleness; DDP and FSDP ranks keep exact waits (what spreads
  their measured steps is mostly the collectives' CPU sharing, which the node floor
  carries: a spread drawn per rank on top would count it again as waiting for the slowest);
- PS rows are predicted over MODEL_SEEDS seeds (seed, seed + 1, ...) and the medians over
  them compared, as the measured median over repeats is (`perfmodel/compare/run.py`): a
  crowded SSP run flips between two orders of service, so one seed is one draw; the seeds'
  spread also gives each staleness a 90 % interval for the median of the runs;
- a capped link: the ranks sit on two emulated nodes (devices_per_node = 1) joined by an
  inter-node link of the cap's bandwidth, with the calibrated loopback latency;
- FSDP on CPU: prefetch 0, since the measured run times each gloo collective synchronously
  (measure/runs/fsdp.py), so no all-gather is in flight ahead of its unit;
- ssp-ps: the measured run's staleness bound (measure's default 1).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmodel import strategies as strategy_records
from perfmodel.cluster import ClusterProfile, Link
from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import ps_worker_seconds, unit_times
from perfmodel.sim.ddp import HARNESS_COMM_HOOK as HARNESS_DDP_HOOK
from perfmodel.sim.scenario import Scenario, timed_wait_jitter
from perfmodel.tomlfile import Fields, load_toml
from perfmodel.workload import load_workload

WARMUP_STEPS = 2
# Timed steps per worker of each B run. The full set's 40 (12 until 2026-12-05, report 30):
# a 2-worker async run with a half-speed worker gives its slow worker ~5 updates in the
# steady window at 12 steps, so one update more or less of staleness 1 or 2 moved its
# per-speed mean by 10 % (reports 27-30 measured 1.80, 2.00, 2.00, 1.80): the 10 % target
# could not be resolved. 40 steps give ~19; a run gets ~3 s longer (28 steps of 40-150 ms).
STEPS = {"full": 40, "quick": 6}
# Timed steps per worker of each PS run (a PS row's staleness is a property of its sequence of
# updates): 200 in the full set from report 42 (decided before it, session 27; 40 before).
# An SSP run with a straggler starts in one order of service and settles into another
# (docs/model.md, "Known simplifications"): at 40 steps a run's staleness is mostly that
# transient, whose length varies run to run. The model at 40 / 120 / 200 steps (report 41's
# profile, 30 seeds): the SSP fast workers' mean 1.32 / 1.12 / 1.08, its SD over seeds
# 0.20 / 0.07 / 0.05, so by 200 steps a run measures the settled order, not how long the
# first one lasted; three runs of 200 steps (an exploration, not a report) measured 1.05-1.10,
# settling within ~50 steps. Every PS row alike; a run gets ~10-60 s longer.
PS_STEPS = {"full": 200, "quick": 6}
# Seeds of the model per PS row, for every PS row alike: the point predictions are the
# medians over them, their range is shown beside, and their spread gives each staleness its
# interval (uncertainty.py `median_of_runs_interval`). 9 from report 35 on; 45 from report 41
# (decided before it, session 26): over 9 seeds the SSP row's fast-worker median itself moved
# by ~8 % (its seeds flip between two regimes), and 5 %/95 % tails need more than 9 seeds.
# ~0.1 s a seed.
MODEL_SEEDS = 45
SSP_DEFAULT_BOUND = 1                   # measure/runs/ps.py's default staleness bound
TIMEOUT_S = 300.0                       # process-group timeout of each B run
HELD_OUT_FILE = Path(__file__).resolve().parent.parent / "data" / "heldout" / "local.toml"
HELD_OUT_FIELDS = ("key", "what", "strategy", "workload", "workers", "batch_size", "speed",
                   "options", "timed_wait", "link_rate_Gbps")


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """One configuration of set B."""

    key: str                            # unique, e.g. "ddp-mlp-b32"
    what: str                           # what differs from set A, for the report
    strategy: str                       # ddp, fsdp, sync-ps, async-ps, ssp-ps
    workload: str
    workers: int
    batch_size: int | None = None       # None: the workload's
    speed: tuple[float, ...] = ()       # relative worker speeds; () = all 1
    options: dict[str, Any] = field(default_factory=dict)   # the measured kind's options
    timed_wait: bool = False
    link_rate_Gbps: float | None = None

    @property
    def kind(self) -> str:
        return strategy_records.get(self.strategy).family

    @property
    def batch(self) -> int:
        return self.batch_size or load_workload(self.workload).batch_size

    @property
    def mode(self) -> str:
        return "timed-wait" if self.timed_wait else "real"

    @property
    def processes(self) -> int:
        return self.workers + (1 if self.kind == "ps" else 0)

    @property
    def label(self) -> str:
        extra = [f"{k}={v}" for k, v in sorted(self.options.items()) if k != "mode"]
        if self.speed:
            extra.append("speed " + ",".join(f"{s:g}" for s in self.speed))
        if self.link_rate_Gbps:
            extra.append(f"link {self.link_rate_Gbps:g} Gbit/s")
        if self.timed_wait:
            extra.append("TIMED-WAIT")
        return (f"{self.strategy} {self.workload} x{self.workers} b{self.batch}"
                + (f" ({', '.join(extra)})" if extra else ""))


def held_out_set(quick: bool = False, path: Path | None = None) -> tuple[HeldOut, ...]:
    """Set B from its data file (perfmodel/data/heldout/local.toml): the [[full]] items, or
    with --quick the [[quick]] ones (three 2-worker configurations: tests, a first look)."""
    path = HELD_OUT_FILE if path is None else Path(path)
    name = "quick" if quick else "full"
    items = load_toml(path).get(name)
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise PerfmodelError(f"{path}: no [[{name}]] configurations of the held-out set")
    out = tuple(_held_out_item(Fields(item, path, f"{name}[{n}].")) for n, item in
                enumerate(items))
    keys = [h.key for h in out]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise PerfmodelError(f"{path}: key(s) {', '.join(twice)} appear more than once in "
                             f"[[{name}]]; every held-out configuration needs its own key")
    return out


def _held_out_item(f: Fields) -> HeldOut:
    unknown = sorted(set(f.data) - set(HELD_OUT_FIELDS))
    if unknown:
        raise PerfmodelError(f"{f.path}: unknown field(s) {', '.join(unknown)} in "
                             f"'{f.prefix.rstrip('.')}'; known: {', '.join(HELD_OUT_FIELDS)}")
    speed = f.data.get("speed", [])
    if not isinstance(speed, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in speed):
        raise PerfmodelError(f"{f.path}: field '{f.prefix}speed' must be a list of positive "
                             f"numbers")
    options = f.data.get("options", {})
    if not isinstance(options, dict):
        raise PerfmodelError(f"{f.path}: field '{f.prefix}options' must be a table")
    timed_wait = f.data.get("timed_wait", False)
    if not isinstance(timed_wait, bool):
        raise PerfmodelError(f"{f.path}: field '{f.prefix}timed_wait' must be true or false")
    return HeldOut(
        key=f.str("key"), what=f.str("what"), strategy=f.str("strategy"),
        workload=f.str("workload"), workers=f.integer("workers", minimum=1),
        batch_size=f.integer("batch_size", minimum=1) if f.has("batch_size") else None,
        speed=tuple(float(v) for v in speed), options=dict(options), timed_wait=timed_wait,
        link_rate_Gbps=(f.number("link_rate_Gbps", positive=True)
                        if f.has("link_rate_Gbps") else None))


# ---------------------------------------------------------------- set A and disjointness


def signature(kind: str, workload: str | None, workers: int, batch_size: int | None,
              speed, options: dict, mode: str, link_rate_Gbps: float | None) -> tuple:
    """What makes two training runs the same configuration (repeats and seeds aside)."""
    batch = batch_size or (load_workload(workload).batch_size if workload else None)
    opts = tuple(sorted((k, v) for k, v in (options or {}).items() if v is not None))
    return (kind, workload, int(workers), batch, tuple(float(s) for s in speed or ()), opts,
            mode, link_rate_Gbps)


def held_out_signature(h: HeldOut) -> tuple:
    return signature(h.kind, h.workload, h.workers, h.batch, h.speed, h.options, h.mode,
                     h.link_rate_Gbps)


def config_signature(config: dict[str, Any]) -> tuple | None:
    """The signature of a run's config.json; None for runs that train nothing."""
    kind = config.get("kind")
    if kind not in ("ddp", "fsdp", "ps"):
        return None
    return signature(kind, config.get("workload"), config.get("workers") or 1,
                     config.get("batch_size"), config.get("speed"),
                     (config.get("options") or {}).get(kind, {}),
                     config.get("compute_mode") or "real", config.get("link_rate_Gbps"))


def check_disjoint(held_out: tuple[HeldOut, ...], calibration_configs) -> None:
    """Refuse a set B with a configuration that set A calibrated on."""
    a = {s for c in calibration_configs if (s := config_signature(c)) is not None}
    shared = [h.key for h in held_out if held_out_signature(h) in a]
    if shared:
        raise PerfmodelError(f"held-out configuration(s) {', '.join(shared)} are also in the "
                             f"calibration set; a held-out check must predict what was not "
                             f"fitted")


# ---------------------------------------------------------------- predictions


def model_options(h: HeldOut, *, cpu: bool = True) -> dict[str, Any]:
    """The strategy options that describe the run `h` to the model (module docstring)."""
    o = h.options
    if h.kind == "ddp":     # measure/runs/ddp.py times the buckets with a comm hook
        cap, first = o.get("bucket_cap_MiB"), o.get("first_bucket_MiB")
        if cap is None and first is None:
            return {"comm_hook": HARNESS_DDP_HOOK}
        cap = float(cap if cap is not None else 25.0)       # torch: a set cap is the
        return {"bucket_cap_MiB": cap, "comm_hook": HARNESS_DDP_HOOK,  # first bucket too
                "first_bucket_MiB": float(first if first is not None else cap)}
    if h.kind == "fsdp":
        return {"variant": o.get("variant", "full-shard"), "prefetch": 0 if cpu else 1}
    if h.strategy == "ssp-ps":
        return {"staleness_bound": int(o.get("staleness_bound", SSP_DEFAULT_BOUND))}
    if h.strategy == "async-ps":
        return {k: bool(o[k]) for k in ("staleness_aware_lr", "delay_compensation") if k in o}
    return {}


def cluster_for(h: HeldOut, profile: ClusterProfile) -> ClusterProfile:
    """The profile as this run sees it: timed-wait compute, or the capped link."""
    cluster = profile
    if h.timed_wait:
        cluster = cluster.as_timed_wait()
    if h.link_rate_Gbps:
        def cap(link: Link) -> Link:
            return Link(bandwidth_GBps=h.link_rate_Gbps / 8.0, latency_us=link.latency_us,
                        efficiency_by_bytes=((1.0, 1.0),))
        p2p = profile.intra_node.p2p
        capped = dataclasses.replace(cap(profile.intra_node),
                                     p2p=None if p2p is None else cap(p2p))
        cluster = dataclasses.replace(cluster, devices_per_node=1, inter_node=capped)
    return cluster


def scenario_for(h: HeldOut, profile: ClusterProfile, *, steps: int, seed: int) -> Scenario:
    jitter, cv = "lognormal", None              # real compute: the profile's jitter_cv
    cluster, workload = cluster_for(h, profile), load_workload(h.workload)
    if h.timed_wait:
        spread_s = profile.compute.timed_wait_spread_ms * 1e-3 if h.kind == "ps" else 0.0
        jitter, cv = timed_wait_jitter(spread_s, ps_worker_seconds(cluster, workload, h.batch))
    return Scenario(cluster=cluster, workload=workload,
                    workers=h.workers, batch_size=h.batch, steps=WARMUP_STEPS + steps,
                    warmup_steps=WARMUP_STEPS, speed=h.speed, jitter=jitter,
                    jitter_cv=cv, seed=seed)


def compute_wait(h: HeldOut, profile: ClusterProfile) -> dict[str, Any]:
    """config `compute_wait_s` of a timed-wait run: the model's own per-unit seconds."""
    fraction = {"ddp": 1.0, "fsdp": 1.0 / h.workers, "ps": 0.0}[h.kind]
    t = unit_times(profile, load_workload(h.workload), h.batch,
                   optimizer_param_fraction=fraction)
    return {"forward": [float(x) for x in t.forward_s],
            "backward": [float(x) for x in t.backward_s], "optimizer": float(t.optimizer_s)}


# The compute fields a timed wait's sleeps come from (`compute_wait` -> sim/compute.py
# `unit_times` with one busy process): the passes' rates, the whole-step factor and the
# optimizer's rate. Every other field (the collectives, the CPU floor, the copies, the
# core-sharing and spread fits) is the host's real work beside the sleeps.
WAIT_FIELDS = ("efficiency_by_flops", "overhead_us_per_unit", "backward_flops_ratio",
               "backward_bytes_ratio", "optimizer_GBps", "memory_efficiency",
               "launch_us_per_kernel", "whole_step_factor", "by_workload", "by_precision",
               "weight_stream_GBps")


def with_waits_of(profile: ClusterProfile, waits: ClusterProfile) -> ClusterProfile:
    """`profile` whose timed waits sleep what `waits`' do (WAIT_FIELDS taken from `waits`):
    a timed-wait run measured with the waits of one fit (`run_config`) predicted with a
    later fit (`perfmodel compare --bracket`) must be predicted with the sleeps it slept,
    and only its real work from the later fit."""
    taken = {f: getattr(waits.compute, f) for f in WAIT_FIELDS}
    return dataclasses.replace(profile, compute=dataclasses.replace(profile.compute, **taken))


def timed_steps(h: HeldOut, steps: int, ps_steps: int | None = None) -> int:
    """The timed steps of a run of `h`: `ps_steps` for a PS row where given, else `steps`."""
    return ps_steps if h.kind == "ps" and ps_steps is not None else steps


def run_config(h: HeldOut, profile: ClusterProfile, *, steps: int, seed: int,
               repeat: int) -> dict[str, Any]:
    """config.json of one real run of `h` (measure/configs.py), marked as a compare run."""
    from measure.configs import training_config

    options = dict(h.options)
    if h.kind == "ps":
        # The server evaluates its model only before the first and after the last update:
        # an evaluation inside the run stalls every reply (~0.1-0.3 s each on this host, 8 a
        # run by default) and the model times training, not evaluation (as calibration's PS
        # run does, calibration/suite.py).
        updates = (steps + WARMUP_STEPS) * max(h.workers, 1)
        options.setdefault("eval_every", updates + 1)
    config = training_config(
        h.kind, workers=h.workers, workload=h.workload, batch_size=h.batch, steps=steps,
        warmup_steps=WARMUP_STEPS, speed=",".join(f"{s:g}" for s in h.speed) or None,
        seed=seed, timeout_s=TIMEOUT_S, threads_per_worker=1, options=options)
    if h.timed_wait:
        config["compute_mode"] = "timed-wait"
        config["compute_wait_s"] = compute_wait(h, profile)
    config["compare"] = {"item": h.key, "repeat": repeat}
    return config


# ---------------------------------------------------------------- where set A comes from


def check_host(calibrated_on: str, here: str, *, allow: bool, what: str) -> str | None:
    """Refuse a calibration made on another machine (one line); with `allow`, a warning."""
    hosts = {h.strip() for h in calibrated_on.split(",") if h.strip()}
    if not hosts or hosts == {here}:
        return None
    message = (f"{what} was calibrated on {', '.join(sorted(hosts))}, not on this host "
               f"({here}); measurements here would be compared with another machine's model")
    if not allow:
        raise PerfmodelError(message + ": calibrate here with `perfmodel calibrate --cluster "
                             "local`, or pass --allow-other-host to compare anyway")
    return "warning: " + message


@dataclass(frozen=True, kw_only=True)
class CalibrationRuns:
    """Set A as found in the store: run ids by suite item, and what is missing."""

    suite: str                          # "full" or "quick"
    ids: tuple[int, ...]
    labels: tuple[str, ...]             # one per id, what the run measured
    missing: tuple[str, ...]            # labels of suite items with no stored run
    elsewhere: tuple[str, ...]          # hosts whose runs would match but are not this one


def find_calibration_runs(stored, suite, *, host: str, any_host: bool = False
                          ) -> CalibrationRuns:
    """The newest successful stored run of every suite measurement, from this host (with
    `any_host`, from any host when this one has none): calibration.suite.newest_runs."""
    from calibration.suite import newest_runs

    found = newest_runs(stored, suite, host=host, any_host=any_host)
    return CalibrationRuns(suite="", ids=found.ids, labels=found.labels,
                           missing=found.missing, elsewhere=found.elsewhere)


def calibration_set(stored, cluster: str, *, host: str, any_host: bool = False,
                    kind: str = "cpu", seed: int = 0) -> tuple[CalibrationRuns, tuple]:
    """Set A: the full suite's runs if all are stored, else the quick suite's; else the
    full suite with what is missing. Returns (runs, the suite's configs)."""
    from calibration.suite import build_suite

    best = None
    for name in ("full", "quick"):
        suite = build_suite(kind, suite=cluster, quick=name == "quick", seed=seed)
        found = dataclasses.replace(
            find_calibration_runs(stored, suite, host=host, any_host=any_host), suite=name)
        if not found.missing:
            return found, tuple(m.config for m in suite)
        if best is None:
            best = (found, tuple(m.config for m in suite))
    return best


def missing_calibration_message(found: CalibrationRuns, cluster: str, store_path,
                                here: str) -> str:
    if found.elsewhere and not found.ids:
        return (f"the calibration runs for '{cluster}' in {store_path} were measured on "
                f"{', '.join(found.elsewhere)}, not on this host ({here}); a comparison needs "
                f"them from this machine: run `perfmodel calibrate --cluster {cluster} --db "
                f"{store_path}` here (or pass --calibrate)")
    shown = ", ".join(found.missing[:3]) + (" ..." if len(found.missing) > 3 else "")
    return (f"the store {store_path} lacks {len(found.missing)} calibration run(s) for "
            f"'{cluster}' ({shown}); measure them with `perfmodel calibrate --cluster {cluster} "
            f"--db {store_path}` (or pass --calibrate to measure them now)")


def today() -> str:
    return dt.date.today().isoformat()
