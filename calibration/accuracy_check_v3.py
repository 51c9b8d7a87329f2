"""The third held-out accuracy check (issue 16), exactly as accuracy_plan_v3.toml says.

The plan (committed before any of these runs) fixes the new held-out profiles, the eight seeds
of every group, the fit data, the curve and the rules (v2's, unchanged). Per class
(resumable: recorded runs are not repeated; one torch thread; run it under `nice -n 19`):

1. Fit data: every recorded run of the class's setting in the plan's `[fit] runs_files`,
   one per (profile, mitigation, seed), the first file's first; the synchronous baseline is
   the plan's synchronous seeds.
2. Held-out runs, seed-major, into perfmodel/data/accuracy/v3/<class>_heldout_runs.json (the
   profiles from calibration/fit_accuracy.py simulated_profile, recorded with them).
3. The model: fitted on the fit data with the synchronous runs' measured curve, under v2's
   stability rule, written where the plan's class says, with the v3 check as its [check].
   Beside it, not judged: the model the class had before v3 (kept the first time as
   v3/<class>_before.toml, so a rerun compares with the same one) and a zero-penalty guess.
4. The check, by the plan's rules, every group in perfmodel/data/heldout/accuracy_check_v3.toml
   (--write-check); a class whose runs are not all recorded gets no verdict.

The later checks that keep this method (v4, v5) name their own `Round` (plan, results, runs
folder, command, the model before them) and call `cli` with it.

Usage: python -m calibration.accuracy_check_v3 [--fit-only] [--write-check] CLASS [...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration import accuracy_check_v2 as v2
from calibration.fit_accuracy import REPO, accuracy_unstable
from calibration.fit_accuracy_classes import (
    classes_of,
    fit_setting,
    held_out_rows,
    key_of,
    model_toml,
    now,
    record_runs,
    rel,
    target_of,
)
from perfmodel.accuracy.model import ACCURACY_DIR, load_accuracy_model, parse_accuracy_model
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml

HELD_OUT = REPO / "perfmodel" / "data" / "heldout"


@dataclass(frozen=True)
class Round:
    """One held-out check run by this method: its plan, its results and where its runs go.
    v3, v4 and v5 (calibration/accuracy_check_v4.py, _v5.py) differ only in these."""

    version: str                        # "v3"
    ordinal: str                        # "third"
    # the model a class had before this round, where it is not the plan's `writes` file
    before: dict[str, Path] = field(default_factory=dict)

    @property
    def plan_file(self) -> Path:
        return HELD_OUT / f"accuracy_plan_{self.version}.toml"

    @property
    def check_file(self) -> Path:
        return HELD_OUT / f"accuracy_check_{self.version}.toml"

    @property
    def held_out_dir(self) -> Path:
        return ACCURACY_DIR / self.version

    @property
    def command(self) -> str:
        return f"python -m calibration.accuracy_check_{self.version}"


V3 = Round("v3", "third", {"mlp-digits": ACCURACY_DIR / "mlp.toml"})
PLAN_FILE, CHECK_FILE = V3.plan_file, V3.check_file


def load_plan(path: Path = PLAN_FILE) -> dict[str, Any]:
    return load_toml(path)


def held_out_path(name: str, run: Round = V3) -> Path:
    return run.held_out_dir / f"{name}_heldout_runs.json"


def class_entry(plan: dict[str, Any], name: str) -> dict[str, Any]:
    for c in plan["classes"]:
        if c["name"] == name:
            return c
    raise PerfmodelError(f"not a class of the plan: {name}; the plan's: "
                         f"{', '.join(c['name'] for c in plan['classes'])}")


def model_path(plan: dict[str, Any], name: str) -> Path:
    return REPO / class_entry(plan, name)["writes"].split()[0]


def fit_data(cls, plan: dict[str, Any]) -> dict[str, Any]:
    """Every recorded run of `cls`'s setting in the plan's runs files, one per key, the first
    seen kept; synchronous runs only of the plan's synchronous seeds."""
    sync_seeds = set(plan["fit"]["synchronous_seeds"])
    held_out = set(plan["profiles"]["held_out"])
    runs, profiles, noise, prov, seen = [], {}, [], None, set()
    for name in plan["fit"]["runs_files"][cls.name]:
        data = json.loads((REPO / name).read_text())
        prov = prov or data["provenance"]
        noise = noise or data.get("noise_scale", [])
        for key, value in data["profiles"].items():
            profiles.setdefault(key, value)
        for r in data["runs"]:
            key = key_of(r)
            if (not v2.same_setting(r, cls) or key in seen or r["profile"] in held_out
                    or (r["profile"] == "sync" and key[2] not in sync_seeds)):
                continue
            seen.add(key)
            runs.append(r)
    sync = [r for r in runs if r["profile"] == "sync"]
    if len(sync) != len(sync_seeds):
        raise PerfmodelError(f"{cls.name}: {len(sync)} of the {len(sync_seeds)} synchronous "
                             f"runs the plan names are recorded")
    return {"provenance": prov, "profiles": profiles, "runs": runs, "noise_scale": noise}


def held_out_data(cls, plan: dict[str, Any], record: bool, progress=print, run: Round = V3
                  ) -> dict[str, Any]:
    path = held_out_path(cls.name, run)
    profiles = None if path.exists() else v2.held_out_profiles(plan)
    if record:
        return record_runs(cls, v2.held_out_keys(plan), path, profiles, cls.task(),
                           progress=progress, plan_file=run.plan_file)
    return json.loads(path.read_text()) if path.exists() else {"profiles": profiles,
                                                                "runs": []}


def model_before(plan: dict[str, Any], name: str, run: Round = V3):
    """The class's model before this round, kept as <version>/<class>_before.toml the first
    time."""
    kept = run.held_out_dir / f"{name}_before.toml"
    if not kept.exists():
        source = run.before.get(name, model_path(plan, name))
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, kept)
    return load_accuracy_model(path=kept)


def fit_model(cls, data: dict[str, Any], plan: dict[str, Any], check=None, run: Round = V3):
    """Fit `cls` on `data` with the measured curve; write its TOML when `check` is given."""
    fitted = {r["profile"] for r in data["runs"]} - {"sync"}
    setting = fit_setting(data, fitted, cls.optimizer, cls.lr, cls.budget_updates,
                          is_unstable=accuracy_unstable, measured_curve=True)
    out = model_path(plan, cls.name)
    prov = {**data["provenance"], "date": now(), "command": f"{run.command} {cls.name}",
            "runs_recorded": data["provenance"]["date"], "runs": len(data["runs"]),
            "fitted_profiles": sorted(fitted),
            "held_out_profiles": list(plan["profiles"]["held_out"]),
            "stability_rule": "calibration/fit_accuracy.py accuracy_unstable (plan v2, v3)",
            "curve": plan["fit"]["curve"], "plan": rel(run.plan_file),
            "runs_files": list(plan["fit"]["runs_files"][cls.name]),
            "held_out_runs_file": rel(held_out_path(cls.name, run))}
    text = model_toml(workload=cls.workload, data_set=cls.data_set,
                      caveat=f"fitted on {cls.description} only", chance=1.0 / classes_of(cls),
                      batch=64, target=target_of(setting["sync_observed"]), setting=setting,
                      prov=prov, check=check,
                      header=f"The accuracy cost of staleness for {cls.name}, fitted by "
                             f"`{run.command} {cls.name}` under {run.plan_file.name}.")
    model = parse_accuracy_model(tomllib.loads(text), out)
    if check is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(out)
    return model


def check_class(name: str, plan: dict[str, Any], record: bool, progress=print,
                run: Round = V3) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from measure.staleness_classes import workload_class

    cls = workload_class(name)
    before = model_before(plan, name, run)
    fitted = fit_data(cls, plan)
    held = held_out_data(cls, plan, record, progress, run)
    keys = set(v2.held_out_keys(plan))
    runs = [r for r in held["runs"] if key_of(r) in keys]
    sync = [r for r in fitted["runs"] if r["profile"] == "sync"]
    data = {"profiles": held["profiles"], "runs": sync + runs}
    held_out = list(plan["profiles"]["held_out"])

    def rows_of(model):
        return held_out_rows(data, model, cls.optimizer, cls.lr, cls.budget_updates,
                             held_out, is_unstable=accuracy_unstable)

    rows = rows_of(fit_model(cls, fitted, plan, run=run))
    was = f"before_{run.version}"
    for row, old in zip(rows, rows_of(before), strict=True):
        row[f"{was}_predicted_penalty_points"] = old["predicted_penalty_points"]
        row[f"{was}_predicted_unstable"] = old["predicted_unstable"]
        row[f"{was}_abs_error_points"] = old["abs_error_points"]
        row["zero_penalty_abs_error_points"] = abs(row["observed_penalty_points"])
    summary = v2.verdict(rows, plan["rules"], len(keys), len(runs))
    stable = [r for r in rows if r["stable_group"]]
    summary[f"{was}_median_abs_error_points"] = (
        float(np.median([r[f"{was}_abs_error_points"] for r in stable])) if stable else None)
    summary["zero_penalty_median_abs_error_points"] = (
        float(np.median([r["zero_penalty_abs_error_points"] for r in stable]))
        if stable else None)
    if summary["complete"]:
        fit_model(cls, fitted, plan, (rows, summary), run)
    return rows, summary


def write_check(results: dict[str, tuple[list[dict], dict]], plan: dict[str, Any],
                path: Path | None = None, run: Round = V3) -> None:
    """Every group of every class given, misses included; classes already there are kept."""
    v2.write_check(results, plan, path or run.check_file,
                   title=f"The {run.ordinal} held-out accuracy check, {run.plan_file.name}",
                   command=run.command,
                   legend=(f"before_{run.version}_* = the class's model before {run.version} "
                           "(not judged); zero_penalty_* = predicting no penalty (not judged).",))


def main(argv: list[str] | None = None, run: Round = V3, description: str = __doc__) -> int:
    parser = argparse.ArgumentParser(
        prog=run.command, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=description.splitlines()[0],
        epilog="examples:\n"
               f"  nice -n 19 {run.command} logreg-tabular cnn-digits\n"
               f"  {run.command} --fit-only --write-check mlp-digits cnn-digits"
               "   # recorded runs\n")
    parser.add_argument("classes", nargs="+", metavar="CLASS")
    parser.add_argument("--fit-only", action="store_true",
                        help="no new runs: check on what is recorded")
    parser.add_argument("--write-check", action="store_true",
                        help=f"write the classes given into {rel(run.check_file)}")
    args = parser.parse_args(argv)
    plan = load_plan(run.plan_file)
    for name in args.classes:
        class_entry(plan, name)
    results = {}
    for name in args.classes:
        rows, summary = check_class(name, plan, not args.fit_only, run=run)
        results[name] = (rows, summary)
        for r in rows:
            before = r[f"before_{run.version}_predicted_penalty_points"]
            print(v2.group_line(name, r, f" (before {run.version} {before:5.1f})"))
        print(f"{name}: {summary}")
    if args.write_check:
        write_check(results, plan, run=run)
    return 0


def cli(run: Round = V3, description: str = __doc__) -> None:
    """A round's command line: a PerfmodelError is one line on stderr and exit status 2."""
    try:
        sys.exit(main(run=run, description=description))
    except PerfmodelError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
