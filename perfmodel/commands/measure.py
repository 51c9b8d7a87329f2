"""`perfmodel measure`: launch one real torch.distributed run, store it, summarise it.

Each subcommand builds the run's config.json (keys: measure/worker.py), launches it with
torchrun through measure/launch.py (or measure/netem.py behind a capped link), ingests every
rank's records into the SQLite store (measure/store.py) and prints a summary computed from the
stored records. torch is never imported here: only the worker processes import it.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from measure.configs import check_workload, collectives_config, compute_config, training_config
from measure.configs import torchrun_args as make_torchrun_args
from perfmodel.errors import PerfmodelError
from perfmodel.workload import load_workload

GIB, MIB = 2**30, 2**20
SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}    # nccl-tests: -b 8 -e 128M
NCCL_TYPE = {"float32": "float", "float16": "half", "float64": "double"}  # nccl-tests names


class OneLineError(click.ClickException):
    """A PerfmodelError shown as `perfmodel: error: ...`, exit code 2, as perfmodel.cli does."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"perfmodel: error: {self.message}", err=True)


class RunFailedError(OneLineError):
    """The run happened and failed: exit code 1, not a usage error."""

    exit_code = 1


def one_line_errors(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except PerfmodelError as e:
            raise OneLineError(str(e)) from e
    return wrapper


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
        click.option("--link-rate-Gbps", "link_rate_Gbps", type=click.FloatRange(0, min_open=True),
                     default=None, help="Split the ranks over two emulated nodes joined by a "
                     "link capped at this rate (root only; network namespaces + tc tbf)."),
        click.option("--threads-per-worker", type=click.IntRange(1), default=1,
                     show_default=True, help="torch threads per rank."),
        click.option("--timeout-s", type=click.FloatRange(1), default=300, show_default=True,
                     help="Process-group timeout: a dead or stuck peer fails the run after this."),
        click.option("--max-time-s", type=click.FloatRange(1), default=None,
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
    return f


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


def parse_size(text: str) -> int:
    """Bytes from '8', '64K', '16M', '1G' (binary multiples, as nccl-tests) or '16MiB'."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = t[-1:] if t[-1:] in ("K", "M", "G") else ""
    try:
        value = float(t[:len(t) - len(suffix)]) * SIZE_SUFFIXES[suffix]
    except ValueError:
        raise PerfmodelError(f"'{text}' is not a size in bytes (examples: 8, 64K, 16M, 1G)"
                             ) from None
    if value < 1 or value != int(value):
        raise PerfmodelError(f"'{text}' is not a whole number of bytes >= 1")
    return int(value)


# ------------------------------------------------------------------ running


def execute(config: dict, nproc: int, *, progress_total: int, db, oversubscribe,
            link_rate_Gbps, max_time_s, nnodes, node_rank, rdzv_endpoint, rdzv_id,
            nproc_per_node, as_json) -> None:
    """Launch, store, summarise; exit 1 if the run failed, 130 if interrupted (the run is
    stored either way)."""
    from measure.launch import launch
    from measure.store import Store

    store = Store(db)
    torchrun_args = make_torchrun_args(nnodes, node_rank, rdzv_endpoint, rdzv_id)
    if torchrun_args and link_rate_Gbps is not None:
        raise PerfmodelError("--link-rate-Gbps emulates two nodes on this host; it cannot be "
                             "combined with --nnodes/--rdzv-endpoint")
    if nproc_per_node is not None:
        nproc = nproc_per_node
    label = f"{config['kind']} ({config.get('workload') or 'sweep'}, {nproc} processes)"
    hidden = as_json or not sys.stderr.isatty()
    with ProgressBar(progress_total, label, hidden=hidden) as update:
        if link_rate_Gbps is not None:
            from measure.netem import launch_capped
            result = launch_capped(config, nproc, link_rate_Gbps, progress=update,
                                   oversubscribe=oversubscribe, timeout_s=max_time_s)
        else:
            result = launch(config, nproc, torchrun_args=torchrun_args, progress=update,
                            oversubscribe=oversubscribe, timeout_s=max_time_s)
    run_id = store.ingest(result.run_dir, result.status, result.reason)
    summary = summarize(store.get_run(run_id))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(render(summary))
        click.echo(f"stored as run {run_id} in {store.path} (raw records: {result.run_dir})")
    if result.interrupted:
        raise click.Abort()
    if not result.ok:
        raise RunFailedError(f"run {run_id} failed: {result.reason}")


class ProgressBar:
    """A click progress bar on stderr fed by the launcher's record count (capped at total)."""

    def __init__(self, total: int, label: str, hidden: bool):
        self.total, self.label, self.hidden = max(total, 1), label, hidden
        self.bar, self.shown = None, 0

    def __enter__(self):
        if not self.hidden:
            self.bar = click.progressbar(length=self.total, label=self.label,
                                         file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        return self.update

    def update(self, done: int) -> None:
        done = min(done, self.total)
        if self.bar is not None and done > self.shown:
            self.bar.update(done - self.shown)
            self.shown = done

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


# ------------------------------------------------------------------ subcommands


@command.command("collectives")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
              help="Ranks taking part.")
@click.option("--ops", default="all-reduce,all-gather,reduce-scatter,broadcast,send-recv",
              show_default=True, help="Comma-separated collectives.")
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
@one_line_errors
def collectives(workers, ops, min_bytes, max_bytes, factor, iters, warmup_iters, dtype,
                seed, timeout_s, threads_per_worker, **kwargs):
    """Sweep collectives over message sizes, as nccl-tests does.

    For each collective and size S: warm-up, then timed iterations; the slowest rank's time
    per iteration t; algbw = S/t and busbw = algbw x factor (2(n-1)/n all-reduce, (n-1)/n
    all-gather and reduce-scatter, 1 broadcast and send/recv).

    \b
    Examples:
      perfmodel measure collectives --workers 2
      perfmodel measure collectives --workers 2 --ops all-reduce --min-bytes 1M --max-bytes 64M
      sudo perfmodel measure collectives --workers 2 --link-rate-Gbps 1
    """
    from measure.runs.collectives import DEFAULTS, DTYPES, OPS, message_sizes

    op_list = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in op_list if o not in OPS]
    if unknown or not op_list:
        raise PerfmodelError(f"unknown collective '{unknown[0] if unknown else ops}'; choose "
                             f"from: {', '.join(OPS)}")
    if dtype not in DTYPES:
        raise PerfmodelError(f"unknown dtype '{dtype}'; choose from: {', '.join(DTYPES)}")
    lo, hi = parse_size(min_bytes), parse_size(max_bytes) if max_bytes else None
    guess = DEFAULTS["cuda" if shutil.which("nvidia-smi") else "cpu"]["max_bytes"]
    if lo > (hi or guess):
        raise PerfmodelError(f"--min-bytes {lo} exceeds --max-bytes {hi or guess}")
    config = collectives_config(workers=workers, ops=op_list, min_bytes=lo, max_bytes=hi,
                                factor=factor, iters=iters, warmup_iters=warmup_iters,
                                dtype=dtype, seed=seed, timeout_s=timeout_s,
                                threads_per_worker=threads_per_worker)
    total = len(op_list) * len(message_sizes(lo, hi or guess, factor))
    execute(config, workers, progress_total=total, **kwargs)


@command.command("compute")
@click.option("--workload", required=True, help="Workload name (see `perfmodel workloads`).")
@click.option("--batch-sizes", default=None, metavar="B1,B2,...",
              help="Batch sizes to time [the workload's, its half and its double].")
@click.option("--repeats", type=click.IntRange(3), default=20, show_default=True,
              help="Timed repetitions per unit, pass and batch size.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True,
              help="Untimed repetitions first.")
@run_options
@one_line_errors
def compute(workload, batch_sizes, repeats, warmup, seed, timeout_s, threads_per_worker,
            **kwargs):
    """Time forward and backward of each unit of a workload at several batch sizes.

    One process; median and IQR of the repetitions, with a warning where IQR/median > 10 %.

    \b
    Examples:
      perfmodel measure compute --workload mlp
      perfmodel measure compute --workload cnn-small --batch-sizes 16,32,64 --json
    """
    w = load_workload(check_workload(workload))
    if batch_sizes:
        try:
            sizes = [int(b) for b in batch_sizes.split(",")]
        except ValueError:
            raise PerfmodelError(f"--batch-sizes '{batch_sizes}' is not a comma-separated "
                                 f"list of whole numbers") from None
        if any(b < 1 for b in sizes):
            raise PerfmodelError("every batch size must be at least 1")
    else:
        sizes = sorted({max(1, w.batch_size // 2), w.batch_size, 2 * w.batch_size})
    config = compute_config(workload=workload, batch_sizes=sizes, repeats=repeats,
                            warmup=warmup, seed=seed, timeout_s=timeout_s,
                            threads_per_worker=threads_per_worker)
    execute(config, 1, progress_total=2 * len(w.units) * len(sizes), **kwargs)


@command.command("ddp")
@training_options
@click.option("--bucket-cap-MiB", "bucket_cap_MiB", type=click.FloatRange(0, min_open=True),
              default=None, help="Gradient bucket cap [torch's 25].")
@click.option("--first-bucket-MiB", "first_bucket_MiB", type=click.FloatRange(0, min_open=True),
              default=None, help="First bucket size [torch's 1].")
@run_options
@one_line_errors
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
@one_line_errors
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
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=None,
              help="Learning rate of the server's optimizer [the workload's, e.g. 0.05 for "
                   "mlp]; a smaller one keeps async training stable at higher staleness.")
@run_options
@one_line_errors
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
    nproc = workers + 1 if kind == "ps" else workers
    execute(config, nproc, progress_total=steps, **kwargs)


# ------------------------------------------------------------------ summary


def summarize(run) -> dict[str, Any]:
    """The numbers a person wants after a run, from its stored records (measure.store.Run)."""
    import numpy as np

    row = run.row
    out: dict[str, Any] = {
        "run_id": row.id, "kind": row.kind, "status": row.status, "reason": row.reason,
        "workload": row.workload, "workers": row.workers, "world_size": row.world_size,
        "backend": row.backend, "wall_s": row.wall_s, "oversubscribed": bool(row.oversubscribed),
        "link_rate_Gbps": row.link_rate_Gbps,
    }
    steps = run.table("steps")
    if steps:
        wall = np.array([s["wall_s"] for s in steps], dtype=float)
        q1, med, q3 = np.percentile(wall, [25, 50, 75])
        reported = [s["value"] for s in run.table("summaries")
                    if s["key"] == "throughput_samples_per_s"]
        if reported:
            throughput = max(reported)
        else:       # each rank's own rate, summed
            throughput = sum(
                sum(s["samples"] or 0 for s in mine) / sum(s["wall_s"] for s in mine)
                for r in {s["rank"] for s in steps}
                if (mine := [s for s in steps if s["rank"] == r]))
        last = {s["rank"]: s["loss"] for s in steps if s["loss"] is not None}
        out |= {"throughput_samples_per_s": throughput,
                "step_time_s": {"median": med, "iqr": q3 - q1, "count": len(steps)},
                "compute_s_median": float(np.median([s["compute_s"] for s in steps])),
                "comm_wait_s_median": float(np.median([s["comm_wait_s"] for s in steps])),
                "final_loss": float(np.mean(list(last.values()))) if last else None}
    memory = run.table("memory")
    if memory:
        out["peak_memory_bytes"] = {str(m["rank"]): m["peak_bytes"] for m in memory}
        out["memory_method"] = memory[0].get("method")
    updates = run.table("updates")
    if updates:
        tau = np.array([u["staleness"] for u in updates], dtype=float)
        out["staleness"] = {"mean": float(tau.mean()), "max": float(tau.max()),
                            "updates": len(updates)}
    evals = run.table("evals")
    if evals:
        final = max(evals, key=lambda e: (e["step"] or 0))
        out["accuracy"] = final.get("accuracy")
    if run.table("collectives"):
        out["collectives"] = [{k: c[k] for k in ("op", "bytes", "count", "dtype", "time_s",
                                                 "algbw_GBps", "busbw_GBps", "busbw_factor")}
                              for c in run.table("collectives")]
    if run.table("compute"):
        out["compute"] = [{k: c.get(k) for k in ("unit", "batch_size", "pass", "median_s",
                                                 "iqr_s", "repeats")}
                          for c in run.table("compute")]
    return out


def render(s: dict[str, Any]) -> str:
    head = (f"run {s['run_id']}: {s['kind']}"
            + (f" {s['workload']}" if s.get("workload") else "")
            + f", {_processes(s['world_size'])} ({s['backend'] or '?'})"
            + (f", link capped at {s['link_rate_Gbps']:g} Gbit/s" if s["link_rate_Gbps"] else "")
            + (", OVERSUBSCRIBED" if s["oversubscribed"] else "")
            + f": {s['status'].upper()}" + (f" — {s['reason']}" if s["reason"] else ""))
    lines = [head]
    if "step_time_s" in s:
        st = s["step_time_s"]
        lines += [f"  throughput       {s['throughput_samples_per_s']:,.1f} samples/s",
                  f"  step time        median {_ms(st['median'])}   IQR {_ms(st['iqr'])}   "
                  f"({st['count']} step records)",
                  f"  per step         compute {_ms(s['compute_s_median'])} | comm wait "
                  f"{_ms(s['comm_wait_s_median'])} (medians)"]
        if s.get("final_loss") is not None:
            lines.append(f"  final loss       {s['final_loss']:.4f}")
    if "peak_memory_bytes" in s:
        peaks = s["peak_memory_bytes"]
        lines.append(f"  peak memory      {max(peaks.values()) / MIB:,.1f} MiB max over ranks "
                     f"({s['memory_method']}): "
                     + ", ".join(f"r{r} {v / MIB:,.1f}" for r, v in peaks.items()))
    if "staleness" in s:
        t = s["staleness"]
        lines.append(f"  staleness        mean {t['mean']:.2f}, max {t['max']:.0f} over "
                     f"{t['updates']} updates")
    if s.get("accuracy") is not None:
        lines.append(f"  accuracy         {s['accuracy']:.4f} (held-out)")
    if "collectives" in s:
        lines.append(render_collectives(s["collectives"]))
    if "compute" in s:
        lines.append(render_compute(s["compute"]))
    return "\n".join(lines)


def render_collectives(rows: list[dict]) -> str:
    """nccl-tests' columns: size count type redop time algbw busbw."""
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        out += [f"# {op}",
                f"#{'size':>12} {'count':>12} {'type':>7} {'redop':>6} {'time':>10} "
                f"{'algbw':>8} {'busbw':>8}",
                f"#{'(B)':>12} {'(elements)':>12} {'':>7} {'':>6} {'(us)':>10} "
                f"{'(GB/s)':>8} {'(GB/s)':>8}"]
        for r in (r for r in rows if r["op"] == op):
            redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
            out.append(f" {r['bytes']:>12} {r['count']:>12} "
                       f"{NCCL_TYPE.get(r['dtype'], r['dtype']):>7} {redop:>6} "
                       f"{r['time_s'] * 1e6:>10.1f} {r['algbw_GBps']:>8.3f} "
                       f"{r['busbw_GBps']:>8.3f}")
    return "\n".join(out)


def render_compute(rows: list[dict]) -> str:
    out = [f"  {'unit':<16} {'batch':>6} {'pass':<9} {'median':>10} {'IQR/median':>10}"]
    for r in rows:
        med, iqr = r["median_s"] or 0.0, r["iqr_s"] or 0.0
        ratio = iqr / med if med else 0.0
        out.append(f"  {str(r['unit']):<16} {r['batch_size']:>6} {str(r['pass']):<9} "
                   f"{_ms(med):>10} {ratio:>9.0%}" + ("  noisy" if ratio > 0.10 else ""))
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def _processes(n: int | None) -> str:
    return "? processes" if n is None else f"{n} process" + ("es" if n != 1 else "")


from perfmodel.commands.measure_elastic import command as elastic_command  # noqa: E402

command.add_command(elastic_command)      # `perfmodel measure elastic ddp|ps`
