"""`perfmodel calibrate`: measure what is missing, fit the model's parameters, write a profile.

Steps: check that this machine may calibrate the named cluster (calibration/hardware.py),
list the suite of measurements it needs (calibration/suite.py), then let the calibration
driver (calibration/driver.py) run those not already in the store, fit them and write the
profile. This module parses the options and prints. torch is only imported by the
measurement processes.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from perfmodel.commands.options import Finite
from perfmodel.commands.progress import RunsProgress
from perfmodel.commands.protocol_options import make_protocol, protocol_options
from perfmodel.errors import PerfmodelError

PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")    # as calibration/profile_writer.py


@click.command("calibrate")
@click.option("--cluster", required=True,
              help="Profile to write: local (this machine), a shipped GPU profile (on that "
                   "GPU only) or a new name.")
@click.option("--fresh", is_flag=True, help="Measure everything again instead of reusing "
              "runs stored in the last 24 hours on this host.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Measurement store [$PERFMODEL_DB or the per-user default].")
@click.option("--workloads", default=None, metavar="W1,W2,...",
              help="Workloads to profile [CPU: cnn-small,mlp,transformer-small; GPU: "
                   "resnet50,bert-large]; DDP and PS run the first, DDP the second once.")
@click.option("--quick", is_flag=True, help="A smaller suite (fewer sizes, repeats and "
              "steps; about half the time) for tests and a first look; wider residuals.")
@click.option("--max-time-s", type=Finite(1), default=600, show_default=True,
              help="Stop any one measurement after this many seconds.")
@click.option("--nnodes", default=None, help="torchrun: nodes (calibrating several nodes).")
@click.option("--node-rank", type=int, default=None, help="torchrun: this node's rank.")
@click.option("--rdzv-endpoint", default=None, help="torchrun: HOST:PORT of node 0.")
@click.option("--rdzv-id", default=None, help="torchrun: job id shared by all nodes.")
@click.option("--nproc-per-node", type=click.IntRange(1), default=None,
              help="Ranks per node for collectives and DDP [2 on CPU, every GPU].")
@click.option("--from-nccl-tests", "nccl_logs", multiple=True, metavar="LOG...",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Fit the links from nccl-tests logs (all_reduce_perf, all_gather_perf, "
                   "reduce_scatter_perf; or `perfmodel measure collectives` output) instead "
                   "of measuring; no torch needed.")
@click.option("--from-profiler", "traces", multiple=True, metavar="TRACE...",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Fit the compute parameters from PyTorch profiler traces (Chrome/Kineto "
                   "JSON) of a few training steps of --workload.")
@click.option("--workload", default=None,
              help="With --from-profiler: the workload the traces ran (name or .toml).")
@click.option("--batch-size", type=click.IntRange(1), default=None,
              help="With --from-profiler: batch per step in the traces [the workload's].")
@click.option("--base", default=None,
              help="With --from-*: the profile the unmeasured fields come from [--cluster if "
                   "it is a profile, else the logs' GPU].")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--pool", "pool", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              multiple=True, help="Also fit the same suite's runs stored in this earlier store "
              "(repeatable): one session on a shared or virtual machine is a snapshot of its "
              "state; pooled sessions give steadier fits (calibration/pool.py).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@protocol_options
def command(cluster, fresh, db, workloads, quick, max_time_s, nnodes, node_rank,
            rdzv_endpoint, rdzv_id, nproc_per_node, nccl_logs, traces, workload, batch_size,
            base, files, pool, as_json, settle_load, settle_max_s, no_pin):
    """Measure this machine or cluster and write a calibrated profile.

    Runs the suite of real measurements the model needs (collective sweeps, per-unit compute
    timings, DDP and parameter-server runs), reusing successful runs stored in the last 24
    hours on this host unless --fresh, fits latency, bandwidth, compute efficiency, overlap
    slowdown, memory overheads and the server's apply rate, and writes the profile with
    provenance and residuals to $PERFMODEL_PROFILES (a previous one is backed up). Interrupt
    it and run it again: it resumes with the measurements still missing.

    Several nodes: run the same command on every node with --nnodes, --node-rank and
    --rdzv-endpoint; node 0 fits and writes the profile.

    \b
    Examples:
      perfmodel calibrate --cluster local
      perfmodel calibrate --cluster local --quick --json
      perfmodel calibrate --cluster mybox --workloads mlp,cnn-small --fresh
      perfmodel calibrate --cluster local --db today.sqlite --pool monday.sqlite
      perfmodel calibrate --cluster a10g --nnodes 4 --node-rank 0 --rdzv-endpoint head:29500
      perfmodel calibrate --cluster mynodes --from-nccl-tests all_reduce_perf_*.log
      perfmodel calibrate --cluster mynodes --base h100 --from-nccl-tests ar_1x8.log ar_4x8.log
      perfmodel calibrate --cluster mygpu --base a100 --workload mlp --from-profiler trace.json
    """
    from perfmodel.commands import calibrate_files

    calibrate_files.check_sources(list(nccl_logs), list(traces), files)
    if nccl_logs or traces:
        if not PROFILE_NAME.fullmatch(cluster):
            raise PerfmodelError(f"--cluster '{cluster}': a profile name is letters, digits, "
                                 f"'_', '-' or '.' (it becomes the file name)")
        if nccl_logs:
            calibrate_files.from_nccl_tests(cluster, [*nccl_logs, *files], base, as_json)
            return
        calibrate_files.from_profiler(cluster, [*traces, *files], base, workload, batch_size,
                                      as_json)
        return
    from calibration import driver
    from calibration.hardware import choose_base, detect, torch_version
    from calibration.suite import build_suite
    from measure.configs import torchrun_args
    from measure.launch import require_torch
    from measure.store import Store

    started = time.monotonic()
    if not PROFILE_NAME.fullmatch(cluster):
        raise PerfmodelError(f"--cluster '{cluster}': a profile name is letters, digits, '_', "
                             f"'-' or '.' (it becomes the file name)")
    require_torch()                 # one line: install torch==2.13.0 first; nothing stored
    hw = detect()
    choice = choose_base(cluster, hw)
    args = torchrun_args(nnodes, node_rank, rdzv_endpoint, rdzv_id)
    nodes = int(nnodes) if args and str(nnodes).isdigit() else 1
    if args and nodes < 2:
        raise PerfmodelError(f"--nnodes must be a whole number >= 2 for a multi-node "
                             f"calibration, got {nnodes!r}")
    ranks = nproc_per_node or (len(hw.gpus) if hw.gpus else 2)
    names = tuple(w.strip() for w in workloads.split(",") if w.strip()) if workloads else None
    suite = build_suite(hw.kind, suite=cluster, workloads=names, quick=quick, ranks=ranks,
                        nnodes=nodes)
    if node_rank:                   # other nodes take part in the multi-node runs only
        suite = tuple(m for m in suite if m.multinode)
    store = Store(db)
    pooled = driver.pool_sources(suite, [Store(p) for p in pool], host=hw.host)
    todo = driver.plan(suite, store, fresh=fresh, host=hw.host, torch=torch_version())
    with RunsProgress(command="perfmodel calibrate", label="calibrating",
                      bar=not as_json and sys.stderr.isatty(), lines=True,
                      announce=True) as progress:
        ids, measured = driver.measure(todo, store, torchrun=args, max_time_s=max_time_s,
                                       progress=progress,
                                       protocol=make_protocol(settle_load, settle_max_s,
                                                              no_pin))
    if node_rank:
        click.echo(f"node {node_rank}: measurements done; node 0 fits and writes the profile")
        return
    written = driver.fit_and_write(cluster, ids, store, base=choice.base, pool=pooled)
    for note in written.data["calibration"].get("notes") or []:
        if note.startswith("CHECK FAILED"):     # loud: also in the profile's notes
            click.echo(f"warning: {note}", err=True)
    out = {"cluster": cluster, "profile": str(written.path),
           "backup": str(written.backup) if written.backup else None,
           "base": choice.base, "base_reason": choice.reason, "hardware": hw.describe(),
           "runs": {"used": ids, "measured": measured,
                    "reused": [i for i in ids if i not in measured]},
           "wall_s": time.monotonic() - started, **summary(written.data)}
    click.echo(json.dumps(out, indent=2) if as_json else render(out))
    warn_self_check(written.data)


def warn_self_check(data: dict[str, Any]) -> None:
    """Each component the self-check flagged, one loud line on stderr (also in the
    profile's [calibration] notes and self_check table)."""
    for line in (data.get("calibration") or {}).get("self_check_warnings") or []:
        click.echo(f"perfmodel: warning: {line}", err=True)


# ---------------------------------------------------------------- summary


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """The calibration table of a profile's data, for the JSON and the table."""
    table = data["calibration"]
    return {key: table.get(key) for key in (
        "residuals", "run_spread_cv", "step_rms_rel", "step_comm_rms_rel", "network_rms_rel",
        "compute_rms_rel",
        "residuals_by_op", "checks", "self_check", "measured", "unmeasured", "notes")} | {
        "provenance": {k: data["provenance"][k] for k in ("date", "host", "versions", "runs",
                                                          "devices")}}


def render(out: dict[str, Any]) -> str:
    prov = out["provenance"]
    lines = [
        f"calibrated '{out['cluster']}' in {out['wall_s']:.0f} s: {out['profile']}"
        + (f" (previous profile kept as {Path(out['backup']).name})" if out["backup"] else ""),
        f"  {prov['runs']} runs ({len(out['runs']['measured'])} measured now, "
        f"{len(out['runs']['reused'])} reused) on {prov['host']}: "
        f"{', '.join(prov['devices'])}; {prov['versions']}",
        f"  base '{out['base']}': {out['base_reason']}",
        "",
        f"  {'parameter':<34} {'value':>11} {'± stderr':>11} {'rms resid':>10} "
        f"{'max resid':>10} {'points':>7}",
    ]
    for name, r in (out["residuals"] or {}).items():
        lines.append(f"  {name:<34} {r['value']:>11.4g} {'± ' + format(r['stderr'], '.2g'):>11} "
                     f"{r['rms_rel']:>9.1%} {r['max_rel']:>10.1%} {r['points']:>7}")
    if out.get("run_spread_cv") is not None:
        lines.append(f"  {'run-to-run spread (CV)':<34} {out['run_spread_cv']:>11.1%}")
    if out.get("step_rms_rel") is not None:
        lines.append(f"  {'step residual, fitted runs (RMS)':<34} {out['step_rms_rel']:>11.1%}"
                     f"   (with the spread: the prediction intervals' width)")
    if out.get("step_comm_rms_rel") is not None:
        lines.append(f"  {'... with measured compute (RMS)':<34} "
                     f"{out['step_comm_rms_rel']:>11.1%}   (a timed wait's interval width)")
    by_op = out.get("residuals_by_op") or {}
    if by_op:
        lines += ["", "  residuals by collective (model - measured) / measured:"]
        lines += [f"    {op:<32} bias {r['bias_rel']:+7.1%}   rms {r['rms_rel']:6.1%}   "
                  f"max {r['max_rel']:6.1%}   ({r['points']} points)" for op, r in by_op.items()]
    checks = out.get("checks") or {}
    if checks:
        lines += ["", "  checks, model vs measured (not fitted):"]
        for name, c in checks.items():
            lines.append(f"    {name:<40} {_quantity(name, c['model'])} vs "
                         f"{_quantity(name, c['measured'])} ({c['rel']:+.0%})")
    for run, check in (out.get("self_check") or {}).items():
        lines += ["", f"  self-check on {run} ({check['label']}), a run the fit did not use:"]
        for name, c in check.items():
            if isinstance(c, dict):
                lines.append(f"    {name:<20} predicted {c['predicted_s'] * 1e3:,.2f} ms vs "
                             f"measured {c['measured_s'] * 1e3:,.2f} ms ({c['error_rel']:+.0%};"
                             f" tolerance x{1 + c['tolerance_rel']:.2f} either way)"
                             + ("  <-- OFF" if name in check["flagged"] else ""))
    if out.get("unmeasured"):
        lines += ["", f"  kept from '{out['base']}' (not measured): "
                  + ", ".join(out["unmeasured"])]
    lines += [f"  note: {n}" for n in out.get("notes") or []]
    lines += ["", f"  use it: perfmodel predict --cluster {out['cluster']} --strategy ddp "
              f"--workers 2 --workload mlp"]
    return "\n".join(lines)


def _quantity(name: str, value: float) -> str:
    if "bytes" in name:
        return f"{value / 2**20:,.1f} MiB"
    return f"{value * 1e3:,.2f} ms" if name.split(".")[0].endswith("_s") else f"{value:.4g}"
