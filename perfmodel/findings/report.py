"""Build the findings report and write it (report.md, figures, findings.csv) without ever
replacing measured sections by empty ones.

Sections 1-5 and 8 come from the model and data shipped with perfmodel, so anyone can
regenerate them. Sections 6-7 come from real runs in a measurement store that is not
shipped: a report is written either with both measured sections filled from the store, or
as a model-only report (`model_only=True`) into a folder that holds no measured report.
"""

from __future__ import annotations

import csv
from pathlib import Path

from perfmodel.errors import PerfmodelError
from perfmodel.findings.classes import class_penalties
from perfmodel.findings.common import MEASURE_COMMAND
from perfmodel.findings.figures import write_figures
from perfmodel.findings.measured import LOCAL_HEADER, PS_HEADER, measured_local, measured_ps
from perfmodel.findings.predicted import async_saving, ddp_speedup, fsdp_memory
from perfmodel.findings.records import CSV_FIELDS, Findings, LocalRuns, MeasuredPs
from perfmodel.findings.staleness import accuracy_penalty, mitigations
from perfmodel.findings.text import report_markdown

REPORT = "report.md"
CSV = "findings.csv"


class MeasuredSectionsMissingError(PerfmodelError):
    """Writing would leave the report's measured sections (6-7) empty or drop them."""


def build_findings(*, db: Path | None = None, model_only: bool = False) -> Findings:
    """Every section; sections 6-7 from the store `db` ($PERFMODEL_DB or the per-user
    default when None), or left out when `model_only` (no store is opened). The store is
    read first: MeasuredSectionsMissingError before the model sections' seconds of work
    when it lacks runs for either measured section."""
    if model_only:
        local = measured = store = None
    else:
        from measure.store import Store

        store = str(Store(db).path)
        local, measured = measured_local(db), measured_ps(db)
        check_measured(local, measured, store)
    return Findings(speedup=ddp_speedup(), memory=fsdp_memory(), saving=async_saving(),
                    accuracy=accuracy_penalty(), mitigations=mitigations(), local=local,
                    measured=measured, classes=class_penalties(), store=store)


def check_measured(local: LocalRuns | None, measured: MeasuredPs | None,
                   store: str | None) -> None:
    """Raise MeasuredSectionsMissingError if a measured section found no runs."""
    missing = []
    if local is not None and local.table is None:
        missing.append("6 (local mlp DDP, FSDP and PS runs)")
    if measured is not None and not measured.runs:
        missing.append("7 (async/ssp mlp PS runs)")
    if missing:
        raise MeasuredSectionsMissingError(
            f"the measurement store {store} has no runs for section {' or '.join(missing)}; "
            "nothing written, so the report keeps its measurements: run "
            f"`{MEASURE_COMMAND}` (needs torch), pass --db with the store that has them, or "
            "write a model-only report with --model-only --out DIR")


def has_measured_sections(report: Path) -> bool:
    """Whether an existing report.md shows measured runs (either measured table)."""
    if not report.is_file():
        return False
    text = report.read_text(encoding="utf-8")
    return LOCAL_HEADER in text or PS_HEADER in text


def check_out(out: Path, *, model_only: bool) -> None:
    """Raise MeasuredSectionsMissingError if a model-only report would replace, in `out`,
    a report that has measured sections."""
    if model_only and has_measured_sections(out / REPORT):
        raise MeasuredSectionsMissingError(
            f"{out / REPORT} has measured sections that a --model-only report would drop; "
            f"nothing written: choose another --out, or run `{MEASURE_COMMAND}`")


def write_findings(out: Path, findings: Findings) -> list[Path]:
    """Write report.md, its figures and findings.csv into `out`, unless that would drop
    measured sections (check_measured, check_out); the paths written."""
    check_measured(findings.local, findings.measured, findings.store)
    check_out(out, model_only=findings.model_only)
    out.mkdir(parents=True, exist_ok=True)
    paths = write_figures(out, findings)
    with open(out / CSV, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        writer.writerows(row.as_dict() for row in findings.rows)
    (out / REPORT).write_text(report_markdown(findings), encoding="utf-8")
    return [*paths, out / CSV, out / REPORT]
