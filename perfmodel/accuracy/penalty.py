"""The study's accuracy penalty of asynchronous PS, read the two ways a practitioner reads it.

The study reports async PS costing 4–17 % accuracy against synchronous PS (DESIGN.md). Two
readings of "costs", at the budget of U asynchronous updates (one worker's batch b each):

- **same epochs**: both have seen the same samples, U·b. Synchronous PS after U updates'
  worth of samples against async after U updates:
  P_epochs = acc_sync(U) − acc_async(U).
- **same wall-clock time**: async PS does r = X_async / X_sync times the samples per second of
  synchronous PS on the same cluster (the simulator's throughput ratio, `perfmodel predict`),
  so in the time async makes U updates synchronous PS makes U / r:
  P_time = acc_sync(U / r) − acc_async(U).
  r > 1 helps async: P_time ≤ P_epochs whenever the synchronous curve rises.

With the fitted curve of perfmodel/accuracy/model.py: acc_async(U) = curve(U · worth) (worth =
mean (lr_i/α₀)^κ / (1 + β·τ_i)), or chance when the instability index crosses the fitted
threshold (an unstable run's accuracy is not predictable; the penalty shown is to chance);
acc_sync(u) = curve(u · e), where e = 1 counts a synchronous step of N batches as N updates
(linear scaling, as the harness's synchronous runs of batch b do) and e =
model.batch_efficiency counts it with the measured gradient noise scale (McCandlish et al.
2018), as `perfmodel predict` does.

`observed_penalties` reads the same two numbers off recorded harness runs: the synchronous
runs' mean accuracy curve (interpolated between its evaluations) at U and U / r, against the
mean over the async runs' seeds of their accuracy at U.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.accuracy.model import (
    AccuracyModel,
    Setting,
    batch_efficiency,
    check_mitigation,
    check_staleness,
    instability,
    mean_worth,
)
from perfmodel.errors import PerfmodelError


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyPenalty:
    """async PS against sync PS at U async updates: same epochs and same wall-clock time."""

    workload: str
    setting: str                    # "momentum lr 0.05"
    mitigation: str                 # none, staleness-aware, dc
    workers: int
    mean_staleness: float
    throughput_ratio: float         # r = X_async / X_sync, samples per second
    budget_updates: int             # U
    worth: float                    # synchronous updates per async update (staleness only)
    sync_efficiency: float          # e: what one batch of a synchronous step is worth
    unstable: bool                  # the instability index crosses the fitted threshold
    chance_accuracy: float
    sync_accuracy_same_epochs: float    # acc_sync(U)
    sync_accuracy_same_time: float      # acc_sync(U / r)
    async_accuracy: float               # acc_async(U); chance when unstable

    @property
    def same_epochs_points(self) -> float:
        return 100.0 * (self.sync_accuracy_same_epochs - self.async_accuracy)

    @property
    def same_time_points(self) -> float:
        return 100.0 * (self.sync_accuracy_same_time - self.async_accuracy)


def study_penalty(model: AccuracyModel, setting: Setting,
                  staleness: Sequence[int] | np.ndarray, *, throughput_ratio: float,
                  workers: int, mitigation: str = "none", updates: int | None = None,
                  noise_scaled: bool = False) -> StudyPenalty:
    """Both penalties of async PS with `staleness` (one τ per update) against synchronous PS
    over `workers`, from the fitted curve of `setting`; `noise_scaled` counts a synchronous
    step with the measured noise scale instead of linearly."""
    check_mitigation(mitigation)
    if not throughput_ratio > 0 or not np.isfinite(throughput_ratio):
        raise PerfmodelError(f"the throughput ratio must be positive, got {throughput_ratio}")
    if workers < 1:
        raise PerfmodelError(f"workers must be at least 1, got {workers}")
    taus = check_staleness(staleness)
    budget = setting.budget_updates if updates is None else int(updates)
    if budget < 1:
        raise PerfmodelError(f"the update budget must be at least 1, got {budget}")
    worth = mean_worth(taus, setting.beta[mitigation], setting.lr, mitigation,
                       setting.rate_exponent)
    efficiency = (batch_efficiency(setting.noise_scale_samples, model.batch_size, workers)
                  if noise_scaled else 1.0)
    shaky = instability(taus, setting.lr, setting.momentum, mitigation) \
        >= setting.instability_threshold
    curve = setting.curve
    return StudyPenalty(
        workload=model.workload, setting=setting.name, mitigation=mitigation, workers=workers,
        mean_staleness=float(taus.mean()), throughput_ratio=float(throughput_ratio),
        budget_updates=budget, worth=worth, sync_efficiency=efficiency, unstable=shaky,
        chance_accuracy=model.chance_accuracy,
        sync_accuracy_same_epochs=curve.accuracy(budget * efficiency),
        sync_accuracy_same_time=curve.accuracy(budget / throughput_ratio * efficiency),
        async_accuracy=model.chance_accuracy if shaky else curve.accuracy(budget * worth))


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservedPenalty:
    """The two penalties read off recorded runs (points; mean over the async seeds)."""

    same_epochs_points: float
    same_time_points: float
    seeds: int


def observed_penalties(sync_updates: Sequence[float], sync_accuracy: Sequence[float],
                       async_accuracy: Sequence[float], *, budget_updates: int,
                       throughput_ratio: float) -> ObservedPenalty:
    """`sync_updates`/`sync_accuracy`: the synchronous runs' mean accuracy at its evaluations
    (increasing updates, reaching the budget); `async_accuracy`: each async seed's accuracy
    at the budget. acc_sync(U / r) is interpolated linearly between evaluations; r < 1 would
    read the synchronous curve past the budget, which runs do not reach: refused."""
    u = np.asarray(sync_updates, dtype=float)
    acc = np.asarray(sync_accuracy, dtype=float)
    seeds = np.asarray(async_accuracy, dtype=float)
    if u.size == 0 or u.size != acc.size or seeds.size == 0:
        raise PerfmodelError("observed penalties need synchronous evaluations and async runs")
    if np.any(np.diff(u) <= 0) or u[-1] < budget_updates:
        raise PerfmodelError("synchronous evaluations must increase and reach the budget")
    if not throughput_ratio >= 1:
        raise PerfmodelError(f"observed same-time penalty needs r >= 1, got {throughput_ratio}")
    mean_async = float(seeds.mean())
    same_epochs, same_time = np.interp([budget_updates, budget_updates / throughput_ratio],
                                       u, acc)
    return ObservedPenalty(same_epochs_points=100.0 * (float(same_epochs) - mean_async),
                           same_time_points=100.0 * (float(same_time) - mean_async),
                           seeds=int(seeds.size))
