"""Held-out step intervals pooled over reports: does a 90 % interval hold 90 % of the runs?

An exploration over committed reports (seen data: it fits nothing and no interval rule reads
it). One report's coverage is k of its 14 held-out rows inside their 90 % intervals; with 14
rows a perfect 90 % interval lands in issue 14's 80-97 % band (12 or 13 of 14) with
probability 0.61 (perfmodel/compare/report.py `band_probability`), so one report cannot tell
a well-made interval from a lucky one. Pooled over reports it can. This reads each report's
headline (comparisons.json: the bracketed predictions where the report was bracketed, as its
headline is) and prints, per report and pooled, by row group (all, real, timed-wait):

- k of n inside, the median half-width, and whether k/n lies in the band;
- pooled: coverage with two 90 % confidence intervals: Clopper-Pearson (exact, if rows were
  independent) and a bootstrap over reports (rows of one report share a calibration, so
  they are not independent; resampling whole reports keeps that, a generator of its own);
- how many reports landed in the band against how many a perfect 90 % interval would put
  there (the sum of each report's band probability).

    python benchmarks/interval_coverage.py reports/local-2026-12-0[5-7]-heldout-*

Reports without intervals (or without a headline) are listed as skipped, never dropped
silently.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from perfmodel.compare.report import COVERAGE_BAND, band_probability, within_band  # noqa: E402

GROUPS = ("all", "real", "timed-wait")
LEVEL = 0.9
RESAMPLES = 4000
SEED = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Count:
    """One report's coverage of one row group."""

    report: str
    inside: int
    rows: int
    half_width_median_rel: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Pooled:
    inside: int
    rows: int
    exact_low: float
    exact_high: float
    bootstrap_low: float
    bootstrap_high: float
    reports_in_band: int
    reports_in_band_expected: float

    @property
    def coverage(self) -> float:
        return self.inside / self.rows


def report_label(path: Path) -> str:
    m = re.search(r"heldout-(\d+)$", path.name)
    return m.group(1) if m else path.name


def counts(report: Path, quantity: str = "step_time") -> dict[str, Count] | None:
    """The report's headline coverage by group, or None where it has no intervals."""
    file = report / "comparisons.json"
    if not file.is_file():
        return None
    headline = json.loads(file.read_text()).get("headline", {}).get(quantity, {})
    out = {}
    for group in GROUPS:
        h = headline.get(group)
        if h and h.get("with_interval"):
            out[group] = Count(report=report_label(report), inside=int(h["inside"]),
                               rows=int(h["with_interval"]),
                               half_width_median_rel=h.get("half_width_median"))
    return out or None


def in_band(c: Count) -> bool:
    return within_band(c.inside / c.rows)


def pool(items: list[Count], seed: int = SEED) -> Pooled:
    """Pooled coverage of `items` (one per report) with its confidence intervals."""
    if not items:
        raise ValueError("nothing to pool")
    inside = sum(c.inside for c in items)
    rows = sum(c.rows for c in items)
    exact = scipy.stats.binomtest(inside, rows).proportion_ci(LEVEL, method="exact")
    k = np.array([c.inside for c in items], dtype=float)
    n = np.array([c.rows for c in items], dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(items), size=(RESAMPLES, len(items)))
    resampled = k[picks].sum(axis=1) / n[picks].sum(axis=1)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(resampled, [tail, 1 - tail])
    return Pooled(inside=inside, rows=rows, exact_low=float(exact.low),
                  exact_high=float(exact.high), bootstrap_low=float(low),
                  bootstrap_high=float(high),
                  reports_in_band=sum(in_band(c) for c in items),
                  reports_in_band_expected=sum(band_probability(c.rows) for c in items))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report directories")
    parser.add_argument("--quantity", default="step_time", choices=("step_time", "throughput"))
    args = parser.parse_args(argv)
    by_group: dict[str, list[Count]] = {g: [] for g in GROUPS}
    reports = sorted(args.reports, key=lambda p: (len(report_label(p)), report_label(p)))
    print(f"{'report':>8}  " + "  ".join(f"{g:>22}" for g in GROUPS))
    for report in reports:
        found = counts(report, args.quantity)
        if found is None:
            print(f"{report_label(report):>8}  skipped: no headline intervals")
            continue
        cells = []
        for group in GROUPS:
            c = found.get(group)
            if c is None:
                cells.append(f"{'-':>22}")
                continue
            by_group[group].append(c)
            width = ("" if c.half_width_median_rel is None
                     else f" ±{c.half_width_median_rel:.0%}")
            cells.append(f"{c.inside:>2}/{c.rows:<2}{width:>5}{' ' if in_band(c) else ' *'}"
                         .rjust(22))
        print(f"{report_label(report):>8}  " + "  ".join(cells))
    print(f"* outside the band {COVERAGE_BAND[0]:.0%}-{COVERAGE_BAND[1]:.0%}")
    for group in GROUPS:
        if not by_group[group]:
            continue
        p = pool(by_group[group])
        print(f"{group:>10}: {p.inside} of {p.rows} inside, {p.coverage:.1%}; 90 % CI "
              f"{p.exact_low:.1%}-{p.exact_high:.1%} exact, {p.bootstrap_low:.1%}-"
              f"{p.bootstrap_high:.1%} bootstrap over {len(by_group[group])} reports; in band "
              f"{p.reports_in_band} of {len(by_group[group])} (a perfect 90 % interval: "
              f"{p.reports_in_band_expected:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
