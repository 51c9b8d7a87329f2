"""`perfmodel measure`: launch one real torch.distributed run, store it, summarise it.

Each subcommand parses its options into the run's config.json (measure/configs.py), has
measure/session.py launch and store it, and prints the summary of measure/summary.py.
torch is never imported here: only the worker processes import it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from measure import session
from measure.configs import (
    collectives_config,
    compute_config,
    parse_batch_sizes,
    parse_size,
    processes,
    progress_total,
    training_config,
)
from measure.configs import torchrun_args as make_torchrun_args
from measure.runs.collectives import OPS as COLLECTIVE_OPS
from measure.store import Store
from measure.summary import render, summarize
from perfmodel.commands.errors import check_run
from perfmodel.commands.measure_elastic import command as elastic_command
from perfmodel.commands.options import Finite
from perfmodel.commands.progress import RunsProgress
from perfmodel.commands.protocol_options import make_protocol, protocol_options
from perfmodel.errors import PerfmodelError


@click.group("measure")
def command() -> None:
    """Run real torch.distributed measurements and store them (needs torch).

    Every run is launched with torchrun (gloo on CPU, NCCL with CUDA GPUs), one thread per
    worker, and stored with all its records in the measurement store (--db, else
    $PERFMODEL_DB, else ~/.local/share/perfmodel/measurements.sqlite); `perfmodel runs` lists
    them. A run that fails or is interrupted is stored too, marked failed with the reason.

    Several nodes: run the same command on every node with --nnodes, --node-rank,
    --rdzv-endpoint (and --nproc-per-node); each node stores the records of its own ranks.

    \b
    Examples:
      perfmodel measure collectives --workers 2 --max-bytes 16M
      perfmodel measure ddp --workers 2 --workload mlp --steps 20
      perfmodel measure ps --workers 2 --workload mlp --mode async --speed 1,0.5
    """


# ------------------------------------------------------------------ shared options


def run_options(f):
    """Options of every subcommand: store, capacity, link cap, timeouts, torchrun flags."""
    for opt in reversed([
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of every rank's data and initial weights."),
        click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Measurement store [$PERFMODEL_DB or the per-user default]."),
        click.option("--oversubscribe", is_flag=True,
                     help="Allow more compute processes than CPU cores (recorded in the run)."),
        click.option("--link-rate-Gbps", "link_rate_Gbps", type=Finite(0, min_open=True),
                     default=None, help="Split the ranks over two emulated nodes joined by a "
                     "link capped at this rate (root only; network namespaces + tc tbf)."),
        click.option("--threads-per-worker", type=click.IntRange(1), default=1,
                     show_default=True, help="torch threads per rank."),
        click.option("--timeout-s", type=Finite(1), default=300, show_default=True,
                     help="Process-group timeout: a dead or stuck peer fails the run after this."),
        click.option("--max-time-s", type=Finite(1), default=None,
                     help="Stop the whole run after this many seconds [no limit]."),
        click.option("--nnodes", default=None, help="torchrun: nodes (multi-node runs)."),
        click.option("--node-rank", type=int, default=None, help="torchrun: this node's rank."),
        click.option("--rdzv-endpoint", default=None, help="torchrun: HOST:PORT of node 0."),
        click.option("--rdzv-id", default=None, help="torchrun: job id shared by all nodes."),
        click.option("--nproc-per-node", type=click.IntRange(1), default=None,
                     help="torchrun: processes on this node [the run's process count]."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]):
        f = opt(f)
    return protocol_options(f)


def training_options(f):
    for opt in reversed([
        click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
                     help="Training workers (PS: the server is one process more)."),
        click.option("--workload", required=True,
                     help="Workload name (see `perfmodel workloads`)."),
        click.option("--batch-size", type=click.IntRange(1), default=None,
                     help="Samples per worker per step [the workload's]."),
        click.option("--steps", type=click.IntRange(1), default=20, show_default=True,
                     help="Timed steps per worker (PS: pushes per worker)."),
        click.option("--warmup-steps", type=click.IntRange(0), default=2, show_default=True,
                     help="Untimed steps before them."),
        click.option("--speed", default=None, metavar="S1,S2,...",
                     help="Relative speed of each worker (1 = full, 0.5 = half speed)."),
    ]):
        f = opt(f)
    return f


# ------------------------------------------------------------------ running


def execute(config: dict, nproc: int, *, progress_total: int, db, oversubscribe,
            link_rate_Gbps, max_time_s, nnodes, node_rank, rdzv_endpoint, rdzv_id,
            nproc_per_node, as_json, settle_load=0.5, settle_max_s=0.0,
            no_pin=False) -> None:
    """Launch, store, summarise; exit 1 if the run failed, 130 if interrupted (the run is
    stored either way)."""
    store = Store(db)
    torchrun_args = make_torchrun_args(nnodes, node_rank, rdzv_endpoint, rdzv_id)
    if nproc_per_node is not None:
        nproc = nproc_per_node
    label = f"{config['kind']} ({config.get('workload') or 'sweep'}, {nproc} processes)"
    with RunsProgress(command="perfmodel measure", label=label, total=progress_total,
                      bar=not as_json and sys.stderr.isatty(), lines=False) as bar:
        stored = session.run(config, nproc, store, torchrun_args=torchrun_args,
                             link_rate_Gbps=link_rate_Gbps,
                             progress=bar.start(label, progress_total),
                             oversubscribe=oversubscribe, timeout_s=max_time_s,
                             protocol=make_protocol(settle_load, settle_max_s, no_pin))
    summary = summarize(store.get_run(stored.run_id))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(render(summary))
        click.echo(f"stored as run {stored.run_id} in {store.path} (raw records: "
                   f"{stored.run_dir})")
    check_run(stored)


# ------------------------------------------------------------------ subcommands


@command.command("collectives")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
              help="Ranks taking part.")
@click.option("--ops", default=",".join(COLLECTIVE_OPS), show_default=True,
              help="Comma-separated collectives; ping-pong times one way of a round trip.")
@click.option("--min-bytes", default="8", show_default=True, help="Smallest size S (8, 64K, 1M).")
@click.option("--max-bytes", default=None, help="Largest size S [256M on GPUs, 64M on CPU].")
@click.option("--factor", type=click.IntRange(2), default=2, show_default=True,
              help="Size multiplier between steps.")
@click.option("--iters", type=click.IntRange(1), default=None,
              help="Timed iterations per size [20 on GPUs, 10 on CPU].")
@click.option("--warmup-iters", type=click.IntRange(0), default=None,
              help="Untimed iterations first [5 on GPUs, 2 on CPU].")
@click.option("--dtype", default="float32", show_default=True, help="Element type.")
@run_options
def collectives(workers, ops, min_bytes, max_bytes, factor, iters, warmup_iters, dtype,
                seed, timeout_s, threads_per_worker, **kwargs):
    """Sweep collectives over message sizes, as nccl-tests does.

    For each collective and size S: warm-up, then timed iterations; the slowest rank's time
    per iteration t; algbw = S/t and busbw = algbw x factor (2(n-1)/n all-reduce, (n-1)/n
    all-gather and reduce-scatter, 1 broadcast, send/recv and ping-pong). ping-pong's t is
    one way, half a round trip between rank pairs (OSU's osu_latency): the message a
    parameter server's push or pull is.

    \b
    Examples:
      perfmodel measure collectives --workers 2
      perfmodel measure collectives --workers 2 --ops all-reduce --min-bytes 1M --max-bytes 64M
      sudo perfmodel measure collectives --workers 2 --link-rate-Gbps 1
    """
    config = collectives_config(
        workers=workers, ops=[o.strip() for o in ops.split(",") if o.strip()],
        min_bytes=parse_size(min_bytes), max_bytes=parse_size(max_bytes) if max_bytes else None,
        factor=factor, iters=iters, warmup_iters=warmup_iters, dtype=dtype, seed=seed,
        timeout_s=timeout_s, threads_per_worker=threads_per_worker)
    execute(config, workers, progress_total=progress_total(config), **kwargs)


@command.command("compute")
@click.option("--workload", required=True, help="Workload name (see `perfmodel workloads`).")
@click.option("--batch-sizes", default=None, metavar="B1,B2,...",
              help="Batch sizes to time [the workload's, its half and its double].")
@click.option("--repeats", type=click.IntRange(3), default=20, show_default=True,
              help="Timed repetitions per unit, pass and batch size.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True,
              help="Untimed repetitions first.")
@click.option("--concurrent", type=click.IntRange(1), default=None, metavar="P",
              help="Instead: time whole steps at the first batch size in P processes at once "
              "(wall and CPU seconds per step: compute under core sharing; P above the "
              "cores needs --oversubscribe).")
@run_options
def compute(workload, batch_sizes, repeats, warmup, concurrent, seed, timeout_s,
            threads_per_worker, **kwargs):
    """Time forward and backward of each unit of a workload at several batch sizes.

    One process; median and IQR of the repetitions, with a warning where IQR/median > 10 %.
    With --concurrent P, P processes each time whole forward + backward steps at the same
    time; runs with P = 1, 2, 3 feed compute.core_contention (docs/model.md).

    \b
    Examples:
      perfmodel measure compute --workload mlp
      perfmodel measure compute --workload cnn-small --batch-sizes 16,32,64 --json
      perfmodel measure compute --workload cnn-small --concurrent 3 --oversubscribe
    """
    sizes = parse_batch_sizes(batch_sizes, workload)
    if concurrent and not batch_sizes:
        from perfmodel.workload import load_workload

        sizes = [load_workload(workload).batch_size]
    config = compute_config(workload=workload, batch_sizes=sizes,
                            repeats=repeats, warmup=warmup, seed=seed, timeout_s=timeout_s,
                            threads_per_worker=threads_per_worker, concurrent=concurrent or 0)
    execute(config, concurrent or 1, progress_total=progress_total(config), **kwargs)


@command.command("ddp")
@training_options
@click.option("--bucket-cap-MiB", "bucket_cap_MiB", type=Finite(0, min_open=True),
              default=None, help="Gradient bucket cap [torch's 25].")
@click.option("--first-bucket-MiB", "first_bucket_MiB", type=Finite(0, min_open=True),
              default=None, help="First bucket size [torch's 1].")
@run_options
def ddp(bucket_cap_MiB, first_bucket_MiB, **kwargs):
    """Train with DistributedDataParallel and record every step.

    Per step and rank: wall time, compute time, communication wait, loss; per rank: peak
    memory. Stragglers with --speed (a worker at 0.5 takes twice as long to compute).

    \b
    Examples:
      perfmodel measure ddp --workers 2 --workload mlp
      perfmodel measure ddp --workers 2 --workload cnn-small --bucket-cap-MiB 1 --json
    """
    _training("ddp", {"bucket_cap_MiB": bucket_cap_MiB, "first_bucket_MiB": first_bucket_MiB},
              **kwargs)


@command.command("fsdp")
@training_options
@click.option("--variant", type=click.Choice(["full-shard", "grad-op"]), default="full-shard",
              show_default=True, help="full-shard (ZeRO-3) or grad-op (no re-gather in "
              "backward, ZeRO-2-like).")
@run_options
def fsdp(variant, **kwargs):
    """Train with FSDP2 (fully_shard) and record every step and the peak memory per rank.

    \b
    Examples:
      perfmodel measure fsdp --workers 2 --workload transformer-small
      perfmodel measure fsdp --workers 2 --workload mlp --variant grad-op
    """
    _training("fsdp", {"variant": variant}, **kwargs)


@command.command("ps")
@training_options
@click.option("--mode", type=click.Choice(["sync", "async", "ssp"]), default="async",
              show_default=True, help="Synchronous, asynchronous or bounded staleness.")
@click.option("--staleness-bound", type=click.IntRange(0), default=None,
              help="ssp: clocks a worker may run ahead of the slowest.")
@click.option("--staleness-aware-lr", is_flag=True, default=None,
              help="async: scale the learning rate by 1/staleness.")
@click.option("--delay-compensation", is_flag=True, default=None,
              help="async: DC-ASGD delay compensation on the server.")
@click.option("--lr", type=Finite(0, min_open=True), default=None,
              help="Learning rate of the server's optimizer [the workload's, e.g. 0.05 for "
                   "mlp]; a smaller one keeps async training stable at higher staleness.")
@run_options
def ps(mode, staleness_bound, staleness_aware_lr, delay_compensation, lr, **kwargs):
    """Train with a parameter server: rank 0 serves, ranks 1..N train.

    Records every update's staleness (version applied - version read), each worker's steps,
    and the server model's accuracy on held-out data.

    \b
    Examples:
      perfmodel measure ps --workers 2 --workload mlp --mode sync
      perfmodel measure ps --workers 3 --workload mlp --mode async --speed 1,1,0.5
      perfmodel measure ps --workers 2 --workload mlp --mode ssp --staleness-bound 2
      perfmodel measure ps --workers 2 --workload mlp --mode async --lr 0.01
    """
    if staleness_bound is not None and mode != "ssp":
        raise PerfmodelError("--staleness-bound applies to --mode ssp only")
    if (staleness_aware_lr or delay_compensation) and mode != "async":
        raise PerfmodelError("--staleness-aware-lr and --delay-compensation apply to "
                             "--mode async only")
    _training("ps", {"mode": mode, "staleness_bound": staleness_bound,
                     "staleness_aware_lr": staleness_aware_lr,
                     "delay_compensation": delay_compensation, "lr": lr}, **kwargs)


def _training(kind: str, options: dict, *, workers, workload, batch_size, steps, warmup_steps,
              speed, seed, timeout_s, threads_per_worker, **kwargs) -> None:
    config = training_config(kind, workers=workers, workload=workload, batch_size=batch_size,
                             steps=steps, warmup_steps=warmup_steps, speed=speed, seed=seed,
                             timeout_s=timeout_s, threads_per_worker=threads_per_worker,
                             options=options)
    execute(config, processes(config), progress_total=progress_total(config), **kwargs)


command.add_command(elastic_command)      # `perfmodel measure elastic ddp|ps`
