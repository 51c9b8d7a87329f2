"""The held-out coverage band (issue 14: 80-97 % of measured medians inside their 90 %
intervals) and the chance a perfect interval has of landing in it (perfmodel/compare/report.py
`band_probability`), against the binomial distribution written out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.compare.matching import Headline
from perfmodel.compare.report import COVERAGE_BAND, band_probability, in_band, interval_cell


def _binomial(k: int, n: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def _headline(inside: int, rows: int) -> Headline:
    return Headline(quantity="step_time", count=rows, median_abs=0.04, max_abs=0.1,
                    worst="x", inside=inside, with_interval=rows, noise_median=0.05,
                    half_width_median=0.15)


def test_fourteen_rows_is_close_to_a_coin_toss():
    # 80-97 % of 14 rows: 12 or 13 inside (11/14 = 78.6 %, 14/14 = 100 %)
    expected = _binomial(12, 14, 0.9) + _binomial(13, 14, 0.9)
    assert band_probability(14) == pytest.approx(expected, rel=1e-12)
    assert band_probability(14) == pytest.approx(0.6129, abs=1e-4)


def test_six_rows_have_one_count_in_the_band():
    assert band_probability(6) == pytest.approx(_binomial(5, 6, 0.9), rel=1e-12)


@given(st.integers(min_value=1, max_value=300), st.floats(min_value=0.01, max_value=0.99))
def test_a_probability(n, coverage):
    p = band_probability(n, coverage)
    assert 0.0 <= p <= 1.0 + 1e-12
    ks = [k for k in range(n + 1) if COVERAGE_BAND[0] <= k / n <= COVERAGE_BAND[1]]
    assert p == pytest.approx(sum(_binomial(k, n, coverage) for k in ks), abs=1e-9)


def test_many_rows_make_the_band_a_real_test():
    assert band_probability(400) > 0.99                 # a perfect 90 % interval passes
    assert band_probability(400, coverage=0.99) < 0.01  # one twice too wide fails


@pytest.mark.parametrize(("inside", "rows", "expected"),
                         [(14, 14, False), (13, 14, True), (12, 14, True), (11, 14, False),
                          (0, 0, None)])
def test_in_band(inside, rows, expected):
    assert in_band(_headline(inside, rows)) is expected


def test_the_cell_says_out_and_the_chance():
    cell = interval_cell(_headline(14, 14))
    assert cell.startswith("14 of 14 (median half-width ±15%)")
    assert "band: OUT" in cell and "P = 61% at n = 14" in cell
    assert "band: in" in interval_cell(_headline(13, 14))
    assert interval_cell(_headline(0, 0)) == "no interval"
