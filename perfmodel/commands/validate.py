"""`perfmodel validate --published`: perfmodel against published GPU training throughput."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("validate")
@click.option("--published", is_flag=True, required=True,
              help="Compare with the published points of perfmodel/data/published.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("reports/published"),
              show_default=True, help="Folder for report.md, results.json, scatter.png.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(published: bool, out: Path, as_json: bool) -> None:
    """Predict every published point and report the errors, held-out beside fit.

    \b
    Example:
      perfmodel validate --published
    """
    from perfmodel.compare.published_report import validate_published
    report = validate_published(out)
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    for s in ("heldout", "fit"):
        r = report[s]
        click.echo(f"{s:8s} {r['points']:3d} points  median |error| {r['median_abs_error']:.1%}"
                   f"  max {r['max_abs_error']:.1%}")
    click.echo(f"report: {out / 'report.md'}")
