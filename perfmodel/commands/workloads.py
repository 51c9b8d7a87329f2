"""`perfmodel workloads`: the available workloads."""

from __future__ import annotations

import json

import click

from perfmodel.workload import load_workload, workload_paths


@click.command("workloads")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(as_json: bool) -> None:
    """List the workloads: parameters, FLOPs per sample, precision and optimizer.

    Workload files are generated from PyTorch module definitions by
    `python -m measure.make_workloads`; add a model there to add a workload.

    \b
    Example:
      perfmodel workloads
    """
    rows = []
    for name in workload_paths():
        w = load_workload(name)
        rows.append({
            "name": w.name, "params": w.params, "units": len(w.units),
            "forward_GFLOP_per_sample": w.forward_flops_per_sample / 1e9,
            "precision": w.precision, "optimizer": w.optimizer,
            "batch_size": w.batch_size, "description": w.description,
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'name':<18} {'params':>10} {'units':>5} {'GFLOP/sample':>12} "
               f"{'precision':<11} {'optimizer':<9} {'batch':>5}")
    for r in rows:
        click.echo(f"{r['name']:<18} {r['params'] / 1e6:>9.1f}M {r['units']:>5} "
                   f"{r['forward_GFLOP_per_sample']:>12.3f} {r['precision']:<11} "
                   f"{r['optimizer']:<9} {r['batch_size']:>5}")
