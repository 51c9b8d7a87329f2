"""accuracy_plan_v2.toml, the second held-out accuracy check, and the rules it freezes.

Checked: the plan parses; every held-out group gets the same seeds, in seed-major order; no
v2 held-out profile appears among v1's fitted or held-out profiles (nor its worker count and
straggler mix among v1's); every held-out profile has a spec the profile builder accepts; the
accuracy-based stability rule tells a linear model's loss blow-up from a collapse (and, on
the recorded fitted runs, changes exactly the logreg verdicts it was made for); a class gets
no verdict before every planned run is recorded, nor a pass without a stable group.
"""

from __future__ import annotations

import json
import tomllib

import pytest

from calibration.accuracy_check_v2 import PLAN_FILE, held_out_keys, load_plan, verdict
from calibration.fit_accuracy import (
    PROFILE_WORKERS,
    STRAGGLER_SPEED,
    accuracy_unstable,
    straggler_mix,
    unstable,
)
from calibration.fit_accuracy_classes import load_plan as load_v1_plan
from perfmodel.accuracy.model import ACCURACY_DIR
from perfmodel.errors import PerfmodelError


@pytest.fixture(scope="module")
def plan():
    return load_plan()


def test_plan_parses_and_names_its_rules(plan):
    assert tomllib.loads(PLAN_FILE.read_text()) == plan
    rules = plan["rules"]
    for key in ("observed_unstable_run", "observed_unstable_group", "predicted_unstable",
                "median_abs_error_points_max", "stability_right_fraction_min",
                "min_stable_groups"):
        assert key in rules
    assert "no near-threshold exemption" in rules["predicted_unstable"]


def test_every_group_has_the_same_seeds_seed_major(plan):
    keys = held_out_keys(plan)
    assert len(keys) == len(set(keys))
    groups: dict[tuple[str, str], list[int]] = {}
    for profile, mitigation, seed in keys:
        groups.setdefault((profile, mitigation), []).append(seed)
    assert len(groups) == len(plan["profiles"]["held_out"]) * len(plan["profiles"]["mitigations"])
    assert all(seeds == plan["seeds"]["held_out"] for seeds in groups.values())
    # seed-major: the first len(groups) runs are every group's first seed
    assert {k[2] for k in keys[:len(groups)]} == {plan["seeds"]["held_out"][0]}


def test_held_out_profiles_are_new(plan):
    v1 = load_v1_plan()["profiles"]
    for name in plan["profiles"]["held_out"]:
        assert name not in v1["fitted"] and name not in v1["held_out"]
        spec = plan["profiles"]["specs"][name]
        mix = straggler_mix(spec["workers"], spec["slow_workers"], spec["slow_speed"])
        v1_mixes = {(1.0,) * w for w in PROFILE_WORKERS} | {
            (1.0,) * (w - max(1, w // 4)) + (STRAGGLER_SPEED,) * max(1, w // 4)
            for w in PROFILE_WORKERS}
        assert mix not in v1_mixes
    assert plan["profiles"]["fitted"] == v1["fitted"]      # the fitted runs are v1's


def test_straggler_mix_rejects_bad_input():
    assert straggler_mix(4, 2, 0.5) == (1.0, 1.0, 0.5, 0.5)
    for bad in ((0, 0, 1.0), (4, 5, 0.5), (4, 1, 0.0), (4, 1, 1.5)):
        with pytest.raises(PerfmodelError):
            straggler_mix(*bad)


def _run(accuracy, loss, diverged=False):
    return {"accuracy": accuracy, "loss": loss, "diverged": diverged}


def test_accuracy_rule_keeps_a_linear_models_loss_blowup_stable():
    kept = _run([0.5, 0.95, 0.97, 0.96], [0.7, 0.2, 3.0, 5.0])      # loss x7, accuracy kept
    stuck = _run([0.1, 0.15, 0.12, 0.11], [2.3, 2.2, 9.0, 40.0])    # loss x17, never learned
    collapsed = _run([0.1, 0.9, 0.5, 0.6], [2.3, 0.4, 1.9, 1.5])    # 0.4 drawdown
    diverged = _run([0.1, 0.5, 0.1], [2.3, 1.0, None], diverged=True)
    assert unstable(kept) and not accuracy_unstable(kept)
    assert accuracy_unstable(stuck) and accuracy_unstable(collapsed)
    assert accuracy_unstable(diverged)


@pytest.mark.parametrize("name,changed", [
    ("logreg-tabular", {("homo-16", "none"), ("het-32", "none"), ("homo-64", "none"),
                        ("het-64", "none")}),
    ("cnn-digits", set()), ("transformer-seq", set()), ("mlp", set())])
def test_accuracy_rule_changes_only_the_logreg_fitted_verdicts(plan, name, changed):
    runs = json.loads((ACCURACY_DIR / f"{name}_runs.json").read_text())["runs"]
    fitted = set(plan["profiles"]["fitted"]) | {"sync"}
    seen = {(r["profile"], r["mitigation"]) for r in runs
            if r["profile"] in fitted and unstable(r) != accuracy_unstable(r)}
    assert seen == changed


def _row(stable: bool, error: float, right: bool = True) -> dict:
    return {"stable_group": stable, "abs_error_points": error, "stability_right": right,
            "seed_sd_points": 1.0, "seeds": 5}


def test_no_verdict_before_every_run_nor_a_pass_without_a_stable_group(plan):
    rules = plan["rules"]
    rows = [_row(True, 1.0), _row(False, 40.0)]
    assert verdict(rows, rules, 30, 30)["passed"]
    assert not verdict([dict(r) for r in rows], rules, 30, 29)["passed"]
    assert not verdict([_row(False, 1.0), _row(False, 2.0)], rules, 30, 30)["passed"]
    assert not verdict([_row(True, 4.0), _row(True, 3.5)], rules, 30, 30)["passed"]
    assert not verdict([_row(True, 1.0), _row(False, 1.0, right=False)] * 5, rules, 30,
                       30)["passed"]


def test_committed_v2_check_has_every_group_of_every_class(plan):
    from calibration.accuracy_check_v2 import CHECK_FILE

    data = tomllib.loads(CHECK_FILE.read_text())
    names = [c["name"] for c in plan["classes"]]
    assert data["classes_run"] + data["classes_not_run"] == names
    groups = len(plan["profiles"]["held_out"]) * len(plan["profiles"]["mitigations"])
    for name in data["classes_run"]:
        summary = data["classes"][name]
        assert summary["groups"] == len(summary["held_out"]) == groups
        assert summary["runs_recorded"] <= summary["runs_planned"]
        assert summary["passed"] is False or summary["complete"]
        for row in summary["held_out"]:
            assert row["result"] in ("pass", "miss")
            assert row["seeds"] == len(plan["seeds"]["held_out"]) or not summary["complete"]
