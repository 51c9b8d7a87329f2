"""reports/make_findings.py end to end on the shipped profiles and the recorded harness runs,
with an empty store (so the measured sections say how to fill them): every section, figure
and CSV row is written, and the report's numbers are the CSV's."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parent.parent / "reports"


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    sys.path.insert(0, str(REPORTS))
    try:
        import make_findings
    finally:
        sys.path.remove(str(REPORTS))
    out = tmp_path_factory.mktemp("findings")
    assert make_findings.main(["--out", str(out), "--db", str(out / "empty.sqlite")]) == 0
    return out


def test_every_section_and_figure_is_written(findings):
    text = (findings / "report.md").read_text()
    for n in range(1, 8):
        assert f"\n## {n}. " in text
    for png in ("ddp_speedup", "fsdp_memory", "async_saving", "accuracy_penalty"):
        assert (findings / f"{png}.png").stat().st_size > 5_000
    assert "reports/make_findings.py --measure` to add them" in text    # empty store


def test_report_quotes_the_csv(findings):
    with open(findings / "findings.csv") as f:
        rows = list(csv.DictReader(f))
    speedups = {(r["cluster"], r["workload"], r["workers"]): float(r["value"]) for r in rows
                if r["finding"] == "ddp_speedup" and r["metric"] == "speedup"}
    text = (findings / "report.md").read_text()
    a100 = [speedups[("a100", "resnet50", str(n))] for n in (1, 2, 4)]
    assert a100[0] == pytest.approx(1.0)
    assert f"| a100 | resnet50 | {a100[0]:.2f}x | {a100[1]:.2f}x | {a100[2]:.2f}x" in text
