"""`perfmodel sweep`: strategies x worker counts, one table, a CSV, a JSON and a plot."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import click

from perfmodel import strategies as strategy_records
from perfmodel.commands.options import (
    ELASTIC_OPTION_NAMES,
    build_scenario,
    check_elastic_options_fit,
    elastic_options,
    pop_elastic_options,
    pop_strategy_options,
    scenario_options,
    strategy_options,
)
from perfmodel.errors import PerfmodelError
from perfmodel.sim.strategy import make_strategy


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise PerfmodelError(f"--workers '{text}' is not a comma-separated list of "
                             "integers") from None
    if any(v < 1 for v in values):
        raise PerfmodelError("every worker count must be at least 1")
    return values


@click.command("sweep")
@click.option("--strategies", default="ddp,fsdp,sync-ps,async-ps", show_default=True,
              help=f"Comma-separated strategies from: {', '.join(strategy_records.names())}.")
@click.option("--workers", default="1,2,4,8,16,32,64", show_default=True,
              help="Comma-separated worker counts.")
@scenario_options
@strategy_options
@elastic_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for sweep.csv, sweep.json and sweep.png "
                   "[default: sweep-<cluster>-<workload>].")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.option("--jobs", type=click.IntRange(1), default=None,
              help="Processes predicting points at once; 1 runs them one by one in this "
                   "process. The rows are the same either way. [this machine's cores]")
def command(strategies, workers, out, as_json, jobs, **kwargs):
    """Predict every strategy at every worker count; write a table, CSV, JSON and a plot.

    Strategy options apply to the strategies that take them (e.g. --variant to fsdp only).
    The plot shows throughput, scaling efficiency and peak memory per device against workers.
    With elasticity options (a failure rate or an event schedule, as for `perfmodel
    predict`), every row also gets goodput and time lost to restarts, and goodput.png plots
    goodput against workers and throughput over the run at the largest worker count.

    \b
    Examples:
      perfmodel sweep --strategies ddp,fsdp --workers 1,8,64,512 --workload gpt2-xl
      perfmodel sweep --cluster a10g --workers 1,4,16,64 --out sweeps/a10g
      perfmodel sweep --workers 8,32,128 --failure-rate-per-hour 0.01 --run-hours 48
    """
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        raise PerfmodelError(f"--strategies '{strategies}' names no strategy; choose from "
                             f"{', '.join(strategy_records.names())}")
    for s in names:
        strategy_records.get(s)     # an unknown name: one line listing the known ones
    counts = _int_list(workers)
    if kwargs["speed"] is not None:
        raise PerfmodelError("--speed lists one speed per worker and cannot apply to a sweep "
                             "over worker counts; use --stragglers K --straggler-speed S")
    if kwargs["stragglers"] > min(counts):
        raise PerfmodelError(f"--stragglers {kwargs['stragglers']} exceeds the smallest worker "
                             f"count {min(counts)}")
    # an elasticity option must fit at least one strategy of the sweep (as strategy options)
    given_elastic = {k: kwargs.get(k) for k in ELASTIC_OPTION_NAMES}
    refusals = []
    for s in names:
        try:
            check_elastic_options_fit(given_elastic, s)
        except PerfmodelError as e:
            refusals.append(str(e))
    if len(refusals) == len(names):
        raise PerfmodelError(f"it applies to none of {', '.join(names)}: {refusals[0]}")
    elastic = pop_elastic_options(kwargs, max(counts))
    if elastic is not None and elastic.events:
        from perfmodel.goodput import check_events

        check_events(elastic.events, min(counts))     # before any work: every point has them
    given = pop_strategy_options(kwargs)
    per_strategy = {}
    for s in names:
        accepted = set(asdict(make_strategy(s).options))
        per_strategy[s] = {k: v for k, v in given.items() if k in accepted}
    unused = set(given) - {k for opts in per_strategy.values() for k in opts}
    if unused:
        raise PerfmodelError(f"option(s) {', '.join(sorted(unused))} apply to none of "
                             f"{', '.join(names)}")

    out = out or Path(f"sweep-{kwargs['cluster']}-{Path(kwargs['workload']).stem}")
    try:                                # before any work: an unwritable --out is one line
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-check").touch()
        (out / ".write-check").unlink()
    except OSError as e:
        raise PerfmodelError(f"--out {out}: cannot write there ({e.strerror})") from None

    from perfmodel.sweep import load_pyplot, plot, run_sweep, write_csv, write_json

    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    from perfmodel.commands.progress import RunsProgress

    with RunsProgress(command="perfmodel sweep", label="predicting", bar=True, lines=False,
                      total=len(names) * len(counts)) as bar:
        scenarios = [build_scenario(workers=n, **kwargs) for n in counts]
        # with a pool, this process imports matplotlib for the plot while the workers predict
        rows = run_sweep(scenarios, names, per_strategy, progress=bar.advance,
                         elastic=elastic, jobs=jobs, while_waiting=load_pyplot)
    base = scenarios[0]
    meta = {"cluster": base.cluster.name, "workload": base.workload.name,
            "batch_size": base.batch_size, "seed": base.seed, "options": per_strategy,
            "cluster_source": base.cluster.provenance.source}
    write_csv(rows, out / "sweep.csv")
    write_json(rows, out / "sweep.json", meta)
    title = (f"{base.workload.name} on {base.cluster.name} "
             f"({base.cluster.provenance.source}), batch {base.batch_size} per worker")
    plot(rows, out / "sweep.png", title)
    if elastic is not None:
        from perfmodel.sweep import plot_over_time

        plot_over_time(rows, out / "goodput.png", title)
    if as_json:
        click.echo((out / "sweep.json").read_text())
        return
    click.echo(f"{'strategy':<9} {'workers':>7} {'samples/s':>12} {'speedup':>8} "
               f"{'step':>10} {'exposed comm':>12} {'wait':>9} {'mem GiB':>8} {'staleness':>9}")
    for r in rows:
        click.echo(f"{r.strategy:<9} {r.workers:>7} {r.throughput_samples_per_s:>12,.1f} "
                   f"{r.speedup_vs_1_worker:>7.2f}x {r.step_time_s * 1e3:>8.1f}ms "
                   f"{r.comm_exposed_s * 1e3:>10.1f}ms {r.wait_s * 1e3:>7.1f}ms "
                   f"{r.peak_memory_GiB:>7.2f}{'!' if r.oom else ' '} {r.staleness_mean:>9.2f}")
    if elastic is not None:
        click.echo(f"\n{'strategy':<9} {'workers':>7} {'goodput/s':>12} {'of thruput':>10} "
                   f"{'restarts lost':>14} {'work lost':>10}")
        for r in rows:
            click.echo(f"{r.strategy:<9} {r.workers:>7} {r.goodput_samples_per_s:>12,.1f} "
                       f"{r.goodput_fraction:>10.1%} {r.time_lost_to_restarts_s:>12,.0f} s "
                       f"{r.lost_work_s:>8,.0f} s")
    click.echo(f"\nwrote {out}/sweep.csv, sweep.json, sweep.png"
               + (", goodput.png" if elastic is not None else "")
               + ("  (! = out of memory)" if any(r.oom for r in rows) else ""))
