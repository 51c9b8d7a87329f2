"""What gradient staleness costs in accuracy: a model fitted on real delayed-gradient runs.

The cost model (DESIGN.md "Staleness and accuracy"), fitted by calibration/fit_accuracy.py
from measure/staleness_harness.py runs of `mlp` on scikit-learn's digits:

- Learning curve of synchronous training, in updates u of one worker's batch b:
  acc(u) = a_inf − (a_inf − a0)·exp(−(u / scale)^shape), fitted on runs with τ = 0.
  Synchronous data parallelism with N workers does one step of batch N·b: counted as N
  updates of batch b (linear learning-rate scaling, Goyal et al. 2017; holds below the
  critical batch size, McCandlish et al. 2018).
- A stale update is worth less: after U updates with staleness τ_1..τ_U the model is where
  synchronous training is after u_eff = Σ (lr_i/α₀)^κ / (1 + β·τ_i) updates (DESIGN.md's
  Σ 1/(1 + β·τ), weighted by the rate lr_i each update was applied with, which only the
  staleness-aware rate α₀/max(τ, 1) of Zhang et al. 2016 changes); β is fitted per optimizer,
  learning rate and mitigation (none; staleness-aware; DC-ASGD's compensation of Zheng et al.
  2017), κ on the staleness-aware runs.
- Instability: training oscillates or diverges when the instability index
  x = mean_i(lr_i · (2τ_i + 1)) / (1 − momentum) crosses a threshold fitted, per setting,
  from the harness runs that became unstable (one threshold for every learning rate did
  not fit: the smaller rate turned unstable at a smaller index). Why this index: gradient
  descent with delay τ on a quadratic of curvature h is stable only while
  lr·h < 2 sin(π / (2(2τ + 1))), about π / (2τ + 1) (Levin & May 1976, the delay
  difference equation x_{n+1} = x_n − a·x_{n−τ}); 1/(1 − momentum) is heavy-ball
  momentum's long-run step multiplier; lr_i is the rate the update was applied with
  (α₀/max(τ_i, 1) under the staleness-aware rate). Fixed rates fail at large staleness,
  as Zhang et al. 2016 saw on CIFAR-10. An unstable run's accuracy is not predictable (it
  swings between chance and far below synchronous), so the model reports the risk instead.

The numbers hold for this small MLP on digits only; deeper networks and adaptive optimizers
are more sensitive to staleness (Dai et al. 2019). Every result says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import Fields, load_toml

ACCURACY_DIR = Path(__file__).resolve().parent.parent / "data" / "accuracy"
MITIGATIONS = ("none", "staleness-aware", "dc")
# measure/models.py make_optimizer; Adam's first-moment β1 = 0.9 stands in for momentum in the
# instability index (a constant factor: the threshold is fitted per setting)
OPTIMIZER_MOMENTUM = {"sgd": 0.0, "momentum": 0.9, "adam": 0.9}


@dataclass(frozen=True, kw_only=True, slots=True)
class LearningCurve:
    """acc(u) = a_inf − (a_inf − a0)·exp(−(u / scale_updates)^shape) (a stretched exponential),
    or, where `measured` is given, the synchronous runs' own mean accuracy at each evaluation
    (updates, accuracy), linear in between, with the stretched exponential only beyond the
    last evaluation. A measured curve keeps shapes the formula cannot: transformer-pointer's
    synchronous runs sit on a plateau at 0.28-0.44 for 100-400 updates, then jump to 0.93+
    (accuracy_plan_v3.toml)."""

    a0: float                   # test accuracy of the initial weights
    a_inf: float                # plateau
    scale_updates: float        # updates to close 1 − 1/e of the gap
    shape: float                # 1 = plain saturating exponential
    measured: tuple[tuple[float, float], ...] = ()     # (updates, accuracy), updates rising

    def accuracy(self, updates: float | np.ndarray) -> float | np.ndarray:
        u = np.maximum(np.asarray(updates, dtype=float), 0.0)
        acc = self.a_inf - (self.a_inf - self.a0) * np.exp(-(u / self.scale_updates)
                                                             ** self.shape)
        if self.measured:
            at, seen = np.array(self.measured).T
            acc = np.where(u <= at[-1], np.interp(u, at, seen), acc)
        return float(acc) if acc.ndim == 0 else acc

    def updates_to(self, target: float) -> float:
        """Updates needed to reach `target` (a measured curve: its first crossing); inf when
        the plateau lies below it."""
        if self.measured:
            at, seen = np.array(self.measured).T
            hit = np.nonzero(seen >= target)[0]
            if len(hit):
                i = int(hit[0])
                return 0.0 if i == 0 else float(np.interp(target, seen[i - 1:i + 1],
                                                          at[i - 1:i + 1]))
            return max(self._formula_updates_to(target), float(at[-1]))
        return self._formula_updates_to(target)

    def _formula_updates_to(self, target: float) -> float:
        if target <= self.a0:
            return 0.0
        if target >= self.a_inf:
            return math.inf
        gap = (self.a_inf - target) / (self.a_inf - self.a0)
        return self.scale_updates * (-math.log(gap)) ** (1.0 / self.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """One fitted optimizer and learning rate."""

    optimizer: str
    lr: float
    budget_updates: int         # updates of the harness runs: the default budget U
    curve: LearningCurve
    beta: dict[str, float]      # per mitigation: the worth 1/(1 + β·τ) of a stale update
    rate_exponent: float        # κ: an update at rate lr_i is worth (lr_i/α₀)^κ as much
    seed_sd: float              # SD of synchronous accuracy between seeds near the budget
    band: float                 # half-width of the predicted accuracy band (accuracy units)
    instability_threshold: float  # unstable from this instability index up
    # gradient noise scale B_simple = tr(Σ)/|G|² in samples (McCandlish et al. 2018), measured
    # along the synchronous runs; None when not measured (synchronous steps then scale linearly)
    noise_scale_samples: float | None = None

    @property
    def momentum(self) -> float:
        return OPTIMIZER_MOMENTUM[self.optimizer]

    @property
    def name(self) -> str:
        return f"{self.optimizer} lr {self.lr:g}"


@dataclass(frozen=True, kw_only=True, slots=True)
class AccuracyModel:
    workload: str
    data_set: str
    caveat: str                 # printed with every result
    chance_accuracy: float
    batch_size: int             # samples per update in the harness runs
    target_accuracy: float      # default target for time-to-accuracy
    default_optimizer: str
    default_lr: float
    settings: tuple[Setting, ...]
    provenance: dict[str, object]
    path: Path

    def setting(self, optimizer: str | None = None, lr: float | None = None) -> Setting:
        """The fitted setting for (optimizer, lr); the workload's defaults when not given."""
        optimizer = self.default_optimizer if optimizer is None else optimizer
        lr = self.default_lr if lr is None else lr
        for s in self.settings:
            if s.optimizer == optimizer and math.isclose(s.lr, lr, rel_tol=1e-9):
                return s
        known = ", ".join(s.name for s in self.settings)
        raise PerfmodelError(f"the accuracy model of {self.workload} has no fit for "
                             f"{optimizer} at lr {lr:g}; fitted: {known} (run "
                             f"calibration/fit_accuracy.py to add one)")


def mean_worth(staleness: np.ndarray, beta: float, lr: float, mitigation: str,
               rate_exponent: float) -> float:
    """Mean over updates of (lr_i/α₀)^κ / (1 + β·τ_i): synchronous updates per update."""
    ratio = update_rates(staleness, lr, mitigation) / lr
    return float(np.mean(ratio ** rate_exponent / (1.0 + beta * staleness)))


def batch_efficiency(noise_scale_samples: float | None, batch: int, workers: int) -> float:
    """What one worker's batch is worth inside a synchronous step of `workers` such batches.

    A step of batch B does 1/(1 + B_noise/B) of an ideal (noise-free) step (McCandlish et al.
    2018, eq. 2.9: S = S_min(1 + B_noise/B)); the learning curve counts updates of one batch
    b, so the step is worth (1 + B_noise/b)/(1 + B_noise/(N·b)) of them, and each of its N
    worker batches (b + B_noise)/(N·b + B_noise): 1 at N = 1, 1/N when B_noise ≪ b. Without a
    measured noise scale every batch counts fully (linear scaling, Goyal et al. 2017).
    """
    if noise_scale_samples is None or workers <= 1:
        return 1.0
    return (batch + noise_scale_samples) / (workers * batch + noise_scale_samples)


def update_rates(staleness: np.ndarray, lr: float, mitigation: str) -> np.ndarray:
    """The learning rate each update is applied with (α₀/max(τ, 1) under staleness-aware)."""
    if mitigation == "staleness-aware":
        return lr / np.maximum(staleness, 1)
    return np.full(staleness.shape, float(lr))


def instability(staleness: np.ndarray, lr: float, momentum: float, mitigation: str) -> float:
    """x = mean(lr_i · (2τ_i + 1)) / (1 − momentum); unstable above the fitted threshold."""
    return float(np.mean((2 * staleness + 1) * update_rates(staleness, lr, mitigation))
                 / (1.0 - momentum))


def check_staleness(values: Sequence[int] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.size == 0:
        return np.zeros(1)
    if not np.isfinite(a).all() or (a < 0).any():
        raise PerfmodelError("staleness values must be finite and >= 0")
    return a


def check_mitigation(mitigation: str) -> None:
    if mitigation not in MITIGATIONS:
        raise PerfmodelError(f"mitigation '{mitigation}' is not one of {', '.join(MITIGATIONS)}")


# ---------------------------------------------------------------- the data file


def accuracy_model_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(ACCURACY_DIR.glob("*.toml"))}


def load_accuracy_model(workload: str = "mlp", path: Path | None = None) -> AccuracyModel:
    """The fitted cost model of `workload` (perfmodel/data/accuracy/<workload>.toml)."""
    if path is None:
        paths = accuracy_model_paths()
        if workload not in paths:
            raise PerfmodelError(f"no accuracy model for workload '{workload}'; fitted: "
                                 f"{', '.join(paths) or 'none'}")
        path = paths[workload]
    return parse_accuracy_model(load_toml(path), path)


def measured_curve(raw: object, where: str) -> tuple[tuple[float, float], ...]:
    """`curve_measured` = [[updates, accuracy], ...]: updates from 0, rising; accuracy in
    [0, 1]; at least two points (or none: the formula alone)."""
    if raw == []:
        return ()
    bad = PerfmodelError(f"{where}.curve_measured must be [[updates, accuracy], ...]: two or "
                         f"more points, updates rising from 0, accuracy within [0, 1]")
    if not isinstance(raw, list) or len(raw) < 2:
        raise bad
    points = []
    for p in raw:
        if not (isinstance(p, list) and len(p) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in p)):
            raise bad
        points.append((float(p[0]), float(p[1])))
    at = np.array([p[0] for p in points])
    seen = np.array([p[1] for p in points])
    if at[0] != 0 or np.any(np.diff(at) <= 0) or np.any((seen < 0) | (seen > 1)):
        raise bad
    return tuple(points)


def parse_accuracy_model(data: dict, path: Path) -> AccuracyModel:
    f = Fields(data, path)
    raw = data.get("settings")
    if not isinstance(raw, list) or not raw:
        raise PerfmodelError(f"{path}: needs at least one [[settings]] table")
    settings = []
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise PerfmodelError(f"{path}: settings[{i}] is not a table")
        s = Fields(table, path, f"settings[{i}].")
        optimizer = s.str("optimizer")
        if optimizer not in OPTIMIZER_MOMENTUM:
            raise PerfmodelError(f"{path}: settings[{i}].optimizer '{optimizer}' is not one "
                                 f"of {', '.join(OPTIMIZER_MOMENTUM)}")
        curve = LearningCurve(a0=s.number("curve_a0"), a_inf=s.number("curve_a_inf"),
                              scale_updates=s.number("curve_scale_updates", positive=True),
                              shape=s.number("curve_shape", positive=True),
                              measured=measured_curve(table.get("curve_measured", []),
                                                      f"{path}: settings[{i}]"))
        if not curve.a0 < curve.a_inf <= 1:
            raise PerfmodelError(f"{path}: settings[{i}] needs curve_a0 < curve_a_inf <= 1")
        beta = s.table("beta")
        settings.append(Setting(
            optimizer=optimizer, lr=s.number("lr", positive=True),
            budget_updates=s.integer("budget_updates", minimum=1), curve=curve,
            beta={m: beta.number(m) for m in MITIGATIONS},
            rate_exponent=s.number("rate_exponent"),
            seed_sd=s.number("seed_sd"), band=s.number("band"),
            instability_threshold=s.table("instability").number("threshold", positive=True),
            noise_scale_samples=(s.number("noise_scale_samples", positive=True)
                                 if s.has("noise_scale_samples") else None)))
    return AccuracyModel(
        workload=f.str("workload"), data_set=f.str("data_set"), caveat=f.str("caveat"),
        chance_accuracy=f.number("chance_accuracy"),
        batch_size=f.integer("batch_size", minimum=1),
        target_accuracy=f.number("target_accuracy", positive=True),
        default_optimizer=f.str("default_optimizer"),
        default_lr=f.number("default_lr", positive=True),
        settings=tuple(settings),
        provenance=dict(f.table("provenance").data), path=path)
