"""Issue 16's held-out accuracy check: harness runs, fit and check per workload class.

Everything comes from perfmodel/data/heldout/accuracy_plan.toml, committed before any of its
runs: the classes (measure/staleness_classes.py builds them), which simulated staleness
profiles are fitted and which held out, the mitigations, the seeds and the pass rules. Per
class (resumable: runs already recorded are not repeated; one torch thread):

1. Profiles: calibration/fit_accuracy.py's simulated async-ps profiles (a100/resnet50, batch
   64, 40 steps per worker, seed 0; het = last quarter at 0.25).
2. Runs (measure/staleness_harness.py): synchronous (τ = 0) with the plan's sync seeds; every
   fitted profile x mitigation with the fitted seeds; every held-out profile x mitigation with
   the held-out seeds; the gradient noise scale along the synchronous runs. Written to
   perfmodel/data/accuracy/<class>_runs.json. The mlp-digits class reuses the runs of
   mlp_runs.json that the plan names (same protocol, same seeds) and records only the missing
   ones, in mlp-digits_runs.json.
3. Fit (calibration/fit_accuracy.py's fitters, on the synchronous and fitted-profile runs
   only): learning curve, β per mitigation and κ, the instability threshold, seed spread, noise
   scale; written to perfmodel/data/accuracy/<workload>.toml. mlp-digits is not refitted: its
   model is the shipped mlp.toml (lr 0.05 setting), as the plan says.
4. The held-out check, by the plan's rules, on every (held-out profile, mitigation) group:
   observed penalty = mean over seeds of (synchronous mean accuracy − accuracy) at the
   budget; observed unstable = unstable in at least half of its seeds; a class passes when the
   median absolute error over its stable groups (predicted and observed stable) is at most
   the plan's bound and stability is right for at least the plan's fraction of its groups.
   Every group goes into the class's TOML [check] (not for mlp-digits: mlp.toml is not
   rewritten) and, with --write-check, into perfmodel/data/heldout/accuracy_check.toml
   (the classes already there are kept).

Usage: python -m calibration.fit_accuracy_classes [--fit-only] [--write-check] CLASS [...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit_accuracy import (
    REPO,
    fit_curve,
    fit_threshold,
    fit_worth,
    noise_scale_of,
    observed,
    profile_values,
    seed_spread,
    settings_lines,
    unstable,
)
from calibration.fit_accuracy import _toml_value as toml_value
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import (
    ACCURACY_DIR,
    MITIGATIONS,
    OPTIMIZER_MOMENTUM,
    AccuracyModel,
    instability,
    load_accuracy_model,
    parse_accuracy_model,
)
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml

PLAN_FILE = REPO / "perfmodel" / "data" / "heldout" / "accuracy_plan.toml"
CHECK_FILE = REPO / "perfmodel" / "data" / "heldout" / "accuracy_check.toml"
COMMAND = "python -m calibration.fit_accuracy_classes"
NOISE_EVERY = 20
TARGET_BELOW_SYNC = 0.02    # default target: 2 points under the synchronous plateau, floored
MLP_RUNS = ACCURACY_DIR / "mlp_runs.json"


def load_plan(path: Path = PLAN_FILE) -> dict[str, Any]:
    return load_toml(path)


def runs_path(name: str) -> Path:
    return ACCURACY_DIR / f"{name}_runs.json"


Key = tuple[str, str, int]          # (profile, mitigation, seed); profile "sync" for τ = 0


def planned_keys(plan: dict[str, Any]) -> list[Key]:
    """Every run the plan asks for, per class, in a fixed order."""
    seeds, prof = plan["seeds"], plan["profiles"]
    keys: list[Key] = [("sync", "none", s) for s in seeds["sync"]]
    keys += [(p, m, s) for p in prof["fitted"] for m in prof["mitigations"]
             for s in seeds["fitted"]]
    keys += [(p, m, s) for p in prof["held_out"] for m in prof["mitigations"]
             for s in seeds["held_out"]]
    return keys


def key_of(run: dict[str, Any]) -> Key:
    return run["profile"], run["mitigation"], int(run["seed"])


# ---------------------------------------------------------------- runs (torch)


def run_one(cls, task, key: Key, profiles: dict[str, Any]) -> dict[str, Any]:
    """One harness run of `cls` (a WorkloadClass-like: config()) on `task`."""
    from measure.staleness_harness import run_harness

    profile, mitigation, seed = key
    taus = [0] if profile == "sync" else profile_values(profiles[profile])
    config = cls.config(mitigation=mitigation, seed=seed)
    start = time.perf_counter()
    result = run_harness(taus, config, task)
    return {"class": cls.name, "optimizer": config.optimizer, "lr": config.lr,
            "warmup_updates": config.warmup_updates, "profile": profile,
            "mitigation": mitigation, "seed": seed, "updates": config.updates,
            "eval_every": config.eval_every,
            "mean_staleness": round(float(np.mean(result.staleness)), 4),
            "eval_updates": list(result.eval_updates),
            "accuracy": [round(a, 5) for a in result.accuracy],
            "loss": [None if not np.isfinite(v) else round(v, 5) for v in result.loss],
            "diverged": result.diverged, "wall_s": round(time.perf_counter() - start, 2)}


def record_runs(cls, keys: list[Key], path: Path, profiles: dict[str, Any], task=None,
                seed_runs: list[dict[str, Any]] | None = None, noise_seeds=(),
                progress=print, plan_file: Path = PLAN_FILE) -> dict[str, Any]:
    """Run every key missing from `path` (saving after each), then the noise scale."""
    import torch

    from measure.noise_scale import noise_scale_run

    torch.set_num_threads(1)
    data = json.loads(path.read_text()) if path.exists() else {}
    if "runs" not in data:
        data = {"provenance": {}, "profiles": profiles, "runs": list(seed_runs or [])}
    done = {key_of(r) for r in data["runs"]}
    todo = [k for k in keys if k not in done]
    for i, key in enumerate(todo):
        run = run_one(cls, task, key, data["profiles"])
        data["runs"].append(run)
        data["provenance"] = provenance(cls, len(data["runs"]), plan_file)
        write_json(path, data)
        progress(f"{cls.name} [{i + 1}/{len(todo)}] {key[0]} {key[1]} seed {key[2]}: "
                 f"accuracy {run['accuracy'][-1]:.3f} in {run['wall_s']:.1f} s")
    measured = {int(r["seed"]) for r in data.get("noise_scale", [])}
    for seed in noise_seeds:
        if seed in measured:
            continue
        points = noise_scale_run(cls.config(seed=seed), NOISE_EVERY, task)
        data.setdefault("noise_scale", []).append({
            "optimizer": cls.optimizer, "lr": cls.lr, "updates": cls.budget_updates,
            "seed": seed, "every": NOISE_EVERY, "micro_batches": 16, "micro_batch_size": 16,
            "points": [[p.updates, p.trace_sigma, p.grad_sq] for p in points]})
        write_json(path, data)
        progress(f"{cls.name} noise scale seed {seed}: "
                 f"{noise_scale_of(data['noise_scale'][-1:]):.1f} samples")
    return data


def provenance(cls, runs: int, plan_file: Path = PLAN_FILE) -> dict[str, Any]:
    import torch

    return {"date": now(), "command": COMMAND, "class": cls.name,
            "torch_version": torch.__version__, "python_version": platform.python_version(),
            "threads": 1, "runs": runs, "optimizer": cls.optimizer, "lr": cls.lr,
            "warmup_updates": cls.warmup_updates, "budget_updates": cls.budget_updates,
            "eval_every": cls.eval_every, "plan": rel(plan_file)}


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def mlp_seed_runs(keys: list[Key]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """mlp_runs.json's profiles and its lr 0.05 runs that the plan names."""
    data = json.loads(MLP_RUNS.read_text())
    wanted = set(keys)
    runs = [dict(r, source="mlp_runs.json") for r in data["runs"]
            if np.isclose(r["lr"], 0.05) and r["updates"] == 200 and key_of(r) in wanted]
    return data["profiles"], runs


# ---------------------------------------------------------------- fit (no torch)


def fit_setting(data: dict[str, Any], fitted: set[str], optimizer: str, lr: float,
                updates: int, is_unstable=unstable, measured_curve: bool = False
                ) -> dict[str, Any]:
    """calibration/fit_accuracy.py's fit of one setting, on the sync and `fitted` runs;
    `is_unstable` is the plan's stability rule (v1: unstable; v2: accuracy_unstable);
    `measured_curve` keeps the synchronous runs' mean curve (v3)."""
    runs, profiles = data["runs"], data["profiles"]
    sync = [r for r in runs if r["profile"] == "sync"]
    if len(sync) < 2:
        raise PerfmodelError("the fit needs at least 2 synchronous runs")
    curve = fit_curve(sync, measured=measured_curve)
    momentum = OPTIMIZER_MOMENTUM[optimizer]
    fitting = [r for r in runs if r["profile"] in fitted]
    points = [(instability(np.zeros(1), lr, momentum, "none"), is_unstable(r)) for r in sync]
    beta, residuals, kappa = {}, [], 1.0
    for mitigation in MITIGATIONS:
        mine = [r for r in fitting if r["mitigation"] == mitigation]
        points += [(instability(profile_values(profiles[r["profile"]]), lr, momentum,
                                mitigation), is_unstable(r)) for r in mine]
        stable = [r for r in mine if not is_unstable(r)]
        beta[mitigation], k, rms = fit_worth(stable, curve, profiles, lr, mitigation)
        kappa = k if mitigation == "staleness-aware" and stable else kappa
        residuals += [rms] * len(stable)
    fallback = {"none": ("staleness-aware", "dc"), "dc": ("none", "staleness-aware"),
                "staleness-aware": ("none", "dc")}
    for mitigation in MITIGATIONS:      # no stable run: the worth of the nearest kind, else 1
        if not np.isfinite(beta[mitigation]):
            beta[mitigation] = next((beta[m] for m in fallback[mitigation]
                                     if np.isfinite(beta[m])), 1.0)
    spread = seed_spread(sync)
    fit_rms = float(np.sqrt(np.mean(np.square(residuals)))) if residuals else 0.0
    return {"optimizer": optimizer, "lr": lr, "budget_updates": updates, "curve": curve,
            "beta": beta, "rate_exponent": kappa, "seed_sd": spread, "fit_rms": fit_rms,
            "band": 2.0 * float(np.hypot(spread, fit_rms)),
            "sync_observed": float(np.mean([observed(r, updates) for r in sync])),
            "noise": data.get("noise_scale", []), "instability": fit_threshold(points)}


def held_out_rows(data: dict[str, Any], model: AccuracyModel, optimizer: str, lr: float,
                  updates: int, held_out: list[str], is_unstable=unstable
                  ) -> list[dict[str, Any]]:
    """Every (held-out profile, mitigation) group: predicted against observed, by the plan."""
    runs = data["runs"]
    sync = float(np.mean([observed(r, updates) for r in runs if r["profile"] == "sync"]))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r["profile"] in held_out:
            groups.setdefault((r["profile"], r["mitigation"]), []).append(r)
    rows = []
    for (profile, mitigation), mine in sorted(groups.items(),
                                              key=lambda g: (g[0][1], held_out.index(g[0][0]))):
        cost = staleness_cost(profile_values(data["profiles"][profile]), mitigation=mitigation,
                              updates=updates, optimizer=optimizer, lr=lr, model=model)
        seen = [observed(r, updates) for r in mine]
        predicted_unstable = cost.divergence_risk == "unstable"
        observed_unstable = 2 * sum(is_unstable(r) for r in mine) >= len(mine)
        error = cost.penalty_points - 100.0 * (sync - np.mean(seen))
        rows.append({
            "profile": profile, "mitigation": mitigation, "seeds": len(mine),
            "mean_staleness": cost.mean_staleness,
            "predicted_penalty_points": cost.penalty_points,
            "observed_penalty_points": float(100.0 * (sync - np.mean(seen))),
            "seed_sd_points": float(100.0 * np.std(seen, ddof=1)) if len(seen) > 1 else 0.0,
            "instability": cost.instability, "threshold": cost.divergence_threshold,
            "risk": cost.divergence_risk, "unstable_seeds": int(sum(map(is_unstable, mine))),
            "abs_error_points": float(abs(error)),
            "predicted_unstable": predicted_unstable, "observed_unstable": observed_unstable,
            "stable_group": not (predicted_unstable or observed_unstable),
            "stability_right": predicted_unstable == observed_unstable})
    return rows


def verdict(rows: list[dict[str, Any]], rules: dict[str, Any]) -> dict[str, Any]:
    """The plan's pass rules over one class's groups."""
    stable = [r["abs_error_points"] for r in rows if r["stable_group"]]
    median = float(np.median(stable)) if stable else None
    right = float(np.mean([r["stability_right"] for r in rows])) if rows else 0.0
    error_ok = median is None or median <= rules["median_abs_error_points_max"]
    right_ok = right >= rules["stability_right_fraction_min"]
    for r in rows:
        ok = r["stability_right"] and (not r["stable_group"] or r["abs_error_points"]
                                       <= rules["median_abs_error_points_max"])
        r["result"] = "pass" if ok else "miss"
    return {"groups": len(rows), "stable_groups": len(stable),
            "median_abs_error_points": median, "stability_right_fraction": right,
            "passed": bool(error_ok and right_ok)}


def target_of(sync_observed: float) -> float:
    return float(np.floor(100.0 * (sync_observed - TARGET_BELOW_SYNC)) / 100.0)


def model_toml(*, workload: str, data_set: str, caveat: str, chance: float, batch: int,
               target: float, setting: dict[str, Any], prov: dict[str, Any],
               check: tuple[list[dict[str, Any]], dict[str, Any]] | None,
               header: str) -> str:
    s = setting
    lines = [f"# {header}", "# Model: perfmodel/accuracy/model.py. Regenerate; do not edit.",
             f"workload = {toml_value(workload)}", f"data_set = {toml_value(data_set)}",
             f"caveat = {toml_value(caveat)}", f"chance_accuracy = {chance!r}",
             f"batch_size = {batch}", f"target_accuracy = {target!r}",
             f'default_optimizer = "{s["optimizer"]}"', f"default_lr = {s['lr']!r}", "",
             "[provenance]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in prov.items()]
    lines += settings_lines(s)
    scale = noise_scale_of(s["noise"]) if s["noise"] else float("nan")
    if np.isfinite(scale) and scale > 0:
        lines += ["# gradient noise scale tr(Σ)/|G|² in samples (McCandlish et al. 2018)",
                  f"noise_scale_samples = {scale!r}"]
    lines += ["beta = { " + ", ".join(f'"{m}" = {b!r}' for m, b in s["beta"].items()) + " }",
              "# instability index x = mean(lr_applied * (2 tau + 1)) / (1 - momentum)",
              "[settings.instability]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in s["instability"].items()
              if not isinstance(v, float) or np.isfinite(v)]     # no unstable run: no inf
    if check:
        rows, summary = check
        lines += ["", "[check]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in summary.items() if v is not None]
        for r in rows:
            lines += ["", "[[check.held_out]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in r.items()]
    return "\n".join(lines) + "\n"


def fit_and_write(cls, data: dict[str, Any], plan: dict[str, Any], runs_file: Path,
                  out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fit `cls` on its sync and fitted runs, write `out`, run the held-out check on it."""
    fitted = set(plan["profiles"]["fitted"])
    setting = fit_setting(data, fitted, cls.optimizer, cls.lr, cls.budget_updates)
    chance = 1.0 / classes_of(cls)
    prov = {**data["provenance"], "date": now(), "runs_recorded": data["provenance"]["date"],
            "runs": len(data["runs"]), "fitted_profiles": sorted(fitted),
            "held_out_profiles": list(plan["profiles"]["held_out"]),
            "noise_scale": f"measure/noise_scale.py every {NOISE_EVERY} updates of the "
                           "synchronous runs, 16 batches of 16",
            "runs_file": rel(runs_file)}
    kwargs = dict(workload=cls.workload, data_set=cls.data_set,
                  caveat=f"fitted on {cls.description} only", chance=chance, batch=64,
                  target=target_of(setting["sync_observed"]), setting=setting, prov=prov,
                  header=f"The accuracy cost of staleness for {cls.name}, fitted by "
                         f"`{COMMAND} {cls.name}` from {runs_file.name}.")
    model = parse_accuracy_model(tomllib.loads(model_toml(check=None, **kwargs)), out)
    rows = held_out_rows(data, model, cls.optimizer, cls.lr, cls.budget_updates,
                         list(plan["profiles"]["held_out"]))
    summary = verdict(rows, plan["rules"])
    text = model_toml(check=(rows, summary), **kwargs)
    parse_accuracy_model(tomllib.loads(text), out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    return rows, summary


def classes_of(cls) -> int:
    task = cls.task()
    return 10 if task is None else task.classes


def rel(path: Path) -> str:
    p = path.resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(path)


def check_mlp(data: dict[str, Any], plan: dict[str, Any], cls
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """mlp-digits: the shipped mlp.toml (not refitted) against the plan's runs."""
    model = load_accuracy_model("mlp")
    rows = held_out_rows(data, model, cls.optimizer, cls.lr, cls.budget_updates,
                         list(plan["profiles"]["held_out"]))
    return rows, verdict(rows, plan["rules"])


def write_check(results: dict[str, tuple[list[dict], dict]], plan: dict[str, Any],
                path: Path = CHECK_FILE) -> None:
    """Every group of every class run, in one file beside the plan: per class its verdict
    and its groups as [[classes."NAME".held_out]] tables (as a class TOML's
    [[check.held_out]]). Classes already in the file and not in `results` are kept as they
    were (each with the date it was checked), so one class can be checked at a time."""
    now_date = now()
    kept = {}
    if path.is_file():
        old = tomllib.loads(path.read_text())
        kept = {name: (summary.pop("held_out", []), summary, summary.pop("date", old["date"]))
                for name, summary in old.get("classes", {}).items() if name not in results}
    blocks = {**{name: (groups, summary, date) for name, (groups, summary, date)
                 in kept.items()},
              **{name: (rows, dict(summary), now_date) for name, (rows, summary)
                 in results.items()}}
    order = [c["name"] for c in plan["classes"]]
    done = list(blocks)         # those kept in their order, then the ones just checked
    lines = ["# The held-out accuracy check of perfmodel/data/heldout/accuracy_plan.toml, as "
             "run by", f"# `{COMMAND}`: every group of every class run, misses included.",
             "# penalty = synchronous mean accuracy - accuracy at the class's budget, in "
             "points;", "# seed_sd_points = SD of the group's accuracy over its seeds.",
             f"date = {toml_value(now_date)}", f"classes_run = {toml_value(done)}",
             f"classes_not_run = {toml_value([n for n in order if n not in blocks])}", ""]
    for name in done:
        rows, summary, date = blocks[name]
        lines += [f"[classes.{toml_value(name)}]", f"date = {toml_value(date)}"]
        lines += [f"{k} = {toml_value(v)}" for k, v in summary.items() if v is not None]
        for r in rows:
            lines += [f"[[classes.{toml_value(name)}.held_out]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in r.items()]
        lines += [""]
    path.write_text("\n".join(lines))


def run_class(name: str, plan: dict[str, Any], fit_only: bool,
              progress=print) -> tuple[list[dict], dict]:
    from measure.staleness_classes import workload_class

    cls = workload_class(name)
    keys = planned_keys(plan)
    path = runs_path(name)
    if name == "mlp-digits":
        profiles, seed_runs = mlp_seed_runs(keys)
    else:
        from calibration.fit_accuracy import simulated_profiles

        seed_runs = []
        profiles = None if path.exists() else simulated_profiles()
    if fit_only:
        data = json.loads(path.read_text())
    else:
        data = record_runs(cls, keys, path, profiles, cls.task(), seed_runs,
                           () if name == "mlp-digits" else plan["seeds"]["sync"], progress)
    missing = set(keys) - {key_of(r) for r in data["runs"]}
    if missing:
        raise PerfmodelError(f"{name}: {len(missing)} planned runs are not recorded in {path}")
    data = dict(data, runs=[r for r in data["runs"] if key_of(r) in set(keys)])
    if name == "mlp-digits":
        return check_mlp(data, plan, cls)
    return fit_and_write(cls, data, plan, path, ACCURACY_DIR / f"{cls.workload}.toml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.splitlines()[0],
        epilog="examples:\n"
               f"  {COMMAND} cnn-digits logreg-tabular      # run, fit and check\n"
               f"  {COMMAND} --fit-only cnn-digits          # refit from recorded runs\n")
    parser.add_argument("classes", nargs="+", metavar="CLASS")
    parser.add_argument("--fit-only", action="store_true")
    parser.add_argument("--write-check", action="store_true",
                        help="also write the classes given into "
                             "perfmodel/data/heldout/accuracy_check.toml (classes already "
                             "there and not given are kept)")
    args = parser.parse_args(argv)
    plan = load_plan()
    results = {}
    for name in args.classes:
        rows, summary = run_class(name, plan, args.fit_only)
        results[name] = (rows, summary)
        for r in rows:
            print(f"{name} {r['profile']:>8} {r['mitigation']:>15}: predicted "
                  f"{r['predicted_penalty_points']:5.1f} observed "
                  f"{r['observed_penalty_points']:5.1f} ± {r['seed_sd_points']:4.1f} "
                  f"(n={r['seeds']}); unstable predicted {r['predicted_unstable']} observed "
                  f"{r['observed_unstable']}: {r['result']}")
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
