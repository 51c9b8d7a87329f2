"""`perfmodel clusters add`: a spec-derived profile of a listed GPU on a stated node."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.cluster import load_cluster


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_PROFILES", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def add(*args: str):
    return CliRunner().invoke(cli, ["clusters", "add", *args])


def test_the_device_comes_from_the_gpus_profile_and_the_node_from_the_user(profiles):
    result = add("mine", "--gpu", "h100", "--gpus-per-node", "4", "--nic-Gbps", "800",
                 "--intra-GBps", "64", "--json")
    assert result.exit_code == 0, result.output
    mine, h100 = load_cluster("mine"), load_cluster("h100")
    assert mine.path == profiles / "mine.toml" and mine.provenance.source == "spec"
    assert mine.device == h100.device and mine.compute == h100.compute
    assert mine.server == h100.server
    assert mine.devices_per_node == 4
    assert mine.inter_node.bandwidth_GBps == 100.0                 # 800 Gbit/s / 8
    assert mine.inter_node.latency_us == h100.inter_node.latency_us
    assert mine.intra_node.bandwidth_GBps == 64.0
    assert mine.intra_node.efficiency_by_bytes == h100.intra_node.efficiency_by_bytes
    cites = "\n".join(json.loads(result.output)["citations"])
    for field in ("topology.devices_per_node = 4", "inter_node.bandwidth_GBps = 100",
                  "intra_node.bandwidth_GBps = 64", "device.*", "inter_node.latency_us",
                  "h100.toml"):
        assert field in cites
    assert all(f"'h100': {c}" in cites for c in h100.provenance.citations)


def test_the_new_profile_predicts_and_is_listed(profiles):
    assert add("mine", "--gpu", "a100-80gb", "--gpus-per-node", "8",
               "--nic-Gbps", "400").exit_code == 0
    out = CliRunner().invoke(cli, ["predict", "--cluster", "mine", "--workload", "resnet50",
                                   "--strategy", "ddp", "--workers", "16"])
    assert out.exit_code == 0, out.output
    listed = json.loads(CliRunner().invoke(cli, ["clusters", "--json"]).output)
    assert "mine" in {r["name"] for r in listed}


@pytest.mark.parametrize(("args", "says"), [
    (["x", "--gpu", "v100", "--gpus-per-node", "8", "--nic-Gbps", "100"], "choose from"),
    (["h100", "--gpu", "h100", "--gpus-per-node", "8", "--nic-Gbps", "100"], "exists"),
])
def test_bad_input_is_one_line_and_exit_2(profiles, args, says):
    result = add(*args)
    assert result.exit_code == 2 and says in result.output
    assert result.output.strip().count("\n") == 0


def test_force_replaces_only_a_profile_you_added(profiles):
    args = ["mine", "--gpu", "a10g", "--gpus-per-node", "4", "--nic-Gbps", "25"]
    assert add(*args).exit_code == 0
    assert add(*args).exit_code == 2
    assert add(*args, "--force").exit_code == 0
    assert add("a10g", *args[1:], "--force").exit_code == 2      # a shipped one: never
