"""The second held-out accuracy check (issues 14, 16), exactly as accuracy_plan_v2.toml says.

The plan (committed before any of these runs) fixes the new held-out profiles, the seeds, the
stability rule and the pass rules. Per class (resumable: recorded runs are not repeated; one
torch thread; run it under `nice -n 19`):

1. Fitted runs: the class's v1 runs file (sync seeds and one seed per fitted profile x
   mitigation), reused as recorded; a class new in v2 (transformer-pointer) records them
   first, into its own runs file, with the noise scale along its synchronous runs.
2. Held-out profiles: calibration/fit_accuracy.py simulated_profile from the plan's specs.
3. Held-out runs, seed-major (every group's first seed, then every group's second, ...), into
   perfmodel/data/accuracy/v2/<class>_heldout_runs.json.
4. The model: mlp-digits is checked against the shipped mlp.toml (not refitted); every other
   class is fitted on its sync and fitted runs only, under the plan's stability rule
   (fit_accuracy.accuracy_unstable), and written to perfmodel/data/accuracy/<workload>.toml
   with the v2 check as its [check].
5. The check, by the plan's rules, every group in perfmodel/data/heldout/accuracy_check_v2.toml
   (--write-check), with the number of planned runs recorded: a class whose runs are not all
   recorded gets no verdict.

Usage: python -m calibration.accuracy_check_v2 [--fit-only] [--write-check] CLASS [...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit_accuracy import REPO, accuracy_unstable, simulated_profile
from calibration.fit_accuracy import _toml_value as toml_value
from calibration.fit_accuracy_classes import (
    Key,
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

PLAN_FILE = REPO / "perfmodel" / "data" / "heldout" / "accuracy_plan_v2.toml"
CHECK_FILE = REPO / "perfmodel" / "data" / "heldout" / "accuracy_check_v2.toml"
HELD_OUT_DIR = ACCURACY_DIR / "v2"
COMMAND = "python -m calibration.accuracy_check_v2"
FITTED_RUNS = {"mlp-digits": ACCURACY_DIR / "mlp_runs.json"}


def load_plan(path: Path = PLAN_FILE) -> dict[str, Any]:
    return load_toml(path)


def fitted_keys(plan: dict[str, Any]) -> list[Key]:
    seeds, prof = plan["seeds"], plan["profiles"]
    return ([("sync", "none", s) for s in seeds["sync"]]
            + [(p, m, s) for p in prof["fitted"] for m in prof["mitigations"]
               for s in seeds["fitted"]])


def held_out_keys(plan: dict[str, Any]) -> list[Key]:
    """Seed-major: a run cut short leaves every group with the same number of seeds."""
    prof = plan["profiles"]
    return [(p, m, s) for s in plan["seeds"]["held_out"] for p in prof["held_out"]
            for m in prof["mitigations"]]


def held_out_profiles(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    specs = plan["profiles"]["specs"]
    missing = [p for p in plan["profiles"]["held_out"] if p not in specs]
    if missing:
        raise PerfmodelError(f"the plan has no [profiles.specs] for {', '.join(missing)}")
    return {name: simulated_profile(specs[name]["workers"], specs[name]["slow_workers"],
                                    specs[name]["slow_speed"])
            for name in plan["profiles"]["held_out"]}


def fitted_path(name: str) -> Path:
    return FITTED_RUNS.get(name, ACCURACY_DIR / f"{name}_runs.json")


def held_out_path(name: str) -> Path:
    return HELD_OUT_DIR / f"{name}_heldout_runs.json"


def fitted_data(cls, plan: dict[str, Any], record: bool) -> dict[str, Any]:
    """The sync and fitted runs of `cls` that the plan names (recorded first if missing)."""
    keys = fitted_keys(plan)
    path = fitted_path(cls.name)
    if record and cls.name not in ("mlp-digits", "cnn-digits", "logreg-tabular"):
        from calibration.fit_accuracy import simulated_profiles

        profiles = None if path.exists() else {
            k: v for k, v in simulated_profiles().items() if k in plan["profiles"]["fitted"]}
        record_runs(cls, keys, path, profiles, cls.task(), [], plan["seeds"]["sync"],
                    plan_file=PLAN_FILE)
    data = json.loads(path.read_text())
    runs = [r for r in data["runs"] if same_setting(r, cls) and key_of(r) in set(keys)]
    missing = set(keys) - {key_of(r) for r in runs}
    if missing:
        raise PerfmodelError(f"{cls.name}: {len(missing)} fitted runs are not in {rel(path)}")
    return dict(data, runs=runs)


def same_setting(run: dict[str, Any], cls) -> bool:
    return (np.isclose(run["lr"], cls.lr) and int(run["updates"]) == cls.budget_updates
            and run["optimizer"] == cls.optimizer)


def held_out_data(cls, plan: dict[str, Any], record: bool, progress=print) -> dict[str, Any]:
    path = held_out_path(cls.name)
    profiles = None if path.exists() else held_out_profiles(plan)
    if record:
        return record_runs(cls, held_out_keys(plan), path, profiles, cls.task(),
                           progress=progress, plan_file=PLAN_FILE)
    return json.loads(path.read_text()) if path.exists() else {"profiles": profiles,
                                                                "runs": []}


def verdict(rows: list[dict[str, Any]], rules: dict[str, Any], planned: int,
            recorded: int) -> dict[str, Any]:
    """The plan's rules over one class's groups; no verdict before every run is recorded."""
    stable = [r["abs_error_points"] for r in rows if r["stable_group"]]
    median = float(np.median(stable)) if stable else None
    right = float(np.mean([r["stability_right"] for r in rows])) if rows else 0.0
    bound = rules["median_abs_error_points_max"]
    for r in rows:
        ok = r["stability_right"] and (not r["stable_group"] or r["abs_error_points"] <= bound)
        r["result"] = "pass" if ok else "miss"
        r["standard_error_points"] = r["seed_sd_points"] / np.sqrt(r["seeds"])
    complete = recorded == planned
    passed = (complete and len(stable) >= rules["min_stable_groups"]
              and median is not None and median <= bound
              and right >= rules["stability_right_fraction_min"])
    return {"runs_planned": planned, "runs_recorded": recorded, "complete": complete,
            "groups": len(rows), "stable_groups": len(stable),
            "median_abs_error_points": median, "stability_right_fraction": right,
            "passed": bool(passed)}


def check_class(name: str, plan: dict[str, Any], record: bool, progress=print
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from measure.staleness_classes import workload_class

    cls = workload_class(name)
    fitted = fitted_data(cls, plan, record)
    held = held_out_data(cls, plan, record, progress)
    keys = set(held_out_keys(plan))
    runs = [r for r in held["runs"] if key_of(r) in keys]
    sync = [r for r in fitted["runs"] if r["profile"] == "sync"]
    data = {"profiles": held["profiles"], "runs": sync + runs}
    held_out = list(plan["profiles"]["held_out"])
    if name == "mlp-digits":
        model = load_accuracy_model("mlp")
    else:
        model = fit_and_write(cls, fitted, plan, None)
    rows = held_out_rows(data, model, cls.optimizer, cls.lr, cls.budget_updates, held_out,
                         is_unstable=accuracy_unstable)
    summary = verdict(rows, plan["rules"], len(keys), len(runs))
    if name != "mlp-digits" and summary["complete"]:
        fit_and_write(cls, fitted, plan, (rows, summary))
    return rows, summary


def fit_and_write(cls, fitted: dict[str, Any], plan: dict[str, Any], check):
    """Fit `cls` on its sync and fitted runs under the v2 rule; write its TOML with `check`."""
    setting = fit_setting(fitted, set(plan["profiles"]["fitted"]), cls.optimizer, cls.lr,
                          cls.budget_updates, is_unstable=accuracy_unstable)
    out = ACCURACY_DIR / f"{cls.workload}.toml"
    prov = {**fitted["provenance"], "date": now(), "command": COMMAND,
            "runs_recorded": fitted["provenance"]["date"], "runs": len(fitted["runs"]),
            "fitted_profiles": list(plan["profiles"]["fitted"]),
            "held_out_profiles": list(plan["profiles"]["held_out"]),
            "stability_rule": "calibration/fit_accuracy.py accuracy_unstable (plan v2)",
            "noise_scale": "measure/noise_scale.py every 20 updates of the synchronous runs, "
                           "16 batches of 16",
            "plan": rel(PLAN_FILE), "runs_file": rel(fitted_path(cls.name)),
            "held_out_runs_file": rel(held_out_path(cls.name))}
    text = model_toml(workload=cls.workload, data_set=cls.data_set,
                      caveat=f"fitted on {cls.description} only", chance=1.0 / classes_of(cls),
                      batch=64, target=target_of(setting["sync_observed"]), setting=setting,
                      prov=prov, check=check,
                      header=f"The accuracy cost of staleness for {cls.name}, fitted by "
                             f"`{COMMAND} {cls.name}` under accuracy_plan_v2.toml.")
    model = parse_accuracy_model(tomllib.loads(text), out)
    if check is not None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, out)
    return model


def write_check(results: dict[str, tuple[list[dict], dict]], plan: dict[str, Any],
                path: Path = CHECK_FILE, *, title: str = "The second held-out accuracy check, "
                "accuracy_plan_v2.toml", command: str = COMMAND, legend: tuple[str, ...] = ()
                ) -> None:
    """Every group of every class given, misses included; classes already there are kept."""
    old = tomllib.loads(path.read_text()).get("classes", {}) if path.is_file() else {}
    blocks = {name: (summary.pop("held_out", []), summary) for name, summary in old.items()
              if name not in results}
    blocks.update({name: (rows, dict(summary, date=now()))
                   for name, (rows, summary) in results.items()})
    order = [c["name"] for c in plan["classes"]]
    lines = [f"# {title} as run by",
             f"# `{command}`: every group of every class, misses included.",
             "# penalty = synchronous mean accuracy - accuracy at the class's budget, in "
             "points; seed_sd_points = SD over the",
             "# group's seeds; standard_error_points = seed_sd / sqrt(seeds); risk = the "
             "model's flag (near is never an exemption).",
             *(f"# {line}" for line in legend),
             f"date = {toml_value(now())}",
             f"classes_run = {toml_value([n for n in order if n in blocks])}",
             f"classes_not_run = {toml_value([n for n in order if n not in blocks])}", ""]
    for name in [n for n in order if n in blocks]:
        rows, summary = blocks[name]
        lines += [f"[classes.{toml_value(name)}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in summary.items() if v is not None]
        for r in rows:
            lines += [f"[[classes.{toml_value(name)}.held_out]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in r.items()]
        lines += [""]
    path.write_text("\n".join(lines))


def group_line(name: str, r: dict[str, Any], beside: str = "") -> str:
    """One checked group as the drivers print it; `beside` follows the prediction."""
    return (f"{name} {r['profile']:>11} {r['mitigation']:>15}: predicted "
            f"{r['predicted_penalty_points']:5.1f}{beside} observed "
            f"{r['observed_penalty_points']:5.1f} ± {r['seed_sd_points']:4.1f} "
            f"(n={r['seeds']}); unstable predicted {r['predicted_unstable']} "
            f"({r['risk']}) observed {r['observed_unstable']} "
            f"({r['unstable_seeds']}/{r['seeds']}): {r['result']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.splitlines()[0],
        epilog="examples:\n"
               f"  nice -n 19 {COMMAND} --write-check logreg-tabular cnn-digits\n"
               f"  {COMMAND} --fit-only --write-check mlp-digits   # recorded runs only\n")
    parser.add_argument("classes", nargs="+", metavar="CLASS")
    parser.add_argument("--fit-only", action="store_true",
                        help="no new runs: check on what is recorded")
    parser.add_argument("--write-check", action="store_true",
                        help="write the classes given into "
                             "perfmodel/data/heldout/accuracy_check_v2.toml")
    args = parser.parse_args(argv)
    plan = load_plan()
    known = [c["name"] for c in plan["classes"]]
    unknown = [n for n in args.classes if n not in known]
    if unknown:
        raise PerfmodelError(f"not a class of the v2 plan: {', '.join(unknown)}; "
                             f"the plan's: {', '.join(known)}")
    results = {}
    for name in args.classes:
        rows, summary = check_class(name, plan, not args.fit_only)
        results[name] = (rows, summary)
        for r in rows:
            print(group_line(name, r))
        print(f"{name}: {summary}")
    if args.write_check:
        write_check(results, plan)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PerfmodelError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
