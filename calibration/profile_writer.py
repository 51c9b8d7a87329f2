"""Build a measured cluster profile from fitted parameters and write it atomically as TOML.

The profile has the fields perfmodel/cluster.py parses. What was measured replaces the base
profile's value; everything else (device peaks and capacity, topology, what was not fitted)
is copied from the base profile and listed in [calibration] as `unmeasured`. Provenance says
`source = "measured"` with date, host, device names, versions and the number of runs; each
fitted parameter's residuals go to [calibration.residuals."<field>"], and the relative errors
perfmodel/uncertainty.py needs to [calibration] (read into ClusterProfile.calibration_errors).

Writing is atomic (a temporary file in the same folder, flushed, then os.replace, which is
atomic on POSIX and Windows), so a crash leaves the old profile or the new one, never half of
one; an existing profile is first copied to <name>.toml.bak-<UTC timestamp>. The TOML text is
produced by perfmodel/tomlfile.py `to_toml` (no dependency; Python's repr of a float is valid
TOML and round-trips exactly) and checked by parsing it back with tomllib and
perfmodel.cluster.parse_profile before it replaces anything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.fit import FitResult
from calibration.fit_compute import ComputeFit
from calibration.fit_memory import MemoryFit
from calibration.fit_network import LinkFit
from perfmodel.cluster import ClusterProfile, Link, parse_profile, user_profile_dir
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import to_toml

_PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# Profile fields calibration can measure; those it did not are listed as `unmeasured`.
MEASURABLE_FIELDS = (
    "intra_node.bandwidth_GBps", "intra_node.latency_us", "intra_node.efficiency_by_bytes",
    "inter_node.bandwidth_GBps", "inter_node.latency_us", "inter_node.efficiency_by_bytes",
    "compute.efficiency_by_flops", "compute.overhead_us_per_unit", "compute.optimizer_GBps",
    "compute.jitter_cv", "compute.overlap_slowdown", "device.framework_overhead_GiB",
    "device.memory_overhead_fraction", "server.apply_GBps", "compute.core_contention",
    "intra_node.p2p", "inter_node.p2p", "topology.comm_cpu_bound_fraction",
    "compute.whole_step_factor", "compute.by_workload", "server.update",
    "topology.comm_cpu_bound_by_bytes", "topology.comm_cpu_stretch_by_level",
    "topology.comm_cpu_busy_by_level",
    "compute.ps_worker_extra_ms", "compute.copy_GBps", "compute.timed_wait_spread_ms",
    "compute.sharing_delay_cv", "compute.ddp_cpu_work_factor",
    "server.crowded_message_factor", "server.crowded_update_factor",
)


@dataclass(frozen=True, kw_only=True)
class WorkloadFits:
    """compute.by_workload.<workload>: one workload's whole-step factor and contention."""

    workload: str
    whole_step_factor: FitResult
    core_contention: FitResult


@dataclass(frozen=True, kw_only=True)
class MeasuredFits:
    """Whatever calibration fitted; None = not measured, keep the base profile's value."""

    intra_node: LinkFit | None = None
    inter_node: LinkFit | None = None
    compute: ComputeFit | None = None
    jitter_cv: FitResult | None = None
    optimizer_GBps: FitResult | None = None
    overlap_slowdown: FitResult | None = None       # proposed field compute.overlap_slowdown
    memory: MemoryFit | None = None
    server_apply_GBps: FitResult | None = None
    core_contention: FitResult | None = None         # CPU hosts: compute under core sharing
    timed_wait_spread: FitResult | None = None       # CPU hosts: a crowded timed wait's, ms
    sharing_delay_cv: FitResult | None = None        # CPU hosts: a core wait's SD / mean
    ddp_cpu_work_factor: FitResult | None = None     # CPU hosts: crowded DDP's CPU work
    comm_cpu_bound_fraction: FitResult | None = None  # CPU hosts: collectives under sharing
    comm_cpu_bound_by_bytes: tuple[tuple[float, float], ...] = ()   # ... and u by size
    # ... or, swept at >= 2 crowding levels, the whole collective's stretch by level and size
    comm_cpu_stretch_by_level: tuple[tuple[str, tuple[tuple[float, float, float], ...]],
                                     ...] = ()
    # ... and the share of the cores its crowded collectives kept busy, by level
    comm_cpu_busy_by_level: tuple[tuple[float, float], ...] = ()
    whole_step_factor: FitResult | None = None        # CPU hosts: whole steps vs unit sums
    # CPU hosts: the two above for each workload whose whole steps were timed (>= 2 workloads)
    by_workload: tuple[WorkloadFits, ...] = ()
    # CPU hosts: the serial server's own time per update (latency_us, bandwidth_GBps)
    server_update: tuple[FitResult, FitResult] | None = None
    # CPU hosts: its one push received and one reply sent, each (latency_us, bandwidth_GBps)
    server_messages: tuple[tuple[FitResult, FitResult], tuple[FitResult, FitResult]] | None \
        = None
    # CPU hosts: those messages on a crowded host over the 1-worker ones
    crowded_message_factor: FitResult | None = None
    crowded_update_factor: FitResult | None = None     # ... and its apply + pack there
    # CPU hosts: a PS worker's compute beyond the model's, per workload (parameter
    # "compute.ps_worker_extra_ms.<workload>", value in ms)
    ps_worker_extra: tuple[FitResult, ...] = ()
    copy_GBps: FitResult | None = None         # CPU hosts: FSDP2's and DDP's copies


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """Where and with what the measurements were taken."""

    host: str
    device_names: tuple[str, ...]   # one per device seen, e.g. ("NVIDIA A10G",) or ("CPU core",)
    versions: str                   # e.g. "torch 2.13.0, gloo"
    runs: int                       # measurement runs the fits used
    run_spread_cv: float | None = None   # run-to-run CV of a repeated configuration's step
    step_rms_rel: float | None = None    # RMS log error of the fitted runs' mean step time
    step_comm_rms_rel: float | None = None   # the same with their measured compute
    step_rms_runs: int = 0               # how many runs that residual is over
    cpu_cores: int | None = None    # cores of the host (for a CPU base's comm_cpu_cores_per_node)
    date: str = ""                  # ISO 8601; "" = now, in UTC


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteResult:
    path: Path
    backup: Path | None             # the previous profile's copy, if there was one


def build_profile(name: str, base: ClusterProfile, fits: MeasuredFits, info: RunInfo,
                  description: str | None = None) -> dict[str, Any]:
    """The measured profile as a plain dict in the TOML layout cluster.parse_profile reads."""
    date = info.date or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    names = list(dict.fromkeys(info.device_names)) or [base.device.name]
    measured, results = _measured_fields(fits)
    device = {
        "name": ", ".join(names),
        "memory_GiB": base.device.memory_GiB,
        "memory_bandwidth_GBps": base.device.memory_bandwidth_GBps,
        "framework_overhead_GiB": (base.device.framework_overhead_GiB if fits.memory is None
                                   else fits.memory.framework_overhead_GiB.value),
        "peak_TFLOPS": dict(base.device.peak_TFLOPS),
    }
    if fits.memory is not None:
        device["memory_overhead_fraction"] = fits.memory.overhead_fraction.value
    if fits.compute is not None and fits.compute.raised_peak:
        key, tflops = fits.compute.raised_peak
        device["peak_TFLOPS"][key] = tflops
    c, cf = base.compute, fits.compute
    compute = {
        "efficiency_by_flops": _curve(c.efficiency_by_flops if cf is None
                                      else cf.efficiency_by_flops),
        "overhead_us_per_unit": (c.overhead_us_per_unit if cf is None
                                 else cf.overhead_us_per_unit.value),
        "backward_flops_ratio": c.backward_flops_ratio,
        "optimizer_GBps": _value(fits.optimizer_GBps, c.optimizer_GBps),
        "jitter_cv": _value(fits.jitter_cv, c.jitter_cv),
    }
    if fits.overlap_slowdown is not None:
        compute["overlap_slowdown"] = fits.overlap_slowdown.value
    if base.compute_cpu_cores_per_node:
        compute["core_contention"] = _value(fits.core_contention, c.core_contention)
        compute["whole_step_factor"] = _value(fits.whole_step_factor, c.whole_step_factor)
        if fits.by_workload:
            compute["by_workload"] = {
                w.workload: {"whole_step_factor": w.whole_step_factor.value,
                             "core_contention": w.core_contention.value}
                for w in fits.by_workload}
        if cf is not None or c.weight_stream_GBps:    # units timed apart: see the field
            compute["weight_stream_GBps"] = (compute["optimizer_GBps"] if cf is not None
                                             else c.weight_stream_GBps)
        if fits.copy_GBps is not None or c.copy_GBps:
            compute["copy_GBps"] = _value(fits.copy_GBps, c.copy_GBps)
        if fits.timed_wait_spread is not None or c.timed_wait_spread_ms:
            compute["timed_wait_spread_ms"] = _value(fits.timed_wait_spread,
                                                     c.timed_wait_spread_ms)
        if fits.sharing_delay_cv is not None or c.sharing_delay_cv:
            compute["sharing_delay_cv"] = _value(fits.sharing_delay_cv, c.sharing_delay_cv)
        if fits.ddp_cpu_work_factor is not None or c.ddp_cpu_work_factor != 1.0:
            compute["ddp_cpu_work_factor"] = _value(fits.ddp_cpu_work_factor,
                                                    c.ddp_cpu_work_factor)
        if fits.ps_worker_extra:
            compute["ps_worker_extra_ms"] = {r.parameter.rsplit(".", 1)[1]: r.value
                                             for r in fits.ps_worker_extra}
    calibration: dict[str, Any] = {
        "base": base.name,
        "measured": measured,
        "unmeasured": [f for f in MEASURABLE_FIELDS if f not in measured],
    }
    calibration.update(_errors(fits, info))
    calibration["residuals"] = {r.parameter: {"value": r.value, "stderr": r.stderr,
                                              "rms_rel": r.rms_rel, "max_rel": r.max_rel,
                                              "points": r.points} for r in results}
    return {
        "name": name,
        "description": description or f"{base.description} (measured on {info.host})",
        "provenance": {
            "source": "measured",
            "note": (f"calibrated by perfmodel calibrate on {info.host} from {info.runs} runs; "
                     f"unmeasured fields come from the '{base.name}' profile "
                     f"({base.provenance.source})"),
            "citations": [
                "alpha-beta collective model, Thakur, Rabenseifner & Gropp, IJHPCA 2005; "
                "least squares in relative error (calibration/fit.py)",
                f"base profile '{base.name}': {base.provenance.note}",
            ],
            "date": date, "host": info.host, "versions": info.versions, "runs": info.runs,
            "devices": names,
        },
        "device": device,
        "compute": compute,
        "topology": {"devices_per_node": base.devices_per_node}
                    | ({"comm_cpu_cores_per_node": info.cpu_cores or
                        base.comm_cpu_cores_per_node}
                       if base.comm_cpu_cores_per_node else {})
                    | ({"comm_cpu_bound_fraction": _value(fits.comm_cpu_bound_fraction,
                                                          base.comm_cpu_bound_fraction)}
                       if base.comm_cpu_cores_per_node else {})
                    | _sharing_curve(fits, base)
                    | ({"compute_cpu_cores_per_node": info.cpu_cores or
                        base.compute_cpu_cores_per_node}
                       if base.compute_cpu_cores_per_node else {}),
        "intra_node": _link(fits.intra_node, base.intra_node),
        "inter_node": _link(fits.inter_node, base.inter_node),
        "server": {"apply_GBps": _value(fits.server_apply_GBps, base.server.apply_GBps),
                   "link": base.server.link} | _server_update_table(fits, base),
        "calibration": calibration,
    }


def _sharing_curve(fits: MeasuredFits, base: ClusterProfile) -> dict[str, Any]:
    """topology.comm_cpu_bound_by_bytes: fitted (with its u), else the base profile's unless
    the one value was fitted without it, else none."""
    if not base.comm_cpu_cores_per_node:
        return {}
    curve = fits.comm_cpu_bound_by_bytes or (
        base.comm_cpu_bound_by_bytes if fits.comm_cpu_bound_fraction is None else ())
    out = {"comm_cpu_bound_by_bytes": [[n, round(u, 4)] for n, u in curve]} if curve else {}
    if fits.comm_cpu_stretch_by_level:
        out["comm_cpu_stretch_by_level"] = {
            op: [[lv, n, round(st, 4)] for lv, n, st in rows]
            for op, rows in fits.comm_cpu_stretch_by_level}
    if fits.comm_cpu_busy_by_level:
        out["comm_cpu_busy_by_level"] = [[lv, round(share, 4)]
                                         for lv, share in fits.comm_cpu_busy_by_level]
    return out


def _server_update_table(fits: MeasuredFits, base: ClusterProfile) -> dict[str, Any]:
    """[server.update], [server.push], [server.reply] and the crowded factors: each
    fitted, else the base profile's where it has one, else none."""
    fitted = {"update": fits.server_update}
    if fits.server_messages is not None:
        fitted |= {"push": fits.server_messages[0], "reply": fits.server_messages[1]}
    out: dict[str, Any] = {}
    for name in ("crowded_message_factor", "crowded_update_factor"):
        fit, had = getattr(fits, name), getattr(base.server, name)
        if fit is not None or had is not None:
            out[name] = _value(fit, had)
    for name in ("update", "push", "reply"):
        if fitted.get(name) is not None:
            latency, rate = fitted[name]
            out[name] = {"latency_us": max(latency.value, 0.0), "bandwidth_GBps": rate.value}
        elif getattr(base.server, f"{name}_GBps") is not None:
            out[name] = {"latency_us": getattr(base.server, f"{name}_latency_us") or 0.0,
                         "bandwidth_GBps": getattr(base.server, f"{name}_GBps")}
    return out


def _measured_fields(fits: MeasuredFits) -> tuple[list[str], list[FitResult]]:
    measured: list[str] = []
    results: list[FitResult] = []
    for link in (fits.intra_node, fits.inter_node):
        if link is not None:
            measured += [f"{link.scope}.bandwidth_GBps", f"{link.scope}.latency_us",
                         f"{link.scope}.efficiency_by_bytes"]
            measured += [f"{link.scope}.p2p"] if link.p2p is not None else []
            results += link.results
    if fits.compute is not None:
        measured += ["compute.efficiency_by_flops", "compute.overhead_us_per_unit"]
        results += fits.compute.results
    if fits.memory is not None:
        measured += ["device.framework_overhead_GiB", "device.memory_overhead_fraction"]
        results += fits.memory.results
    for r in (fits.optimizer_GBps, fits.jitter_cv, fits.overlap_slowdown,
              fits.server_apply_GBps, fits.core_contention, fits.comm_cpu_bound_fraction,
              fits.whole_step_factor, fits.copy_GBps, fits.timed_wait_spread,
              fits.sharing_delay_cv, fits.ddp_cpu_work_factor, fits.crowded_message_factor,
              fits.crowded_update_factor):
        if r is not None:
            measured.append(r.parameter)
            results.append(r)
    if fits.comm_cpu_bound_by_bytes:
        measured.append("topology.comm_cpu_bound_by_bytes")
    if fits.comm_cpu_stretch_by_level:
        measured.append("topology.comm_cpu_stretch_by_level")
    if fits.comm_cpu_busy_by_level:
        measured.append("topology.comm_cpu_busy_by_level")
    if fits.server_update is not None:
        measured.append("server.update")
        results += list(fits.server_update)
    if fits.server_messages is not None:
        measured += ["server.push", "server.reply"]
        results += [r for pair in fits.server_messages for r in pair]
    if fits.by_workload:
        measured.append("compute.by_workload")
        results += [r for w in fits.by_workload for r in (w.whole_step_factor, w.core_contention)]
    if fits.ps_worker_extra:
        measured.append("compute.ps_worker_extra_ms")
        results += list(fits.ps_worker_extra)
    return measured, results


def _errors(fits: MeasuredFits, info: RunInfo) -> dict[str, float]:
    """The relative errors perfmodel/uncertainty.py reads back, for what was measured."""
    out = {}
    links = [f for f in (fits.intra_node, fits.inter_node) if f is not None]
    if links:
        out["network_rms_rel"] = max(f.latency_us.rms_rel for f in links)
    if fits.compute is not None:
        out["compute_rms_rel"] = fits.compute.overhead_us_per_unit.rms_rel
    if info.run_spread_cv is not None:
        out["run_spread_cv"] = info.run_spread_cv
    if info.step_rms_rel is not None:
        out["step_rms_rel"] = info.step_rms_rel
        out["step_rms_runs"] = info.step_rms_runs
    if info.step_comm_rms_rel is not None:
        out["step_comm_rms_rel"] = info.step_comm_rms_rel
    return out


def _value(fit: FitResult | None, fallback: float) -> float:
    return fallback if fit is None else fit.value


def _curve(points) -> list[list[float]]:
    return [[float(x), float(y)] for x, y in points]


def _link(fit: LinkFit | None, base: Link) -> dict[str, Any]:
    if fit is None:
        out = {"bandwidth_GBps": base.bandwidth_GBps, "latency_us": base.latency_us,
               "efficiency_by_bytes": _curve(base.efficiency_by_bytes)}
        return out | ({"p2p": _link(None, base.p2p)} if base.p2p is not None else {})
    out = {"bandwidth_GBps": fit.bandwidth_GBps.value, "latency_us": fit.latency_us.value,
           "efficiency_by_bytes": _curve(fit.efficiency_by_bytes)}
    if fit.time_factor_by_op:
        out["time_factor_by_op"] = dict(fit.time_factor_by_op)
    if fit.p2p is not None:
        out["p2p"] = _link(fit.p2p, base)
    return out


# --- atomic write -------------------------------------------------------------------------

def write_profile(data: dict[str, Any], folder: Path | None = None, *,
                  now: dt.datetime | None = None, header: str | None = None) -> WriteResult:
    """Write `data` to <folder>/<name>.toml atomically, backing up a profile already there.

    `folder` defaults to the user profile folder ($PERFMODEL_PROFILES). The text is checked
    with parse_profile first, so a profile that perfmodel could not load is never written.
    """
    name = data.get("name")
    if not isinstance(name, str) or not _PROFILE_NAME.fullmatch(name):
        raise PerfmodelError(f"profile name {name!r} must be letters, digits, '_', '-' or '.' "
                             f"(it becomes the file name)")
    folder = Path(folder) if folder is not None else user_profile_dir()
    target = folder / f"{name}.toml"
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    header = header or (f"Measured profile written by perfmodel calibrate ({stamp}).\n"
                        "Delete this file to fall back to the shipped profile.")
    text = to_toml(data, header=header)
    parsed = tomllib.loads(text)
    parse_profile(parsed, target)
    if parsed != _as_lists(data):
        raise PerfmodelError(f"{target}: the TOML text does not read back as written; "
                             f"profile not written")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    except OSError as e:
        raise PerfmodelError(f"cannot write a profile to {folder}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); a profile is ordinary data
        if target.exists():
            shutil.copymode(target, tmp)
        else:
            os.chmod(tmp, 0o644)
        backup = _backup(target, stamp)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise PerfmodelError(f"cannot write {target}: {e.strerror or e}; the previous profile "
                             f"is unchanged") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return WriteResult(path=target, backup=backup)


def _backup(target: Path, stamp: str) -> Path | None:
    """Copy an existing profile to <name>.toml.bak-<stamp>(-<n>); None if there is none."""
    if not target.exists():
        return None
    backup = target.with_name(f"{target.name}.bak-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = target.with_name(f"{target.name}.bak-{stamp}-{n}")
    shutil.copy2(target, backup)
    return backup


def _as_lists(value: Any) -> Any:
    """`value` with tuples turned into lists and ints kept, as tomllib would return it."""
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value
