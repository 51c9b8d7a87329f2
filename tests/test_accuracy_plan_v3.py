"""accuracy_plan_v3.toml, the third held-out accuracy check, and the measured learning curve.

Checked: the plan parses with v2's rules unchanged; every group gets the same eight seeds,
seed-major; no v3 held-out profile (nor its worker count or straggler mix) was used by v1 or
v2; the fit data the plan names load for every class, hold no v3 held-out profile, one run
per key and the three synchronous seeds; a measured curve reads its points, interpolates
between them, keeps a plateau the formula cannot, and hands over to the formula beyond; its
TOML round trip and bad tables refused; fit_curve(measured=True) keeps the seeds' mean.
"""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest

from calibration import accuracy_check_v2 as v2
from calibration import accuracy_check_v3 as v3
from calibration.fit_accuracy import PROFILE_WORKERS, STRAGGLER_SPEED, fit_curve, straggler_mix
from calibration.fit_accuracy_classes import load_plan as load_v1_plan
from perfmodel.accuracy.model import LearningCurve, measured_curve, parse_accuracy_model
from perfmodel.errors import PerfmodelError


@pytest.fixture(scope="module")
def plan():
    return v3.load_plan()


def test_plan_parses_and_keeps_v2s_rules(plan):
    assert tomllib.loads(v3.PLAN_FILE.read_text()) == plan
    assert plan["rules"]["median_abs_error_points_max"] == 3.0
    assert plan["rules"]["stability_right_fraction_min"] == 0.9
    v2_rules = v2.load_plan()["rules"]
    for key in ("median_abs_error_points_max", "stability_right_fraction_min",
                "min_stable_groups"):
        assert plan["rules"][key] == v2_rules[key]
    assert "no near-threshold exemption" in plan["rules"]["predicted_unstable"]
    assert [c["name"] for c in plan["classes"]] == [c["name"] for c in v2.load_plan()["classes"]]


def test_every_group_has_the_same_eight_seeds_seed_major(plan):
    keys = v2.held_out_keys(plan)
    groups: dict[tuple[str, str], list[int]] = {}
    for profile, mitigation, seed in keys:
        groups.setdefault((profile, mitigation), []).append(seed)
    assert len(groups) == 6 and len(keys) == len(set(keys)) == 48
    assert all(seeds == list(range(20, 28)) for seeds in groups.values())
    assert {k[2] for k in keys[:len(groups)]} == {20}


def test_held_out_profiles_are_new_to_v1_and_v2(plan):
    v1, old_v2 = load_v1_plan()["profiles"], v2.load_plan()["profiles"]
    used = set(v1["fitted"]) | set(v1["held_out"]) | set(old_v2["held_out"])
    counts = set(PROFILE_WORKERS) | {old_v2["specs"][p]["workers"] for p in old_v2["held_out"]}
    for name in plan["profiles"]["held_out"]:
        spec = plan["profiles"]["specs"][name]
        assert name not in used and spec["workers"] not in counts
        mix = straggler_mix(spec["workers"], spec["slow_workers"], spec["slow_speed"])
        assert spec["slow_workers"] == 0 or spec["slow_speed"] not in (STRAGGLER_SPEED, 0.5)
        assert len(mix) == spec["workers"]


@pytest.mark.parametrize("name", ["mlp-digits", "cnn-digits", "logreg-tabular",
                                  "transformer-pointer"])
def test_fit_data_is_every_earlier_run_once_and_no_held_out_one(plan, name):
    from measure.staleness_classes import workload_class

    data = v3.fit_data(workload_class(name), plan)
    keys = [(r["profile"], r["mitigation"], r["seed"]) for r in data["runs"]]
    assert len(keys) == len(set(keys))
    assert not {k[0] for k in keys} & set(plan["profiles"]["held_out"])
    assert sorted(k[2] for k in keys if k[0] == "sync") == plan["fit"]["synchronous_seeds"]
    assert {k[0] for k in keys} <= set(data["profiles"]) | {"sync"}
    # more than v1's one seed per fitted profile: v1's and v2's held-out runs are in
    assert len(keys) > 19


PLATEAU = ((0, 0.1), (100, 0.3), (200, 0.32), (300, 0.9), (400, 1.0))


def _curve(measured=PLATEAU):
    return LearningCurve(a0=0.1, a_inf=1.0, scale_updates=250.0, shape=3.0, measured=measured)


def test_measured_curve_reads_its_points_and_keeps_a_plateau():
    c = _curve()
    for u, acc in PLATEAU:
        assert c.accuracy(u) == pytest.approx(acc)
    assert c.accuracy(150) == pytest.approx(0.31)
    assert c.accuracy(np.array([50.0, 250.0])) == pytest.approx([0.2, 0.61])
    formula = _curve(())
    assert c.accuracy(500) == formula.accuracy(500)          # beyond: the formula
    assert abs(formula.accuracy(200) - 0.32) > 0.1            # the formula has no plateau
    assert c.updates_to(0.05) == 0.0
    assert c.updates_to(0.31) == pytest.approx(150.0)         # first crossing
    assert c.updates_to(0.61) == pytest.approx(250.0)
    never = _curve(((0, 0.1), (100, 0.3)))
    assert never.updates_to(0.9) == max(formula.updates_to(0.9), 100.0)
    assert math.isinf(never.updates_to(1.0))


@pytest.mark.parametrize("raw", [[[0, 0.1]], [[1, 0.1], [2, 0.2]], [[0, 0.1], [0, 0.2]],
                                 [[0, 0.1], [10, 1.2]], [[0, "x"], [10, 0.2]], "table",
                                 [[0, 0.1, 3], [10, 0.2]]])
def test_bad_measured_tables_are_refused(raw):
    with pytest.raises(PerfmodelError, match="curve_measured"):
        measured_curve(raw, "m.toml: settings[0]")


def _sync_run(seed, accuracy):
    return {"profile": "sync", "seed": seed, "updates": 40, "eval_every": 20,
            "eval_updates": [0, 20, 40], "accuracy": accuracy, "loss": [1.0, 0.5, 0.4],
            "diverged": False}


def test_fit_curve_keeps_the_seeds_mean_only_when_asked():
    sync = [_sync_run(0, [0.1, 0.5, 0.9]), _sync_run(1, [0.1, 0.3, 0.7])]
    assert fit_curve(sync).measured == ()
    assert fit_curve(sync, measured=True).measured == ((0, 0.1), (20, 0.4), (40, 0.8))
    with pytest.raises(PerfmodelError, match="same updates"):
        fit_curve([sync[0], dict(sync[1], eval_every=10, updates=40)], measured=True)


def test_measured_curve_survives_the_model_file(tmp_path):
    from calibration.fit_accuracy_classes import model_toml

    setting = {"optimizer": "momentum", "lr": 0.05, "budget_updates": 400, "curve": _curve(),
               "beta": {"none": 0.1, "staleness-aware": 0.2, "dc": 0.1},
               "rate_exponent": 0.5, "seed_sd": 0.02, "fit_rms": 0.01, "band": 0.05,
               "sync_observed": 1.0, "noise": [],
               "instability": {"threshold": 2.0, "runs": 3}}
    text = model_toml(workload="w", data_set="d", caveat="c", chance=0.1, batch=64,
                      target=0.95, setting=setting, prov={"date": "today"}, check=None,
                      header="test")
    model = parse_accuracy_model(tomllib.loads(text), tmp_path / "w.toml")
    assert model.settings[0].curve == _curve()


def test_committed_v3_check_has_every_group_of_every_class_with_its_comparisons(plan):
    data = tomllib.loads(v3.CHECK_FILE.read_text())
    names = [c["name"] for c in plan["classes"]]
    assert data["classes_run"] + data["classes_not_run"] == names
    for name in data["classes_run"]:
        summary = data["classes"][name]
        assert summary["groups"] == len(summary["held_out"]) == 6
        assert summary["runs_recorded"] == summary["runs_planned"] == 48
        for row in summary["held_out"]:
            assert row["seeds"] == 8 and row["result"] in ("pass", "miss")
            assert row["zero_penalty_abs_error_points"] == abs(row["observed_penalty_points"])
            assert "before_v3_predicted_penalty_points" in row
        stable = [r["abs_error_points"] for r in summary["held_out"] if r["stable_group"]]
        assert summary["passed"] == (bool(stable) and float(np.median(stable)) <= 3.0
                                     and all(r["stability_right"] for r in summary["held_out"]))


@pytest.mark.parametrize("name", ["cnn-digits", "logreg-tabular", "transformer-pointer"])
def test_v3s_fits_are_kept_as_the_model_before_v4(name):
    """v4 rewrote the shipped class models; v3's fit of each is kept in v4/ (its check in
    accuracy_check_v3.toml), so v3's verdict can still be traced to the model it judged."""
    from calibration.accuracy_check_v4 import V4
    from perfmodel.accuracy.model import load_accuracy_model

    kept = V4.held_out_dir / f"{name}_before.toml"
    model = load_accuracy_model(path=kept)
    assert model.provenance["plan"] == "perfmodel/data/heldout/accuracy_plan_v3.toml"
    committed = tomllib.loads(v3.CHECK_FILE.read_text())["classes"][name]
    check = tomllib.loads(kept.read_text())["check"]
    assert check["passed"] == committed["passed"]
    assert check["median_abs_error_points"] == pytest.approx(committed["median_abs_error_points"])
