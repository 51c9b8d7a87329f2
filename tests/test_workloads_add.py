"""`perfmodel workloads add`: a user's nn.Module (tests/user_model.py) and a Hugging Face-style
config.json (tests/fixtures/models/) become workloads, counted as the shipped ones are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.workload import load_workload

MODELS = Path(__file__).parent / "fixtures" / "models"
LLAMA2_7B_PARAMS = 6.74e9      # Touvron et al. 2023, Table 1 / the model card: "7B", 6.74 B


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_WORKLOADS", str(tmp_path / "workloads"))
    return tmp_path / "workloads"


def add(*args: str):
    return CliRunner().invoke(cli, ["workloads", "add", *args])


def test_a_users_sequential_module_becomes_a_workload_with_its_units(folder):
    result = add("mynet", "--module", "tests.user_model:make_net", "--input-shape", "3,8,8",
                 "--precision", "fp32", "--batch-size", "32", "--json")
    assert result.exit_code == 0, result.output
    w = load_workload("mynet")                      # found by name in the user folder
    assert w.path == folder / "mynet.toml"
    assert [u.name for u in w.units] == ["flat", "hidden", "head"]
    assert w.params == 192 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    # 2 FLOPs per multiply-add of the three Linear layers, per sample
    assert w.forward_flops_per_sample == 2 * (192 * 256 + 256 * 256 + 256 * 10)
    assert w.units[1].activation_bytes_per_sample > 0 and w.units[1].forward_kernels > 0
    assert json.loads(result.output)["params"] == w.params
    listed = CliRunner().invoke(cli, ["workloads", "--json"])
    assert "mynet" in {r["name"] for r in json.loads(listed.output)}


def test_any_other_module_is_one_unit_and_token_ids_come_from_its_embedding(folder):
    result = add("mylm", "--module", "tests.user_model:make_lm", "--seq-len", "16")
    assert result.exit_code == 0, result.output
    w = load_workload("mylm")
    assert [u.name for u in w.units] == ["model"] and w.params == 100 * 32 + 32 * 100 + 100


def test_a_llama_2_7b_config_gives_its_parameter_count(folder):
    result = add("llama-7b", "--config", str(MODELS / "llama-2-7b" / "config.json"),
                 "--seq-len", "512")
    assert result.exit_code == 0, result.output
    w = load_workload("llama-7b")
    assert abs(w.params / LLAMA2_7B_PARAMS - 1) < 0.01
    assert len(w.units) == 34 and w.precision == "bf16-mixed"
    # 6 N FLOPs per token of training is 2 N forward, plus attention's s x s term
    assert w.forward_flops_per_sample / (2 * w.params * 512) == pytest.approx(1.0, abs=0.1)
    predicted = CliRunner().invoke(cli, ["predict", "--workload", "llama-7b", "--cluster",
                                         "h100", "--strategy", "fsdp", "--workers", "8"])
    assert predicted.exit_code == 0, predicted.output


def test_a_gpt2_config_gives_the_shipped_gpt2_xl_workload(folder):
    assert add("g2", "--config", str(MODELS / "gpt2" / "config.json")).exit_code == 0
    mine, shipped = load_workload("g2"), load_workload("gpt2-xl")
    assert mine.params == shipped.params
    assert [u.forward_flops_per_sample for u in mine.units] == \
        [u.forward_flops_per_sample for u in shipped.units]


@pytest.mark.parametrize(("args", "says"), [
    (["x", "--module", "tests.user_model:nothing", "--input-shape", "3"], "no callable"),
    (["x", "--module", "no_such_pkg.mod:f", "--input-shape", "3"], "cannot import"),
    (["x", "--module", "tests.user_model:make_net"], "--input-shape"),
    (["x", "--module", "tests.user_model:make_net", "--input-shape", "3,a"], "whole numbers"),
    (["x"], "one source"),
    (["mlp", "--module", "tests.user_model:make_net", "--input-shape", "3,8,8"], "exists"),
])
def test_bad_input_is_one_line_and_exit_2(folder, args, says):
    result = add(*args)
    assert result.exit_code == 2 and says in result.output
    assert result.output.strip().count("\n") == 0


def test_a_config_of_an_unknown_kind_is_refused(folder, tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "t5", "vocab_size": 32128}')
    result = add("t5", "--config", str(config))
    assert result.exit_code == 2 and "model_type 't5'" in result.output
