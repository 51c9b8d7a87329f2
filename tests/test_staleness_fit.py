"""`perfmodel staleness fit` (issue 16): a user's own model, fitted end to end.

A tiny module (a linear classifier on a generated 2-class set) is fitted with the staleness
the simulator predicts for async PS on a100, written to the user's accuracy folder, and then
`perfmodel predict` for that workload costs staleness with it, where before it said that no
accuracy model applies.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli as main

TINY = textwrap.dedent('''
    import torch

    def make_model():
        return torch.nn.Linear(4, 2)

    def make_data():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(400, 4, generator=g)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        return x[:300], y[:300], x[300:], y[300:]
''')


@pytest.fixture
def user_dirs(tmp_path, monkeypatch):
    (tmp_path / "tinymod_16.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PERFMODEL_ACCURACY", str(tmp_path / "accuracy"))
    return tmp_path


def predict_json(runner: CliRunner) -> dict:
    result = runner.invoke(main, ["predict", "--workload", "cnn-small", "--strategy",
                                  "async-ps", "--workers", "8", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.slow
def test_user_model_fit_end_to_end(user_dirs):
    pytest.importorskip("torch")
    runner = CliRunner()
    before = json.dumps(predict_json(runner))
    assert "no accuracy model applies" in before
    result = runner.invoke(main, [
        "staleness", "fit", "--model", "tinymod_16:make_model", "--data",
        "tinymod_16:make_data", "--workload", "cnn-small", "--workers", "2", "--workers", "8",
        "--updates", "40", "--eval-every", "10", "--lr", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    out = user_dirs / "accuracy" / "cnn-small.toml"
    assert summary["out"] == str(out) and out.is_file()
    assert (user_dirs / "accuracy" / "cnn-small_runs.json").is_file()
    assert summary["runs"] == 2 + 2 * 2      # 2 sync seeds + 2 profiles x 2 mitigations
    assert set(summary["profiles"]) == {"async-2", "async-8"}
    after = json.dumps(predict_json(runner))
    assert "no accuracy model applies" not in after
    assert "perfmodel staleness fit" in after         # the fitted file's caveat is shown
    ranked = runner.invoke(main, ["recommend", "--workload", "cnn-small", "--workers", "8"])
    assert ranked.exit_code == 0, ranked.output
    assert "no accuracy model applies" not in ranked.output


@pytest.mark.parametrize("args,message", [
    (["--model", "nocolon", "--data", "m:d"], "pkg.module:function"),
    (["--model", "no_such_module_16:f", "--data", "m:d"], "cannot import"),
    (["--model", "tinymod_16:nothing", "--data", "tinymod_16:make_data"], "no function"),
])
def test_bad_module_is_one_line_exit_2(user_dirs, args, message):
    pytest.importorskip("torch")
    result = CliRunner().invoke(main, ["staleness", "fit", *args, "--workload", "cnn-small",
                                       "--workers", "2"])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_help_has_examples():
    result = CliRunner().invoke(main, ["staleness", "fit", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.output
