"""Prediction interval of a predicted step time, from calibration residuals and run spread.

Derivation. A predicted step is T = C + N: compute C and exposed communication N, each from
a calibrated model. Where the model was fitted, its relative error has the RMS of its
calibration residuals, r_c for compute and r_n for the network (calibration/fit.py); the
errors of the two models come from different measurements and are taken as independent.
A real run of the same configuration also moves from run to run with coefficient of
variation s (measured by repeating runs; DESIGN.md sees ±15–20 % on a shared machine). To first
order the relative error of T is c·ε_c + n·ε_n + ε_run with shares c = C/T and n = N/T, so

    σ² = (c·r_c)² + (n·r_n)² + s².

With the shares unknown, c = n = 1 bounds σ from above (c + n = 1 makes each term smaller):
σ = √(r_c² + r_n² + s²), the default. Taking log T as normal with standard deviation σ (relative
errors multiply, and the interval must stay positive), the interval at coverage q is

    [T·exp(−z·σ), T·exp(z·σ)],   z = Φ⁻¹((1 + q)/2)   (z = 1.645 at q = 0.9),

so its relative half-width is ≈ z·σ for small σ. This is a lower bound away from the
calibrated range: residuals measure the error where the model was fitted, not extrapolation
error; they also already contain part of the run-to-run noise, which errs on the wide side.

Why that made the intervals ±52–75 % wide (issue 14), and what replaces it. r_c and r_n are
the RMS residuals of single small timings: one unit's forward or backward pass, one
collective of 1 KiB–16 MiB. On a shared 2-core host those are dominated by the noise of a
single short timing (gloo's small-message latency is bimodal, 0.35–4 ms, because ranks wait
for a core: DESIGN.md), which averages out over a step's many units and messages; the local
profiles of 2026-12-02/03 had r_n = 0.50–0.52 and r_c = 0.28–0.31 while the same profiles'
fitted DDP runs were predicted within 13–27 %. Stacking the two point residuals per
component, each at a share of 1 by default, counted that point noise twice.

A measured profile that says `step_rms_rel` (calibration/from_store.py) gets the step-level
interval instead, for the median of n runs (n = 1 for `perfmodel predict`, the plan's
repeats for `perfmodel compare`, whose measured side is the median over its repeats):

    σ² = max(r_step² − s², 0) + s²·f(n),   f(1) = 1, f(n) = min(1/2, π/(2n)) for n >= 2

r_step: the RMS of log(predicted / measured) mean step time over the training runs the
calibration *fitted* (set A's DDP/FSDP runs: in-sample, so no held-out run is used and none
could be); it holds the model's error at the step level, where the noise of single timings
has averaged out, plus those runs' own run-to-run noise: each fitted run is one run, so
r_step² ≈ model² + s², and the model's own part is r_step² − s². s: the run-to-run CV of the
calibration's repeated configurations (their repeats interleaved with the other runs,
measure/protocol.py). f(n): the variance of a median of n runs relative to one run's, for
normal noise (`median_variance_factor`; π/(2n) is the large-n limit, wide at small n).
Until report 38 the rule was σ² = r_step² + s² for any n: s counted twice (once inside
r_step) and a median of five taken as one run. Both erred wide, and reports 33-38 covered
14 of 14 held-out rows each, six in a row, which a 90 % interval does with probability
0.23 each. The in-sample residual still cannot see extrapolation to other configurations;
the held-out reports are what test that.

A timed-wait run (perfmodel/compare: its workers sleep the model's own unit times instead of
computing) has no compute error by construction, so r_step, which holds the compute model's
error too, is the wrong width for it. A profile that says `step_comm_rms_rel` gives it

    σ² = r_comm² + s²·f(n)

r_comm: the same fitted runs' RMS of log((measured compute + predicted communication) /
measured step): their step error had the model known their compute exactly, which is what a
timed wait is. (Reports 33-36 put r_step at 9-14 % where set A's DDP cnn-small runs, whose
compute the model under-predicts by 12-18 %, decided most of it; the timed-wait rows of
those reports erred by 2-3 % median.) Its runs' noise partly cancels (their measured compute
is on both sides), so none of s is taken out of it, which errs wide. Like r_step it is
in-sample, at 2 ranks, where the timed-wait configurations crowd 4-8 ranks on the cores: a
lower bound on their error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import PerfmodelError

DEFAULT_COVERAGE = 0.9
# Keys of a measured profile's [calibration] table (written by calibration/profile_writer.py)
ERROR_KEYS = ("network_rms_rel", "compute_rms_rel", "run_spread_cv")
STEP_KEY = "step_rms_rel"      # optional: the step-level residual of the fitted runs
COMM_KEY = "step_comm_rms_rel"  # optional: the same with their measured compute (timed waits)


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationErrors:
    """Relative errors a measured profile stores in its [calibration] table."""

    network_rms_rel: float
    compute_rms_rel: float
    run_spread_cv: float
    step_rms_rel: float | None = None   # RMS log error of the fitted runs' mean step
    step_comm_rms_rel: float | None = None   # the same with their measured compute


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictionInterval:
    point_s: float
    low_s: float
    high_s: float
    coverage: float             # probability the interval holds a measured step, by the model
    sigma_rel: float            # σ: combined relative standard error

    @property
    def half_width_rel(self) -> float:
        """Half the interval's width relative to the point: ≈ z·σ."""
        return (self.high_s - self.low_s) / (2 * self.point_s)


def prediction_interval(point_s: float, *, network_rms_rel: float, compute_rms_rel: float,
                        run_spread_cv: float, coverage: float = DEFAULT_COVERAGE,
                        compute_share: float = 1.0,
                        network_share: float = 1.0) -> PredictionInterval:
    """Interval around a predicted step time `point_s` (see the module docstring).

    `compute_share` and `network_share` are C/T and N/T of the prediction when known; the
    default 1 for both is the conservative bound.
    """
    if not point_s > 0 or not math.isfinite(point_s):
        raise PerfmodelError(f"a predicted step time must be a finite number > 0, got {point_s}")
    if not 0 < coverage < 1:
        raise PerfmodelError(f"coverage must lie strictly between 0 and 1, got {coverage}")
    for name, value in (("network_rms_rel", network_rms_rel),
                        ("compute_rms_rel", compute_rms_rel), ("run_spread_cv", run_spread_cv),
                        ("compute_share", compute_share), ("network_share", network_share)):
        if not value >= 0 or not math.isfinite(value):
            raise PerfmodelError(f"{name} must be a finite number >= 0, got {value}")
    sigma = math.sqrt((compute_share * compute_rms_rel) ** 2
                      + (network_share * network_rms_rel) ** 2 + run_spread_cv**2)
    # imported here: statistics pulls in decimal and fractions (~8 ms), which a prediction
    # without an interval (every spec-derived profile) never needs
    from statistics import NormalDist

    z = NormalDist().inv_cdf((1 + coverage) / 2)
    return PredictionInterval(point_s=point_s, low_s=point_s * math.exp(-z * sigma),
                              high_s=point_s * math.exp(z * sigma), coverage=coverage,
                              sigma_rel=sigma)


def median_variance_factor(repeats: int) -> float:
    """Var(median of `repeats` runs) / Var(one run) under normal run-to-run noise: 1 for one
    run, 1/2 for two (the median of two is their mean) and three (exact 0.449), π/(2n) from
    four on: the large-n limit, which the exact factor approaches from below, so it errs
    wide at small n (0.314 against the exact 0.287 at n = 5)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise PerfmodelError(f"repeats must be a whole number >= 1, got {repeats!r}")
    return 1.0 if repeats == 1 else min(0.5, math.pi / (2 * repeats))


def step_interval(point_s: float, *, step_rms_rel: float, run_spread_cv: float,
                  coverage: float = DEFAULT_COVERAGE, repeats: int = 1,
                  spread_inside: bool = True) -> PredictionInterval:
    """The step-level interval around a prediction of the median of `repeats` runs:
    σ² = r_model² + s²·f(n) with f = `median_variance_factor` (module docstring). With
    `spread_inside` the residual r holds one run's spread already, so r_model² = r² − s²
    (at least 0); else r_model = r."""
    if not step_rms_rel >= 0 or not run_spread_cv >= 0:
        raise PerfmodelError(f"step_rms_rel and run_spread_cv must be numbers >= 0, got "
                             f"{step_rms_rel} and {run_spread_cv}")
    model = math.sqrt(max(step_rms_rel**2 - run_spread_cv**2, 0.0)) if spread_inside \
        else step_rms_rel
    return prediction_interval(point_s, network_rms_rel=0.0, compute_rms_rel=model,
                               run_spread_cv=run_spread_cv
                               * math.sqrt(median_variance_factor(repeats)),
                               coverage=coverage, compute_share=1.0, network_share=0.0)


def interval_for(point_s: float, errors: CalibrationErrors, *, compute_share: float,
                 coverage: float = DEFAULT_COVERAGE, compute_exact: bool = False,
                 repeats: int = 1) -> tuple[PredictionInterval, str]:
    """(the interval a profile's errors give for the median of `repeats` runs, where it
    comes from, in words): step-level when the profile has `step_rms_rel`, else the
    per-component point residuals (for one run); `compute_exact` (a timed wait) takes the
    communication-only residual where the profile has it."""
    runs = "one run" if repeats == 1 else f"the median of {repeats} runs"
    if compute_exact and errors.step_comm_rms_rel is not None:
        iv = step_interval(point_s, step_rms_rel=errors.step_comm_rms_rel,
                           run_spread_cv=errors.run_spread_cv, coverage=coverage,
                           repeats=repeats, spread_inside=False)
        return iv, (f"the fitted runs' step-time residual with their measured compute, "
                    f"{errors.step_comm_rms_rel:.1%} RMS (a timed wait's compute is the "
                    f"model's own), and the run-to-run spread {errors.run_spread_cv:.1%} "
                    f"(CV) of {runs}; log-normal")
    if errors.step_rms_rel is not None:
        iv = step_interval(point_s, step_rms_rel=errors.step_rms_rel,
                           run_spread_cv=errors.run_spread_cv, coverage=coverage,
                           repeats=repeats)
        return iv, (f"the fitted runs' step-time residual {errors.step_rms_rel:.1%} RMS "
                    f"less one run's spread, and the run-to-run spread "
                    f"{errors.run_spread_cv:.1%} (CV) of {runs}; log-normal")
    share = min(max(compute_share, 0.0), 1.0)
    iv = prediction_interval(point_s, network_rms_rel=errors.network_rms_rel,
                             compute_rms_rel=errors.compute_rms_rel,
                             run_spread_cv=errors.run_spread_cv, coverage=coverage,
                             compute_share=share, network_share=1.0 - share)
    return iv, (f"per-point calibration residuals (compute {errors.compute_rms_rel:.0%} and "
                f"network {errors.network_rms_rel:.0%} RMS, weighted by this step's "
                f"{share:.0%} compute share) and run-to-run spread "
                f"{errors.run_spread_cv:.0%} of one run; log-normal; an older calibration "
                f"without the step-level residual (wide: see perfmodel/uncertainty.py)")


def calibration_errors(profile_data: dict[str, Any]) -> CalibrationErrors | None:
    """The [calibration] errors of a profile's raw TOML data; None unless all three are there
    (spec-derived profiles have none; a calibration may skip compute or the network)."""
    table = profile_data.get("calibration")
    if not isinstance(table, dict) or not all(k in table for k in ERROR_KEYS):
        return None
    values = {}
    for key in ERROR_KEYS:
        v = table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                or not math.isfinite(v):
            raise PerfmodelError(f"field 'calibration.{key}' = {v!r} is not a number >= 0; "
                                 f"fix the profile or calibrate again")
        values[key] = float(v)
    for key in (STEP_KEY, COMM_KEY):
        step = table.get(key)
        if step is None:
            continue
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not step >= 0 \
                or not math.isfinite(step):
            raise PerfmodelError(f"field 'calibration.{key}' = {step!r} is not a number "
                                 f">= 0; fix the profile or calibrate again")
        values[key] = float(step)
    return CalibrationErrors(**values)


STALENESS_RESAMPLES = 4000      # resamples behind a staleness interval (fixed generator)


def median_of_runs_interval(per_seed, repeats: int, level: float = 0.9,
                            seed: int = 0) -> tuple[float, float]:
    """The central `level` interval of what `perfmodel compare` measures for a PS row's
    staleness, taken from the model's own spread over seeds: `per_seed` is a seeds x workers
    array (each seed's mean staleness per worker of a speed class, or one column: the
    pooled mean), and the measured side takes each worker's median over `repeats` runs,
    then the mean over the workers. So: draw `repeats` seeds with replacement, take the
    same statistic, STALENESS_RESAMPLES times (a generator of its own, `seed`), and keep
    the quantiles. An SSP run with a straggler flips between orders of service run to run
    (docs/model.md), so a median of 5 runs can move ±10 %: a point error alone cannot tell
    a wrong model from that noise; this interval can."""
    import numpy as np

    values = np.asarray(per_seed, dtype=float)
    if values.ndim != 2 or values.shape[0] < 2 or repeats < 1:
        raise PerfmodelError(f"a staleness interval needs >= 2 seeds and >= 1 repeat, got "
                             f"{values.shape[0] if values.ndim == 2 else 0} and {repeats}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.shape[0], size=(STALENESS_RESAMPLES, repeats))
    stat = np.median(values[picks], axis=1).mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(stat, [tail, 1 - tail])
    return float(low), float(high)
