"""From stored measurement runs to a measured cluster profile: rows -> fit inputs -> profile.

What each kind of run (measure/store.py) feeds:

- collectives (nccl-tests sweeps): the link α, bandwidth and efficiency curve of
  calibration/fit_network.py; single-node runs fit `intra_node`, runs whose config says
  `nodes` > 1 fit `inter_node`.
- compute (per-unit forward/backward medians): the overhead and efficiency curve of
  calibration/fit_compute.py, units keyed "<workload>/<unit>" so that several workloads share
  one fit; units without FLOPs (embedding lookups) are left out. Their optimizer-step timings
  (summary `optimizer_step_s`) give compute.optimizer_GBps (model-state bytes per second) and
  server.apply_GBps: a parameter server's apply *is* the workload's optimizer step on the
  whole model (measure/runs/ps.py `Server.apply`), so gradient bytes / optimizer_step_s.
- ddp / fsdp with >= 2 workers: compute.overlap_slowdown, fitted as the simulator uses it
  (perfmodel/sim/ddp.py stretches backward, fsdp.py forward and backward while communication
  is in flight): measured step compute_s ≈ (the rest + optimizer) + s x (overlapped passes
  x the share of their time with collectives in flight; DDP on a CPU-driven link: its
  all-reduce seconds before backward ends over backward's, DDP.overlap_share), least
  squares in relative error;
  compute.jitter_cv from each rank's step compute_s (divided by its own mean, so rank and
  run offsets do not count as jitter);
  device.framework_overhead_GiB and memory_overhead_fraction from each rank's measured peak
  against perfmodel/memory.py (fit_memory.py) — when the runs span >= 1.5x in modelled memory.
  On a CPU host the FSDP runs also give compute.copy_GBps (`_copy_rate`) and, since their gloo
  collectives block, the all-gather and reduce-scatter time factors (`_fsdp_collectives`:
  scaled to the runs' measured collective time; the crowded stretch rows scaled back).
- compute in concurrent mode (1, 2 and 3 processes timing whole steps at once):
  compute.core_contention from CPU seconds per step, and checks of the whole core-sharing
  factor against the wall-time ratios (calibration/fit_cores.py); the profile's
  topology.compute_cpu_cores_per_node is the host's core count.
- ps: on a CPU host, the serial server's own time per update (apply + pack, recorded at the
  server) from two workloads' 1-worker runs: `[server.update]` (`_server_update`); from the
  same runs its one push and one reply, each latency + bytes / rate: `[server.push]`,
  `[server.reply]` (`_server_messages`; a push took ~1.5x a ping-pong message of its size
  here). Then checks: the round trip a worker waits (push + apply + pull) against the
  model's parts alone (`ps_round_trip_unshared_s`, with no core sharing) where the messages
  were not fitted (where they were, it is in-sample and left out) — and each rank's
  measured peak against perfmodel/memory.py ps_memory. The self-check below predicts the same
  runs with the whole simulation, sharing included (in-sample where the messages were
  fitted: it says so).
- timed waits (measure/timed_wait.py) with more processes than cores, on a CPU host: a PS
  one gives compute.timed_wait_spread_ms (`_timed_wait_spread`); DDP ones give
  compute.ddp_cpu_work_factor, their processes' CPU a step over the model's count of the
  node's CPU work (`_ddp_cpu_work`). No other fit uses a timed wait.
- a check with a stated tolerance that misses it says so loudly: a note starting
  CHECK_FAILED in the profile's [calibration] notes, which `perfmodel calibrate` also
  prints to stderr.
- the self-check (calibration/selfcheck.py): every training run no fit used (PS runs, and
  runs marked `role = "check"`, which every fit leaves out) is predicted with the finished
  profile component by component; what is off by more than its tolerance is written to
  [calibration.self_check] and, loudly, to the notes (`self_check_warnings`).
- repeated training configurations (same config but for the calibration repeat marker): the
  run-to-run spread, pooled CV of each run's median step time (perfmodel/uncertainty.py).
- the DDP/FSDP runs the fits used, predicted with the finished profile: `step_rms_rel`, the
  RMS of log(predicted / measured) mean step time, in-sample; with the run-to-run spread it
  sets the width of every prediction interval from this profile (perfmodel/uncertainty.py).

A part without data keeps the base profile's value and is listed as unmeasured; a part with
data that cannot be fitted is a PerfmodelError naming the measurements missing and the
command that measures them. Notes (what was left out and why) and checks go into the
profile's [calibration] table next to the residuals.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from calibration.fit import FitResult, fit_rate, fit_result, relative_lstsq
from calibration.fit_comm_sharing import SharingFit, fit_comm_sharing, shared
from calibration.fit_compute import UnitTiming, fit_compute, fit_jitter_cv, fit_optimizer_rate
from calibration.fit_cores import (
    ConcurrentTiming,
    fit_core_contention,
    fit_ddp_cpu_work_factor,
    fit_sharing_delay_cv,
    fit_timed_wait_spread,
    fit_whole_step_factor,
    sharing_checks,
)
from calibration.fit_memory import MemorySample, fit_memory, memory_sample
from calibration.fit_network import CollectiveSample, fit_network
from calibration.fit_ps import (
    fit_crowded_factor,
    fit_server_apply,
    fit_server_messages,
    fit_server_update,
)
from calibration.hardware import detect, shipped_profile
from calibration.pool import ID_STRIDE, SAME_MACHINE_RATIO, PooledStore
from calibration.profile_writer import MeasuredFits, RunInfo, WorkloadFits, build_profile
from calibration.selfcheck import (
    COMMUNICATION,
    SelfCheck,
    check_run,
    is_check_run,
    is_timed_wait,
    load_tolerances,
    measured_components,
    predicted_components,
)
from measure.configs import processes
from measure.cpu_meter import cpu_use
from perfmodel.cluster import SHIPPED_PROFILES, ClusterProfile, load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown, ddp_memory, fsdp_memory, ps_memory
from perfmodel.sim import psnet
from perfmodel.sim.compute import ps_worker_seconds, unit_times, weights_streamed_s
from perfmodel.sim.cores import own_work_s_per_byte
from perfmodel.sim.ddp import HARNESS_COMM_HOOK as HARNESS_DDP_HOOK
from perfmodel.sim.fsdp import FSDP, copy_bytes, divide_bytes
from perfmodel.sim.ps import message_s, server_apply_s
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.workload import Workload, load_workload

TRAINING_KINDS = ("ddp", "fsdp", "ps")
OVERLAPPED = {"ddp": ("backward",), "fsdp": ("forward", "backward")}   # as perfmodel/sim/
# What measures each part, for "missing" messages.
COMMANDS = {
    "network": "perfmodel measure collectives --workers 2",
    "compute": "perfmodel measure compute --workload mlp",
    "overlap": "perfmodel measure ddp --workers 2 --workload mlp",
    "memory": "perfmodel measure ddp --workers 2 --workload cnn-small (a second model size)",
    "optimizer": "perfmodel measure compute --workload cnn-small (a second workload)",
}
T = TypeVar("T")
CHECK_FAILED = "CHECK FAILED"
# compute.overlap_slowdown below this cannot be interference (it only slows compute down)
OVERLAP_FLOOR = 1.0
# The PS round trip's tolerance: between runs the mean step moves ±15-20 % on a shared
# 2-core host (DESIGN.md, "What this machine can and cannot measure"), so a model off by
# more than 20 % is off by more than the machine's noise.
PS_ROUND_TRIP_TOL = 0.20


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Everything fitted from a set of runs, before it becomes a profile."""

    base: ClusterProfile
    fits: MeasuredFits
    info: RunInfo
    run_ids: tuple[int, ...]
    notes: tuple[str, ...]
    checks: dict[str, dict[str, float]]
    by_op: dict[str, dict[str, float]]        # network residuals per collective
    self_checks: tuple[SelfCheck, ...] = ()
    spread_warning: str | None = None         # the repeats spread more than they should

    def profile(self, name: str) -> dict[str, Any]:
        data = build_profile(name, self.base, self.fits, self.info)
        table = data["calibration"]
        table["run_ids"] = list(self.run_ids)
        table["notes"] = list(self.notes)
        table["checks"] = self.checks
        table["residuals_by_op"] = self.by_op
        if self.self_checks:
            table["self_check"] = {f"run{c.run_id}": c.as_table() for c in self.self_checks}
        if self.self_checks or self.spread_warning:
            table["self_check_warnings"] = self.warnings
        return data

    @property
    def warnings(self) -> list[str]:
        """The self-check's loud lines: one per component off by more than its tolerance."""
        return ([self.spread_warning] if self.spread_warning else []) + [
            w for c in self.self_checks for w in c.warnings()]


def fit_from_runs(store, run_ids: Sequence[int], *, name: str, base: str = "local"
                  ) -> dict[str, Any]:
    """Profile data (as profile_writer.build_profile returns it) fitted from these runs."""
    return calibrate_runs(store, run_ids, base=base).profile(name)


def base_profile(name: str) -> ClusterProfile:
    """The shipped profile of that name if there is one, else whatever `load_cluster` finds."""
    if (SHIPPED_PROFILES / f"{name}.toml").exists():
        return shipped_profile(name)
    return load_cluster(name)


def calibrate_runs(store, run_ids: Sequence[int], *, base: str = "local") -> Calibration:
    """Fit every part the runs have data for (see the module docstring)."""
    base_cluster = base_profile(base)
    notes: list[str] = []
    runs = [store.get_run(int(i)) for i in dict.fromkeys(run_ids)]
    if isinstance(store, PooledStore) and len(store.sources) > 1:
        notes.append(f"pooled set A of {len(store.sources)} stores (calibration/pool.py): "
                     + "; ".join(store.describe()))
    failed = [r.row.id for r in runs if r.row.status != "ok"]
    if failed:
        notes.append(f"left out failed run(s) {', '.join(map(str, failed))}")
    runs = [r for r in runs if r.row.status == "ok"]
    if isinstance(store, PooledStore) and len(store.sources) > 1:
        notes.append(_one_machine(store, runs))
    by_kind: dict[str, list] = defaultdict(list)
    # timed waits: fitted for the wait's spread only; a PS one is also self-checked
    timed_waits = [r for r in runs if is_timed_wait(r)]
    held_back = [r for r in runs if is_check_run(r)
                 and (r not in timed_waits or r.row.kind == "ps")]
    held_ids = {r.row.id for r in held_back}
    for r in runs:
        if r in timed_waits:
            continue
        if r.row.kind == "ps" or r.row.id not in held_ids:  # PS runs only feed checks anyway
            by_kind[r.row.kind].append(r)
    if not any(by_kind[k] for k in ("collectives", "compute", *TRAINING_KINDS)):
        raise PerfmodelError(
            f"nothing to calibrate from: runs {', '.join(map(str, run_ids)) or '(none)'} hold "
            f"no successful collectives, compute, ddp, fsdp or ps measurement; measure them "
            f"with `perfmodel calibrate` or `perfmodel measure ...`")

    host = (dataclasses.replace(base_cluster, comm_cpu_cores_per_node=os.cpu_count() or 1)
            if base_cluster.comm_cpu_cores_per_node else None)      # CPU-driven links
    network, sharing = _network(by_kind["collectives"], host, base_cluster, notes)
    concurrent = [r for r in by_kind["compute"] if _is_concurrent(r)]
    units = [r for r in by_kind["compute"] if not _is_concurrent(r)]
    compute, optimizer, apply = _compute(units, base_cluster, notes)
    checks: dict[str, dict] = {}
    contention, sharing_delay = _cores(concurrent, base_cluster, notes, checks)
    fits = MeasuredFits(intra_node=(network or {}).get("intra_node"),
                        inter_node=(network or {}).get("inter_node"), compute=compute,
                        optimizer_GBps=optimizer, server_apply_GBps=apply,
                        core_contention=contention, sharing_delay_cv=sharing_delay,
                        comm_cpu_bound_fraction=sharing.fraction if sharing else None,
                        comm_cpu_bound_by_bytes=sharing.by_bytes if sharing else (),
                        comm_cpu_stretch_by_level=sharing.by_level if sharing else (),
                        comm_cpu_busy_by_level=sharing.busy_by_level if sharing else ())
    if contention is not None and compute is not None:
        passes = _as_cluster(base_cluster, fits)
        fits = dataclasses.replace(fits, whole_step_factor=_whole_step(concurrent, passes),
                                   by_workload=_by_workload(concurrent, passes, notes))
    # the profile so far: the model that the overlap fit and the checks predict with
    stage1 = _as_cluster(base_cluster, fits)
    # the host's copy rate first: DDP's reducer copies at it, inside the compute the overlap
    # fit explains (FSDP on gloo overlaps nothing, so its copies do not need the overlap)
    copy = _copy_rate(by_kind["fsdp"], stage1, notes)
    if copy is not None:
        fits = dataclasses.replace(fits, copy_GBps=copy)
        stage1 = _as_cluster(base_cluster, fits)
    fits = _fsdp_collectives(by_kind["fsdp"], stage1, fits, notes)
    stage1 = _as_cluster(base_cluster, fits)
    parallel = [r for k in ("ddp", "fsdp") for r in by_kind[k] if (r.row.workers or 1) > 1]
    overlap = jitter = None
    if parallel and compute is None:
        notes.append("compute.overlap_slowdown not fitted: it needs the compute profile "
                     f"(`{COMMANDS['compute']}`)")
    elif parallel:
        # FSDP2 on gloo issues blocking collectives: it overlaps nothing (perfmodel/sim/fsdp.py)
        overlaps = [r for r in parallel if r.row.kind == "ddp" or not FSDP.blocking(stage1)]
        if overlaps:
            overlap = _overlap(overlaps, stage1)
            notes += overlap_warning(overlap)
        else:
            notes.append("compute.overlap_slowdown not fitted: FSDP on gloo blocks on its "
                         f"collectives, so it overlaps nothing (`{COMMANDS['overlap']}`)")
        stage1 = _as_cluster(base_cluster, dataclasses.replace(fits, overlap_slowdown=overlap))
    if parallel:
        jitter = _jitter(parallel)
    memory = _memory(_memory_runs(by_kind, base_cluster, notes), base_cluster, notes)
    server_update = _server_update(by_kind["ps"], base_cluster, notes)
    if server_update is not None:
        fits = dataclasses.replace(fits, server_update=server_update)
    server_messages = _server_messages(by_kind["ps"], base_cluster, notes)
    if server_messages is not None:
        fits = dataclasses.replace(fits, server_messages=server_messages)
    if server_update is not None or server_messages is not None:
        stage1 = dataclasses.replace(stage1, server=_as_cluster(base_cluster, fits).server)
    checks |= _ps_checks(by_kind["ps"], stage1, base_cluster)
    ps_extra = _ps_worker_extra(by_kind["ps"], stage1, notes)
    if ps_extra:
        fits = dataclasses.replace(fits, ps_worker_extra=ps_extra)
    if timed_waits and base_cluster.compute_cpu_cores_per_node:
        ps_waits = [r for r in timed_waits if r.row.kind == "ps"]
        if ps_waits:
            messages, update = _crowded_server(ps_waits, _as_cluster(base_cluster, fits), notes)
            fits = dataclasses.replace(
                fits, timed_wait_spread=_timed_wait_spread(ps_waits, notes),
                crowded_message_factor=messages, crowded_update_factor=update)
        ddp_waits = [r for r in timed_waits if r.row.kind == "ddp"]
        if ddp_waits:
            fits = dataclasses.replace(fits, ddp_cpu_work_factor=_ddp_cpu_work(
                ddp_waits, _as_cluster(base_cluster, fits), notes))
    notes += failed_checks(checks)
    spread, spread_runs = _run_spread([r for k in TRAINING_KINDS for r in by_kind[k]])
    if spread is None and any(by_kind[k] for k in TRAINING_KINDS):
        notes.append("run-to-run spread not measured: no training configuration was run "
                     "twice, so predictions from this profile carry no interval")
    fits = dataclasses.replace(fits, overlap_slowdown=overlap, jitter_cv=jitter, memory=memory)
    by_op = {}
    for link in (fits.intra_node, fits.inter_node):
        if link is not None:
            by_op |= {f"{link.scope}.{op}": {"bias_rel": r.bias_rel, "rms_rel": r.rms_rel,
                                             "max_rel": r.max_rel, "points": r.points}
                      for op, r in link.by_op.items()}
    if spread is not None:
        notes.append(f"run-to-run spread {spread:.1%} (CV) from {spread_runs} repeated runs")
    info = RunInfo(host=_hosts(runs), device_names=_device_names(runs, base_cluster),
                   versions=_versions(runs), runs=len(runs), run_spread_cv=spread,
                   cpu_cores=os.cpu_count())     # fitted on the host that measured (checked)
    finished = _as_cluster(base_cluster, fits)
    step_rms, comm_rms, step_runs = _step_residual(
        [r for k in ("ddp", "fsdp") for r in by_kind[k]], finished, notes)
    info = dataclasses.replace(info, step_rms_rel=step_rms, step_comm_rms_rel=comm_rms,
                               step_rms_runs=step_runs)
    self_checks = _self_checks(held_back, finished, spread, notes)
    spread_warning = load_tolerances().spread_warning(spread)
    notes += [spread_warning] if spread_warning else []
    return Calibration(base=base_cluster, fits=fits, info=info,
                       run_ids=tuple(r.row.id for r in runs), notes=tuple(notes),
                       checks=checks, by_op=by_op, self_checks=self_checks,
                       spread_warning=spread_warning)


def _one_machine(store: PooledStore, runs) -> str:
    """Refuse to pool stores measured on different machines; else a note of how close they
    are. Each store's per-unit compute timings (its compute runs, one process alone) are
    compared with the first store's, unit by unit: the median ratio must lie within
    SAME_MACHINE_RATIO either way (calibration/pool.py says why and where the bound comes
    from). Stores without common unit timings cannot be compared and are not refused."""
    medians: list[dict[tuple, float]] = [{} for _ in store.sources]
    for r in runs:
        if r.row.kind != "compute" or _is_concurrent(r):
            continue
        k = r.row.id // ID_STRIDE
        for t in unit_timings([r])[0]:
            medians[k][(t.unit, t.phase, t.batch_size)] = t.median_s
    ratios = []
    for k in range(1, len(store.sources)):
        common = sorted(set(medians[0]) & set(medians[k]))
        if not common:
            continue
        ratio = float(np.median([medians[k][c] / medians[0][c] for c in common]))
        if max(ratio, 1 / ratio) > SAME_MACHINE_RATIO:
            raise PerfmodelError(
                f"--pool {store.sources[k].store.path}: its compute took {ratio:.2f}x as long "
                f"as in {store.sources[0].store.path} (median over {len(common)} unit "
                f"timings; sessions of one machine agree within {SAME_MACHINE_RATIO:.2f}x): "
                f"it was measured on another machine, and a pooled fit would fit neither; "
                f"pool only stores measured on this one")
        ratios.append(ratio)
    shown = ", ".join(f"{x:.2f}" for x in ratios) or "none comparable"
    return (f"pooled stores' compute against the first's (median unit-timing ratio; one "
            f"machine within {SAME_MACHINE_RATIO:.2f}x): {shown}")


def _step_residual(fitted, cluster: ClusterProfile, notes: list[str]
                   ) -> tuple[float | None, float | None, int]:
    """(RMS of log(predicted / measured) mean step time, the same with each run's measured
    compute in place of the model's, run count) over the DDP/FSDP runs the fits used
    (in-sample: the model's error at the step level, with those runs' own noise). The second
    is the communication model's share alone: the width for a timed wait, whose compute is
    the model's own by construction (perfmodel/uncertainty.py)."""
    logs, comm_logs = [], []
    for r in fitted:
        measured = measured_components(r)
        if not measured.get("step"):
            continue
        try:
            predicted = predicted_components(cluster, r)
        except PerfmodelError as e:
            notes.append(f"step residual of run {r.row.id} not computed: {e}")
            continue
        logs.append(math.log(predicted["step"] / measured["step"]))
        comm = COMMUNICATION[r.row.kind]
        comm_logs.append(math.log((measured["compute"] + predicted[comm]) / measured["step"]))
    if not logs:
        return None, None, 0
    rms = math.sqrt(sum(v * v for v in logs) / len(logs))
    comm_rms = math.sqrt(sum(v * v for v in comm_logs) / len(comm_logs))
    notes.append(f"step-time residual of the {len(logs)} fitted DDP/FSDP runs: {rms:.1%} RMS "
                 f"(log), bias {math.expm1(sum(logs) / len(logs)):+.1%}: the width of this "
                 f"profile's prediction intervals with the run-to-run spread; with their "
                 f"measured compute in place of the model's {comm_rms:.1%} RMS (the width "
                 f"for timed-wait runs, whose compute is the model's own)")
    return rms, comm_rms, len(logs)


# a crowded PS timed wait's self-check, once the crowded server's factors are fitted
CROWDED_IN_SAMPLE = ("its waits' spread and its server's crowded phases are fitted from it: "
                     "in-sample for its round trip")


def _self_checks(held_back, cluster: ClusterProfile, spread: float | None,
                 notes: list[str]) -> tuple[SelfCheck, ...]:
    """Predict every run no fit used with the finished profile (calibration/selfcheck.py)."""
    training = [r for r in held_back if r.row.kind in TRAINING_KINDS]
    if not training:
        notes.append("no self-check: no training run was left out of the fits (a PS run, or "
                     "one marked role = \"check\")")
        return ()
    tolerances, found = load_tolerances(), []
    for r in training:
        try:
            check = check_run(cluster, r, tolerances, spread)
        except PerfmodelError as e:
            notes.append(f"self-check of run {r.row.id} not possible: {e}")
            continue
        if check is not None:
            if is_timed_wait(r) and r.row.kind == "ps" and (
                    cluster.server.crowded_message_factor is not None
                    or cluster.server.crowded_update_factor is not None):
                check = dataclasses.replace(check, fitted_from_it=CROWDED_IN_SAMPLE)
            found.append(check)
    for c in found:
        worst = max(c.components, key=lambda x: abs(x.error_rel), default=None)
        if worst is not None and not c.flagged:
            fitted = "not fitted"
            if c.fitted_from_it:
                fitted = c.fitted_from_it
            elif c.label.endswith("timed wait"):
                fitted = "only its waits' spread is fitted from it"
            elif c.label.startswith("ps "):
                fitted = ("its server update, messages and worker compute are fitted from it: "
                          "in-sample" if cluster.server.push_GBps is not None else
                          "its server update and worker compute are fitted from it, its "
                          "round trip is not")
            notes.append(f"self-check passed on run {c.run_id} ({c.label}, {fitted}): "
                         f"every component within tolerance, the largest error "
                         f"{worst.component} {worst.error_rel:+.0%}")
    notes += [w for c in found for w in c.warnings()]
    return tuple(found)


def _hinted(part: str, fit: Callable[[], T]) -> T:
    """Run a fit; a refusal says which command measures what is missing."""
    try:
        return fit()
    except PerfmodelError as e:
        raise PerfmodelError(f"{e} (measure with `{COMMANDS[part]}` or `perfmodel calibrate`)"
                             ) from None


# ---------------------------------------------------------------- parts


def collective_samples(runs, host: ClusterProfile | None = None) -> list[CollectiveSample]:
    """The collective timings of stored collectives runs (measure.store.Run). On a CPU host
    (`host` with comm_cpu_cores_per_node set to its cores) a run with more ranks per node
    than cores is divided by the model's own core-sharing factor
    (ClusterProfile.comm_cpu_share of the run's layout), so the links are fitted unshared."""
    out = []
    for r in runs:
        ranks, nodes = int(r.row.world_size), int(r.row.config.get("nodes") or 1)
        share = 1.0
        if host is not None:
            layout = dataclasses.replace(host, devices_per_node=-(-ranks // max(nodes, 1)))
            share = layout.comm_cpu_share(ranks)
        out += [CollectiveSample(op=c["op"], ranks=ranks, bytes=float(c["bytes"]),
                                 time_s=float(c["time_s"]) / share, nodes=nodes,
                                 cpu_busy_fraction=_float_or_none(c.get("cpu_busy_fraction")))
                for c in r.table("collectives")]
    return out


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)


def unit_timings(runs) -> tuple[list[UnitTiming], dict[str, float], set[str]]:
    """(timings, forward FLOPs per sample, units left out for having none) of compute runs,
    units named "<workload>/<unit>"."""
    timings, flops, skipped = [], {}, set()
    for r in runs:
        w = load_workload(r.row.workload)
        unit_flops = {u.name: u.forward_flops_per_sample for u in w.units}
        for row in r.table("compute"):
            unit = f"{w.name}/{row['unit']}"
            if unit_flops.get(row["unit"], 0.0) <= 0:
                skipped.add(unit)
                continue
            flops[unit] = unit_flops[row["unit"]]
            timings.append(UnitTiming(unit=unit, phase=row["pass"],
                                      batch_size=int(row["batch_size"]),
                                      median_s=float(row["median_s"])))
    return timings, flops, skipped


def _network(runs, host: ClusterProfile | None, base: ClusterProfile, notes: list[str]
             ) -> tuple[dict | None, SharingFit | None]:
    """(link fits, topology.comm_cpu_bound_fraction and _by_bytes) of the collectives runs.
    On a CPU host (`host`) the links are fitted on the runs whose ranks fit the cores, and u
    (one value and by size) on the others against them (calibration/fit_comm_sharing.py); a
    store with only runs of more ranks than cores fits the links through the base profile's
    core sharing instead."""
    raw = collective_samples(runs)
    if not raw:
        return None, None
    cores = host.comm_cpu_cores_per_node if host is not None else 0
    crowded = [s for s in raw if cores and shared(s, cores)]
    plain = [s for s in raw if not (cores and shared(s, cores))]
    if not plain or not crowded:      # only crowded runs: their links through p/c (u = 1)
        samples = collective_samples(runs, host) if crowded else raw
        return _hinted("network", lambda: fit_network(samples)), None
    links = _hinted("network", lambda: fit_network(plain))
    unshared = _as_cluster(base, MeasuredFits(intra_node=links.get("intra_node"),
                                              inter_node=links.get("inter_node")))
    try:
        u = fit_comm_sharing(crowded, unshared, cores)
    except PerfmodelError as e:
        notes.append(f"{e}: the base profile's value stays")
        return links, None
    curve = ", ".join(f"{n / 2**20:g} MiB {v:.2f}" for n, v in u.by_bytes)
    notes.append(f"collectives with more ranks than cores ({len(crowded)} timings) fitted "
                 f"the shared part of a collective's byte term u = {u.fraction.value:.2f} "
                 f"(p/c would be u = 1; by size: {curve or 'none'}), not the links")
    if u.by_level:
        table = "; ".join(f"{op} at {lv:g} ranks a core: " + ", ".join(
            f"{n / 2**20:g} MiB x{st:.2f}" for x, n, st in rows if x == lv and n >= 2**20)
            for op, rows in u.by_level for lv in sorted({r[0] for r in rows}))
        notes.append(f"collectives swept at >= 2 crowding levels: the whole collective's "
                     f"measured stretch by kind, level and size replaces u "
                     f"(topology.comm_cpu_stretch_by_level; from 1 MiB: {table})")
    if u.busy_by_level:
        busy = ", ".join(f"{lv:g} ranks a core {share:.2f}" for lv, share in u.busy_by_level)
        notes.append(f"crowded collectives kept this share of the cores busy "
                     f"(topology.comm_cpu_busy_by_level, from 1 MiB): {busy}")
    return links, u


def _compute(runs, base: ClusterProfile, notes: list[str]):
    """(compute fit, optimizer_GBps, server apply_GBps), each None without data."""
    if not runs:
        return None, None, None
    groups: dict[str, list] = defaultdict(list)
    for r in runs:
        groups[load_workload(r.row.workload).precision_spec.compute_key].append(r)
    key = max(groups, key=lambda k: sum(len(r.table("compute")) for r in groups[k]))
    for other in sorted(set(groups) - {key}):
        notes.append(f"left out the compute runs of {other} workloads "
                     f"({', '.join(sorted({r.row.workload for r in groups[other]}))}): one "
                     f"efficiency curve is fitted per calibration, here for {key}")
    timings, flops, skipped = unit_timings(groups[key])
    if skipped:
        notes.append(f"left out units without FLOPs: {', '.join(sorted(skipped))}")
    peak = base.device.peak_TFLOPS.get(key, base.device.peak_TFLOPS["fp32"])
    estimate = key if base.compute_cpu_cores_per_node else None    # a CPU core's peak
    fit = _hinted("compute", lambda: fit_compute(
        timings, flops, peak_TFLOPS=peak, backward_flops_ratio=base.compute.backward_flops_ratio,
        raise_peak=estimate))
    if fit.raised_peak:
        rate = fit.raised_peak[1]
        notes.append(f"device.peak_TFLOPS.{key} raised from {peak:g} to {rate:.4g}: the units "
                     f"reached {rate / peak:.3f}x the base profile's estimate (a CPU core's "
                     f"clock above the one it assumed)")
    state, grads, seconds = [], [], []
    for r in groups[key]:
        step_s = _summary(r, "optimizer_step_s")
        if step_s:
            w = load_workload(r.row.workload)
            state.append(w.model_state_bytes_per_param * w.params)
            grads.append(w.params * w.precision_spec.grad_bytes)
            seconds.append(step_s)
    if len(seconds) < 2:
        notes.append(f"compute.optimizer_GBps and server.apply_GBps not fitted: they need "
                     f"optimizer-step timings of >= 2 workloads, found {len(seconds)} "
                     f"(`{COMMANDS['optimizer']}`)")
        return fit, None, None
    return (fit, fit_optimizer_rate(state, seconds), fit_server_apply(grads, seconds))


def _is_concurrent(run) -> bool:
    return bool(((run.row.config.get("options") or {}).get("compute") or {}).get("concurrent"))


def concurrent_timings(runs) -> list[ConcurrentTiming]:
    """Each rank's concurrent-mode summary (measure/runs/compute.py run_concurrent)."""
    out = []
    for r in runs:
        per_rank: dict[int, dict[str, float]] = defaultdict(dict)
        for s in r.table("summaries"):
            if isinstance(s["value"], int | float):
                per_rank[s["rank"]][s["key"]] = float(s["value"])
        out += [ConcurrentTiming(busy=int(v["busy_processes"]), step_s=v["concurrent_step_s"],
                                 cpu_s=v["concurrent_cpu_s"],
                                 load1=v.get("load1_before", float("nan")),
                                 step_iqr_s=v.get("concurrent_step_iqr_s", float("nan")),
                                 workload=r.row.workload or "")
                for v in per_rank.values() if "concurrent_step_s" in v]
    return out


def _cores(runs, base: ClusterProfile, notes: list[str], checks: dict
           ) -> tuple[FitResult | None, FitResult | None]:
    """(compute.core_contention, compute.sharing_delay_cv) and the core-sharing checks, on a
    CPU host with the runs; the delay's spread None, noted, where no run crowds the cores."""
    if not runs:
        return None, None
    if not base.compute_cpu_cores_per_node:
        notes.append("concurrent compute runs left out: the base profile's devices compute "
                     "on their own (topology.compute_cpu_cores_per_node = 0)")
        return None, None
    timings = concurrent_timings(runs)
    cores = os.cpu_count() or 1
    fit = fit_core_contention(timings, cores)
    checks.update(sharing_checks(timings, cores, fit.value))
    try:
        delay = fit_sharing_delay_cv(timings, cores, fit.value)
    except PerfmodelError as e:
        notes.append(f"compute.sharing_delay_cv not fitted: {e}")
        return fit, None
    notes.append(f"a step's delay waiting for a core varies by {delay.value:.2f} of its mean "
                 f"(SD; compute.sharing_delay_cv; {delay.points} ranks with more busy "
                 f"processes than the {cores} cores)")
    return fit, delay


def _timed_wait_spread(runs, notes: list[str]) -> FitResult | None:
    """compute.timed_wait_spread_ms from the timed-wait runs whose processes outnumbered the
    host's cores (fit_cores.py `fit_timed_wait_spread`): each worker's timed compute a step
    after the warm-up. None, noted, where they do not allow the fit."""
    cores = os.cpu_count() or 1
    series = []
    for r in runs:
        if processes(r.row.config) <= cores:
            continue
        warm = int(r.row.config.get("warmup_steps") or 0)
        by_rank: dict[int, list[float]] = defaultdict(list)
        for x in r.table("steps"):
            if int(x["step"]) >= warm:
                by_rank[int(x["rank"])].append(float(x["compute_s"]))
        series += [v for _, v in sorted(by_rank.items())]
    try:
        fit = fit_timed_wait_spread(series)
    except PerfmodelError as e:
        notes.append(f"compute.timed_wait_spread_ms not fitted: {e}")
        return None
    notes.append(f"a timed wait on the crowded host strays from its length by {fit.value:.2f} "
                 f"ms (SD; compute.timed_wait_spread_ms; {fit.points} workers, {len(runs)} "
                 f"run(s) with more processes than the {cores} cores)")
    return fit


def _crowded_server(runs, cluster: ClusterProfile, notes: list[str]
                    ) -> tuple[FitResult | None, FitResult | None]:
    """(server.crowded_message_factor, server.crowded_update_factor) from the PS timed waits
    whose processes outnumbered the host's cores (fit_ps.py `fit_crowded_factor`): each
    run's phases per update after the warm-up, as its serial server timed them
    (measure/runs/ps.py `recv_s`, `apply_s`, `pack_s`, `reply_s`): its median receive plus
    its median reply against the fitted 1-worker push and reply (`cluster`'s server.push and
    server.reply) at its sizes, and its median apply + pack against the fitted
    server.update. A receive also holds any wait for the next push; a crowded run's server,
    5 workers queued at it, seldom waits (its phases summed to 94 % of its time in report
    56's). Each None, noted, where its 1-worker fit is missing or no such run timed its
    server."""
    srv, cores = cluster.server, cluster.compute_cpu_cores_per_node
    crowded, alone, applied, update = [], [], [], []
    for r in runs:
        if processes(r.row.config) <= cores:
            continue
        w = load_workload(r.row.workload)
        grad_bytes = w.params * w.precision_spec.grad_bytes
        push = srv.message_s("push", grad_bytes)
        reply = srv.message_s("pull", w.params * w.precision_spec.param_bytes)
        warm = int(r.row.config.get("warmup_steps") or 0)
        ups = [u for u in r.table("updates") if int(u["step"]) >= warm
               and all(u.get(k) is not None for k in ("recv_s", "apply_s", "pack_s", "reply_s"))]
        if not ups:
            continue
        if push is not None and reply is not None:
            crowded.append(float(np.median([float(u["recv_s"]) for u in ups]))
                           + float(np.median([float(u["reply_s"]) for u in ups])))
            alone.append(push + reply)
        alone_update = srv.update_s(grad_bytes)
        if alone_update is not None:
            applied.append(float(np.median([float(u["apply_s"]) + float(u["pack_s"])
                                            for u in ups])))
            update.append(alone_update)
    out = []
    for name, measured, fitted, what in (
            ("server.crowded_message_factor", crowded, alone, "receive + reply"),
            ("server.crowded_update_factor", applied, update, "apply + pack")):
        if not measured:
            notes.append(f"{name} not fitted: it needs a crowded PS timed wait whose server "
                         f"timed its {what}, and its 1-worker fit (`perfmodel calibrate` runs "
                         f"ps-crowded on CPU hosts)")
            out.append(None)
            continue
        fit = fit_crowded_factor(name, measured, fitted)
        notes.append(f"a crowded serial server's {what} took {fit.value:.2f}x the 1-worker "
                     f"fit's ({name}; {len(measured)} run(s), {np.median(measured) * 1e3:.1f} "
                     f"vs {np.median(fitted) * 1e3:.1f} ms an update); those runs' server is "
                     f"in-sample in their self-check")
        out.append(fit)
    return out[0], out[1]


def _ddp_cpu_work(runs, cluster: ClusterProfile, notes: list[str]) -> FitResult | None:
    """compute.ddp_cpu_work_factor from the DDP timed waits whose ranks outnumbered the
    host's cores (fit_cores.py `fit_ddp_cpu_work_factor`): each run's CPU seconds a step,
    the cores its processes kept busy over the timed steps times their mean step
    (measure/cpu_meter.py `cpu_use`), against the model's count for the run
    (perfmodel/sim/ddp.py `node_cpu_work_s`, with the profile fitted so far). None, noted,
    where none recorded its CPU."""
    cores = cluster.compute_cpu_cores_per_node
    measured, modelled = [], []
    for r in runs:
        workers = int(r.row.workers or 0)
        own, _ = cpu_use(r.table("summaries"))
        warm = int(r.row.config.get("warmup_steps") or 0)
        steps = [float(s["wall_s"]) for s in r.table("steps") if int(s["step"]) >= warm]
        if workers <= cores or own is None or not steps:
            continue
        scenario = Scenario(cluster=cluster.as_timed_wait(),
                            workload=load_workload(r.row.workload), workers=workers,
                            batch_size=int(r.row.batch_size))
        measured.append(own * float(np.mean(steps)))
        modelled.append(make_strategy("ddp", comm_hook=HARNESS_DDP_HOOK)
                        .node_cpu_work_s(scenario))
    if not measured:
        notes.append("compute.ddp_cpu_work_factor not fitted: no crowded DDP timed wait "
                     "recorded its CPU (measure/cpu_meter.py)")
        return None
    fit = fit_ddp_cpu_work_factor(measured, modelled)
    notes.append(f"a crowded DDP timed wait's node burned {fit.value:.2f}x the CPU work the "
                 f"model counts for it (compute.ddp_cpu_work_factor; {len(measured)} run(s), "
                 f"{np.median(measured) * 1e3:.0f} vs {np.median(modelled) * 1e3:.0f} "
                 f"core-ms a step)")
    return fit


def _whole_step(runs, cluster: ClusterProfile) -> FitResult | None:
    """compute.whole_step_factor from the 1-process concurrent runs (fit_cores.py), their
    passes modelled with the compute fit (`cluster`); None without such runs. The weights'
    trip through memory (sim/compute.py weights_streamed_s) is its own term beside the
    factor, so it is taken off both sides: the factor multiplies the passes alone."""
    steps, passes = [], []
    for r in runs:
        if int(r.row.world_size or 0) != 1:
            continue
        w = load_workload(r.row.workload)
        streamed = float(sum(a.sum() for a in weights_streamed_s(cluster, w)))
        model = unit_times(cluster, w, int(r.row.batch_size), optimizer_param_fraction=0).step_s
        for t in concurrent_timings([r]):
            steps.append(t.step_s - streamed)
            passes.append(model - streamed)
    return fit_whole_step_factor(steps, passes) if len(steps) >= 2 else None


def _by_workload(runs, cluster: ClusterProfile, notes: list[str]) -> tuple[WorkloadFits, ...]:
    """compute.by_workload: the whole-step factor and contention of each workload whose
    concurrent runs allow both fits, when two or more do (with one, the defaults are its)."""
    by_name: dict[str, list] = defaultdict(list)
    for r in runs:
        by_name[str(r.row.workload)].append(r)
    cores = os.cpu_count() or 1
    out = []
    for name, group in sorted(by_name.items()):
        timings = concurrent_timings(group)
        try:
            kappa = fit_core_contention(timings, cores)
        except PerfmodelError as e:
            notes.append(f"compute.by_workload.{name} not fitted: {e}")
            continue
        whole = _whole_step(group, cluster)
        if whole is None:
            notes.append(f"compute.by_workload.{name} not fitted: it needs >= 2 whole-step "
                         f"timings of one process alone")
            continue
        where = f"compute.by_workload.{name}"
        out.append(WorkloadFits(
            workload=name,
            whole_step_factor=dataclasses.replace(whole, parameter=f"{where}.whole_step_factor"),
            core_contention=dataclasses.replace(kappa, parameter=f"{where}.core_contention")))
    if len(out) < 2:
        return ()
    notes.append("whole-step factor and core contention by workload: " + ", ".join(
        f"{w.workload} {w.whole_step_factor.value:.2f} and {w.core_contention.value:.2f}"
        for w in out))
    return tuple(out)


def failed_checks(checks: dict[str, dict]) -> list[str]:
    """A loud note for every check with a tolerance it misses."""
    out = []
    for name, c in checks.items():
        tol = c.get("tolerance")
        if tol is not None and abs(c["rel"]) > tol:
            load = c.get("load1")
            out.append(f"{CHECK_FAILED}: {name}: model {c['model']:.4g} vs measured "
                       f"{c['measured']:.4g} ({c['rel']:+.0%}, tolerance ±{tol:.0%})"
                       + (f"; 1-minute load {load:.1f} when measured"
                          if load is not None and math.isfinite(load) else ""))
    return out


def _overlap(runs, cluster: ClusterProfile) -> FitResult:
    """compute.overlap_slowdown s: compute_s ≈ rest + s x overlapped passes x the share of
    them with collectives in flight (module docstring), with the run's strategy defaults."""
    measured, known, stretched = [], [], []
    for r in runs:
        n = int(r.row.workers)
        w = load_workload(r.row.workload)
        fraction = 1.0 / n if r.row.kind == "fsdp" else 1.0
        # the ranks share the cores as the simulation says, so the overlap slowdown is
        # what is left beyond core sharing
        t = unit_times(cluster, w, int(r.row.batch_size), optimizer_param_fraction=fraction,
                       busy=min(n, cluster.devices_per_node))
        passes = {"forward": float(t.forward_s.sum()), "backward": float(t.backward_s.sum())}
        # The simulator stretches the overlapped passes by the share of their time that
        # collectives are in flight (perfmodel/sim/compute.py in_flight_fraction); DDP on a
        # CPU-driven link by its all-reduce seconds before backward ends over backward's
        # (DDP.overlap_share).
        scenario = Scenario(cluster=cluster, workload=w, workers=n,
                            batch_size=int(r.row.batch_size))
        over = host = 0.0
        if n > 1:       # a DDP run's timer is a comm hook (selfcheck.py's options)
            strategy = make_strategy(r.row.kind, **(
                {"comm_hook": HARNESS_DDP_HOOK} if r.row.kind == "ddp" else {}))
            over = strategy.overlap_share(scenario) * sum(passes[p] for p in OVERLAPPED[r.row.kind])
            host = strategy.host_compute_s(scenario)     # the framework's copies
        for s in r.table("steps"):
            measured.append(float(s["compute_s"]))
            stretched.append(over)
            known.append(t.step_s - over + host)
    m = np.array(measured)
    if m.size < 2 or not np.all(np.isfinite(m) & (m > 0)):
        raise PerfmodelError(f"compute.overlap_slowdown: need >= 2 DDP or FSDP steps with a "
                             f"positive compute_s, found {m.size} (`{COMMANDS['overlap']}`)")
    fit = relative_lstsq(np.array(stretched)[:, None], m, np.array(known))
    s = float(fit.coef[0])
    if not s > 0:
        raise PerfmodelError(
            f"compute.overlap_slowdown: the fit gives {s:.3g} from {m.size} DDP/FSDP steps: "
            f"their measured compute (median {np.median(m) * 1e3:.3g} ms) is less than the "
            f"compute profile's passes that do not overlap communication "
            f"({np.median(known) * 1e3:.3g} ms); recalibrate compute "
            f"(`{COMMANDS['compute']}`)")
    return fit_result("compute.overlap_slowdown", s, fit.stderr[0], fit.rel)


def inconsistent_overlap(data: dict) -> float | None:
    """A fitted profile's compute.overlap_slowdown where it fails `overlap_warning`'s check
    (below 1: the host changed speed during set A), else None."""
    value = (data.get("compute") or {}).get("overlap_slowdown")
    return float(value) if value is not None and float(value) < OVERLAP_FLOOR else None


def overlap_warning(fit: FitResult) -> list[str]:
    """A loud note where compute.overlap_slowdown came out below 1: the training runs
    computed faster with collectives in flight than the compute runs' passes alone, which
    interference cannot do, so the host changed speed between set A's compute runs and its
    training runs (report 43's set A fitted 0.70 where 35-42 fitted 1.47-1.92, and its
    drift anchor ran x1.39). The value is kept as fitted: the note says not to trust it."""
    if fit.value >= OVERLAP_FLOOR:
        return []
    return [f"{CHECK_FAILED}: compute.overlap_slowdown {fit.value:.2f} is below 1: the "
            f"DDP/FSDP runs computed faster while communicating than the compute runs' passes "
            f"alone, which interference cannot do; the host changed speed during the "
            f"calibration: calibrate again on a quiet host (`{COMMANDS['compute']}` and "
            f"`{COMMANDS['overlap']}` back to back)"]


def _jitter(runs) -> FitResult | None:
    series = []
    for r in runs:
        per_rank: dict[int, list[float]] = defaultdict(list)
        for s in r.table("steps"):
            per_rank[s["rank"]].append(float(s["compute_s"]))
        series += [np.array(v) / np.mean(v) for v in per_rank.values() if len(v) >= 2]
    if not series or sum(len(v) for v in series) < 3:
        return None
    return fit_jitter_cv(np.concatenate(series))


def _memory_runs(by_kind, cluster: ClusterProfile, notes: list[str]) -> list:
    """The DDP and FSDP runs the memory overheads are fitted on: FSDP's only where its
    collectives do not block. On gloo ProcessGroupGloo holds a flat copy of each collective's
    buffer that perfmodel/memory.py does not count (the set-A FSDP runs, there for the copy
    rate, measured 16.3 MiB of "other" against 8.8 modelled), which would pull the overheads
    of every strategy down (memory_overhead_fraction -2.6 % -> -6.8 % in reports 18-20)."""
    fsdp = by_kind["fsdp"]
    if fsdp and FSDP.blocking(cluster):
        notes.append(f"memory overheads fitted without the {len(fsdp)} FSDP run(s): on gloo "
                     f"their collectives' buffers are not in the memory model")
        fsdp = []
    return [*by_kind["ddp"], *fsdp]


def _memory(runs, base: ClusterProfile, notes: list[str]):
    """Each rank's measured peak against the analytic model (no calibrated overhead)."""
    cluster = dataclasses.replace(base, device=dataclasses.replace(
        base.device, memory_overhead_fraction=0.0))
    samples: list[MemorySample] = []
    for r in runs:
        model = _memory_model(r, cluster)
        samples += [memory_sample(float(m["peak_bytes"]), model) for m in r.table("memory")
                    if m.get("peak_bytes")]
    if not samples:
        return None
    analytic = [s.analytic_bytes for s in samples]
    if len(samples) < 2 or max(analytic) < 1.5 * min(analytic):
        notes.append(f"device memory overheads not fitted: the DDP/FSDP runs' modelled memory "
                     f"spans {max(analytic) / min(analytic):.2f}x, under the 1.5x that "
                     f"separates a constant from a fraction (`{COMMANDS['memory']}`)")
        return None
    return fit_memory(samples)


def _memory_model(run, cluster: ClusterProfile) -> MemoryBreakdown:
    scenario = _scenario(run, cluster)
    opts = (run.row.config.get("options") or {}).get(run.row.kind, {})
    if run.row.kind == "fsdp":
        return fsdp_memory(scenario, opts.get("variant", "full-shard"), 1)
    return ddp_memory(scenario, opts.get("bucket_cap_MiB") or 25.0,
                      opts.get("first_bucket_MiB") or opts.get("bucket_cap_MiB") or 1.0)


def _scenario(run, cluster: ClusterProfile) -> Scenario:
    return Scenario(cluster=cluster, workload=load_workload(run.row.workload),
                    workers=int(run.row.workers), batch_size=int(run.row.batch_size))


def _server_update(runs, base: ClusterProfile, notes: list[str]):
    """A serial CPU-host server's own time per update (apply + pack, recorded at the server
    by measure/runs/ps.py) from the PS runs of >= 2 workloads: each run's median over its
    timed updates, against its gradient bytes (calibration/fit_ps.py `fit_server_update`).
    None on GPUs (no serial server) or without such runs, with a note saying what is
    missing."""
    if not psnet.serial_server(base) or not runs:
        return None
    sizes, seconds = [], []
    for r in runs:
        w = load_workload(r.row.workload)
        warm = int(r.row.config.get("warmup_steps") or 0)
        took = [float(u["apply_s"]) + float(u["pack_s"]) for u in r.table("updates")
                if u.get("apply_s") is not None and u.get("pack_s") is not None
                and int(u["step"]) >= warm]
        if took:
            sizes.append(w.params * w.precision_spec.grad_bytes)
            seconds.append(float(np.median(took)))
    return _fit_from_two_workloads(
        "server.update", sizes, lambda: fit_server_update(sizes, seconds), notes,
        "it needs the server's own update timings of >= 2 workloads' PS runs",
        "stores from before record none")


def _server_messages(runs, base: ClusterProfile, notes: list[str]):
    """A serial CPU-host server's one push received and one reply sent (calibration/fit_ps.py
    `fit_server_messages`) from the 1-worker PS runs of >= 2 workloads, their steady steps:
    a reply is the server's own median reply time; a push is what is left of the worker's
    median round trip (push to reply held) once the server's median apply, pack and reply
    are taken off - with one worker nothing queues, so that is the push and the reply's
    arrival at the worker. None on GPUs or without such runs, with a note."""
    if not psnet.serial_server(base) or not runs:
        return None
    push_bytes, push_s, reply_bytes, reply_s = [], [], [], []
    for r in runs:
        if int(r.row.workers) != 1:
            continue
        w = load_workload(r.row.workload)
        warm = int(r.row.config.get("warmup_steps") or 0)
        updates = [u for u in r.table("updates") if int(u["step"]) >= warm
                   and all(u.get(k) is not None for k in ("apply_s", "pack_s", "reply_s"))]
        waits = [float(s["comm_wait_s"]) for s in r.table("steps") if int(s["step"]) >= warm]
        if not updates or not waits:
            continue
        reply = float(np.median([float(u["reply_s"]) for u in updates]))
        server = float(np.median([float(u["apply_s"]) + float(u["pack_s"]) + float(u["reply_s"])
                                  for u in updates]))
        push = float(np.median(waits)) - server
        if push <= 0:
            notes.append(f"server.push not fitted: run {r.row.id}'s round trip "
                         f"({np.median(waits) * 1e3:.2f} ms) is not longer than its server's "
                         f"apply, pack and reply ({server * 1e3:.2f} ms); measure again")
            return None
        push_bytes.append(w.params * w.precision_spec.grad_bytes)
        push_s.append(push)
        reply_bytes.append(w.params * w.precision_spec.param_bytes)
        reply_s.append(reply)
    return _fit_from_two_workloads(
        "server.push and server.reply", push_bytes,
        lambda: fit_server_messages(push_bytes, push_s, reply_bytes, reply_s), notes,
        "they need the 1-worker PS runs of >= 2 workloads",
        "the server's link carries its messages")


def _fit_from_two_workloads(what: str, sizes: list[float], fit: Callable[[], T],
                            notes: list[str], needs: str, otherwise: str) -> T | None:
    """`fit()` where the PS runs span >= 2 workloads' sizes; else None, with a note saying
    what is missing (`needs`) and what stands in (`otherwise`)."""
    if len(set(sizes)) < 2:
        notes.append(f"{what} not fitted: {needs}, found {len(set(sizes))} (`perfmodel "
                     f"calibrate` runs ps-cnn-small and ps-mlp; {otherwise})")
        return None
    try:
        return fit()
    except PerfmodelError as e:
        notes.append(f"{what} not fitted: {e}")
        return None


def _mean_compute_s(run) -> float | None:
    """A real-compute run's mean timed compute a step (warm-up steps left out); None for a
    timed wait or a run without timed steps."""
    if run.row.config.get("compute_mode", "real") != "real":
        return None
    warm = int(run.row.config.get("warmup_steps", 0))
    steps = [float(x["compute_s"]) for x in run.table("steps") if x["step"] >= warm]
    return float(np.mean(steps)) if steps else None


FSDP_KINDS = ("all-gather", "reduce-scatter")


def _fsdp_collectives(runs, cluster: ClusterProfile, fits: MeasuredFits, notes: list[str]
                      ) -> MeasuredFits:
    """The node's all-gather and reduce-scatter time factors (intra_node.time_factor_by_op)
    rescaled to what the calibration's FSDP runs measured: on a CPU host FSDP2's gloo
    collectives block, so a run's communication time is exactly its collectives, measured
    in training (set A's FSDP runs: 34.7-36.9 ms a step in two sessions whose 2-rank sweeps
    priced them at 41.1 and 23.6, docs/model.md). k = the geometric mean of measured /
    predicted over the runs (>= 2 ranks, all on one node, >= 2 runs); the factors x k and
    the crowded stretch rows of both kinds / k, so a crowded node keeps what its sweeps
    measured. Unchanged on GPUs, without such runs, or without a fitted intra-node link."""
    link = fits.intra_node
    if link is None or not cluster.compute_cpu_cores_per_node or not FSDP.blocking(cluster):
        return fits
    ratios = []
    for r in runs:
        n = int(r.row.workers or 1)
        if n < 2 or n > cluster.devices_per_node:
            continue
        measured = measured_components(r).get("collective")
        predicted = predicted_components(cluster, r).get("collective")
        if measured and predicted:
            ratios.append(measured / predicted)
    if len(ratios) < 2:
        return fits
    k = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    factors = dict(link.time_factor_by_op)
    for op in FSDP_KINDS:
        factors[op] = factors.get(op, 1.0) * k
    levels = dict(fits.comm_cpu_stretch_by_level)
    fallback = levels.get("all-reduce", ())
    for op in FSDP_KINDS if levels else ():
        levels[op] = tuple((lv, b, st / k) for lv, b, st in levels.get(op, fallback))
    notes.append(f"FSDP runs' collectives: {len(ratios)} run(s) measured "
                 f"{', '.join(f'{x:.2f}' for x in ratios)}x the sweep-priced model; "
                 f"all-gather and reduce-scatter time factors x{k:.2f} (crowded stretch / {k:.2f})")
    return dataclasses.replace(fits, intra_node=dataclasses.replace(
        link, time_factor_by_op=factors), comm_cpu_stretch_by_level=tuple(levels.items()))


def _copy_rate(runs, cluster: ClusterProfile, notes: list[str]) -> FitResult | None:
    """compute.copy_GBps: the rate FSDP2's copies ran at in the calibration's FSDP runs
    (real compute, >= 2 ranks, a CPU host whose gloo collectives block): per run, the mean
    timed compute less the model's passes, optimizer and in-place divides (`cluster`, the
    profile fitted so far), over the bytes the model counts (perfmodel/sim/fsdp.py
    `copy_bytes`) times its core-sharing factor; `fit_rate` over the runs. None on GPUs,
    without such runs, or when the runs left no time for copies (a note says which)."""
    if not cluster.compute_cpu_cores_per_node or not FSDP.blocking(cluster):
        return None
    volume, seconds = [], []
    for r in runs:
        n = int(r.row.workers or 1)
        if n < 2:
            continue
        w, scenario = load_workload(r.row.workload), _scenario(r, cluster)
        opts = (r.row.config.get("options") or {}).get("fsdp", {})
        ranks = min(n, cluster.devices_per_node)
        t = unit_times(cluster, w, int(r.row.batch_size), optimizer_param_fraction=1.0 / n,
                       busy=cluster.ranks_busy(ranks))
        forward, backward = copy_bytes(scenario, opts.get("variant", "full-shard")
                                       == "full-shard", blocking=True)
        divide_s = float(divide_bytes(scenario, True).sum()) * own_work_s_per_byte(
            cluster, ranks, w.name)
        mean_s = _mean_compute_s(r)
        if mean_s is not None:
            volume.append(float(forward.sum() + backward.sum())
                          * own_work_s_per_byte(cluster, ranks, w.name, bytes_per_s=1.0))
            seconds.append(mean_s - t.step_s - divide_s)
    if not seconds:
        return None
    if len(seconds) < 2 or min(seconds) <= 0:
        notes.append(f"compute.copy_GBps not fitted: it needs >= 2 FSDP runs whose "
                     f"compute exceeds the model's passes, found "
                     f"{', '.join(f'{s * 1e3:+.1f} ms' for s in seconds)} beyond them")
        return None
    fit = fit_rate(volume, seconds, parameter="compute.copy_GBps",
                   what="FSDP runs' copy time", unit_scale=1e9)
    notes.append(f"FSDP2's copies ran at {fit.value:.3g} GB/s in {len(seconds)} FSDP run(s) "
                 f"(compute.copy_GBps; compute.optimizer_GBps "
                 f"{cluster.compute.optimizer_GBps:.3g}): those runs are in-sample for the "
                 f"FSDP compute check")
    return fit


def _ps_worker_extra(runs, cluster: ClusterProfile, notes: list[str]) -> tuple[FitResult, ...]:
    """compute.ps_worker_extra_ms: per workload, how much longer a PS worker's compute took
    in the 1-worker PS runs (real compute, a CPU host) than the model's passes and two copies
    (`ps_worker_seconds` with `cluster`, the profile fitted so far): the median over runs of
    each run's mean timed compute, less the model, at least 0. Why measured, not derived: on
    2026-12-05 the mlp's worker computed 4.9-6.2 ms a step beyond that model (its two 12.9 MB
    copies modelled at 1.9 ms) and cnn-small's within 0.3 ms (2.5 MB copies, 0.4 ms), which
    no byte rate fits. These runs are then in-sample for the compute self-check."""
    if not cluster.compute_cpu_cores_per_node or not runs:
        return ()
    by_name: dict[str, list[float]] = defaultdict(list)
    batch: dict[str, int] = {}
    for r in runs:
        mean_s = _mean_compute_s(r) if (r.row.workers or 1) == 1 else None
        if mean_s is not None:
            by_name[str(r.row.workload)].append(mean_s)
            batch[str(r.row.workload)] = int(r.row.batch_size)
    out = []
    for name, means in sorted(by_name.items()):
        model = ps_worker_seconds(cluster, load_workload(name), batch[name])
        extra_s = max(float(np.median(means)) - model, 0.0)
        rel = np.asarray(means) / (model + extra_s) - 1
        spread_ms = float(np.std(means) / np.sqrt(len(means))) * 1e3 if len(means) > 1 else 0.0
        out.append(fit_result(f"compute.ps_worker_extra_ms.{name}", extra_s * 1e3, spread_ms,
                              rel))
    if out:
        notes.append("PS worker compute beyond the model's passes and copies (1-worker PS "
                     "runs): " + ", ".join(f"{r.parameter.rsplit('.', 1)[1]} {r.value:.2f} ms"
                                           for r in out)
                     + "; those runs' compute self-check is in-sample")
    return tuple(out)


def _ps_checks(runs, cluster: ClusterProfile, base: ClusterProfile) -> dict[str, dict]:
    """Model against measurement for PS runs: a worker's round trip, and memory per role."""
    checks: dict[str, dict] = {}
    no_overhead = dataclasses.replace(base, device=dataclasses.replace(
        base.device, memory_overhead_fraction=0.0))
    for r in runs:
        w: Workload = load_workload(r.row.workload)
        waits = [float(s["comm_wait_s"]) for s in r.table("steps")]
        # alone: no queue at the server. Where the server's messages were fitted on these
        # runs (`_server_messages`) the round trip is in-sample: no check.
        if waits and int(r.row.workers) == 1 and cluster.server.push_GBps is None:
            # the apply as the simulation charges it (perfmodel/sim/ps.py): the workload's
            # optimizer over the one server's parameters, all of them, and a CPU host's pack
            model = (message_s(cluster, "pull", w.param_bytes)
                     + message_s(cluster, "push", w.params * w.precision_spec.grad_bytes)
                     + server_apply_s(cluster, w, w.params))
            # "unshared": the transfers and the apply alone, each at its fitted speed, no
            # core sharing; the self-check (calibration/selfcheck.py) predicts the same run
            # with the whole simulation, sharing included, as predict does, so the two can
            # disagree (report 11: this -28 %, the self-check -13 %)
            checks[f"ps_round_trip_unshared_s.run{r.row.id}"] = _check(
                model, float(np.median(waits))) | {"tolerance": PS_ROUND_TRIP_TOL}
        roles = ps_memory(_scenario(r, no_overhead), 1)
        for m in r.table("memory"):
            role = "server" if m["rank"] == 0 else "worker"
            model = roles[role].peak_bytes - roles[role].framework_bytes
            checks[f"ps_{role}_peak_bytes.run{r.row.id}.rank{m['rank']}"] = _check(
                model, float(m["peak_bytes"]))
    return checks


def _check(model: float, measured: float) -> dict[str, float]:
    return {"model": model, "measured": measured, "rel": (model - measured) / measured}


def _run_spread(runs) -> tuple[float | None, int]:
    """Pooled CV of the median step time over runs repeating one configuration."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        walls = [float(s["wall_s"]) for s in r.table("steps")]
        if walls:
            groups[same_configuration(r.row.config)].append(float(np.median(walls)))
    repeated = [np.log(v) for v in groups.values() if len(v) >= 2]
    dof = sum(len(v) - 1 for v in repeated)
    if not dof:
        return None, 0
    var = sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in repeated) / dof
    return math.sqrt(math.expm1(var)), sum(len(v) for v in repeated)   # lognormal CV


def same_configuration(config: dict[str, Any]) -> str:
    """A run's config without what differs between repeats of one measurement."""
    return json.dumps({k: v for k, v in config.items()
                       if k not in ("calibration", "oversubscribed", "protocol")},
                      sort_keys=True)


def _summary(run, key: str) -> float | None:
    values = [s["value"] for s in run.table("summaries") if s["key"] == key
              and isinstance(s["value"], int | float)]
    return float(values[0]) if values else None


def _as_cluster(base: ClusterProfile, fits: MeasuredFits) -> ClusterProfile:
    info = RunInfo(host="-", device_names=(), versions="-", runs=0)
    data = build_profile(base.name, base, fits, info)
    return parse_profile(data, base.path)


# ---------------------------------------------------------------- provenance


def _hosts(runs) -> str:
    return ", ".join(sorted({r.row.host for r in runs if r.row.host})) or "unknown host"


def _versions(runs) -> str:
    torch = sorted({r.row.torch_version for r in runs if r.row.torch_version})
    backends = sorted({f"{r.row.backend} {r.row.backend_version}" if r.row.backend_version
                       else r.row.backend for r in runs if r.row.backend})
    return ", ".join([f"torch {t}" for t in torch] + backends) or "unknown"


def _device_names(runs, base: ClusterProfile) -> tuple[str, ...]:
    """Names of the devices the runs used: this machine's, if they ran here; else the base's."""
    devices = {(r.row.device or "").split(":")[0] for r in runs}
    hw = detect()
    if hw.host in {r.row.host for r in runs}:
        if devices == {"cpu"}:
            return (f"CPU core ({hw.cpu})",)
        if hw.gpus:
            return hw.device_names()
    return (base.device.name,)
