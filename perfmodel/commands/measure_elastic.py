"""`perfmodel measure elastic`: real runs whose membership changes, stored like every run.

- `ddp`: DistributedDataParallel under torchrun's elastic mode (--nnodes MIN:MAX,
  --max-restarts), checkpointing every few steps; ranks are killed on schedule and the job
  recovers from its last checkpoint (measure/elastic_launch.py, measure/runs/elastic_ddp.py).
- `ps`: an asynchronous parameter server from which a worker leaves mid-run and to which a
  standby worker is added later (measure/runs/elastic_ps.py).

Detection, restart and lost work are stored as "elastic" records (the store's other_records)
so that calibration can replace the model's defaults. measure/session.py launches and
stores; measure/summary.py says what happened. torch is imported only by the workers.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from measure import session
from measure.configs import elastic_config
from measure.store import Store
from measure.summary import elastic_events, render, render_elastic_event, summarize
from perfmodel.commands.errors import check_run
from perfmodel.commands.options import Finite
from perfmodel.commands.progress import RunsProgress
from perfmodel.errors import PerfmodelError


def common_options(f):
    for opt in reversed([
        click.option("--workload", required=True, help="Workload name (mlp trains on digits)."),
        click.option("--batch-size", type=click.IntRange(1), default=None,
                     help="Samples per worker per step [the workload's]."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Measurement store [$PERFMODEL_DB or the per-user default]."),
        click.option("--oversubscribe", is_flag=True,
                     help="Allow more compute processes than CPU cores (recorded)."),
        click.option("--timeout-s", type=Finite(1), default=120, show_default=True,
                     help="Process-group timeout."),
        click.option("--max-time-s", type=Finite(1), default=None,
                     help="Stop the whole run after this many seconds [no limit]."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]):
        f = opt(f)
    return f


@click.group("elastic")
def command() -> None:
    """Real runs whose workers fail, leave or join (needs torch).

    \b
    Examples:
      perfmodel measure elastic ddp --workload mlp --kill 1@15
      perfmodel measure elastic ddp --workload mlp --steps 60 --kill 1@15,0@45 --nnodes 1:2
      perfmodel measure elastic ps --workload mlp --workers 3 --leave 0@5 --join-after 10
    """


@command.command("ddp")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=40, show_default=True,
              help="Steps of the whole run (a restarted attempt resumes, not restarts).")
@click.option("--checkpoint-every", type=click.IntRange(1), default=10, show_default=True,
              help="Steps between checkpoints (written to the run directory).")
@click.option("--kill", "kills", default="1@15", show_default=True, metavar="RANK@STEP,...",
              help="The i-th kill SIGKILLs RANK of attempt i once it has done STEP.")
@click.option("--nnodes", default="1:2", show_default=True, metavar="MIN:MAX",
              help="torchrun elastic node range.")
@click.option("--max-restarts", type=click.IntRange(0), default=None,
              help="torchrun --max-restarts [one per kill].")
@common_options
def ddp(workers, steps, checkpoint_every, kills, nnodes, max_restarts, workload, batch_size,
        seed, db, oversubscribe, timeout_s, max_time_s, as_json):
    """DDP under torchrun elastic mode: kill ranks on schedule, recover from checkpoints.

    Prints each recovery: detection (kill -> survivors stopped), restart (-> every rank
    ready again: rendezvous, process start, process-group init, checkpoint reload), lost
    steps (done since the checkpoint) and recovery (kill -> lost progress regained).
    """
    from measure.elastic_launch import parse_kills

    schedule = parse_kills(kills)
    lo, _, hi = nnodes.partition(":")
    if not (lo.isdigit() and (hi or lo).isdigit()):
        raise PerfmodelError(f"--nnodes '{nnodes}' is not MIN:MAX (example: 1:2)")
    config = elastic_config("elastic_ddp", workers=workers, workload=workload,
                            batch_size=batch_size, steps=steps, seed=seed, timeout_s=timeout_s,
                            options={"elastic_ddp": {"checkpoint_every": checkpoint_every}})
    store = Store(db)
    with _progress(config, workers, steps, as_json) as update:
        stored = session.run_elastic_ddp(
            config, workers, schedule, store, min_nodes=int(lo), max_nodes=int(hi or lo),
            max_restarts=max_restarts, timeout_s=max_time_s, progress=update,
            oversubscribe=oversubscribe)
    _finish(stored, store, as_json)


@command.command("ps")
@click.option("--workers", type=click.IntRange(2), default=3, show_default=True,
              help="Workers, standby ones included (the server is one process more).")
@click.option("--steps", type=click.IntRange(1), default=20, show_default=True,
              help="Budget: steps x initially active workers updates.")
@click.option("--standby", type=click.IntRange(0), default=1, show_default=True,
              help="The last workers wait idle until one is needed.")
@click.option("--leave", default="0@10", show_default=True, metavar="WORKER@STEPS",
              help="WORKER leaves after STEPS of its own steps.")
@click.option("--join-after", type=click.IntRange(0), default=10, show_default=True,
              help="Updates applied after the leave before a standby joins.")
@common_options
def ps(workers, steps, standby, leave, join_after, workload, batch_size, seed, db,
       oversubscribe, timeout_s, max_time_s, as_json):
    """Asynchronous PS: a worker leaves mid-run and a standby joins; the server keeps going.

    Prints the update rate before the leave, while the worker is gone and after the joiner's
    first update, and the joiner's join time (parameters sent -> its first gradient in).
    """
    who, _, after = leave.partition("@")
    if not (who.isdigit() and after.isdigit()):
        raise PerfmodelError(f"--leave '{leave}' is not WORKER@STEPS (example: 0@10)")
    options = {"ps": {"mode": "async"},
               "elastic_ps": {"leave_worker": int(who), "leave_after_steps": int(after),
                              "standby": standby, "join_after_updates": join_after}}
    config = elastic_config("elastic_ps", workers=workers, workload=workload,
                            batch_size=batch_size, steps=steps, seed=seed, timeout_s=timeout_s,
                            options=options)
    store = Store(db)
    with _progress(config, workers + 1, steps, as_json) as update:
        stored = session.run_membership_ps(config, workers, store, timeout_s=max_time_s,
                                           progress=update, oversubscribe=oversubscribe)
    _finish(stored, store, as_json)


# ------------------------------------------------------------------ plumbing


@contextlib.contextmanager
def _progress(config: dict, nproc: int, steps: int, as_json: bool):
    label = f"{config['kind']} ({config['workload']}, {nproc} processes)"
    with RunsProgress(command="perfmodel measure", label=label, total=steps,
                      bar=not as_json and sys.stderr.isatty(), lines=False) as bar:
        yield bar.start(label, steps)


def _finish(stored: session.StoredRun, store: Store, as_json: bool) -> None:
    """Print the stored run's summary and its elastic events; exit 1 if it failed."""
    summary = summarize(store.get_run(stored.run_id))
    events = elastic_events(stored.run_dir)
    summary["elastic"] = events
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(render(summary))
        for e in events:
            click.echo("  " + render_elastic_event(e))
        click.echo(f"stored as run {stored.run_id} in {store.path} (raw records: "
                   f"{stored.run_dir})")
    check_run(stored)
