"""The accuracy cost of one staleness profile, and its time to a target accuracy.

`staleness_cost` applies the fitted model of perfmodel/accuracy/model.py to a prediction's
(or a measured run's) per-update staleness values:

- accuracy after a budget of U updates: curve(U · mean worth), or chance when the
  instability index crosses the fitted threshold (the run oscillates or diverges: its
  accuracy is then anywhere from chance to well below synchronous: none is promised); the
  penalty is the synchronous curve's accuracy at the same U minus that, in accuracy points
  (percent of the test set);
- time to a target accuracy: the synchronous curve's updates to the target, divided by the
  mean worth of an update, times batch / throughput seconds per update. An update is one
  worker's batch (PS); a synchronous step of N workers is N updates, each worth
  model.batch_efficiency of one (the critical batch size, McCandlish et al. 2018). Its
  range: the curve read at the target ± the seed spread of synchronous accuracy (independent
  noise, not the fit's error).

`for_prediction` reads the strategy and its options off a perfmodel.predict.Prediction and
finds the workload's accuracy model (perfmodel/accuracy/lookup.py); where none applies it
returns a StalenessRisk: the staleness and a risk flag, no accuracy and no time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.accuracy.lookup import accuracy_model_for, no_model_line
from perfmodel.accuracy.model import (
    AccuracyModel,
    batch_efficiency,
    check_mitigation,
    check_staleness,
    instability,
    load_accuracy_model,
    mean_worth,
)
from perfmodel.errors import PerfmodelError
from perfmodel.stats import quantile

NEAR_FRACTION = 0.8     # risk is "near" from this fraction of the instability threshold up


@dataclass(frozen=True, kw_only=True, slots=True)
class StalenessCost:
    """What a staleness profile costs, against synchronous training on the same updates."""

    workload: str                   # the workload the model was fitted on (mlp)
    data_set: str                   # and its data (digits)
    caveat: str
    setting: str                    # optimizer and learning rate, e.g. "momentum lr 0.05"
    mitigation: str                 # none, staleness-aware, dc
    mean_staleness: float
    updates: int                    # the budget U (updates of one worker's batch)
    worth: float                    # synchronous one-batch updates per update: staleness
    #                                 worth mean 1/(1 + β·τ) x batch efficiency
    batch_efficiency: float         # (b + B_noise)/(N·b + B_noise); 1 when not synchronous
    sync_workers: int               # batches averaged per synchronous step (1: PS updates)
    noise_scale_samples: float | None
    sync_accuracy: float            # synchronous accuracy after U updates
    accuracy: float                 # predicted accuracy after U updates
    band: float                     # ± half-width of the accuracy band
    instability: float              # mean(τ·lr)/(1 − momentum)
    divergence_threshold: float
    divergence_risk: str            # low, near, unstable (oscillates or diverges)
    target_accuracy: float
    sync_updates_to_target: float   # inf when the synchronous plateau is below the target
    updates_to_target: float        # with staleness; inf when unstable or never gets there
    time_to_target_s: float | None  # None without a throughput; inf when never
    time_range_s: tuple[float, float] | None = None   # at target ∓ the seed spread

    @property
    def penalty_points(self) -> float:
        return 100.0 * (self.sync_accuracy - self.accuracy)

    @property
    def penalty_relative(self) -> float:
        return (self.sync_accuracy - self.accuracy) / self.sync_accuracy

    def to_json(self) -> dict[str, Any]:
        def num(v: float | None) -> float | str | None:
            return v if v is None or math.isfinite(v) else "inf"

        return {
            "model": f"{self.workload} on {self.data_set}", "caveat": self.caveat,
            "setting": self.setting, "mitigation": self.mitigation,
            "mean_staleness": self.mean_staleness, "budget_updates": self.updates,
            "update_worth": self.worth, "batch_efficiency": self.batch_efficiency,
            "sync_workers": self.sync_workers, "noise_scale_samples": self.noise_scale_samples,
            "sync_accuracy": self.sync_accuracy,
            "accuracy": self.accuracy, "accuracy_band": self.band,
            "penalty_points": self.penalty_points, "penalty_relative": self.penalty_relative,
            "instability": self.instability,
            "divergence_threshold": self.divergence_threshold,
            "divergence_risk": self.divergence_risk,
            "target_accuracy": self.target_accuracy,
            "sync_updates_to_target": num(self.sync_updates_to_target),
            "updates_to_target": num(self.updates_to_target),
            "time_to_target_s": num(self.time_to_target_s),
            "time_to_target_range_s": None if self.time_range_s is None
            else [num(t) for t in self.time_range_s],
        }


def staleness_cost(staleness: Sequence[int] | np.ndarray, *, mitigation: str = "none",
                   updates: int | None = None, target_accuracy: float | None = None,
                   optimizer: str | None = None, lr: float | None = None,
                   samples_per_s: float | None = None, batch_size: int | None = None,
                   model: AccuracyModel | None = None, sync_workers: int = 1) -> StalenessCost:
    """The cost of `staleness` (one τ per update) under `mitigation`.

    Without `optimizer`/`lr` the fitted workload's own are used; `samples_per_s` and
    `batch_size` (samples per update) give the time to the target; `sync_workers` > 1 is a
    synchronous step averaging that many batches (worth model.batch_efficiency each).
    """
    check_mitigation(mitigation)
    model = load_accuracy_model() if model is None else model
    setting = model.setting(optimizer, lr)
    taus = check_staleness(staleness)
    budget = setting.budget_updates if updates is None else int(updates)
    if budget < 1:
        raise PerfmodelError(f"the update budget must be at least 1, got {budget}")
    target = model.target_accuracy if target_accuracy is None else float(target_accuracy)
    if not 0 < target < 1:
        raise PerfmodelError(f"the target accuracy must lie between 0 and 1, got {target}")
    curve = setting.curve
    efficiency = batch_efficiency(setting.noise_scale_samples,
                                  batch_size or model.batch_size, sync_workers)
    worth = efficiency * mean_worth(taus, setting.beta[mitigation], setting.lr, mitigation,
                                    setting.rate_exponent)
    x = instability(taus, setting.lr, setting.momentum, mitigation)
    threshold = setting.instability_threshold
    diverges = x >= threshold
    risk = "unstable" if diverges else "near" if x >= NEAR_FRACTION * threshold else "low"
    sync_to_target = curve.updates_to(target)
    to_target = math.inf if diverges else sync_to_target / worth
    time_s, time_range = None, None
    if samples_per_s is not None:
        if batch_size is None or batch_size < 1 or not samples_per_s > 0:
            raise PerfmodelError("time to target needs a positive throughput and batch size")
        per_update_s = batch_size / samples_per_s
        time_s = to_target * per_update_s
        if not diverges:
            time_range = tuple(curve.updates_to(min(max(target + d, 0.0), 1.0)) / worth
                               * per_update_s for d in (-setting.seed_sd, setting.seed_sd))
    return StalenessCost(
        workload=model.workload, data_set=model.data_set, caveat=model.caveat,
        setting=setting.name, mitigation=mitigation, mean_staleness=float(taus.mean()),
        updates=budget, worth=worth, batch_efficiency=efficiency, sync_workers=sync_workers,
        noise_scale_samples=setting.noise_scale_samples, sync_accuracy=curve.accuracy(budget),
        accuracy=model.chance_accuracy if diverges else curve.accuracy(budget * worth),
        band=setting.band, instability=x, divergence_threshold=threshold,
        divergence_risk=risk, target_accuracy=target, sync_updates_to_target=sync_to_target,
        updates_to_target=to_target, time_to_target_s=time_s, time_range_s=time_range)


@dataclass(frozen=True, kw_only=True, slots=True)
class StalenessRisk:
    """Where no accuracy model applies: the staleness and a flag, no accuracy, no time."""

    workload: str
    mean_staleness: float
    p95_staleness: float
    max_staleness: float
    divergence_risk: str            # "none" (synchronous) or "unknown" (stale, not costed)
    note: str                       # no_model_line: why, and how to fit a model

    def to_json(self) -> dict[str, Any]:
        return {"model": None, "mean_staleness": self.mean_staleness,
                "p95_staleness": self.p95_staleness, "max_staleness": self.max_staleness,
                "divergence_risk": self.divergence_risk, "note": self.note}


def staleness_risk(staleness: Sequence[int] | np.ndarray, workload: Any) -> StalenessRisk:
    taus = check_staleness(staleness)
    return StalenessRisk(
        workload=workload.name, mean_staleness=float(taus.mean()),
        p95_staleness=quantile(np.sort(taus.astype(float)), 0.95),
        max_staleness=float(taus.max()),
        divergence_risk="none" if taus.max() == 0 else "unknown", note=no_model_line(workload))


def mitigation_of(strategy: str, options: dict[str, Any]) -> str:
    """The accuracy model's mitigation for a strategy and its options.

    With both async options on, the staleness-aware rate is modelled (no harness runs of the
    two together were fitted).
    """
    if strategy != "async-ps":
        return "none"
    if options.get("staleness_aware_lr"):
        return "staleness-aware"
    return "dc" if options.get("delay_compensation") else "none"


def for_prediction(prediction: Any, *, updates: int | None = None,
                   target_accuracy: float | None = None) -> StalenessCost | StalenessRisk:
    """The staleness cost of a perfmodel.predict.Prediction (any strategy; 0 when
    synchronous), or its StalenessRisk where no accuracy model applies to the workload."""
    from perfmodel import strategies

    s, sc = prediction.summary, prediction.scenario
    model = accuracy_model_for(sc.workload)
    if model is None:
        return staleness_risk(s.staleness_values, sc.workload)
    sync = strategies.get(prediction.strategy).synchronous
    return staleness_cost(
        s.staleness_values, mitigation=mitigation_of(prediction.strategy, prediction.options),
        updates=updates, target_accuracy=target_accuracy,
        samples_per_s=s.throughput_samples_per_s, batch_size=sc.batch_size, model=model,
        sync_workers=sc.workers if sync else 1)


def render_lines(cost: StalenessCost | StalenessRisk) -> list[str]:
    """Lines for `perfmodel predict`'s table."""
    if isinstance(cost, StalenessRisk):
        flag = ("none: synchronous" if cost.divergence_risk == "none" else
                f"unknown: stale gradients (mean {cost.mean_staleness:.1f}, p95 "
                f"{cost.p95_staleness:.0f}) with no fitted stability threshold")
        return [f"  accuracy         not predicted; staleness risk {flag}",
                f"  {cost.note}"]
    mit = "" if cost.mitigation == "none" else f", {cost.mitigation}"
    if cost.divergence_risk == "unstable":
        acc = (f"UNSTABLE (instability {cost.instability:.2f} >= threshold "
               f"{cost.divergence_threshold:.2f}): training oscillates or diverges; "
               "no accuracy can be promised")
    else:
        acc = (f"{100 * cost.accuracy:.1f} % ± {100 * cost.band:.1f} after {cost.updates} "
               f"updates vs {100 * cost.sync_accuracy:.1f} % synchronous: penalty "
               f"{cost.penalty_points:.1f} points; divergence risk {cost.divergence_risk} "
               f"(instability {cost.instability:.2f}, threshold "
               f"{cost.divergence_threshold:.2f})")
    t = cost.time_to_target_s
    when = ("never" if t is None or not math.isfinite(t) else _duration(t))
    if cost.time_range_s is not None and math.isfinite(t or math.inf):
        lo, hi = cost.time_range_s
        when += f" ({_duration(lo)} - {_duration(hi) if math.isfinite(hi) else 'never'})"
    target = f"to {100 * cost.target_accuracy:.0f} % accuracy"
    return [f"  accuracy         {acc}",
            f"  {target:<17}{when} "
            f"({_count(cost.updates_to_target)} updates, {cost.worth:.2f} of a synchronous "
            f"update each; {cost.setting}{mit})",
            f"  accuracy model: {cost.workload} on {cost.data_set}; {cost.caveat}"] \
        + ([f"  batch            a step of {cost.sync_workers} batches counts as "
            f"{cost.sync_workers * cost.batch_efficiency:.2f} ("
            + (f"noise scale {cost.noise_scale_samples:,.0f} samples, McCandlish et al. 2018)"
               if cost.noise_scale_samples is not None else
               "no noise scale measured: linear scaling assumed)")]
           if cost.sync_workers > 1 else [])


def _count(n: float) -> str:
    return "inf" if not math.isfinite(n) else f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    if seconds < 600:
        return f"{seconds:,.1f} s"
    return f"{seconds / 60:,.1f} min"
