"""benchmarks/interval_coverage.py: per-report and pooled coverage of the held-out intervals.

Golden counts come from committed reports' headlines (report 63: 14 of 14, 8 real and 6
timed-wait, at ±11 %, README); the pooling is checked against the binomial it stands on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import load_benchmark

REPO = Path(__file__).resolve().parent.parent
R63 = REPO / "reports/local-2026-12-07-heldout-63"
R62 = REPO / "reports/local-2026-12-07-heldout-62"


def _module():
    return load_benchmark("interval_coverage")


def test_counts_read_a_committed_headline():
    got = _module().counts(R63)
    assert {g: (c.inside, c.rows) for g, c in got.items()} == {
        "all": (14, 14), "real": (8, 8), "timed-wait": (6, 6)}
    assert got["all"].report == "63"
    assert got["all"].half_width_median_rel == pytest.approx(0.114, abs=0.001)


def test_a_report_without_intervals_is_none(tmp_path):
    m = _module()
    assert m.counts(tmp_path) is None
    (tmp_path / "comparisons.json").write_text(json.dumps(
        {"headline": {"step_time": {"all": {"inside": 0, "with_interval": 0}}}}))
    assert m.counts(tmp_path) is None


def test_band_is_twelve_or_thirteen_of_fourteen():
    m = _module()
    got = {k: m.in_band(m.Count(report="x", inside=k, rows=14, half_width_median_rel=None))
           for k in range(10, 15)}
    assert got == {10: False, 11: False, 12: True, 13: True, 14: False}


def test_pool_sums_rows_and_its_intervals_hold_the_coverage():
    m = _module()
    items = [m.Count(report=str(i), inside=k, rows=14, half_width_median_rel=0.1)
             for i, k in enumerate([14, 12, 13, 11, 13])]
    p = m.pool(items)
    assert (p.inside, p.rows) == (63, 70)
    assert p.exact_low < p.coverage < p.exact_high <= 1.0
    assert p.bootstrap_low <= p.coverage <= p.bootstrap_high
    # the bootstrap resamples whole reports: a pooled coverage of resampled reports lies
    # between the lowest report's and the highest's
    assert p.bootstrap_low >= 11 / 14 and p.bootstrap_high <= 1.0
    assert p.reports_in_band == 3
    assert p.reports_in_band_expected == pytest.approx(5 * 0.6129, abs=0.001)
    assert m.pool(items) == p                      # its own generator: the same every time


def test_exact_interval_is_clopper_pearson():
    # 9 of 10: the two-sided 90 % Clopper-Pearson interval is [0.6058, 0.9949]
    m = _module()
    p = m.pool([m.Count(report="a", inside=9, rows=10, half_width_median_rel=None)])
    assert (p.exact_low, p.exact_high) == pytest.approx((0.6058, 0.9949), abs=1e-3)


def test_main_prints_every_report_and_the_pool(capsys, tmp_path):
    assert _module().main([str(R62), str(R63), str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: no headline intervals" in out
    assert "all: 27 of 28 inside" in out        # 62: 13 of 14, 63: 14 of 14 (README)
