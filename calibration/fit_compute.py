"""Fit a device's achieved compute from per-unit forward/backward timings at several batch sizes.

The model is the simulator's (perfmodel/sim/compute.py `pass_seconds`, the roofline-style
model of llm-analysis and Calculon): one pass of a unit doing F FLOPs takes

    overhead + F / (peak · efficiency(F)),    F = forward FLOPs per sample x batch size,
                                              x backward_flops_ratio for the backward pass.

The fit (calibration/fit.py) finds the overhead, the best achieved FLOP/s and the efficiency
curve relative to it; the profile's `efficiency_by_flops` is that curve times best/peak, the
fraction of the device peak, so a measured rate above the stated peak is refused.

Also here: step-to-step jitter (compute.jitter_cv) and the optimizer's memory rate
(compute.optimizer_GBps). The slowdown of compute while communication overlaps it
(compute.overlap_slowdown) is fitted from stored DDP/FSDP runs in calibration/from_store.py,
as the simulator applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calibration.fit import (
    FitResult,
    Residual,
    check_measurements,
    coefficient_of_variation,
    fit_latency_rate,
    fit_rate,
    fit_result,
    round_sig,
)
from perfmodel.errors import PerfmodelError

PHASES = ("forward", "backward")
MIN_FLOP_COUNTS = 3          # distinct FLOP counts needed to separate overhead from rate
FLOPS_BIN_DECADES = 0.25     # units whose FLOPs differ by less than ~1.8x share a curve point
RATIO_MIN_SHARE = 0.5        # use a (unit, batch) pair for the backward check when FLOPs
                             # (not overhead) are at least half of its forward time


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitTiming:
    """Median seconds of one unit's forward or backward pass at one batch size."""

    unit: str
    phase: str              # "forward" or "backward"
    batch_size: int
    median_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ComputeFit:
    overhead_us_per_unit: FitResult
    achieved_TFLOPS: FitResult                       # best rate seen (peak x top efficiency)
    efficiency_by_flops: tuple[tuple[float, float], ...]   # [FLOPs, fraction of peak]
    curve_fitted: bool                               # False: one constant efficiency
    backward_time_ratio: FitResult | None            # check of backward_flops_ratio
    by_phase: dict[str, Residual]
    # (precision key, TFLOPS): the device peak raised to the best rate the units reached,
    # where the base profile's peak was an estimate they beat (fit_compute's raise_peak)
    raised_peak: tuple[str, float] | None = None

    @property
    def results(self) -> tuple[FitResult, ...]:
        extra = () if self.backward_time_ratio is None else (self.backward_time_ratio,)
        return (self.overhead_us_per_unit, self.achieved_TFLOPS, *extra)


def fit_compute(timings: Sequence[UnitTiming], flops_per_sample: Mapping[str, float], *,
                peak_TFLOPS: float, backward_flops_ratio: float = 2.0,
                raise_peak: str | None = None) -> ComputeFit:
    """Fit overhead, achieved rate and efficiency curve from unit pass timings.

    `flops_per_sample` maps unit name → forward FLOPs per sample (the workload file's
    forward_flops_per_sample); `peak_TFLOPS` is the device peak for the workload's precision.
    Units faster than that peak are an error (a wrong base profile), unless `raise_peak`
    names the precision key of a peak that is only an estimate (a CPU core, whose clock
    boosts past the one its spec assumed): then the peak becomes the best rate reached
    (`ComputeFit.raised_peak`) and the efficiencies are relative to it.
    """
    if peak_TFLOPS <= 0:
        raise PerfmodelError(f"device.peak_TFLOPS must be > 0, got {peak_TFLOPS}")
    flops, times, phases = _flops_and_times(timings, flops_per_sample, backward_flops_ratio)
    counts = np.unique(np.round(np.log10(flops) / FLOPS_BIN_DECADES))
    if counts.size < MIN_FLOP_COUNTS:
        raise PerfmodelError(
            f"compute: need unit timings at >= {MIN_FLOP_COUNTS} distinct FLOP counts "
            f"(e.g. one unit at 3 batch sizes), found {counts.size}")
    what = (f"{times.size} unit pass timings ({', '.join(sorted(set(phases)))}; "
            f"{flops.min():.3g}-{flops.max():.3g} FLOPs)")
    fit = fit_latency_rate(np.ones_like(times), flops, flops, times,
                           names=("compute.overhead_us_per_unit", "compute.efficiency_by_flops"),
                           what=what, bin_decades=FLOPS_BIN_DECADES)
    best = fit.rate / (peak_TFLOPS * 1e12)
    raised = None
    if best > 1.0 and raise_peak:
        raised, best = (raise_peak, fit.rate / 1e12), 1.0
    if best > 1.0:
        raise PerfmodelError(
            f"compute.efficiency_by_flops: the units reach {fit.rate / 1e12:.4g} TFLOP/s, "
            f"{best:.2f}x the device peak of {peak_TFLOPS:g} TFLOPS in the base profile; "
            f"raise device.peak_TFLOPS to the device's real peak")
    curve = tuple((x, round_sig(e * best, 4)) for x, e in fit.curve)
    return ComputeFit(
        overhead_us_per_unit=fit_result("compute.overhead_us_per_unit", fit.latency * 1e6,
                                        fit.latency_stderr * 1e6, fit.rel),
        achieved_TFLOPS=fit_result("compute.achieved_TFLOPS", fit.rate / 1e12,
                                   fit.rate_stderr / 1e12, fit.rel),
        efficiency_by_flops=curve,
        curve_fitted=fit.curve_kept,
        backward_time_ratio=_backward_ratio(timings, times, fit.latency),
        by_phase={p: Residual.of(fit.rel[phases == p]) for p in PHASES if (phases == p).any()},
        raised_peak=raised,
    )


def _flops_and_times(timings, flops_per_sample, ratio):
    if ratio <= 0:
        raise PerfmodelError(f"compute.backward_flops_ratio must be > 0, got {ratio}")
    flops, phases = [], []
    for t in timings:
        if t.phase not in PHASES:
            raise PerfmodelError(f"unit '{t.unit}': phase '{t.phase}' is not one of "
                                 f"{', '.join(PHASES)}")
        if t.unit not in flops_per_sample:
            raise PerfmodelError(f"unit '{t.unit}' is not in the workload; its units are: "
                                 f"{', '.join(flops_per_sample)}")
        if t.batch_size < 1:
            raise PerfmodelError(f"unit '{t.unit}': batch size must be >= 1, got "
                                 f"{t.batch_size}")
        f = flops_per_sample[t.unit] * t.batch_size * (ratio if t.phase == "backward" else 1.0)
        flops.append(f)
        phases.append(t.phase)
    flops = check_measurements(flops, "unit FLOPs (forward_flops_per_sample x batch)")
    times = check_measurements([t.median_s for t in timings], "unit pass median_s")
    return flops, times, np.array(phases)


def _backward_ratio(timings, times, overhead_s) -> FitResult | None:
    """Median of (backward − overhead) / (forward − overhead) over (unit, batch) pairs.

    With a constant efficiency it equals the backward/forward FLOPs ratio (2 for dense layers:
    weight and input gradients); with efficiency rising with FLOPs it reads a little lower.
    """
    forward, backward = {}, {}
    for t, s in zip(timings, times, strict=True):
        (forward if t.phase == "forward" else backward)[(t.unit, t.batch_size)] = s
    ratios = [(backward[k] - overhead_s) / (forward[k] - overhead_s) for k in forward
              if k in backward and forward[k] - overhead_s >= RATIO_MIN_SHARE * forward[k]]
    if len(ratios) < 2:
        return None
    r = np.array(ratios)
    med = float(np.median(r))
    stderr = 1.2533 * r.std(ddof=1) / np.sqrt(r.size)      # standard error of a median
    return fit_result("compute.backward_time_ratio", med, stderr, (med - r) / r)


def fit_jitter_cv(step_compute_s: Sequence[float]) -> FitResult:
    """compute.jitter_cv: CV of one worker's per-step compute time (warm-up steps removed)."""
    return coefficient_of_variation(step_compute_s, parameter="compute.jitter_cv",
                                    what="step compute_s")


def fit_optimizer_rate(state_bytes: Sequence[float], seconds: Sequence[float]) -> FitResult:
    """compute.optimizer_GBps: bytes of parameters + optimizer state touched per second."""
    return fit_rate(state_bytes, seconds, parameter="compute.optimizer_GBps",
                    what="optimizer step timings", unit_scale=1e9)
