"""Which accuracy model applies to a workload — or that none does, said out loud.

A workload's accuracy model is found, first match wins:

1. the workload file's optional `accuracy_model` field: a model name (looked up as below) or
   a path to a model file, relative to the workload file;
2. `<name>.toml` in the user's accuracy folder (`$PERFMODEL_ACCURACY`, default
   `~/.local/share/perfmodel/accuracy`);
3. `<name>.toml` in perfmodel/data/accuracy/ (shipped, fitted by calibration/fit_accuracy.py).

`name` is the workload's `accuracy_model` or else its own name. Nothing else: a model fitted
on one workload is never applied to another that did not name it (issue 16: the mlp/digits
fit called async PS unstable for ResNet-50 and promised it 95 % accuracy in 158.5 ms).
"""

from __future__ import annotations

import os
from pathlib import Path

from perfmodel.accuracy.model import ACCURACY_DIR, AccuracyModel, load_accuracy_model
from perfmodel.cluster import data_home
from perfmodel.errors import PerfmodelError
from perfmodel.workload import Workload

# How to get one today: the harness and fitter are mlp/digits-specific (a `perfmodel staleness
# fit` for the user's own model is issue 16's open part), so the line points at them and at
# the workload field that names a model file.
FIT_HINT = ("to cost it, fit one on your own model: perfmodel staleness fit --model "
            "PKG.MOD:FUNC --data PKG.MOD:FUNC --workload NAME (or name a fitted file in the "
            "workload's TOML: accuracy_model = \"path.toml\")")


def user_accuracy_dir() -> Path:
    env = os.environ.get("PERFMODEL_ACCURACY")
    return Path(env) if env else data_home() / "accuracy"


def accuracy_model_path(workload: Workload) -> Path | None:
    """The file of `workload`'s accuracy model, or None when none applies."""
    named = workload.accuracy_model
    if named.endswith(".toml"):
        path = (workload.path.parent / named) if not Path(named).is_absolute() else Path(named)
        if not path.is_file():
            raise PerfmodelError(f"{workload.path}: accuracy_model '{named}' is not a file")
        return path
    name = named or workload.name
    for folder in (user_accuracy_dir(), ACCURACY_DIR):
        if (folder / f"{name}.toml").is_file():
            return folder / f"{name}.toml"
    if named:
        raise PerfmodelError(f"{workload.path}: accuracy_model '{named}' is in neither "
                             f"{user_accuracy_dir()} nor {ACCURACY_DIR}")
    return None


def accuracy_model_for(workload: Workload) -> AccuracyModel | None:
    path = accuracy_model_path(workload)
    return None if path is None else load_accuracy_model(path=path)


def no_model_line(workload: Workload) -> str:
    """The one line said wherever no accuracy model applies."""
    return (f"no accuracy model applies to {workload.name} (fitted: "
            f"{', '.join(fitted_names()) or 'none'}), so staleness is shown but not costed; "
            f"{FIT_HINT}")


def fitted_names() -> list[str]:
    """The workloads a model applies to by name. The held-out classes' models
    (cnn-digits, logreg-tabular, ...: calibration/fit_accuracy_classes.py) are no workload's
    and apply only where a workload names them in `accuracy_model`."""
    from perfmodel.workload import workload_paths

    known = set(workload_paths())
    names = {p.stem for folder in (user_accuracy_dir(), ACCURACY_DIR)
             for p in folder.glob("*.toml")}
    return sorted(names & known)
