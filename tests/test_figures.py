"""Every figure type renders from a small fixture: the compare report's seven (scatter,
scaling, memory, staleness, timeline, torch_memory, elastic) from the committed held-out
report's stored numbers (perfmodel/compare/rerender.py, no store needed), and the findings
report's five (ddp_speedup, fsdp_memory, async_saving, accuracy_penalty, measured_ps) from
the model-only findings plus two made-up PS runs. A figure is checked to be a PNG of some
size; what it shows was looked at by a person (issue 14)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HELDOUT = REPO / "reports" / "local-2026-12-02-heldout"
PNG = b"\x89PNG"


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:4] == PNG and path.stat().st_size > 5000


def test_every_compare_figure_renders(tmp_path):
    from perfmodel.compare.rerender import rerender

    folder = tmp_path / "report"
    shutil.copytree(HELDOUT, folder)
    for png in folder.glob("*.png"):
        png.unlink()
    text = rerender(folder).read_text()
    for name in ("scatter", "scaling", "memory", "staleness", "timeline", "torch_memory",
                 "elastic"):
        assert _is_png(folder / f"{name}.png"), name
        assert f"({name}.png)" in text
    assert "Wasserstein-1" in text and "median half-width" in text


def test_every_findings_figure_renders(tmp_path):
    from perfmodel.findings import build_findings
    from perfmodel.findings.figures import write_figures
    from perfmodel.findings.records import MeasuredPs, MeasuredPsRun

    findings = build_findings(model_only=True)
    runs = tuple(MeasuredPsRun(run_id=i, workers=w, protocol=p, updates=200,
                               mean_staleness=w - 1.0, accuracy=0.9, predicted_accuracy=0.88,
                               band=0.03, agrees=True, divergence_risk=risk,
                               observed_unstable=False)
                 for i, (w, p, risk) in enumerate([(2, "async", "low"), (4, "ssp s=0", "low"),
                                                   (8, "async staleness-aware, lr 0.01",
                                                    "unstable")], start=1))
    from dataclasses import replace
    findings = replace(findings, measured=MeasuredPs(table="", runs=runs, rows=()))
    paths = write_figures(tmp_path, findings)
    assert {p.name for p in paths} == {"ddp_speedup.png", "fsdp_memory.png",
                                       "async_saving.png", "accuracy_penalty.png",
                                       "measured_ps.png"}
    for p in paths:
        assert _is_png(p), p.name


@pytest.mark.parametrize("name", ["scatter", "staleness"])
def test_rerender_keeps_every_stored_number(tmp_path, name):
    """Re-rendering changes headlines and figures, never a row's measured or predicted
    number (rows_from checks each rebuilt error against the stored one)."""
    import json

    from perfmodel.compare.rerender import rerender

    folder = tmp_path / "report"
    shutil.copytree(HELDOUT, folder)
    before = json.loads((HELDOUT / "comparisons.json").read_text())["comparisons"]
    rerender(folder)
    after = json.loads((folder / "comparisons.json").read_text())["comparisons"]
    for b, a in zip(before, after, strict=True):
        for k, v in b.items():
            if k.split("_")[-1] in ("predicted", "measured", "low", "high", "error"):
                assert a[k] == v, (b["key"], k)
    assert (folder / f"{name}.png").exists()
