"""Least-squares fitting shared by the calibration modules: fitted values with their residuals.

Every time model calibrated here has one form,

    t = known + α·steps + volume / (rate · e(size)),

- a collective on one link class: α per ring step, 1/rate = β seconds per byte, volume = the
  bytes a rank sends (busbw factor x size), e = the size-dependent efficiency of the link
  (Thakur, Rabenseifner & Gropp, IJHPCA 2005; nccl-tests doc/PERFORMANCE.md busbw-vs-size);
- one unit pass: α = fixed overhead, volume = FLOPs, rate x e = achieved FLOP/s
  (the roofline-style model of llm-analysis and Calculon, perfmodel/sim/compute.py).

Fits minimise the *relative* error Σ((model − t)/t)², so a 1 KiB message counts as much as a
1 GiB one (weighted least squares with weights 1/t). The efficiency curve e is found by
alternating on two disjoint sets of points, split once by the plain α–β fit: those whose
bandwidth term is a sizable share of their time give the rate volume / (t − known − α·steps),
whose median per size bin (relative to the best well-determined bin) is one point of the
curve; the latency-dominated rest refit α with the curve's bandwidth time subtracted. The
curve is kept only where the residuals show it: an F-test of the curve's extra points against
the plain α–β fit (nested least-squares models; e.g. Draper & Smith, Applied Regression
Analysis, sec. 6) at significance CURVE_SIGNIFICANCE, or where the plain fit is biased at the
sizes its bandwidth term dominates (share >= BEST_SHARE): a one-sample t-test of their mean
relative residual against 0 at BIAS_SIGNIFICANCE, for the network only (one operation swept
over sizes: a size bin's median is a size effect; a compute fit's FLOP bins hold different
kinds of layers, and keeping their curve fitted a 0.09-0.92 zigzag that left held-out DDP
steps no better, tests/test_calibrate.py). The second test is there because noisy
small sizes can hide a real curve from the F-test: on gloo over loopback the 2-rank sweeps of
five calibrations (2026-12-03) had the plain line over-predict one-way 8-16 MiB messages by
19-45 % and under-predict 1 MiB ones up to 3x (mean residual of the bandwidth-dominated
points -25 to -32 %, t-test p = 0.005-0.019), every time, while the bimodal sub-100 KiB
latencies (0.35-4 ms) kept the F-test from keeping the curve. A third test, for the network
too, sees what the bias test cannot: a residual that drifts with size (too slow at one end,
too fast at the other) and averages near 0, the slope of the bandwidth-dominated points'
relative residual against log10(size) at BIAS_SIGNIFICANCE (`_trending`, one parameter, so
the knots do not drown it as they drown the F-test): the 2-rank gloo all-reduces of reports
24-27's set A took 1.9-2.6x the line at 256 KiB-1 MiB and 0.84-0.91x at 4-16 MiB (slope
p <= 0.0003). Otherwise the plain fit stands, with efficiency 1 at every size and its
(possibly large) residuals reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats

from perfmodel.errors import PerfmodelError

MAX_ITERATIONS = 200         # alternating α / efficiency-curve passes before giving up
CONVERGED_REL = 1e-7         # a pass changing α and every curve point by less has converged
CURVE_SIGNIFICANCE = 0.01    # keep the curve if noise alone would explain its gain this rarely
BIAS_SIGNIFICANCE = 0.05     # ...or the plain fit's bias where bandwidth dominates this rarely:
                             # looser, as a wrongly kept curve costs about the noise (its
                             # points are measured medians), a wrongly dropped one a bias
BEST_SHARE = 0.5             # the best rate comes from sizes where bandwidth is >= half the time
ZERO_SIGMAS = 2.0            # a negative α within this many standard errors of 0 is taken as 0


@dataclass(frozen=True, kw_only=True, slots=True)
class FitResult:
    """One fitted parameter, in the unit its name carries, with the residuals of its model."""

    parameter: str          # profile field it feeds, e.g. "intra_node.latency_us"
    value: float
    stderr: float           # standard error of `value` from the least-squares covariance
    rms_rel: float          # RMS of (model − measured) / measured over the points fitted
    max_rel: float          # largest |model − measured| / measured
    points: int             # measurements the fit used


@dataclass(frozen=True, kw_only=True, slots=True)
class Residual:
    """Relative residuals (model − measured) / measured of one group of points."""

    bias_rel: float         # mean: > 0 means the model is slower than measured
    rms_rel: float
    max_rel: float
    points: int

    @classmethod
    def of(cls, rel: np.ndarray) -> Residual:
        rel = np.asarray(rel, dtype=float)
        return cls(bias_rel=float(rel.mean()), rms_rel=float(np.sqrt(np.mean(rel**2))),
                   max_rel=float(np.max(np.abs(rel))), points=int(rel.size))


def fit_result(parameter: str, value: float, stderr: float, rel: np.ndarray) -> FitResult:
    r = Residual.of(rel)
    return FitResult(parameter=parameter, value=float(value), stderr=float(stderr),
                     rms_rel=r.rms_rel, max_rel=r.max_rel, points=r.points)


def check_measurements(values: Sequence[float], what: str, *, positive: bool = True) -> np.ndarray:
    """The values as an array, refusing NaN, infinities and (if `positive`) values <= 0."""
    a = np.asarray(values, dtype=float)
    bad = ~np.isfinite(a) | ((a <= 0) if positive else (a < 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        bound = "> 0" if positive else ">= 0"
        raise PerfmodelError(f"{what}[{i}] = {a[i]!r} is not a finite number {bound}; "
                             f"fix or remove that measurement")
    return a


@dataclass(frozen=True, slots=True)
class LinearFit:
    coef: np.ndarray
    stderr: np.ndarray
    rel: np.ndarray          # (model − measured) / measured


def relative_lstsq(design: np.ndarray, times: np.ndarray, known: np.ndarray | None = None,
                   zero_ok: Sequence[int] = ()) -> LinearFit:
    """Least squares of times ≈ known + design @ coef, minimising the relative error.

    A coefficient listed in `zero_ok` (a latency, an overhead) that comes out negative but
    within ZERO_SIGMAS standard errors of zero is too small to resolve: it is fixed at 0 and
    the others refitted. Standard errors come from s²(AᵀA)⁻¹ of the weighted problem.
    """
    known = np.zeros_like(times) if known is None else known
    a = design / times[:, None]
    b = (times - known) / times
    free = np.ones(design.shape[1], dtype=bool)
    for _ in range(design.shape[1] + 1):      # + 1: the refit after the last one is fixed
        coef, stderr = _solve(a, b, free)
        small = [j for j in zero_ok if free[j] and coef[j] < 0 <= coef[j] + ZERO_SIGMAS * stderr[j]]
        if not small:
            break
        free[small] = False
    rel = (known + design @ coef - times) / times
    return LinearFit(coef=coef, stderr=stderr, rel=rel)


def _solve(a: np.ndarray, b: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coef, stderr = np.zeros(a.shape[1]), np.zeros(a.shape[1])
    af = a[:, free]
    sol, *_ = np.linalg.lstsq(af, b, rcond=None)
    dof = max(a.shape[0] - af.shape[1], 1)
    s2 = float(np.sum((af @ sol - b) ** 2)) / dof
    cov = s2 * np.linalg.pinv(af.T @ af)
    coef[free], stderr[free] = sol, np.sqrt(np.maximum(np.diag(cov), 0.0))
    return coef, stderr


@dataclass(frozen=True, slots=True)
class CurveFit:
    """Result of `fit_latency_rate`: α, the best rate and the efficiency relative to it."""

    latency: float                  # α, seconds per step
    latency_stderr: float
    rate: float                     # volume units per second where the efficiency is 1
    rate_stderr: float
    curve: tuple[tuple[float, float], ...]   # [size, efficiency relative to `rate`], max 1
    rel: np.ndarray                 # relative residuals of the final model
    curve_kept: bool


def fit_latency_rate(steps: np.ndarray, volume: np.ndarray, size: np.ndarray, times: np.ndarray,
                     known: np.ndarray | None = None, *, names: tuple[str, str], what: str,
                     bin_decades: float = 0.05, min_share: float = 0.1,
                     bias_test: bool = False) -> CurveFit:
    """Fit t = known + α·steps + volume / (rate · e(size)) in relative error.

    `names` are the parameters (α's, rate's) for error messages, `what` describes the data.
    First the plain α–β fit (e = 1). Then the points whose bandwidth term is at least
    `min_share` of their time under that fit shape the efficiency curve: each gives the rate
    volume / (t − known − α·steps), and the median per size bin (`bin_decades` wide in
    log10(size)) is one point of the curve, relative to the best bin. The other points, where
    latency dominates, refit α with that curve's bandwidth time subtracted; the two steps
    alternate until neither changes. Where no point is latency-dominated, α and a rising
    efficiency cannot be told apart (both add time at small sizes): α is then the plain fit's,
    lowered if needed so that no size runs faster than the best rate; the times still fit.
    `bias_test`: also keep the curve where the plain fit is biased at bandwidth-dominated
    sizes (module docstring); for sweeps of one operation over sizes (the network), where a
    size bin's median is a size effect, not for compute units, whose FLOP bins hold
    different kinds of layers.
    """
    known = np.zeros_like(times) if known is None else known
    plain = _alpha_beta(steps, volume, times, known, names, what)
    alpha, beta = plain.coef
    # the bandwidth term's share of each point's time *under the plain model*: a property of
    # the point's size and op, not of its noise
    bandwidth_s = volume * beta
    share = bandwidth_s / (known + alpha * steps + bandwidth_s)
    if share.max() < min_share:
        raise PerfmodelError(
            f"{names[1]}: the bandwidth term is under {min_share:.0%} of every time in {what}; "
            f"measure larger sizes so that the rate can be fitted")
    flat = _curve_fit(plain.coef, plain.stderr, plain.rel, ((float(size.min()), 1.0),), False)
    # The points that shape the curve are chosen once: letting a point near `min_share` move
    # in and out between passes can make the alternation cycle instead of converge.
    on_curve = share >= min_share
    latency_points = ~on_curve & (steps > 0)
    alpha_se, knots = plain.stderr[0], None
    for _ in range(MAX_ITERATIONS):
        rate, new_knots = _rate_knots(alpha, steps, volume, size, times, known, share,
                                      on_curve, bin_decades, names)
        if not latency_points.any():
            # α cannot be told from a rising efficiency here; take the largest α under which
            # no size runs faster than the best rate (every efficiency <= 1)
            alpha = _largest_alpha(alpha, rate, steps, volume, size, times, known, on_curve,
                                   bin_decades)
            knots = new_knots
            break
        lat = _refit_alpha(alpha_from=latency_points, rate=rate, knots=new_knots, steps=steps,
                           volume=volume, size=size, times=times, known=known)
        if lat.coef[0] < 0:
            # the curve leaves the small sizes less time than they took: the ops or sizes
            # disagree with one α–β model; keep the plain α and let the residuals say so
            alpha, alpha_se, knots = plain.coef[0], plain.stderr[0], new_knots
            break
        done = (knots is not None and _same_curve(new_knots, knots)
                and abs(lat.coef[0] - alpha) <= CONVERGED_REL * max(alpha, 1e-300))
        alpha, alpha_se, knots = lat.coef[0], lat.stderr[0], new_knots
        if done:
            break
    else:
        raise PerfmodelError(f"{names[1]}: the efficiency-curve fit did not converge in "
                             f"{MAX_ITERATIONS} passes over {what}; the measurements are too "
                             f"noisy or do not follow the α–β model")
    rate, knots = _rate_knots(alpha, steps, volume, size, times, known, share, on_curve,
                              bin_decades, names)
    model = known + alpha * steps + volume / (rate * _interp(knots, size))
    rel = (model - times) / times
    bandwidth_bound = share >= BEST_SHARE
    if not (_curve_significant(plain.rel, rel, extra=len(knots) - 1)
            or (bias_test and (_biased(plain.rel[bandwidth_bound])
                               or _trending(plain.rel[bandwidth_bound],
                                            size[bandwidth_bound])))):
        return flat
    # the rate's standard error is taken from the plain fit's relative error of β
    coef = np.array([alpha, 1.0 / rate])
    stderr = np.array([alpha_se, plain.stderr[1] / beta / rate])
    return _curve_fit(coef, stderr, rel, knots, True)


def _alpha_beta(steps, volume, times, known, names, what) -> LinearFit:
    """The plain α–β fit, efficiency 1 at every size."""
    fit = relative_lstsq(np.column_stack([steps, volume]), times, known, zero_ok=(0,))
    alpha, beta = fit.coef
    if beta <= 0:
        raise PerfmodelError(f"{names[1]}: the fit gives a non-positive rate (β = {beta:.3g}) "
                             f"from {what}; the times do not grow with size")
    _check_alpha(fit, names, what)
    return fit


def _check_alpha(fit: LinearFit, names, what) -> None:
    if fit.coef[0] < 0:
        raise PerfmodelError(f"{names[0]}: the fit gives a negative value ({fit.coef[0]:.3g} s, "
                             f"± {fit.stderr[0]:.2g}) from {what}; the α–β model does not fit "
                             f"these times (measure smaller sizes, or check for outliers)")


def _refit_alpha(*, alpha_from, rate, knots, steps, volume, size, times, known) -> LinearFit:
    """α from the latency-dominated points, their (small) bandwidth time taken as known."""
    sel = alpha_from
    bandwidth_s = volume[sel] / (rate * _interp(knots, size[sel]))
    return relative_lstsq(steps[sel, None], times[sel], known[sel] + bandwidth_s, zero_ok=(0,))


def _rate_knots(alpha, steps, volume, size, times, known, share, on_curve, bin_decades, names):
    """The best rate and one [size, rate / best] point per size bin (median over the bin).

    The best rate is taken over the bins whose bandwidth share is at least BEST_SHARE, where
    the rate is well determined; a noisier bin that seems faster is capped at efficiency 1.
    """
    bw = times - known - alpha * steps
    # a point that α leaves no time for is "infinitely fast": it counts in its bin's median
    # (so the set of bins never changes between passes) and is capped at efficiency 1
    with np.errstate(divide="ignore"):
        r = np.where(bw[on_curve] > 0, volume[on_curve] / np.maximum(bw[on_curve], 1e-300),
                     np.inf)
    if not np.isfinite(r).any():
        raise PerfmodelError(f"{names[0]}: the fitted value leaves no time for the bandwidth "
                             f"term of any large size; the measurements do not follow the "
                             f"α–β model")
    logs = np.log10(size[on_curve])
    bins = np.round(logs / bin_decades)
    knots, shares = [], []
    for b in np.unique(bins):
        sel = bins == b
        knots.append((round_sig(10 ** logs[sel].mean(), 6), float(np.median(r[sel]))))
        shares.append(float(share[on_curve][sel].mean()))
    finite = [(r, sh) for (_, r), sh in zip(knots, shares, strict=True) if np.isfinite(r)]
    if not finite:
        raise PerfmodelError(f"{names[0]}: the fitted value leaves no time for the bandwidth "
                             f"term of most sizes; the measurements do not follow the α–β model")
    best = max([r for r, sh in finite if sh >= BEST_SHARE] or [r for r, _ in finite])
    return best, tuple((x, min(r / best, 1.0)) for x, r in knots)


def _largest_alpha(alpha, rate, steps, volume, size, times, known, on_curve, bin_decades):
    """min(α, the α at which the fastest size bin just reaches `rate`), at least 0."""
    sel = on_curve & (steps > 0)
    a = (times[sel] - known[sel] - volume[sel] / rate) / steps[sel]
    bins = np.round(np.log10(size[sel]) / bin_decades)
    per_bin = [float(np.median(a[bins == b])) for b in np.unique(bins)]
    return max(0.0, min([alpha, *per_bin]))


def _curve_significant(plain_rel: np.ndarray, curve_rel: np.ndarray, extra: int) -> bool:
    """F-test: does the curve's `extra` parameters cut the residual sum of squares by more
    than noise would? F = ((RSS₀ − RSS₁)/q) / (RSS₁/(m − 2 − q))."""
    m = plain_rel.size
    dof = m - 2 - extra
    if extra < 1 or dof < 1:
        return False
    rss0, rss1 = float(np.sum(plain_rel**2)), float(np.sum(curve_rel**2))
    if rss1 >= rss0:
        return False
    if rss1 == 0.0:
        return True
    f = ((rss0 - rss1) / extra) / (rss1 / dof)
    return float(scipy.stats.f.sf(f, extra, dof)) < CURVE_SIGNIFICANCE


def _biased(rel: np.ndarray) -> bool:
    """t-test: is the mean of these relative residuals non-zero at BIAS_SIGNIFICANCE?"""
    if rel.size < 3 or float(np.std(rel)) == 0.0:
        return False
    return float(scipy.stats.ttest_1samp(rel, 0.0).pvalue) < BIAS_SIGNIFICANCE


def _trending(rel: np.ndarray, size: np.ndarray) -> bool:
    """Does the relative residual drift with log(size), a straight line's slope non-zero at
    BIAS_SIGNIFICANCE (scipy.stats.linregress)? An efficiency that changes with size leaves
    the plain fit too slow at one end and too fast at the other, a mean near 0 that
    _biased cannot see; one parameter, so it is not drowned by a knot per size as the
    F-test is."""
    x = np.log10(size)
    if rel.size < 4 or np.ptp(x) == 0.0 or float(np.std(rel)) == 0.0:
        return False
    return float(scipy.stats.linregress(x, rel).pvalue) < BIAS_SIGNIFICANCE


def _interp(knots, size: np.ndarray) -> np.ndarray:
    """cluster.interpolate_log, vectorised: linear in log10(size), flat beyond the ends."""
    xs = np.log10([x for x, _ in knots])
    ys = np.array([e for _, e in knots])
    return np.interp(np.log10(size), xs, ys)


def _same_curve(a, b) -> bool:
    return len(a) == len(b) and all(
        abs(x0 - x1) <= CONVERGED_REL * x1 and abs(e0 - e1) <= CONVERGED_REL
        for (x0, e0), (x1, e1) in zip(a, b, strict=True))


def _curve_fit(coef, stderr, rel, knots, kept: bool) -> CurveFit:
    alpha, beta = coef
    return CurveFit(latency=float(alpha), latency_stderr=float(stderr[0]),
                    rate=float(1.0 / beta), rate_stderr=float(stderr[1] / beta**2),
                    curve=tuple((x, round_sig(e, 4)) for x, e in knots), rel=rel,
                    curve_kept=kept)


def round_sig(x: float, digits: int) -> float:
    """`x` to `digits` significant digits, so a profile shows 0.6063 rather than 0.60633704966."""
    return float(f"{x:.{digits}g}")


def fit_rate(volume: Sequence[float], seconds: Sequence[float], *, parameter: str,
             what: str, unit_scale: float = 1.0) -> FitResult:
    """Rate through the origin, seconds = volume / rate, in relative error.

    Minimising Σ(volume·x/t − 1)² over x = 1/rate gives x = Σ(v/t) / Σ(v/t)².
    `unit_scale` divides the rate for the reported unit (1e9 for GB/s).
    """
    v = check_measurements(volume, f"{what}: volume")
    t = check_measurements(seconds, f"{what}: seconds")
    if v.size < 2:
        raise PerfmodelError(f"{parameter}: need at least 2 timings in {what}, found {v.size}")
    fit = relative_lstsq(v[:, None], t)
    x = fit.coef[0]
    rate = 1.0 / x / unit_scale
    return fit_result(parameter, rate, fit.stderr[0] / x**2 / unit_scale, fit.rel)


def coefficient_of_variation(values: Sequence[float], *, parameter: str,
                             what: str) -> FitResult:
    """Sample CV (std with ddof=1 / mean), e.g. step-to-step jitter or run-to-run spread.

    Its standard error uses the normal-theory approximation cv/√(2(n−1)).
    """
    v = check_measurements(values, what)
    if v.size < 3:
        raise PerfmodelError(f"{parameter}: need at least 3 values in {what}, found {v.size}")
    cv = float(v.std(ddof=1) / v.mean())
    rel = (v.mean() - v) / v
    return fit_result(parameter, cv, cv / np.sqrt(2 * (v.size - 1)), rel)
