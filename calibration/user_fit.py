"""`perfmodel staleness fit`: the accuracy cost of staleness, fitted on the user's own model.

The user gives a model factory and a data function (`pkg.mod:make_model`, `pkg.mod:make_data`;
make_data() returns (x_train, y_train, x_test, y_test) tensors, integer class targets) and
the workload and cluster they will train on. Steps:

1. Staleness profiles from the simulator: async-ps on that cluster and workload, for each
   worker count asked for (with the stragglers asked for), SIM_STEPS steps per worker; the
   per-update τ values become the harness's profiles (calibration/fit_accuracy.py builds the
   shipped fits the same way).
2. Harness runs (measure/staleness_harness.py with a Task from the user's module; one torch
   thread): synchronous (τ = 0) with seeds 0..sync_seeds-1, and every profile with no
   mitigation and with the staleness-aware rate at seed 0; the gradient noise scale along
   the synchronous runs.
3. The fit of calibration/fit_accuracy_classes.py (curve, β per mitigation, κ, instability
   threshold, seed spread, noise scale) on all of them, written as `<workload>.toml` in the
   user's accuracy folder ($PERFMODEL_ACCURACY) beside its runs file: the file
   perfmodel/accuracy/lookup.py finds for that workload, so predict and recommend cost
   staleness with it from then on. No held-out check: the file says so in its caveat.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit_accuracy_classes import (
    fit_setting,
    key_of,
    model_toml,
    now,
    record_runs,
    target_of,
)
from measure.user_models import load_callable
from perfmodel.accuracy.model import parse_accuracy_model
from perfmodel.errors import PerfmodelError

SIM_STEPS = 40
SIM_SEED = 0
MITIGATIONS = ("none", "staleness-aware")


@dataclass(frozen=True, kw_only=True)
class UserFit:
    """What `perfmodel staleness fit` runs; mirrors measure/staleness_classes.WorkloadClass."""

    name: str                       # the workload the model is for (the output file's name)
    description: str
    optimizer: str = "momentum"
    lr: float = 0.05
    warmup_updates: int = 0
    budget_updates: int = 200
    eval_every: int = 20
    batch_size: int = 64
    sync_seeds: int = 2

    def __post_init__(self):
        if self.budget_updates < 2 or self.eval_every < 1:
            raise PerfmodelError("--updates must be at least 2 and --eval-every at least 1")
        if self.sync_seeds < 2:
            raise PerfmodelError(f"--sync-seeds must be at least 2 (the seed spread needs two),"
                                 f" got {self.sync_seeds}")

    def config(self, *, mitigation: str = "none", seed: int = 0):
        from measure.staleness_harness import HarnessConfig

        return HarnessConfig(updates=self.budget_updates, lr=self.lr, optimizer=self.optimizer,
                             warmup_updates=self.warmup_updates, mitigation=mitigation,
                             batch_size=self.batch_size, eval_every=self.eval_every, seed=seed)


def build_task(name: str, make_model: Callable[[], Any], make_data: Callable[[], Any]):
    import torch

    from measure.staleness_harness import Task

    data = make_data()
    if not (isinstance(data, tuple | list) and len(data) == 4
            and all(isinstance(t, torch.Tensor) for t in data)):
        raise PerfmodelError("--data must return (x_train, y_train, x_test, y_test) tensors")
    x_train, y_train, x_test, y_test = data
    if y_train.dtype.is_floating_point or y_test.dtype.is_floating_point:
        raise PerfmodelError("--data targets must be integer class labels")
    classes = int(max(y_train.max(), y_test.max())) + 1
    return Task(name=name, make_model=make_model, x_train=x_train, y_train=y_train.long(),
                x_test=x_test, y_test=y_test.long(), classes=max(classes, 2))


def simulated_profiles(cluster: str, workload: str, workers: tuple[int, ...],
                       stragglers: int, straggler_speed: float) -> dict[str, Any]:
    """{name: {workers, speeds, tau: [[value, count], ...]}}: async-ps on the user's cluster."""
    from perfmodel.cluster import load_cluster
    from perfmodel.predict import predict
    from perfmodel.sim.scenario import Scenario
    from perfmodel.workload import load_workload

    c, w = load_cluster(cluster), load_workload(workload)
    profiles = {}
    for n in workers:
        slow = min(stragglers, n - 1)
        speeds = (1.0,) * (n - slow) + (straggler_speed,) * slow
        scenario = Scenario(cluster=c, workload=w, workers=n, batch_size=w.batch_size,
                            steps=SIM_STEPS, speed=speeds if slow else (), seed=SIM_SEED)
        taus = np.array(predict("async-ps", scenario).summary.staleness_values)
        values, counts = np.unique(taus, return_counts=True)
        profiles[f"async-{n}"] = {"workers": n, "speeds": list(speeds),
                                  "tau": [[int(v), int(k)] for v, k in
                                          zip(values, counts, strict=True)],
                                  "held_out": False}
    return profiles


def fit_user_model(*, fit: UserFit, model: str, data: str, cluster: str, workload: str,
                   workers: tuple[int, ...], stragglers: int = 0, straggler_speed: float = 0.5,
                   out: Path, progress=print) -> dict[str, Any]:
    """Run, fit and write `out` (and its runs file beside it); returns a summary."""
    if not workers or min(workers) < 2:
        raise PerfmodelError("--workers must be at least 2 (async PS with one worker is not "
                             "stale)")
    task = build_task(fit.name, load_callable(model, "model"), load_callable(data, "data"))
    profiles = simulated_profiles(cluster, workload, workers, stragglers, straggler_speed)
    keys = [("sync", "none", s) for s in range(fit.sync_seeds)]
    keys += [(p, m, 0) for p in profiles for m in MITIGATIONS]
    runs_file = out.with_name(f"{out.stem}_runs.json")
    if runs_file.exists():
        runs_file.unlink()          # a new fit: the module or data may have changed
    data_ = record_runs(fit, keys, runs_file, profiles, task, (),
                        range(fit.sync_seeds), progress)
    data_ = dict(data_, runs=[r for r in data_["runs"] if key_of(r) in set(keys)])
    setting = fit_setting(data_, set(profiles), fit.optimizer, fit.lr, fit.budget_updates)
    prov = {**data_["provenance"], "date": now(), "model": model, "data": data,
            "cluster": cluster, "simulated_workload": workload, "workers": list(workers),
            "stragglers": stragglers, "straggler_speed": straggler_speed,
            "runs_file": runs_file.name}
    text = model_toml(
        workload=fit.name, data_set=f"{data} (user data)",
        caveat=f"fitted on {model} with {data} by perfmodel staleness fit; not checked on "
               "held-out staleness", chance=task.chance_accuracy, batch=fit.batch_size,
        target=max(target_of(setting["sync_observed"]), task.chance_accuracy + 0.01),
        setting=setting, prov=prov, check=None,
        header=f"The accuracy cost of staleness for {fit.name}, fitted by `perfmodel "
               f"staleness fit` from {runs_file.name}.")
    parse_accuracy_model(tomllib.loads(text), out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return {"workload": fit.name, "out": str(out), "runs_file": str(runs_file),
            "runs": len(data_["runs"]), "profiles": {p: float(np.mean(
                np.repeat(*np.array(v["tau"]).T))) for p, v in profiles.items()},
            "sync_accuracy": setting["sync_observed"], "beta": setting["beta"],
            "instability_threshold": setting["instability"]["threshold"]}
