"""Fit compute under core sharing from whole-step timings with 1, 2 and 3 busy processes.

The model (perfmodel/cluster.py `ClusterProfile.compute_share`, docs/model.md "Compute under
core sharing"): b busy processes on c cores take

    s(b) = (1 + κ·(min(b, c) − 1)) · max(1, b/c)

times as long as one alone: processor sharing (each gets min(1, c/b) of a core) times
contention κ per further core in use (shared memory bandwidth and caches).

The two factors are measured apart (measure/runs/compute.py, concurrent mode: every rank
times the same steps at once and records wall and CPU seconds per step):

- κ from CPU time: a process waiting for a core spends no CPU time, so CPU seconds per step
  over the 1-process CPU seconds is the contention alone, 1 + κ·(min(b, c) − 1). Least
  squares through the origin in κ over every run with b >= 2; a busy host (other people's
  work) lengthens wall time but hardly CPU time, which is why CPU time is used.
- the sharing factor max(1, b/c) is theory, not fitted; `sharing_checks` compares the whole
  s(b) with the measured wall-time ratios, with the host's load recorded beside them.
- how noisy the time lost to sharing is (`fit_sharing_delay_cv`): s(b) is a mean. With more
  busy processes than cores a step either keeps a core or waits out another's time slice,
  so its extra time t·(s(b) − 1) varies from step to step about as much as it is long.
  compute.sharing_delay_cv is that delay's SD over its mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibration.fit import FitResult, check_measurements, fit_result
from perfmodel.cluster import MAX_SHARING_DELAY_CV
from perfmodel.errors import PerfmodelError

# the most spread delay calibration fits: CV = MAX_SHARING_DELAY_CV
MIN_ALPHA = (1 / MAX_SHARING_DELAY_CV**2 - 1) / 2
IQR_PER_SD = 1.3489795003921634   # a normal's interquartile range, in SDs
SHARING_CHECK_TOL = 0.15    # |model/measured − 1| of a wall-time ratio above which the
                            # check is flagged: 2x the ~5 % within-run spread of one-thread
                            # steps (DESIGN.md) on each of the two timings of the ratio


@dataclass(frozen=True, kw_only=True, slots=True)
class ConcurrentTiming:
    """One rank's median wall and CPU seconds per step, with `busy` processes running."""

    busy: int
    step_s: float
    cpu_s: float
    load1: float = float("nan")     # the host's 1-minute load average when it started
    step_iqr_s: float = float("nan")    # interquartile range of its wall seconds per step
    workload: str = ""


def _medians(timings: Sequence[ConcurrentTiming]) -> dict[int, tuple[float, float, float]]:
    """busy -> (median wall s, median CPU s, max load) over ranks and runs."""
    out = {}
    for b in sorted({t.busy for t in timings}):
        group = [t for t in timings if t.busy == b]
        out[b] = (float(np.median([t.step_s for t in group])),
                  float(np.median([t.cpu_s for t in group])),
                  float(np.nanmax([t.load1 for t in group] + [np.nan]))
                  if any(np.isfinite(t.load1) for t in group) else float("nan"))
    return out


def fit_core_contention(timings: Sequence[ConcurrentTiming], cores: int) -> FitResult:
    """compute.core_contention κ from CPU seconds per step (module docstring)."""
    if cores < 1:
        raise PerfmodelError(f"the host's cores must be >= 1, got {cores}")
    check_measurements([t.step_s for t in timings], "concurrent step seconds")
    check_measurements([t.cpu_s for t in timings], "concurrent CPU seconds")
    med = _medians(timings)
    if 1 not in med or not any(b >= 2 for b in med):
        raise PerfmodelError(
            f"compute.core_contention: need concurrent compute timings with 1 busy process "
            f"and with >= 2, found {', '.join(map(str, sorted(med))) or 'none'} "
            f"(`perfmodel calibrate` measures 1, 2 and 3)")
    cpu1 = med[1][1]
    xs, ys = [], []
    for b, (_, cpu, _) in med.items():
        if b >= 2 and min(b, cores) > 1:
            xs.append(min(b, cores) - 1.0)
            ys.append(cpu / cpu1 - 1.0)
    if not xs:
        raise PerfmodelError(f"compute.core_contention: with {cores} core(s) no run has two "
                             f"processes on separate cores; contention cannot be measured")
    x, y = np.array(xs), np.array(ys)
    kappa = float((x @ y) / (x @ x))
    resid = y - kappa * x
    stderr = float(np.sqrt((resid @ resid) / max(x.size - 1, 1) / (x @ x))) if x.size > 1 \
        else float("nan")
    kappa = max(kappa, 0.0)       # a faster process beside a busy core is noise, not physics
    rel = (1 + kappa * x) / (1 + y) - 1
    return fit_result("compute.core_contention", kappa, stderr, rel)


def sharing_checks(timings: Sequence[ConcurrentTiming], cores: int,
                   contention: float) -> dict[str, dict[str, float]]:
    """Model s(b) against the measured wall-time ratio t(b)/t(1), per b >= 2, with the load."""
    med = _medians(timings)
    if 1 not in med:
        return {}
    wall1 = med[1][0]
    checks = {}
    for b, (wall, _, load) in med.items():
        if b < 2:
            continue
        model = (1 + contention * (min(b, cores) - 1)) * max(1.0, b / cores)
        measured = wall / wall1
        checks[f"compute_share.busy{b}"] = {"model": model, "measured": measured,
                                            "rel": model / measured - 1,
                                            "tolerance": SHARING_CHECK_TOL} \
            | ({"load1": load} if np.isfinite(load) else {})
    return checks


def fit_timed_wait_spread(series: Sequence[Sequence[float]]) -> FitResult:
    """compute.timed_wait_spread_ms: how far a timed-wait worker's step strays from its
    usual length on a crowded host, in ms. `series`: each worker's timed compute seconds a
    step (warm-up left out) in runs whose processes outnumber the cores. Each step less its
    worker's median, pooled over the workers, and the standard deviation a normal with that
    interquartile range has (IQR / 1.349): robust to the odd step that waits a whole time
    slice. In ms, not relative: a sleep ends when the scheduler gives the worker a core
    back, a delay that does not grow with the sleep (this host, 2026-12-05: waits of ~38 ms
    in the calibration's run strayed by an IQR of 3-6 ms, the held-out runs' waits of
    ~16 ms by 4-7 ms); measure/timed_wait.py pays oversleep back from the next sleeps, so
    the mean holds. Residuals: each worker's own spread against the pooled one."""
    kept = [check_measurements(x, "timed-wait step seconds") for x in series if len(x) >= 4]
    if len(kept) < 2:
        raise PerfmodelError(
            f"compute.timed_wait_spread_ms: need >= 2 workers with >= 4 timed steps each of "
            f"a crowded timed-wait run, found {len(kept)} (`perfmodel calibrate` runs "
            f"ps-crowded on CPU hosts)")
    pooled = np.concatenate([x - np.median(x) for x in kept])
    spread_ms = _robust_sd(pooled) * 1e3
    own = np.array([_robust_sd(x) * 1e3 for x in kept])
    stderr = 1.2533 * float(np.std(own, ddof=1)) / np.sqrt(own.size)
    return fit_result("compute.timed_wait_spread_ms", spread_ms, stderr,
                      spread_ms / np.maximum(own, 1e-6) - 1)


def fit_sharing_delay_cv(timings: Sequence[ConcurrentTiming], cores: int,
                         contention: float) -> FitResult:
    """compute.sharing_delay_cv: the coefficient of variation of the time a step loses to
    core sharing, as twice a symmetric beta variable (perfmodel/sim/ps.py draws it so).

    For each rank of a run with more busy processes b than cores c: the robust SD of its
    steps (IQR / 1.349: one run's step records keep only the median and the IQR) over the
    mean delay the model gives it, t1·(s(b) − 1), with t1 its workload's median step alone
    and s(b) `ClusterProfile.compute_share` with the fitted contention. The median of those
    ratios over ranks and runs is matched by a delay of mean 1 with that IQR / 1.349
    (`delay_cv_for_robust_sd`), whose CV is the result. On this host (sets A of reports
    31-40, 18 ranks each) the ratio was 0.73-1.27 by report, median ~0.9, alike for
    cnn-small, the mlp and transformer-small: a CV of ~0.65, a step's wait spread from none
    to twice its mean. Residuals: each rank's own ratio against the median."""
    if cores < 1:
        raise PerfmodelError(f"the host's cores must be >= 1, got {cores}")
    solo: dict[str, list[float]] = {}
    for t in timings:
        if t.busy == 1:
            solo.setdefault(t.workload, []).append(t.step_s)
    ratios = []
    for t in timings:
        if t.busy <= cores or t.workload not in solo or not np.isfinite(t.step_iqr_s):
            continue
        share = (1 + contention * (min(t.busy, cores) - 1)) * t.busy / cores
        delay_s = float(np.median(solo[t.workload])) * (share - 1)
        if delay_s > 0:
            ratios.append(t.step_iqr_s / IQR_PER_SD / delay_s)
    if len(ratios) < 2:
        raise PerfmodelError(
            f"compute.sharing_delay_cv: need >= 2 ranks of concurrent compute runs with more "
            f"busy processes than the {cores} cores, each with its workload timed alone, "
            f"found {len(ratios)} (`perfmodel calibrate` measures 1, 2 and 3)")
    r = np.array(ratios)
    ratio = float(np.median(r))
    cv = delay_cv_for_robust_sd(ratio)
    stderr_ratio = 1.2533 * float(np.std(r, ddof=1)) / np.sqrt(r.size)
    # the CV's standard error through the mapping's local slope
    step = max(stderr_ratio, 1e-6)
    slope = (delay_cv_for_robust_sd(ratio + step) - delay_cv_for_robust_sd(
        max(ratio - step, 1e-6))) / (ratio + step - max(ratio - step, 1e-6))
    return fit_result("compute.sharing_delay_cv", cv, abs(slope) * stderr_ratio,
                      ratio / np.maximum(r, 1e-9) - 1)


def delay_cv_for_robust_sd(ratio: float) -> float:
    """The CV of d = 2·Beta(α, α) (mean 1, between 0 and 2: a step waits for a core from
    not at all to twice the mean) whose IQR / 1.349 is `ratio`, by bisection over α. The
    family reaches every ratio seen: from near 0 (α large: every step waits its mean) past
    0.74 (α = 1: uniform) to 1.48 (α → 0: a step waits twice the mean or not at all); a
    gamma or lognormal delay of mean 1 cannot pass 0.91 or 0.66. CV = 1/√(2α + 1)."""
    from scipy.special import betaincinv

    def robust(alpha: float) -> float:
        q1, q3 = betaincinv(alpha, alpha, 0.25), betaincinv(alpha, alpha, 0.75)
        return 2 * float(q3 - q1) / IQR_PER_SD

    lo, hi = np.log(MIN_ALPHA), np.log(1e4)      # robust() falls as α grows
    for _ in range(100):
        mid = (lo + hi) / 2
        if robust(float(np.exp(mid))) > ratio:
            lo = mid
        else:
            hi = mid
    return float(1 / np.sqrt(2 * np.exp((lo + hi) / 2) + 1))


def _robust_sd(x: np.ndarray) -> float:
    """The standard deviation of a normal with the interquartile range of `x`."""
    q1, q3 = np.percentile(x, [25, 75])
    return float(q3 - q1) / IQR_PER_SD


def fit_whole_step_factor(step_s: Sequence[float], passes_s: Sequence[float]) -> FitResult:
    """compute.whole_step_factor f: whole steps of one process alone (zero the gradients,
    forward, loss, backward: measure/runs/compute.py `run_concurrent` with 1 process) over
    the compute profile's forward and backward passes summed unit by unit at that batch; f is
    the median ratio. The unit timings the compute fit uses time each unit's passes apart,
    so they leave out what joins them into a step (the loss, autograd across units, the
    Python between them, caches the whole model shares): on this 2-core host cnn-small's
    whole steps took 1.31-1.43x the sum in three calibrations (2026-12-03), and the
    calibration's 1-worker PS check measured the worker's compute 28-50 % over the model
    without the factor in every calibration that day (24 % with it, in the last).
    """
    steps = check_measurements(step_s, "whole-step seconds")
    passes = check_measurements(passes_s, "modelled pass seconds")
    if steps.size != passes.size or steps.size < 2:
        raise PerfmodelError(f"compute.whole_step_factor: need >= 2 whole-step timings of one "
                             f"process alone with their modelled passes, found {steps.size}")
    ratio = steps / passes
    f, stderr = median_ratio(ratio)
    return fit_result("compute.whole_step_factor", f, stderr, f / ratio - 1)


def median_ratio(ratio: np.ndarray) -> tuple[float, float]:
    """(median, its standard error) of per-run ratios: the standard error of a median of n
    normal points, 1.2533 σ / √n; 0 for a single ratio."""
    if ratio.size < 2:
        return float(np.median(ratio)), 0.0
    return (float(np.median(ratio)),
            1.2533 * float(np.std(ratio, ddof=1)) / np.sqrt(ratio.size))


def fit_ddp_cpu_work_factor(measured_s: Sequence[float], modelled_s: Sequence[float]
                            ) -> FitResult:
    """compute.ddp_cpu_work_factor: the CPU work a crowded DDP timed wait's node really did a
    step (`measured_s`, core-seconds: every rank's process CPU, gloo's threads and the
    training thread, measure/cpu_meter.py) over what the model's crowded-node floor counts
    for the same run (`modelled_s`, perfmodel/sim/cores.py `node_cpu_work_s`: the crowded
    sweeps' all-reduces on the share of the cores they keep busy, and the reducer's passes
    at the fitted copy rate), one pair per run: the median ratio (`fit_run_ratio`)."""
    return fit_run_ratio("compute.ddp_cpu_work_factor", measured_s, modelled_s,
                         measured="a crowded DDP run's CPU seconds a step",
                         reference="the model's CPU seconds a step",
                         hint="`perfmodel calibrate` runs ddp-crowded on CPU hosts")


def fit_run_ratio(parameter: str, measured_s: Sequence[float], reference_s: Sequence[float],
                  *, measured: str, reference: str, hint: str) -> FitResult:
    """`parameter` as the median over runs of each run's measured / reference value, one
    pair per run; its standard error (`median_ratio`); residuals: each run's own ratio
    against it. A refusal names what was given and `hint`, what measures it."""
    got = check_measurements(measured_s, measured)
    ref = check_measurements(reference_s, reference)
    if got.size != ref.size or got.size < 1:
        raise PerfmodelError(f"{parameter}: need one reference value per measured run and >= 1 "
                             f"run, got {got.size} measured and {ref.size} reference ({hint})")
    ratio = got / ref
    value, stderr = median_ratio(ratio)
    return fit_result(parameter, value, stderr, ratio / value - 1)
