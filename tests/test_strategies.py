"""One record per strategy: a new strategy is one module plus one record, and reaches every
place that weighs, plots or schedules strategies (perfmodel/strategies.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perfmodel import strategies as strategy_records
from perfmodel.cli import cli
from perfmodel.cluster import load_cluster
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.workload import load_workload
from tests import toy_strategy


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(strategy_records.REGISTRY, "toy", toy_strategy.RECORD)
    return toy_strategy.RECORD


def scenario(workers: int = 8) -> Scenario:
    w = load_workload("resnet50")
    return Scenario(cluster=load_cluster("a100"), workload=w, workers=workers,
                    batch_size=w.batch_size, steps=6, speed=(), jitter="none", seed=0)


def test_every_record_builds_its_simulator_with_its_options():
    for r in strategy_records.RECORDS:
        model = make_strategy(r.name)
        assert model.name == r.name
        assert set(r.option_names()) == set(type(model.options).__dataclass_fields__)
        assert r.is_ps == (r.ps_mode is not None)
        assert r.synchronous == (r.scheduling in ("gang", "sync"))


def test_families_and_modes_are_the_measure_layer_vocabulary():
    assert {r.family for r in strategy_records.RECORDS} == {"ddp", "fsdp", "ps"}
    assert {r.ps_mode for r in strategy_records.RECORDS if r.is_ps} == {"sync", "async", "ssp"}


def test_unknown_strategy_is_one_line_naming_the_known_ones():
    result = CliRunner().invoke(cli, ["predict", "--strategy", "zero3", "--workers", "2"])
    assert result.exit_code == 2
    assert "ddp, fsdp, sync-ps, async-ps, ssp-ps" in result.output


def test_toy_strategy_reaches_predict(toy):
    result = CliRunner().invoke(cli, ["predict", "--strategy", "toy", "--workers", "8",
                                      "--json", "--bucket-cap-MiB", "2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["strategy"] == "toy" and out["options"] == {"bucket_cap_MiB": 2.0}
    assert out["throughput_samples_per_s"] > 0


def test_toy_option_not_taken_is_an_error_naming_who_takes_it(toy):
    result = CliRunner().invoke(cli, ["predict", "--strategy", "toy", "--workers", "2",
                                      "--servers", "2"])
    assert result.exit_code != 0
    assert "does not apply to toy" in result.output


def test_toy_strategy_reaches_sweep(toy, tmp_path):
    result = CliRunner().invoke(cli, ["sweep", "--strategies", "ddp,toy", "--workers", "1,8",
                                      "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [r["strategy"] for r in rows].count("toy") == 2
    assert (tmp_path / "sweep.png").is_file()


def test_toy_strategy_reaches_recommend(toy):
    from perfmodel.recommend import recommend

    rec = recommend(scenario())
    assert "toy" in [c.label for c in rec.ranked]


def test_toy_strategy_reaches_elasticity(toy):
    from perfmodel.goodput import job_for
    from perfmodel.sim.elastic import ElasticConfig

    job = job_for("toy", scenario(), {}, ElasticConfig(run_s=3600.0))
    assert job.scheduling == "gang"


def test_toy_strategy_reaches_the_report_figures(toy, tmp_path):
    from perfmodel.compare import figures

    assert figures._color("toy") == "tab:brown"
