"""`--cluster path.toml` takes a profile file from anywhere, as `--workload path.toml` does."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.cluster import SHIPPED_PROFILES, load_cluster


def test_a_profile_file_by_path_predicts_as_its_name_does(tmp_path):
    path = tmp_path / "my-g5.toml"
    shutil.copy(SHIPPED_PROFILES / "a10g.toml", path)
    assert load_cluster(str(path)).path == path
    runs = [CliRunner().invoke(cli, ["predict", "--strategy", "ddp", "--workers", "8",
                                     "--cluster", c, "--json"]) for c in ("a10g", str(path))]
    by_name, by_path = (json.loads(r.stdout) for r in runs)
    assert by_name["throughput_samples_per_s"] == by_path["throughput_samples_per_s"]


def test_a_missing_profile_path_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["predict", "--strategy", "ddp", "--workers", "2",
                                      "--cluster", str(tmp_path / "none.toml")])
    assert result.exit_code != 0
    assert result.exit_code == 2 and "no such file" in result.output


def test_a_profile_path_works_for_sweep_and_recommend(tmp_path):
    path = tmp_path / "my-g5.toml"
    shutil.copy(SHIPPED_PROFILES / "a10g.toml", path)
    sweep = CliRunner().invoke(cli, ["sweep", "--strategies", "ddp", "--workers", "1,4",
                                     "--cluster", str(path), "--json", "--jobs", "1",
                                     "--out", str(tmp_path / "sweep")])
    assert sweep.exit_code == 0, sweep.output
    assert json.loads(sweep.stdout)["meta"]["cluster"] == "a10g"
    rec = CliRunner().invoke(cli, ["recommend", "--workers", "4", "--cluster", str(path),
                                   "--json"])
    assert rec.exit_code == 0, rec.output
    assert json.loads(rec.stdout)["cluster"] == "a10g"
