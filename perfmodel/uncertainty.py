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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import PerfmodelError

DEFAULT_COVERAGE = 0.9
# Keys of a measured profile's [calibration] table (written by calibration/profile_writer.py)
ERROR_KEYS = ("network_rms_rel", "compute_rms_rel", "run_spread_cv")


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationErrors:
    """Relative errors a measured profile stores in its [calibration] table."""

    network_rms_rel: float
    compute_rms_rel: float
    run_spread_cv: float


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
    return CalibrationErrors(**values)
