"""accuracy_plan_v5.toml, the fifth held-out accuracy check (cnn-digits alone).

Checked: the plan keeps v4's rules and method; its seed count follows from the seed SDs it
cites (SE <= 1.5 points at SD 15.6); every group gets the same 112 seeds, seed-major, none an
earlier check's; no v5 held-out profile, worker count or straggler speed was used by v1-v4;
the fit data is every earlier cnn-digits run once, v4's included; and, once run, the committed
check has every group.
"""

from __future__ import annotations

import math

import pytest

from calibration import accuracy_check_v2 as v2
from calibration import accuracy_check_v3 as v3
from calibration.accuracy_check_v4 import V4
from calibration.accuracy_check_v5 import V5
from calibration.fit_accuracy import PROFILE_WORKERS, STRAGGLER_SPEED
from calibration.fit_accuracy_classes import load_plan as load_v1_plan


@pytest.fixture(scope="module")
def plan():
    return v3.load_plan(V5.plan_file)


def test_plan_keeps_v4s_rules_for_cnn_alone(plan):
    old = v3.load_plan(V4.plan_file)
    for key in ("median_abs_error_points_max", "stability_right_fraction_min",
                "min_stable_groups", "observed_unstable_run", "observed_unstable_group",
                "predicted_unstable", "stable_group"):
        assert plan["rules"][key] == old["rules"][key]
    assert [c["name"] for c in plan["classes"]] == ["cnn-digits"]
    assert plan["fit"]["curve"] == old["fit"]["curve"]
    assert plan["driver"] == V5.command


def test_seed_count_follows_from_the_cited_seed_sd(plan):
    seeds = plan["seeds"]["held_out"]
    assert len(seeds) >= math.ceil((15.6 / 1.5) ** 2) == 109   # the plan rounds 108.16 to 108
    keys = v2.held_out_keys(plan)
    groups: dict[tuple[str, str], list[int]] = {}
    for profile, mitigation, seed in keys:
        groups.setdefault((profile, mitigation), []).append(seed)
    assert len(groups) == 10 and all(s == seeds for s in groups.values())
    assert {k[2] for k in keys[:len(groups)]} == {seeds[0]}
    earlier = set()
    for p in (v2.load_plan(), v3.load_plan(), v3.load_plan(V4.plan_file)):
        earlier |= set(p["seeds"]["held_out"])
    assert not earlier & set(seeds)


def test_held_out_profiles_are_new_to_every_earlier_check(plan):
    plans = [v2.load_plan(), v3.load_plan(), v3.load_plan(V4.plan_file)]
    v1 = load_v1_plan()["profiles"]
    used = set(v1["fitted"]) | set(v1["held_out"])
    counts, speeds = set(PROFILE_WORKERS), {STRAGGLER_SPEED}
    for p in plans:
        used |= set(p["profiles"]["held_out"])
        for name in p["profiles"]["held_out"]:
            spec = p["profiles"]["specs"][name]
            counts.add(spec["workers"])
            if spec["slow_workers"]:
                speeds.add(spec["slow_speed"])
    for name in plan["profiles"]["held_out"]:
        spec = plan["profiles"]["specs"][name]
        assert name not in used and spec["workers"] not in counts
        assert spec["slow_workers"] == 0 or spec["slow_speed"] not in speeds


def test_fit_data_is_every_earlier_cnn_run_v4s_included(plan):
    from measure.staleness_classes import workload_class

    cls = workload_class("cnn-digits")
    data = v3.fit_data(cls, plan)
    keys = [(r["profile"], r["mitigation"], r["seed"]) for r in data["runs"]]
    assert len(keys) == len(set(keys))
    assert not {k[0] for k in keys} & set(plan["profiles"]["held_out"])
    assert set(v3.load_plan(V4.plan_file)["profiles"]["held_out"]) <= {k[0] for k in keys}
    assert len(keys) > len(v3.fit_data(cls, v3.load_plan(V4.plan_file))["runs"])


def test_committed_v5_check_has_every_group_and_ships_its_fit(plan):
    import tomllib

    import numpy as np

    from perfmodel.accuracy.model import load_accuracy_model

    data = tomllib.loads(V5.check_file.read_text())
    assert data["classes_run"] == ["cnn-digits"] and data["classes_not_run"] == []
    summary = data["classes"]["cnn-digits"]
    assert summary["groups"] == len(summary["held_out"]) == 10
    assert summary["runs_recorded"] == summary["runs_planned"] == 1120
    for row in summary["held_out"]:
        assert row["seeds"] == 112 and "before_v5_predicted_penalty_points" in row
    stable = [r["abs_error_points"] for r in summary["held_out"] if r["stable_group"]]
    right = np.mean([r["stability_right"] for r in summary["held_out"]])
    assert summary["passed"] == (bool(stable) and float(np.median(stable)) <= 3.0
                                 and right >= 0.9)
    path = v3.model_path(plan, "cnn-digits")
    assert load_accuracy_model(path=path).provenance["plan"] == \
        "perfmodel/data/heldout/accuracy_plan_v5.toml"
    assert tomllib.loads(path.read_text())["check"]["passed"] == summary["passed"]
