"""`perfmodel measure elastic`: real runs whose membership changes, stored like every run.

- `ddp`: DistributedDataParallel under torchrun's elastic mode (--nnodes MIN:MAX,
  --max-restarts), checkpointing every few steps; ranks are killed on schedule and the job
  recovers from its last checkpoint (measure/elastic_launch.py, measure/runs/elastic_ddp.py).
- `ps`: an asynchronous parameter server from which a worker leaves mid-run and to which a
  standby worker is added later (measure/runs/elastic_ps.py).

Detection, restart and lost work are stored as "elastic" records (the store's other_records)
so that calibration can replace the model's defaults. torch is imported only by the workers;
the shared plumbing of `perfmodel measure` is imported when a command runs.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import click

from perfmodel.errors import PerfmodelError
from perfmodel.workload import load_workload, workload_paths


def one_line_errors(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except PerfmodelError as e:
            from perfmodel.commands.measure import OneLineError
            raise OneLineError(str(e)) from e
    return wrapper


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
        click.option("--timeout-s", type=click.FloatRange(1), default=120, show_default=True,
                     help="Process-group timeout."),
        click.option("--max-time-s", type=click.FloatRange(1), default=None,
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
@one_line_errors
def ddp(workers, steps, checkpoint_every, kills, nnodes, max_restarts, workload, batch_size,
        seed, db, oversubscribe, timeout_s, max_time_s, as_json):
    """DDP under torchrun elastic mode: kill ranks on schedule, recover from checkpoints.

    Prints each recovery: detection (kill -> survivors stopped), restart (-> every rank
    ready again: rendezvous, process start, process-group init, checkpoint reload), lost
    steps (done since the checkpoint) and recovery (kill -> lost progress regained).
    """
    from measure.elastic_launch import launch_elastic, parse_kills

    schedule = parse_kills(kills)
    lo, _, hi = nnodes.partition(":")
    if not (lo.isdigit() and (hi or lo).isdigit()):
        raise PerfmodelError(f"--nnodes '{nnodes}' is not MIN:MAX (example: 1:2)")
    config = _config("elastic_ddp", workers, workload, batch_size, steps, seed, timeout_s,
                     {"elastic_ddp": {"checkpoint_every": checkpoint_every}})
    result, _ = _run(lambda progress: launch_elastic(
        config, workers, schedule, min_nodes=int(lo), max_nodes=int(hi or lo),
        max_restarts=max_restarts, timeout_s=max_time_s, progress=progress,
        oversubscribe=oversubscribe), config, workers, steps, as_json)
    _finish(result, db, as_json)


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
@one_line_errors
def ps(workers, steps, standby, leave, join_after, workload, batch_size, seed, db,
       oversubscribe, timeout_s, max_time_s, as_json):
    """Asynchronous PS: a worker leaves mid-run and a standby joins; the server keeps going.

    Prints the update rate before the leave, while the worker is gone and after the joiner's
    first update, and the joiner's join time (parameters sent -> its first gradient in).
    """
    from measure.elastic_launch import launch_membership_ps

    who, _, after = leave.partition("@")
    if not (who.isdigit() and after.isdigit()):
        raise PerfmodelError(f"--leave '{leave}' is not WORKER@STEPS (example: 0@10)")
    options = {"ps": {"mode": "async"},
               "elastic_ps": {"leave_worker": int(who), "leave_after_steps": int(after),
                              "standby": standby, "join_after_updates": join_after}}
    config = _config("elastic_ps", workers, workload, batch_size, steps, seed, timeout_s,
                     options)
    result = _run(lambda progress: launch_membership_ps(
        config, workers, timeout_s=max_time_s, progress=progress,
        oversubscribe=oversubscribe), config, workers + 1, steps, as_json)
    _finish(result, db, as_json)


# ------------------------------------------------------------------ plumbing


def _config(kind: str, workers: int, workload: str, batch_size: int | None, steps: int,
            seed: int, timeout_s: float, options: dict) -> dict[str, Any]:
    if workload not in workload_paths():
        raise PerfmodelError(f"unknown workload '{workload}'; choose from: "
                             f"{', '.join(sorted(workload_paths()))}")
    w = load_workload(workload)
    return {"kind": kind, "workers": workers, "workload": workload,
            "batch_size": batch_size or w.batch_size, "steps": steps, "warmup_steps": 0,
            "seed": seed, "speed": [], "options": options, "timeout_s": timeout_s,
            "threads_per_worker": 1}


def _run(start, config: dict, nproc: int, steps: int, as_json: bool):
    from perfmodel.commands.measure import ProgressBar

    label = f"{config['kind']} ({config['workload']}, {nproc} processes)"
    with ProgressBar(steps, label, hidden=as_json or not sys.stderr.isatty()) as update:
        return start(update)


def _finish(result, db, as_json: bool) -> None:
    """Store the run with its records, print its summary and the elastic figures."""
    from measure.recorder import read_records
    from measure.store import Store
    from perfmodel.commands.measure import RunFailedError, render, summarize

    store = Store(db)
    run_id = store.ingest(result.run_dir, result.status, result.reason)
    summary = summarize(store.get_run(run_id))
    elastic = [{k: v for k, v in r.items() if k not in ("type", "rank")}
               for r in read_records(result.run_dir) if r.get("type") == "elastic"
               and r.get("event") in ("recovery", "membership", "left", "join_sent")]
    summary["elastic"] = elastic
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(render(summary))
        for e in elastic:
            click.echo("  " + _line(e))
        click.echo(f"stored as run {run_id} in {store.path} (raw records: {result.run_dir})")
    if result.interrupted:
        raise click.Abort()
    if not result.ok:
        raise RunFailedError(f"run {run_id} failed: {result.reason}")


def _line(e: dict[str, Any]) -> str:
    def s(key: str) -> str:
        v = e.get(key)
        return "?" if v is None else f"{v:.2f} s"

    if e["event"] == "recovery":
        return (f"recovery of attempt {e['attempt']} (rank {e['killed_rank']} killed after "
                f"step {e['steps_done'] - 1}): detection {s('detection_s')}, restart "
                f"{s('restart_s')} (rendezvous {s('rendezvous_s')}, start-up "
                f"{s('startup_s')}, reload {s('reload_s')}), lost {e['lost_steps']} steps "
                f"({s('lost_work_s')}), recovered in {s('recovery_s')}")
    if e["event"] == "membership":
        rates = ", ".join(f"{w} {e[f'update_rate_{w}_per_s']:.1f}/s"
                          for w in ("before", "gone", "after")
                          if f"update_rate_{w}_per_s" in e)
        return (f"updates {e['updates']}: rate {rates}; joiner's first gradient "
                f"{s('join_s')} after the parameters were sent")
    return f"{e['event']}: worker {e.get('worker')} at server version {e.get('version')}"
