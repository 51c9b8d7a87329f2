"""Calibration checks itself: predict a training run it measured but did not fit, part by part.

After the fits, `check_run` predicts one stored training run that no fit used — every
parameter-server run (calibration/from_store.py fits nothing from them) and any run whose
calibration marker says `role = "check"` (left out of every fit) — with the fitted profile
and the same model `perfmodel predict` runs (perfmodel/predict.py), and compares it with the
measurement component by component (`components`):

- step: wall time per step;
- compute: forward + backward (+ optimizer where the worker runs it): measured `compute_s`
  against the model's compute;
- collective (DDP, FSDP) or ps_round_trip (PS worker: push + server apply + pull): the time
  the training loop stood still for communication (`comm_wait_s`) against the model's
  exposed communication + waiting.

Measured values are means over every training rank's timed steps (as perfmodel/compare
measures them). A component is flagged when predicted / measured lies outside
[1/(1+t), 1+t] for its tolerance t (symmetric in the ratio, so an under-prediction is caught
however wide t is); t is stated in calibration/data/self_check.toml with its source,
widened to `noise_multiple` x the run-to-run CV the calibration measured and capped at
`max_tolerance_rel` (a 2x miss is always flagged). A run-to-run CV above `max_run_spread_cv`
is flagged too (`spread_warning`). The check is generic over components:
`compare_components` takes any named pairs.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.cluster import ClusterProfile
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.compute import ps_worker_seconds
from perfmodel.sim.ddp import HARNESS_COMM_HOOK as HARNESS_DDP_HOOK
from perfmodel.sim.scenario import Scenario, timed_wait_jitter
from perfmodel.sim.scenario import parse_speeds as scenario_speeds
from perfmodel.workload import load_workload

TOLERANCES_FILE = Path(__file__).resolve().parent / "data" / "self_check.toml"
COMMUNICATION = {"ddp": "collective", "fsdp": "collective", "ps": "ps_round_trip"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Tolerances:
    """Per-component tolerance (relative) and the multiple of the run spread that widens it."""

    tolerance_rel: Mapping[str, float]
    noise_multiple: float
    max_tolerance_rel: float = 0.8
    max_run_spread_cv: float = 0.25

    def for_component(self, component: str, run_spread_cv: float | None) -> float:
        if component not in self.tolerance_rel:
            raise PerfmodelError(f"no self-check tolerance for component '{component}' in "
                                 f"{TOLERANCES_FILE}")
        noise = self.noise_multiple * (run_spread_cv or 0.0)
        return min(max(self.tolerance_rel[component], noise), self.max_tolerance_rel)

    def spread_warning(self, run_spread_cv: float | None) -> str | None:
        """A loud line when the calibration's own repeats spread more than a shared machine
        should (None when they do not, or were not measured)."""
        if run_spread_cv is None or run_spread_cv <= self.max_run_spread_cv:
            return None
        return (f"SELF-CHECK FAILED: the calibration's repeated runs spread "
                f"{run_spread_cv:.0%} (CV), above the {self.max_run_spread_cv:.0%} a shared "
                f"machine shows: the machine was too busy to calibrate on; its fits and "
                f"intervals carry that noise (calibrate again on a quieter machine)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentCheck:
    component: str
    predicted_s: float
    measured_s: float
    tolerance_rel: float

    @property
    def error_rel(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def flagged(self) -> bool:
        """predicted / measured outside [1/(1+t), 1+t]."""
        ratio = self.predicted_s / self.measured_s
        return not ratio > 0 or abs(math.log(ratio)) > math.log1p(self.tolerance_rel)


@dataclass(frozen=True, kw_only=True, slots=True)
class SelfCheck:
    """One held-back run predicted by the fitted profile."""

    run_id: int
    label: str                          # e.g. "ps cnn-small, 1 worker"
    components: tuple[ComponentCheck, ...]
    # what the fits took from this run, where anything: e.g. "its crowded messages are
    # fitted from it"; "" = not used in the fit
    fitted_from_it: str = ""

    @property
    def flagged(self) -> tuple[ComponentCheck, ...]:
        return tuple(c for c in self.components if c.flagged)

    def warnings(self) -> list[str]:
        """One loud line per component off by more than its tolerance."""
        used = self.fitted_from_it or "not used in the fit"
        return [f"SELF-CHECK FAILED: {c.component} of run {self.run_id} ({self.label}), "
                f"{used}, is predicted {c.predicted_s * 1e3:.3g} ms against "
                f"{c.measured_s * 1e3:.3g} ms measured ({c.error_rel:+.0%}; tolerance: "
                f"a factor {1 + c.tolerance_rel:.2f} either way); predictions that lean on "
                f"{c.component} are not to be trusted from this profile"
                for c in self.flagged]

    def as_table(self) -> dict[str, Any]:
        """The profile's [calibration.self_check."run<ID>"] table."""
        return {"label": self.label, "flagged": [c.component for c in self.flagged],
                **{c.component: {"predicted_s": c.predicted_s, "measured_s": c.measured_s,
                                 "error_rel": c.error_rel, "tolerance_rel": c.tolerance_rel}
                   for c in self.components}}


def load_tolerances(path: Path = TOLERANCES_FILE) -> Tolerances:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        table = {str(k): float(v) for k, v in data["tolerance_rel"].items()}
        multiple = float(data["noise_multiple"])
        cap, spread = float(data["max_tolerance_rel"]), float(data["max_run_spread_cv"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise PerfmodelError(f"{path}: cannot read the self-check tolerances ({e})") from None
    if not all(0 < v <= cap for v in table.values()) or not multiple >= 0 or not spread > 0:
        raise PerfmodelError(f"{path}: tolerances must be > 0 and <= max_tolerance_rel, "
                             f"noise_multiple >= 0 and max_run_spread_cv > 0")
    return Tolerances(tolerance_rel=table, noise_multiple=multiple, max_tolerance_rel=cap,
                      max_run_spread_cv=spread)


def compare_components(predicted: Mapping[str, float], measured: Mapping[str, float],
                       tolerances: Tolerances, run_spread_cv: float | None = None
                       ) -> tuple[ComponentCheck, ...]:
    """A check for every component both sides have (measured > 0), in `predicted`'s order."""
    return tuple(ComponentCheck(component=k, predicted_s=float(predicted[k]),
                                measured_s=float(measured[k]),
                                tolerance_rel=tolerances.for_component(k, run_spread_cv))
                 for k in predicted if k in measured and measured[k] and measured[k] > 0)


def is_timed_wait(run) -> bool:
    """A run whose workers slept their compute (measure/timed_wait.py)."""
    return run.row.config.get("compute_mode", "real") == "timed-wait"


def is_check_run(run) -> bool:
    """A run no fit uses: a PS run, or one marked `role = "check"`."""
    marker = run.row.config.get("calibration") or {}
    return run.row.kind == "ps" or marker.get("role") == "check"


def measured_components(run) -> dict[str, float]:
    steps = run.table("steps")
    if not steps:
        return {}
    mean = {k: float(np.mean([float(s[k]) for s in steps]))
            for k in ("wall_s", "compute_s", "comm_wait_s")}
    return {"step": mean["wall_s"], "compute": mean["compute_s"],
            COMMUNICATION[run.row.kind]: mean["comm_wait_s"]}


def predicted_components(cluster: ClusterProfile, run) -> dict[str, float]:
    strategy, options = _strategy(run.row.config)
    if is_timed_wait(run):
        cluster = cluster.as_timed_wait()
    p = predict(strategy, _scenario(cluster, run), **options)
    s = p.summary
    return {"step": s.step_time_s.mean, "compute": s.compute_s,
            COMMUNICATION[run.row.kind]: s.comm_exposed_s + s.wait_s}


def check_run(cluster: ClusterProfile, run, tolerances: Tolerances,
              run_spread_cv: float | None = None) -> SelfCheck | None:
    """The self-check of one stored training run (None if it has no timed steps)."""
    measured = measured_components(run)
    if not measured:
        return None
    checks = compare_components(predicted_components(cluster, run), measured, tolerances,
                                run_spread_cv)
    row = run.row
    label = (f"{row.kind} {row.workload}, {row.workers} worker"
             + ("s" if (row.workers or 1) > 1 else "")
             + (", timed wait" if is_timed_wait(run) else ""))
    return SelfCheck(run_id=row.id, label=label, components=checks)


def _strategy(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = config["kind"]
    opts = dict((config.get("options") or {}).get(kind) or {})
    if kind == "ddp":       # measure/runs/ddp.py times the buckets with a comm hook
        cap, first = opts.get("bucket_cap_MiB"), opts.get("first_bucket_MiB")
        if cap is None and first is None:
            return "ddp", {"comm_hook": HARNESS_DDP_HOOK}
        cap = float(cap if cap is not None else 25.0)
        return "ddp", {"bucket_cap_MiB": cap, "comm_hook": HARNESS_DDP_HOOK,
                       "first_bucket_MiB": float(first if first is not None else cap)}
    if kind == "fsdp":
        return "fsdp", {"variant": opts.get("variant", "full-shard"), "prefetch": 0}
    mode = opts.get("mode", "sync")
    if mode == "ssp":
        return "ssp-ps", ({"staleness_bound": int(opts["staleness_bound"])}
                          if opts.get("staleness_bound") is not None else {})
    return f"{mode}-ps", {}


def _scenario(cluster: ClusterProfile, run) -> Scenario:
    c, row = run.row.config, run.row
    warmup = int(c.get("warmup_steps", 2))
    steps = int(c.get("steps", 10))
    speed = c.get("speed")
    if isinstance(speed, list | tuple):
        speed = ",".join(str(v) for v in speed)
    workload, workers, batch = load_workload(row.workload), int(row.workers), int(row.batch_size)
    speeds = scenario_speeds(str(speed), workers) if speed else ()
    jitter, cv = "lognormal", None                  # real compute: the profile's jitter_cv
    if is_timed_wait(run):
        speeds, slept = _timed_wait_speeds(cluster, run, workload, speeds or (1.0,) * workers)
        jitter, cv = timed_wait_jitter(cluster.compute.timed_wait_spread_ms * 1e-3, slept)
    return Scenario(cluster=cluster, workload=workload, workers=workers, batch_size=batch,
                    steps=warmup + max(steps, 1), warmup_steps=warmup, speed=speeds,
                    jitter=jitter, jitter_cv=cv, seed=int(c.get("seed", 0)))


def _timed_wait_speeds(cluster: ClusterProfile, run, workload, speeds: tuple[float, ...]
                       ) -> tuple[tuple[float, ...], float]:
    """(speeds, seconds slept a step) of a timed-wait PS run in the model. Its workers slept
    the waits in its config (`compute_wait_s`: the suite's crowded run sleeps the shipped CPU
    profile's unit times, not this profile's), so every speed is divided by the factor k by
    which those waits exceed the model's passes: the model's wait is then the run's. The
    waits stray by compute.timed_wait_spread_ms (`timed_wait_jitter`, as
    perfmodel/compare/protocol.py's `scenario_for` has them; fitted from this kind of run:
    the check's spread is in-sample, its round trip is not)."""
    if run.row.kind != "ps":
        raise PerfmodelError("only a parameter-server run in a timed wait can be checked")
    wait = run.row.config.get("compute_wait_s") or {}
    slept = sum(map(float, wait.get("forward", ()))) + sum(map(float, wait.get("backward", ())))
    model = ps_worker_seconds(cluster, workload, int(run.row.batch_size))
    if not slept > 0 or not model > 0:
        raise PerfmodelError("its config holds no compute_wait_s to sleep")
    return tuple(s * model / slept for s in speeds), slept
