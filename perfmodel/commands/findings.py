"""`perfmodel findings`: reproduce the study's findings (report.md, figures, findings.csv)."""

from __future__ import annotations

from pathlib import Path

import click

from perfmodel.errors import PerfmodelError

DEFAULT_OUT = Path("reports") / "findings"


@click.command("findings")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Folder for report.md, its figures and findings.csv.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Measurement store holding the runs of sections 6-7 "
                   "[$PERFMODEL_DB or the per-user default].")
@click.option("--measure", is_flag=True,
              help="First run the real jobs of sections 6-7 into the store: async, ssp and "
                   "sync PS, DDP and FSDP on mlp, 1-3 workers (11 runs; needs torch).")
@click.option("--model-only", is_flag=True,
              help="Leave sections 6-7 out and read no store; refused where --out already "
                   "holds a report with measured sections.")
def command(out, db, measure, model_only):
    """Reproduce the study's findings with perfmodel and explain where they differ.

    Sections 1-5 come from what perfmodel ships: DDP speedup, FSDP peak-memory reduction
    and the asynchronous PS time saving predicted on the spec-derived a100 and a10g
    profiles, and the accuracy cost of staleness from the fitted accuracy model and the
    harness runs it was fitted on. Sections 6-7 compare real runs of this machine, read from
    the measurement store, with the model. Section 8 (shipped too) reads the study's 4-17 %
    accuracy penalty per workload class, at the same epochs and at the same wall-clock time.

    The command never drops measured sections: without runs for both sections 6 and 7 in
    the store it writes nothing and exits with status 2. Make the runs with --measure,
    point --db at the store that has them, or write a model-only report with --model-only
    into a folder that holds no measured report. A fresh clone has no store, so regenerate
    the committed reports/findings only with the runs at hand.

    \b
    Examples:
      perfmodel findings --model-only --out /tmp/findings   # model sections, no torch
      perfmodel findings --measure                          # real runs, then the full report
      perfmodel findings --db runs.sqlite --out reports/findings
    """
    from perfmodel.findings import build_findings, check_out, write_findings
    from perfmodel.findings.measured import run_measurements

    if measure and model_only:
        raise PerfmodelError("--measure and --model-only exclude each other: --model-only "
                             "reads no measurements")
    if model_only and db is not None:
        raise PerfmodelError("--db has no effect with --model-only, which reads no store")
    check_out(out, model_only=model_only)
    if measure:
        run_measurements(db, echo=lambda line: click.echo(line, err=True))
    findings = build_findings(db=db, model_only=model_only)
    for path in write_findings(out, findings):
        click.echo(f"wrote {path}")
