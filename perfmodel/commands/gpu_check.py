"""`perfmodel gpu-check`: measure this GPU, calibrate its compute, report predicted vs measured.

The work is perfmodel/compare/gpu_check.py's; this module parses the options and refuses at
once (before torch is imported) on a machine without a CUDA GPU.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from perfmodel.errors import PerfmodelError


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise click.BadParameter("give at least one name, comma-separated")
    return names


@click.command("gpu-check")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder [reports/gpu-check-<date>].")
@click.option("--workloads", default="resnet50,bert-large,gpt2-xl", show_default=True,
              help="Shipped workloads to measure, comma-separated.")
@click.option("--precisions", default="tf32,bf16-mixed", show_default=True,
              help="Precisions, comma-separated: fp32, tf32, bf16-mixed (autocast).")
@click.option("--budget-s", type=click.IntRange(30, 3600), default=420, show_default=True,
              help="Seconds of measuring, shared out between the cases (start-up and the "
                   "fit come on top, about a minute).")
@click.option("--cluster", default=None,
              help="Profile to check [the shipped profile of this GPU].")
@click.option("--batch-size", type=click.IntRange(1), default=None,
              help="Per-GPU batch of every case [each workload's default].")
@click.option("--blocks", type=click.IntRange(1), default=None,
              help="Middle units (transformer blocks) kept [gpt2-xl 8, others all].")
@click.option("--from-measured", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Rebuild the report from a saved measured.json (no GPU "
                                 "needed; --cluster names the spec profile).")
def command(out, workloads, precisions, budget_s, cluster, batch_size, blocks,
            from_measured) -> None:
    """Measure per-unit compute, step time and peak memory of the shipped workloads on this
    GPU at two precisions, calibrate a profile's compute from the unit passes, and write
    report.md with the spec profile's and the calibrated profile's predictions beside the
    measured steps and peaks (held out: nothing is fitted on them).

    Needs one CUDA GPU and a CUDA build of torch; about 8 minutes. GPT-2 XL is cut to 8
    blocks, and a case predicted to need more than 70 % of the GPU's memory is cut further
    (the report says so).

    \b
    Examples:
      perfmodel gpu-check
      perfmodel gpu-check --workloads resnet50 --precisions tf32,bf16-mixed --budget-s 120
      perfmodel gpu-check --from-measured reports/gpu-check-2026-12-04/measured.json \\
          --cluster h200 --out /tmp/again

    \b
    A calibrated profile checked on new measurements (held out: the base column):
      PERFMODEL_PROFILES=reports/gpu-check-2026-12-04-fitset perfmodel gpu-check \\
          --from-measured reports/gpu-check-2026-12-04-heldout3/measured.json \\
          --cluster h200-gpu-check --out /tmp/heldout
    """
    out = out or Path(f"reports/gpu-check-{dt.date.today().isoformat()}")
    if from_measured is not None:
        from perfmodel.compare.gpu_check import rebuild
        if cluster is None:
            raise click.UsageError("--from-measured needs --cluster (the spec profile)")
        rebuild(from_measured, out, cluster)
        click.echo(f"report: {out / 'report.md'}")
        return
    from perfmodel.compare.gpu_check import check_names, run_check
    workloads, precisions = _names(workloads), _names(precisions)
    check_names(workloads, precisions)
    _require_cuda()
    run_check(out, workloads=workloads, precisions=precisions,
              budget_s=float(budget_s), cluster=cluster, batch=batch_size, blocks=blocks,
              say=lambda line: click.echo(line, err=True))
    click.echo(f"report: {out / 'report.md'}")


def _require_cuda() -> None:
    """One line and exit 2 where there is no GPU, before torch is imported."""
    from calibration.hardware import detect

    hw = detect()
    if not hw.gpus:
        raise PerfmodelError(f"gpu-check needs a CUDA GPU and found {hw.describe()}; run it "
                             f"on a GPU machine (or --from-measured to rebuild a report)")
