"""`perfmodel runs`: list the stored measurement runs, or export them (or one table) to CSV."""

from __future__ import annotations

import json
from pathlib import Path

import click

from perfmodel.errors import PerfmodelError


@click.command("runs")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Measurement store [$PERFMODEL_DB or the per-user default].")
@click.option("--kind", default=None, help="Only runs of this kind (ddp, fsdp, ps, ...).")
@click.option("--workload", default=None, help="Only runs of this workload.")
@click.option("--status", type=click.Choice(["ok", "failed"]), default=None,
              help="Only runs that ended so.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write CSV to this file ('-' for stdout) instead of a table.")
@click.option("--table", default="runs", show_default=True,
              help="With --csv: which table of the matching runs (runs, steps, updates, "
                   "memory, collectives, compute, evals, summaries, errors, ranks).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(db, kind, workload, status, csv_path, table, as_json):
    """List stored measurement runs, or export them to CSV.

    The store's schema is documented in measure/store.py. A run whose launcher died before
    storing it (kill -9) is stored as failed first, with that reason.

    \b
    Examples:
      perfmodel runs
      perfmodel runs --kind ddp --status ok --json
      perfmodel runs --kind collectives --csv collectives.csv --table collectives
    """
    from measure.session import recover_orphans
    from measure.store import TABLES, Store

    store = Store(db)
    if store.journal_dir.is_dir():      # runs orphaned by a dead launcher: stored as failed
        recover_orphans(store)
    if table not in TABLES:
        raise PerfmodelError(f"unknown table '{table}'; choose from: {', '.join(TABLES)}")
    if table != "runs" and csv_path is None:
        raise PerfmodelError("--table applies to --csv exports only")
    if csv_path is not None:
        if str(csv_path) == "-":
            n = store.export_csv(click.get_text_stream("stdout"), table, kind=kind,
                                 workload=workload, status=status)
        else:
            with open(csv_path, "w", newline="", encoding="utf-8") as f:
                n = store.export_csv(f, table, kind=kind, workload=workload, status=status)
            click.echo(f"wrote {n} {table} rows to {csv_path}", err=True)
        return
    runs = store.list_runs(kind=kind, workload=workload, status=status)
    if as_json:
        rows = []
        for r in runs:
            row = {k: getattr(r, k) for k in r.__slots__ if k != "config_json"}
            rows.append(row | {"config": r.config})
        click.echo(json.dumps(rows, indent=2))
        return
    if not runs:
        click.echo(f"no runs stored in {store.path}" + (" match the filters" if
                                                        (kind or workload or status) else ""))
        return
    click.echo(f"{'id':>4} {'kind':<12} {'workload':<18} {'procs':>5} {'status':<7} "
               f"{'started (UTC)':<20} {'wall':>8}  reason")
    for r in runs:
        flags = " [oversubscribed]" if r.oversubscribed else ""
        flags += f" [link {r.link_rate_Gbps:g} Gbit/s]" if r.link_rate_Gbps else ""
        wall = f"{r.wall_s:.1f} s" if r.wall_s is not None else "?"
        click.echo(f"{r.id:>4} {r.kind:<12} {r.workload or '-':<18} {r.world_size or '?':>5} "
                   f"{r.status:<7} {(r.started_at or '?')[:19]:<20} {wall:>8}  "
                   f"{(r.reason or '')[:80]}{flags}")
    click.echo(f"({len(runs)} runs in {store.path})")
