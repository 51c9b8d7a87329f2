"""Calibrate a GPU's compute from `perfmodel gpu-check`'s unit-pass and optimizer timings.

What is fitted, and on what (declared here, before any comparison; the report repeats it):
- FITTED on every unit pass (forward and backward of each unit alone, at the batch and
  half of it, every case and precision): the roofline of perfmodel/sim/compute.py with the
  same form as the spec profiles' fit (calibration/fit_published.py), by least squares on
  log(predicted / measured) pass time. Each precision with at least PASSES_PER_PRECISION
  passes gets its own matmul curve height e_max and `launch_us_per_kernel`
  ([compute.by_precision.<precision>]); the curve's F_half (e_max x F / (F + F_half)) and
  `compute.memory_efficiency` are shared, all in one fit. Then the profile's default e_max
  and launch_us_per_kernel, for precisions not measured: every pass pooled, at the shared
  F_half and memory_efficiency. `compute.overhead_us_per_unit` is 0 (the launch term
  carries the fixed cost). Why per precision: on one H200 (reports/gpu-check-2026-12-04)
  big matmul units reached ~0.6 of the fp32 peak but 0.2-0.4 of the TF32 and BF16 peaks,
  and eager PyTorch spent 21 us per small Linear call, 67 us under bf16 autocast; a pooled
  curve fitted on tf32 and bf16 put fp32 steps 51-55 % too slow.
- FITTED on the optimizer-alone timings: `compute.optimizer_GBps` (model-state bytes per
  second, calibration/fit_compute.py `fit_optimizer_rate`).
- HELD OUT: whole training steps and their peak memory. Nothing is fitted on them; the
  report compares them with the spec profile's and the calibrated profile's predictions.

The measured allocator overhead (max_memory_reserved / max_memory_allocated - 1) is reported
beside the profile's `allocator_reserve_fraction`, not written into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from calibration.fit_compute import fit_optimizer_rate
from calibration.fit_published import curve
from perfmodel.cluster import ClusterProfile, PrecisionCompute
from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import unit_times
from perfmodel.workload import Workload, load_workload

MIN_PASSES = 8          # unit passes needed to fit four parameters with some to spare
PASSES_PER_PRECISION = 4    # a precision's own two parameters need this many of its passes


def cut_workload(name: str, precision: str, blocks: int | None) -> Workload:
    """The shipped workload at `precision`, cut as measure/gpu_check.py cuts the module."""
    w = load_workload(name).with_precision(precision)
    if blocks is None or blocks >= len(w.units) - 2:
        return w
    return replace(w, units=(w.units[0], *w.units[1:1 + blocks], w.units[-1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuFit:
    profile: ClusterProfile
    e_max: float
    log_flops_half: float
    memory_efficiency: float
    launch_us_per_kernel: float
    optimizer_GBps: float | None
    unit_pass_rel: tuple[float, ...]        # (predicted - measured) / measured, fitted passes
    # precision -> (e_max, launch_us_per_kernel) of its own fit (module docstring)
    by_precision: dict[str, tuple[float, float]] = field(default_factory=dict)


def predicted_passes(cluster: ClusterProfile, workload: Workload,
                     passes: Sequence[dict[str, Any]]) -> np.ndarray:
    """perfmodel's seconds for each measured unit pass (unit, phase, batch_size)."""
    names = [u.name for u in workload.units]
    cache: dict[int, Any] = {}
    out = []
    for p in passes:
        if p["unit"] not in names:
            raise PerfmodelError(f"measured unit '{p['unit']}' is not in workload "
                                 f"'{workload.name}' (units: {', '.join(names)})")
        b = int(p["batch_size"])
        times = cache.setdefault(b, unit_times(cluster, workload, b))
        seconds = times.forward_s if p["phase"] == "forward" else times.backward_s
        out.append(float(seconds[names.index(p["unit"])]))
    return np.array(out)


def _all_passes(cluster: ClusterProfile, data) -> np.ndarray:
    """perfmodel's seconds for every measured pass of `data` ((workload, passes) pairs), in
    order."""
    return np.concatenate([predicted_passes(cluster, w, passes) for w, passes in data])


def with_compute(cluster: ClusterProfile, x: Sequence[float],
                 by_precision: dict[str, tuple[float, float]] | None = None) -> ClusterProfile:
    """`cluster` with the pooled fit `x` (e_max, log10 F_half, memory_efficiency,
    launch_us) and each precision's own (e_max, launch_us) on the pooled F_half."""
    e_max, log_half, memory_efficiency, launch_us = x
    own = tuple(PrecisionCompute(precision=p, efficiency_by_flops=curve(e, log_half),
                                 launch_us_per_kernel=float(launch))
                for p, (e, launch) in sorted((by_precision or {}).items()))
    compute = replace(cluster.compute, efficiency_by_flops=curve(e_max, log_half),
                      memory_efficiency=float(memory_efficiency),
                      launch_us_per_kernel=float(launch_us), overhead_us_per_unit=0.0,
                      by_precision=own)
    return replace(cluster, compute=compute)


def _fit_joint(base: ClusterProfile, data, own: Sequence[str]
               ) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """log10 F_half and memory_efficiency shared, (e_max, launch_us) per precision in
    `own`: one least-squares fit on log(predicted / measured) of every pass in `data`."""
    measured = np.array([p["median_s"] for _, passes in data for p in passes])

    def unpack(x):
        return {p: (x[2 + 2 * i], x[3 + 2 * i]) for i, p in enumerate(own)}

    def residuals(x):
        cluster = with_compute(base, (0.5, x[0], x[1], 0.0), unpack(x))
        return np.log(_all_passes(cluster, data) / measured)

    x0 = np.array([9.0, 0.6] + [0.6, 5.0] * len(own))
    lo = [6.0, 0.05] + [0.02, 0.0] * len(own)
    hi = [14.0, 1.0] + [1.0, 200.0] * len(own)
    x = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3).x
    return float(x[0]), float(x[1]), {p: (float(e), float(u)) for p, (e, u) in unpack(x).items()}


def _fit_default(base: ClusterProfile, data, measured: np.ndarray, log_half: float,
                 memory_efficiency: float) -> tuple[float, float]:
    """The profile's default (e_max, launch_us), for precisions not measured: every pass
    pooled, on the joint fit's F_half and memory_efficiency."""
    def residuals(y):
        cluster = with_compute(base, (y[0], log_half, memory_efficiency, y[1]))
        return np.log(_all_passes(cluster, data) / measured)

    y = least_squares(residuals, np.array([0.6, 5.0]), bounds=([0.02, 0.0], [1.0, 200.0]),
                      diff_step=1e-3).x
    return float(y[0]), float(y[1])


def fit_gpu(base: ClusterProfile, cases: Sequence[dict[str, Any]]) -> GpuFit:
    """The calibrated profile (module docstring) from the measured `cases`
    (measure/gpu_check.py's records)."""
    data = [(cut_workload(c["workload"], c["precision"], c["blocks"]), c["unit_passes"])
            for c in cases if c.get("unit_passes")]
    measured = np.array([p["median_s"] for _, passes in data for p in passes])
    if measured.size < MIN_PASSES or not (measured > 0).all():
        raise PerfmodelError(f"gpu-check: need at least {MIN_PASSES} positive unit-pass "
                             f"timings to calibrate, got {measured.size}")

    own = sorted(p for p in {w.precision for w, _ in data}
                 if sum(len(ps) for w, ps in data if w.precision == p) >= PASSES_PER_PRECISION)
    if not own:
        raise PerfmodelError(f"gpu-check: need at least {PASSES_PER_PRECISION} unit passes of "
                             f"some precision to calibrate")
    log_half, memory_efficiency, by_precision = _fit_joint(
        base, [(w, ps) for w, ps in data if w.precision in own], own)
    e_max, launch_us = _fit_default(base, data, measured, log_half, memory_efficiency)
    x = (e_max, log_half, memory_efficiency, launch_us)
    profile = with_compute(base, x, by_precision)
    final = _all_passes(profile, data)
    opt = _optimizer_rate(cases)
    if opt is not None:
        profile = replace(profile, compute=replace(profile.compute, optimizer_GBps=opt))
    profile = replace(profile, name=f"{base.name}-gpu-check", provenance=replace(
        base.provenance, source="measured",
        note=f"compute calibrated by perfmodel gpu-check from unit passes on {base.name}'s "
             f"GPU; everything else is {base.name}'s"))
    return GpuFit(profile=profile, e_max=e_max, log_flops_half=log_half,
                  memory_efficiency=memory_efficiency, launch_us_per_kernel=launch_us,
                  optimizer_GBps=opt,
                  unit_pass_rel=tuple(float(v) for v in final / measured - 1),
                  by_precision=by_precision)


def _optimizer_rate(cases: Sequence[dict[str, Any]]) -> float | None:
    state, seconds = [], []
    for c in cases:
        if c.get("optimizer"):
            w = cut_workload(c["workload"], c["precision"], c["blocks"])
            state.append(w.model_state_bytes_per_param * w.params)
            seconds.append(c["optimizer"]["median_s"])
    if len(state) < 2:
        return None
    return float(fit_optimizer_rate(state, seconds).value)


def profile_text(base_name: str, fit: GpuFit, note: str) -> str:
    """The calibrated profile as TOML: the base profile's file with the fitted [compute]
    fields replaced, the name `<base>-gpu-check` and measured provenance (`note`)."""
    from perfmodel.cluster import profile_paths
    from perfmodel.tomlfile import load_toml, to_toml

    data = load_toml(profile_paths()[base_name])
    c = fit.profile.compute
    data["name"] = fit.profile.name
    data["compute"].update({
        "efficiency_by_flops": [[float(f), float(e)] for f, e in c.efficiency_by_flops],
        "memory_efficiency": round(float(c.memory_efficiency), 4),
        "launch_us_per_kernel": round(float(c.launch_us_per_kernel), 3),
        "overhead_us_per_unit": 0.0, "optimizer_GBps": round(float(c.optimizer_GBps), 1)})
    if c.by_precision:
        data["compute"]["by_precision"] = {p.precision: {
            "efficiency_by_flops": [[float(f), float(e)] for f, e in p.efficiency_by_flops],
            "launch_us_per_kernel": round(float(p.launch_us_per_kernel), 3)}
            for p in c.by_precision}
    data["provenance"] = {"source": "measured", "note": note,
                          "citations": list(data.get("provenance", {}).get("citations", []))}
    return to_toml(data, header=f"Calibrated by `perfmodel gpu-check` from {base_name}: "
                   "[compute] fitted on unit passes and optimizer steps only.")
