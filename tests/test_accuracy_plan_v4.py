"""accuracy_plan_v4.toml, the fourth held-out accuracy check, as its driver reads it.

Checked before any v4 run: the plan keeps v3's rules and classes; every group gets the same
sixteen seeds, seed-major; no v4 held-out profile, worker count or straggler speed was used by
v1-v3; the fit data of every class is every earlier run once (v3's held-out runs included)
and no v4 one; the driver's round writes where the plan says and keeps v3's fit of mlp-digits
as the model before v4.
"""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from calibration import accuracy_check_v2 as v2
from calibration import accuracy_check_v3 as v3
from calibration.accuracy_check_v4 import V4
from calibration.fit_accuracy import PROFILE_WORKERS, STRAGGLER_SPEED, straggler_mix
from calibration.fit_accuracy_classes import load_plan as load_v1_plan
from perfmodel.accuracy.model import ACCURACY_DIR

NAMES = ["mlp-digits", "cnn-digits", "logreg-tabular", "transformer-pointer"]


@pytest.fixture(scope="module")
def plan():
    return v3.load_plan(V4.plan_file)


def test_plan_keeps_v3s_rules_and_classes(plan):
    old = v3.load_plan()
    assert plan["rules"]["median_abs_error_points_max"] == 3.0
    for key in ("median_abs_error_points_max", "stability_right_fraction_min",
                "min_stable_groups", "observed_unstable_run", "observed_unstable_group",
                "predicted_unstable", "stable_group"):
        assert plan["rules"][key] == old["rules"][key]
    assert [c["name"] for c in plan["classes"]] == NAMES
    assert plan["fit"]["curve"] == old["fit"]["curve"]
    assert plan["fit"]["synchronous_seeds"] == old["fit"]["synchronous_seeds"]


def test_every_group_has_the_same_sixteen_seeds_seed_major(plan):
    keys = v2.held_out_keys(plan)
    groups: dict[tuple[str, str], list[int]] = {}
    for profile, mitigation, seed in keys:
        groups.setdefault((profile, mitigation), []).append(seed)
    assert len(groups) == 10 and len(keys) == len(set(keys)) == 160
    assert all(seeds == list(range(40, 56)) for seeds in groups.values())
    assert {k[2] for k in keys[:len(groups)]} == {40}
    earlier = set(v3.load_plan()["seeds"]["held_out"]) | set(v2.load_plan()["seeds"]["held_out"])
    assert not earlier & set(plan["seeds"]["held_out"])


def test_held_out_profiles_are_new_to_v1_v2_and_v3(plan):
    v1, old2, old3 = load_v1_plan()["profiles"], v2.load_plan()["profiles"], \
        v3.load_plan()["profiles"]
    used = set(v1["fitted"]) | set(v1["held_out"]) | set(old2["held_out"]) | set(
        old3["held_out"])
    counts = (set(PROFILE_WORKERS) | {old2["specs"][p]["workers"] for p in old2["held_out"]}
              | {old3["specs"][p]["workers"] for p in old3["held_out"]})
    speeds = {STRAGGLER_SPEED, 0.5} | {old3["specs"][p]["slow_speed"] for p in old3["held_out"]}
    for name in plan["profiles"]["held_out"]:
        spec = plan["profiles"]["specs"][name]
        assert name not in used and spec["workers"] not in counts
        assert spec["slow_workers"] == 0 or spec["slow_speed"] not in speeds
        assert len(straggler_mix(spec["workers"], spec["slow_workers"],
                                 spec["slow_speed"])) == spec["workers"]


@pytest.mark.parametrize("name", NAMES)
def test_fit_data_is_every_earlier_run_once_v3s_included(plan, name):
    from measure.staleness_classes import workload_class

    data = v3.fit_data(workload_class(name), plan)
    keys = [(r["profile"], r["mitigation"], r["seed"]) for r in data["runs"]]
    assert len(keys) == len(set(keys))
    assert not {k[0] for k in keys} & set(plan["profiles"]["held_out"])
    assert set(v3.load_plan()["profiles"]["held_out"]) <= {k[0] for k in keys}
    assert sorted(k[2] for k in keys if k[0] == "sync") == plan["fit"]["synchronous_seeds"]
    assert len(keys) > len(v3.fit_data(workload_class(name), v3.load_plan())["runs"])


def test_the_round_writes_where_the_plan_says(plan):
    assert V4.plan_file.name == "accuracy_plan_v4.toml"
    assert V4.check_file.name == tomllib.loads(V4.plan_file.read_text())["results"].split("/")[-1]
    assert V4.held_out_dir == ACCURACY_DIR / "v4"
    assert V4.command == plan["driver"]
    assert v3.model_path(plan, "mlp-digits") == ACCURACY_DIR / "v4" / "mlp-digits.toml"
    assert V4.before["mlp-digits"].is_file()
    assert v3.held_out_path("cnn-digits", V4) == ACCURACY_DIR / "v4" / \
        "cnn-digits_heldout_runs.json"


def test_committed_v4_check_has_every_group_of_every_class(plan):
    data = tomllib.loads(V4.check_file.read_text())
    assert data["classes_run"] == NAMES and data["classes_not_run"] == []
    for name in NAMES:
        summary = data["classes"][name]
        assert summary["groups"] == len(summary["held_out"]) == 10
        assert summary["runs_recorded"] == summary["runs_planned"] == 160
        for row in summary["held_out"]:
            assert row["seeds"] == 16 and row["result"] in ("pass", "miss")
            assert row["zero_penalty_abs_error_points"] == abs(row["observed_penalty_points"])
            assert "before_v4_predicted_penalty_points" in row
        stable = [r["abs_error_points"] for r in summary["held_out"] if r["stable_group"]]
        right = np.mean([r["stability_right"] for r in summary["held_out"]])
        assert summary["passed"] == (bool(stable) and float(np.median(stable)) <= 3.0
                                     and right >= 0.9)


@pytest.mark.parametrize("name", NAMES)
def test_v4s_fits_ship_or_are_kept_with_its_check(plan, name):
    """The shipped model of each class is v4's fit, except cnn-digits, refitted by v5 (its
    v4 fit is kept as v5/cnn-digits_before.toml)."""
    from calibration.accuracy_check_v5 import V5
    from perfmodel.accuracy.model import load_accuracy_model

    path = (V5.held_out_dir / f"{name}_before.toml" if name == "cnn-digits"
            else v3.model_path(plan, name))
    model = load_accuracy_model(path=path)
    assert model.settings[0].curve.measured
    assert model.provenance["plan"] == "perfmodel/data/heldout/accuracy_plan_v4.toml"
    check = tomllib.loads(path.read_text())["check"]
    committed = tomllib.loads(V4.check_file.read_text())["classes"][name]
    assert check["passed"] == committed["passed"]
    assert check["median_abs_error_points"] == pytest.approx(committed["median_abs_error_points"])
