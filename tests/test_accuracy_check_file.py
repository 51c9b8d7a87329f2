"""perfmodel/data/heldout/accuracy_check.toml, the held-out accuracy check of issue 16's plan:
the committed file is valid TOML with every group of every class run, and writing one class
keeps the others as they were."""

from __future__ import annotations

import tomllib

from calibration.fit_accuracy_classes import CHECK_FILE, load_plan, write_check


def test_committed_check_is_valid_and_complete():
    data = tomllib.loads(CHECK_FILE.read_text())
    plan = {c["name"] for c in load_plan()["classes"]}
    assert set(data["classes_run"]) | set(data["classes_not_run"]) == plan
    assert set(data["classes"]) == set(data["classes_run"])
    for summary in data["classes"].values():
        # 4 held-out profiles x 2 mitigations, each group once
        assert summary["groups"] == len(summary["held_out"]) == 8
        assert summary["passed"] in (True, False)


def _group(profile: str) -> dict:
    return {"profile": profile, "mitigation": "none", "seeds": 10,
            "abs_error_points": 1.0, "result": "pass"}


def test_writing_one_class_keeps_the_others(tmp_path):
    path = tmp_path / "check.toml"
    plan = load_plan()
    first = {"groups": 1, "stable_groups": 1, "median_abs_error_points": 1.0,
             "stability_right_fraction": 1.0, "passed": True}
    write_check({"cnn-digits": ([_group("homo-8")], first)}, plan, path)
    before = tomllib.loads(path.read_text())["classes"]["cnn-digits"]
    write_check({"mlp-digits": ([_group("het-4")], dict(first, passed=False))}, plan, path)
    data = tomllib.loads(path.read_text())
    assert data["classes_run"] == ["cnn-digits", "mlp-digits"]
    assert "mlp-digits" not in data["classes_not_run"]
    assert data["classes"]["cnn-digits"] == before          # its date too
    assert data["classes"]["mlp-digits"]["passed"] is False
    assert data["classes"]["mlp-digits"]["held_out"][0]["profile"] == "het-4"
