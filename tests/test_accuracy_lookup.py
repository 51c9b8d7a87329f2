"""Which accuracy model applies to a workload (perfmodel/accuracy/lookup.py): never a silent
extrapolation (issue 16: the mlp/digits fit was applied to ResNet-50)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from perfmodel.accuracy.lookup import accuracy_model_for, accuracy_model_path
from perfmodel.accuracy.model import ACCURACY_DIR
from perfmodel.cli import cli
from perfmodel.errors import PerfmodelError
from perfmodel.workload import WORKLOAD_DIR, load_workload


def test_only_the_workload_it_was_fitted_on():
    assert accuracy_model_for(load_workload("mlp")).workload == "mlp"
    for name in ("resnet50", "bert-large", "gpt2-xl", "cnn-small", "transformer-small"):
        assert accuracy_model_for(load_workload(name)) is None


def test_a_workload_file_names_its_model(tmp_path):
    text = (WORKLOAD_DIR / "resnet50.toml").read_text()
    shutil.copy(ACCURACY_DIR / "mlp.toml", tmp_path / "mine.toml")
    (tmp_path / "w.toml").write_text('accuracy_model = "mine.toml"\n' + text)
    assert accuracy_model_path(load_workload(str(tmp_path / "w.toml"))) == tmp_path / "mine.toml"
    (tmp_path / "bad.toml").write_text('accuracy_model = "nowhere"\n' + text)
    with pytest.raises(PerfmodelError, match="accuracy_model 'nowhere'"):
        accuracy_model_path(load_workload(str(tmp_path / "bad.toml")))


def test_the_user_folder_comes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_ACCURACY", str(tmp_path))
    shutil.copy(ACCURACY_DIR / "mlp.toml", tmp_path / "resnet50.toml")
    assert accuracy_model_path(load_workload("resnet50")) == tmp_path / "resnet50.toml"


def test_predict_without_a_model_shows_staleness_and_risk_only():
    out = CliRunner().invoke(cli, ["predict", "--strategy", "async-ps", "--workers", "16"])
    assert out.exit_code == 0, out.output
    assert "UNSTABLE" not in out.output and "to 95 %" not in out.output
    assert "staleness risk unknown" in out.output
    assert "no accuracy model applies to resnet50" in out.output
    data = json.loads(CliRunner().invoke(cli, ["predict", "--strategy", "async-ps", "--workers",
                                               "16", "--json"]).output)
    assert data["accuracy"]["model"] is None and data["accuracy"]["divergence_risk"] == "unknown"
    assert data["accuracy"]["mean_staleness"] == pytest.approx(15.0, abs=0.5)
