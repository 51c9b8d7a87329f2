"""The published points (perfmodel/data/published) and perfmodel's errors against them.

Bounds are issue 12's stated targets (held-out median |error| <= 15 %, max <= 35 %), not
the errors seen; the data-coverage checks restate what the issue asks of the data file.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.cluster import load_cluster
from perfmodel.published import load_published, predict_point

POINTS = load_published()


def test_published_data_covers_what_issue_12_asks():
    assert len(POINTS) >= 25
    assert len({p.family for p in POINTS}) >= 4
    assert len({p.gpu for p in POINTS}) >= 2
    assert any(p.gpus == 1 for p in POINTS) and any(p.gpus >= 8 for p in POINTS)
    assert len({p.precision for p in POINTS}) >= 2
    assert {p.set for p in POINTS} == {"fit", "heldout"}
    assert all(p.citation and p.where for p in POINTS)


def test_every_point_names_a_shipped_cluster_and_workload():
    for p in POINTS:
        assert load_cluster(p.cluster).provenance.source == "spec"
        r = predict_point(p)
        assert r.samples_per_s > 0 and r.step_s > 0


def test_heldout_errors_meet_the_issue_targets():
    errors = np.abs([predict_point(p).error for p in POINTS if p.set == "heldout"])
    assert np.median(errors) <= 0.15      # issue 12 target
    assert errors.max() <= 0.35           # issue 12 target


def test_tokens_metric_round_trips():
    p = next(p for p in POINTS if p.metric == "tokens_per_s_per_gpu")
    assert p.in_metric(p.samples_per_s()) == pytest.approx(p.value)


def test_validate_writes_the_report(tmp_path):
    result = CliRunner().invoke(cli, ["validate", "--published", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert {"report.md", "results.json", "scatter.png"} <= {f.name for f in tmp_path.iterdir()}
