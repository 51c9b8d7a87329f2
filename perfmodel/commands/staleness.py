"""`perfmodel staleness fit`: fit the accuracy cost of staleness on your own model and data.

Thin: options and printing here; the runs and the fit are calibration/user_fit.py's (torch is
imported only when the command runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from perfmodel.commands.options import Finite
from perfmodel.errors import PerfmodelError


@click.group("staleness")
def command() -> None:
    """Fit what gradient staleness costs in accuracy for your workload.

    \b
    Example:
      perfmodel staleness fit --model mypkg.net:make_model --data mypkg.net:make_data \\
          --workload resnet50 --cluster a100 --workers 4 --workers 16
    """


@command.command("fit")
@click.option("--model", "model", required=True, metavar="PKG.MOD:FUNC",
              help="A function returning a fresh torch.nn.Module (built under a seed).")
@click.option("--data", "data", required=True, metavar="PKG.MOD:FUNC",
              help="A function returning (x_train, y_train, x_test, y_test) tensors; "
                   "targets are class labels.")
@click.option("--workload", default="resnet50", show_default=True,
              help="The perfmodel workload this model stands for: the simulator's staleness "
                   "comes from it and the fitted file is named after it.")
@click.option("--cluster", default="a100", show_default=True,
              help="Cluster profile whose async-PS staleness the harness applies.")
@click.option("--workers", type=click.IntRange(2), multiple=True, default=(4, 16),
              show_default=True, help="Worker counts to simulate (repeat the option).")
@click.option("--stragglers", type=click.IntRange(0), default=0, show_default=True,
              help="Slow workers in each simulated profile (the last ones).")
@click.option("--straggler-speed", type=Finite(0, 1, min_open=True), default=0.5,
              show_default=True, help="Relative speed of a straggler.")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]),
              default="momentum", show_default=True, help="Optimizer of the runs.")
@click.option("--lr", type=Finite(0, min_open=True), default=0.05,
              show_default=True, help="Learning rate.")
@click.option("--warmup-updates", type=click.IntRange(0), default=0, show_default=True,
              help="Linear warm-up over this many updates, then constant.")
@click.option("--updates", type=click.IntRange(2), default=200, show_default=True,
              help="Updates per harness run (the budget accuracy is read at).")
@click.option("--eval-every", type=click.IntRange(1), default=20, show_default=True,
              help="Updates between test evaluations.")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True,
              help="Samples per gradient (one worker's batch).")
@click.option("--sync-seeds", type=click.IntRange(2), default=2, show_default=True,
              help="Synchronous runs (seeds 0..N-1): learning curve and seed spread.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Model file to write [default: WORKLOAD.toml in $PERFMODEL_ACCURACY, "
                   "where predict and recommend find it].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fit(model: str, data: str, workload: str, cluster: str, workers: tuple[int, ...],
        stragglers: int, straggler_speed: float, optimizer: str, lr: float,
        warmup_updates: int, updates: int, eval_every: int, batch_size: int,
        sync_seeds: int, out: Path | None, as_json: bool) -> None:
    """Run the staleness harness on your model with the staleness the simulator predicts for
    your cluster (async PS), fit the accuracy model and write it where predict and
    recommend use it for WORKLOAD. Needs torch; minutes for a small model.

    \b
    Examples:
      perfmodel staleness fit --model mypkg.net:make_model --data mypkg.net:make_data
      perfmodel staleness fit --model m:net --data m:data --workload cnn-small \\
          --cluster a100 --workers 8 --stragglers 1 --straggler-speed 0.25 --lr 0.01
      perfmodel predict --workload cnn-small --strategy async-ps --workers 8   # uses it
    """
    from calibration.user_fit import UserFit, fit_user_model
    from perfmodel.accuracy.lookup import user_accuracy_dir
    from perfmodel.workload import load_workload

    name = load_workload(workload).name
    target = out if out is not None else user_accuracy_dir() / f"{name}.toml"
    if target.suffix != ".toml":
        raise PerfmodelError(f"--out {target} must end in .toml")
    spec = UserFit(name=name, description=f"{model} on {data}", optimizer=optimizer, lr=lr,
                   warmup_updates=warmup_updates, budget_updates=updates,
                   eval_every=eval_every, batch_size=batch_size, sync_seeds=sync_seeds)
    progress = (lambda _: None) if as_json else (lambda line: click.echo(line, err=True))
    summary = fit_user_model(fit=spec, model=model, data=data, cluster=cluster,
                             workload=workload, workers=tuple(sorted(set(workers))),
                             stragglers=stragglers, straggler_speed=straggler_speed,
                             out=target, progress=progress)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    taus = ", ".join(f"{p} mean τ {t:.1f}" for p, t in summary["profiles"].items())
    click.echo(f"fitted {summary['workload']} on {summary['runs']} harness runs ({taus}): "
               f"synchronous accuracy {summary['sync_accuracy']:.3f}, unstable from index "
               f"{summary['instability_threshold']:.3g}")
    click.echo(f"wrote {summary['out']} (runs: {summary['runs_file']}); predict and recommend "
               f"use it for --workload {summary['workload']}")
