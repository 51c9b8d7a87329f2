"""`perfmodel recommend`: the decision framework of DESIGN.md turned into numbers.

Checked (issue 6): DDP on a homogeneous a100 cluster with a model that fits; FSDP when the
memory budget excludes DDP (gpt2-xl on a100 with 20 GiB: ZeRO-3 shards the 16Ψ model state,
Rajbhandari et al. 2020); a PS mode only when stragglers make it win on time to accuracy —
each decision backed by the numbers the recommendation prints.
"""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from perfmodel import strategies as strategy_records
from perfmodel.cli import cli
from perfmodel.cluster import load_cluster
from perfmodel.recommend import TIE_FRACTION, recommend
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

SYNCHRONOUS = tuple(r.name for r in strategy_records.RECORDS if r.synchronous)

GPT2_BUDGET_GIB = 20.0


def scenario(workload: str = "resnet50", workers: int = 16, speed: tuple = (),
             cluster: str = "a100") -> Scenario:
    w = load_workload(workload)
    return Scenario(cluster=load_cluster(cluster), workload=w, workers=workers,
                    batch_size=w.batch_size, speed=speed)


def by_label(rec):
    return {c.label: c for c in rec.ranked}


def best(rec, strategies):
    return min((c for c in rec.ranked if c.strategy in strategies and c.fits),
               key=lambda c: c.time_to_target_s)


def test_homogeneous_a100_cluster_gets_ddp():
    rec = recommend(scenario())
    assert rec.choice is not None and rec.choice.strategy == "ddp"
    ddp = by_label(rec)["ddp"]
    assert ddp.fits and ddp.peak_GiB <= rec.memory_budget_GiB
    fastest = min(c.time_to_target_s for c in rec.ranked if c.fits)
    # DDP is the fastest or within the tie margin of it (simpler wins a tie) ...
    assert ddp.time_to_target_s <= fastest * (1 + TIE_FRACTION)
    # ... and every PS mode is slower to accuracy than DDP by the printed numbers.
    for c in rec.ranked:
        if c.strategy not in ("ddp", "fsdp"):
            assert c.time_to_target_s > ddp.time_to_target_s
    assert any("Homogeneous workers" in line for line in rec.reasons)


def test_fsdp_when_the_memory_budget_excludes_ddp():
    rec = recommend(scenario("gpt2-xl", workers=8), memory_budget_GiB=GPT2_BUDGET_GIB)
    ddp = by_label(rec)["ddp"]
    assert not ddp.fits and ddp.peak_GiB > GPT2_BUDGET_GIB
    assert rec.choice is not None and rec.choice.strategy == "fsdp"
    assert rec.choice.peak_GiB <= GPT2_BUDGET_GIB
    memory_line = next(line for line in rec.reasons if line.startswith("Memory binds"))
    assert f"{ddp.peak_GiB:.1f} GiB" in memory_line
    # The same model with the whole device fits DDP: the budget made the difference.
    assert by_label(recommend(scenario("gpt2-xl", workers=8)))["ddp"].fits


def test_ps_only_when_stragglers_make_it_win():
    homogeneous = recommend(scenario(workers=4))
    assert homogeneous.choice.strategy in SYNCHRONOUS
    # One worker at a tenth of the speed holds every synchronous step (it waits ~9 compute
    # times per step); asynchronous PS lets the other three run on.
    straggler = recommend(scenario(workers=4, speed=(1.0, 1.0, 1.0, 0.1)),
                          optimizer="momentum", lr=0.01)
    sync, stale = best(straggler, SYNCHRONOUS), best(straggler, ("async-ps", "ssp-ps"))
    assert stale.throughput_samples_per_s > sync.throughput_samples_per_s
    assert straggler.choice.strategy in ("async-ps", "ssp-ps")   # the fastest PS, or one tied
    assert straggler.choice.time_to_target_s <= stale.time_to_target_s * (1 + TIE_FRACTION)
    assert stale.time_to_target_s < sync.time_to_target_s
    assert any("pays off" in line for line in straggler.reasons)


def test_choice_is_always_backed_by_its_numbers():
    for rec in (recommend(scenario(workers=4, speed=(1.0, 1.0, 1.0, 0.5))),
                recommend(scenario(workers=8, cluster="a10g"))):
        fastest = min(c.time_to_target_s for c in rec.ranked if c.fits)
        assert rec.choice.fits
        assert rec.choice.time_to_target_s <= fastest * (1 + TIE_FRACTION)
        if rec.choice.strategy not in SYNCHRONOUS:   # PS only if it beats every sync one
            assert rec.choice.time_to_target_s < best(rec, SYNCHRONOUS).time_to_target_s


def test_nothing_fits_says_so():
    rec = recommend(scenario("gpt2-xl", workers=2), memory_budget_GiB=1.0)
    assert rec.choice is None
    assert "Nothing both fits" in rec.reasons[0]


def test_cli_table_and_json():
    runner = CliRunner()
    out = runner.invoke(cli, ["recommend", "--workers", "8", "--workload", "gpt2-xl",
                              "--memory-budget-GiB", "20"])
    assert out.exit_code == 0, out.output
    assert ">>fsdp" in out.output and "over budget" in out.output
    assert "accuracy model: mlp on digits" in out.output
    out = runner.invoke(cli, ["recommend", "--workers", "4", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    # 8 variants, and each of the 5 PS ones also colocated (1 worker node: 1 server at most)
    assert data["choice"] == "ddp" and len(data["candidates"]) == 8 + 5
    assert {c["options"].get("server_placement") for c in data["candidates"]
            if c["strategy"].endswith("-ps")} == {None, "colocated"}
    times = [c["time_to_target_s"] for c in data["candidates"] if c["fits"]]
    assert all(t == "inf" or (isinstance(t, float) and math.isfinite(t)) for t in times)


def test_cli_help_and_bad_input():
    runner = CliRunner()
    assert runner.invoke(cli, ["recommend", "--help"]).exit_code == 0
    bad = runner.invoke(cli, ["recommend", "--workers", "4", "--memory-budget-GiB", "-1"])
    assert bad.exit_code == 2
    unknown = runner.invoke(cli, ["recommend", "--workers", "4", "--optimizer", "sgd",
                                  "--lr", "0.7"])
    assert unknown.exit_code == 2 and "no fit for sgd at lr 0.7" in unknown.output
