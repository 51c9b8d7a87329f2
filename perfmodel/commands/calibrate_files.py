"""`perfmodel calibrate --from-nccl-tests LOG... | --from-profiler TRACE...`: fit a profile
from files the user already has, without running anything (and, for nccl-tests, without torch).

Parses the options' files, calls the calibration layer and prints; the fitting is in
calibration/from_nccl_tests.py and calibration/from_profiler.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from perfmodel.errors import PerfmodelError


def from_nccl_tests(cluster: str, logs: list[Path], base: str | None, as_json: bool) -> None:
    from calibration.from_nccl_tests import fit_logs, read_all, reproduce
    from calibration.profile_writer import write_profile
    from perfmodel.cluster import load_cluster

    data = fit_logs(logs, name=cluster, base=base)
    written = write_profile(data)
    profile = load_cluster(str(written.path))
    rows = reproduce(profile, [lg for lg in read_all(logs)])
    out = {"cluster": cluster, "profile": str(written.path),
           "backup": str(written.backup) if written.backup else None,
           "base": data["calibration"]["base"], "logs": data["provenance"]["logs"],
           "links": {k: data[k] for k in ("intra_node", "inter_node")},
           "devices_per_node": data["topology"]["devices_per_node"],
           "measured": data["calibration"]["measured"],
           "residuals": data["calibration"]["residuals"],
           "busbw_reproduction": data["calibration"]["busbw_reproduction"],
           "rows": [{"log": r.log, "op": r.op, "ranks": r.ranks, "nodes": r.nodes,
                     "bytes": r.bytes, "measured_busbw_GBps": r.measured_GBps,
                     "model_busbw_GBps": r.model_GBps, "rel": r.rel} for r in rows]}
    click.echo(json.dumps(out, indent=2) if as_json else render_nccl(out))


def render_nccl(out: dict[str, Any]) -> str:
    rep = out["busbw_reproduction"]
    lines = [f"fitted '{out['cluster']}' from {len(out['logs'])} nccl-tests log(s): "
             f"{out['profile']}"
             + (f" (previous profile kept as {Path(out['backup']).name})" if out["backup"]
                else ""),
             f"  base '{out['base']}' (device, compute, memory); {out['devices_per_node']} "
             f"devices per node",
             "",
             f"  {'parameter':<28} {'value':>11} {'± stderr':>11} {'rms resid':>10} "
             f"{'max resid':>10} {'points':>7}"]
    for name, r in out["residuals"].items():
        lines.append(f"  {name:<28} {r['value']:>11.4g} "
                     f"{'± ' + format(r['stderr'], '.2g'):>11} {r['rms_rel']:>9.1%} "
                     f"{r['max_rel']:>10.1%} {r['points']:>7}")
    lines += ["", f"  {'log':<34} {'op':<14} {'size':>10} {'busbw':>9} {'model':>9} "
                  f"{'error':>7}"]
    for r in out["rows"]:
        lines.append(f"  {r['log'][:34]:<34} {r['op']:<14} {_size(r['bytes']):>10} "
                     f"{r['measured_busbw_GBps']:>9.3f} {r['model_busbw_GBps']:>9.3f} "
                     f"{r['rel']:>+7.1%}")
    if rep.get("points"):
        lines.append(f"  busbw reproduced over {rep['points']} rows: rms {rep['rms_rel']:.1%}, "
                     f"max {rep['max_rel']:.1%} (GB/s; model = the written profile)")
    lines += ["", f"  use it: perfmodel predict --cluster {out['cluster']} --strategy ddp "
                  f"--workers {out['devices_per_node']} --workload resnet50"]
    return "\n".join(lines)


def _size(nbytes: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def check_sources(nccl: list[Path], profiler: list[Path], extra: tuple[Path, ...]) -> None:
    if nccl and profiler:
        raise PerfmodelError("--from-nccl-tests and --from-profiler fit different parts of a "
                             "profile: run one, then the other with --base set to the first")
    if extra and not (nccl or profiler):
        raise PerfmodelError(f"unexpected argument(s) {' '.join(map(str, extra))}: files are "
                             f"read only after --from-nccl-tests or --from-profiler")


def from_profiler(cluster: str, traces: list[Path], base: str | None, workload: str | None,
                  batch_size: int | None, as_json: bool) -> None:
    from calibration.from_profiler import fit_traces
    from calibration.profile_writer import write_profile
    from perfmodel.cluster import load_cluster
    from perfmodel.workload import load_workload

    if workload is None:
        raise PerfmodelError("--from-profiler needs --workload: the workload the traces ran "
                             "(its units are the model's child modules)")
    w = load_workload(workload)
    batch = batch_size or w.batch_size
    data, passes = fit_traces(traces, name=cluster, workload=w, batch=batch, base=base)
    written = write_profile(data)
    profile = load_cluster(str(written.path))
    from calibration.from_profiler import reproduce

    rows = reproduce(profile, w, batch, passes)
    cal = data["calibration"]
    out = {"cluster": cluster, "profile": str(written.path),
           "backup": str(written.backup) if written.backup else None, "base": cal["base"],
           "traces": data["provenance"]["traces"], "workload": w.name, "batch_size": batch,
           "compute": {k: data["compute"][k] for k in (
               "efficiency_by_flops", "launch_us_per_kernel", "memory_efficiency",
               "overhead_us_per_unit")},
           "residuals": cal["residuals"], "notes": cal.get("notes", []),
           "unit_pass_reproduction": cal["unit_pass_reproduction"],
           "rows": [{"unit": p.unit, "phase": p.phase, "measured_s": p.total_s,
                     "matmul_s": p.matmul_s, "memory_s": p.memory_s, "model_s": m,
                     "rel": m / p.total_s - 1 if p.total_s else None} for p, m in rows]}
    click.echo(json.dumps(out, indent=2) if as_json else render_profiler(out))


def render_profiler(out: dict[str, Any]) -> str:
    rep, c = out["unit_pass_reproduction"], out["compute"]
    lines = [f"fitted the compute of '{out['cluster']}' from {len(out['traces'])} profiler "
             f"trace(s) of {out['workload']} at batch {out['batch_size']}: {out['profile']}",
             f"  base '{out['base']}' (device peaks, links, memory)",
             f"  launch_us_per_kernel {c['launch_us_per_kernel']:.3g}, memory_efficiency "
             f"{c['memory_efficiency']:.3g}, efficiency_by_flops "
             + ", ".join(f"{x:.3g}: {e:.3g}" for x, e in c["efficiency_by_flops"]),
             "",
             f"  {'unit':<16} {'pass':<9} {'traced':>10} {'matmul':>10} {'memory':>10} "
             f"{'model':>10} {'error':>7}"]
    for r in out["rows"]:
        lines.append(f"  {r['unit']:<16} {r['phase']:<9} {_ms(r['measured_s']):>10} "
                     f"{_ms(r['matmul_s']):>10} {_ms(r['memory_s']):>10} "
                     f"{_ms(r['model_s']):>10} {r['rel']:>+7.0%}")
    if rep.get("points"):
        lines.append(f"  unit passes reproduced: rms {rep['rms_rel']:.0%}, max "
                     f"{rep['max_rel']:.0%} over {rep['points']} (medians over the steps)")
    lines += [f"  note: {n}" for n in out["notes"]]
    lines += ["", f"  use it: perfmodel predict --cluster {out['cluster']} --workload "
                  f"{out['workload']} --strategy ddp --workers 2"]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"
