"""`perfmodel calibrate --from-nccl-tests`: logs in, a measured profile out, its busbw checked.

The hand-written logs (tests/fixtures/nccl_tests/, see test_nccl_tests.py) hold 1x8 and 2x8
A100 runs; perfmodel_measure_collectives_gloo_2.log is the real output of `perfmodel measure
collectives --workers 2 --ops all-reduce,all-gather,reduce-scatter,broadcast --max-bytes 16M`
on this 2-core CPU host (gloo), captured as printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from calibration.from_nccl_tests import read_all, reproduce
from calibration.nccl_tests import read_logs
from perfmodel.cli import cli
from perfmodel.cluster import load_cluster

LOGS = Path(__file__).parent / "fixtures" / "nccl_tests"
GPU_LOGS = [LOGS / n for n in ("all_reduce_perf_1x8.log", "all_reduce_perf_2x8.log",
                               "all_gather_perf_2x8.log")]
GLOO_LOG = LOGS / "perfmodel_measure_collectives_gloo_2.log"


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_PROFILES", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def calibrate(*args: str):
    return CliRunner().invoke(cli, ["calibrate", *args], catch_exceptions=False)


def test_a_profile_fitted_from_nccl_tests_logs_gives_their_busbw_back(profiles):
    result = calibrate("--cluster", "mynodes", "--json", "--from-nccl-tests",
                       *map(str, GPU_LOGS))
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    profile = load_cluster("mynodes")             # from the user folder, by name
    assert profile.path == profiles / "mynodes.toml"
    assert profile.provenance.source == "measured"
    assert out["base"] == "a100-80gb" and profile.devices_per_node == 8
    rows = reproduce(profile, read_all(GPU_LOGS))
    assert len(rows) == 3 * 14                    # every size of every log
    assert max(abs(r.rel) for r in rows) < 0.05
    assert out["busbw_reproduction"]["max_rel"] < 0.05
    assert {"intra_node.bandwidth_GBps", "inter_node.latency_us"} <= set(out["residuals"])
    text = (profiles / "mynodes.toml").read_text()
    assert all(str(p.resolve()) in text for p in GPU_LOGS)       # provenance names the logs


def test_the_projects_own_collectives_output_is_an_nccl_tests_log(profiles):
    logs = read_logs(GLOO_LOG)
    assert [lg.op for lg in logs] == ["all-reduce", "all-gather", "reduce-scatter",
                                      "broadcast"]
    assert {(lg.ranks, lg.nodes, len(lg.samples)) for lg in logs} == {(2, 1, 22)}
    result = calibrate("--cluster", "box", "--from-nccl-tests", str(GLOO_LOG))
    assert result.exit_code == 0, result.output
    assert "base 'local'" in result.output and "busbw reproduced over 88 rows" in result.output
    assert load_cluster("box").intra_node.time_factor("reduce-scatter") > 1


def test_a_malformed_log_is_one_line_naming_its_line(profiles, tmp_path):
    bad = tmp_path / "all_reduce_perf.log"
    lines = GPU_LOGS[0].read_text().splitlines()
    lines[19] = lines[19].replace("111.55", "1x1.55")
    bad.write_text("\n".join(lines))
    result = CliRunner().invoke(cli, ["calibrate", "--cluster", "x", "--from-nccl-tests",
                                      str(bad)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert f"{bad}:20:" in result.output


def test_files_without_a_source_option_are_refused(profiles):
    result = CliRunner().invoke(cli, ["calibrate", "--cluster", "x", str(GLOO_LOG)])
    assert result.exit_code == 2 and "--from-nccl-tests" in result.output
