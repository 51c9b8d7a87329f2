"""`perfmodel compare`: predict held-out configurations, measure them, report the errors.

Steps (perfmodel/compare/): find calibration set A in the store (or measure it with
--calibrate) and fit the profile from it; predict every configuration of set B and write
the predictions before any run starts; measure set B `--repeats` times; pair runs with
predictions; PyTorch's own memory estimate for GPT-2 XL at scale; figures and the report.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from perfmodel.commands.measure import one_line_errors
from perfmodel.errors import PerfmodelError


@click.command("compare")
@click.option("--cluster", required=True, help="Profile to check, calibrated on this machine "
              "(local).")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Measurement store [$PERFMODEL_DB or the per-user default].")
@click.option("--quick", is_flag=True, help="Three 2-worker configurations, fewer steps, no "
              "PyTorch memory estimate: a first look or a test (a few minutes).")
@click.option("--repeats", type=click.IntRange(2), default=2, show_default=True,
              help="Runs per configuration (>= 2, so the noise floor shows).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the predictions and of the runs' data.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder [reports/<cluster>-<date>-heldout].")
@click.option("--calibrate", is_flag=True, help="Measure calibration set A now where the "
              "store lacks it (as `perfmodel calibrate` would).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Use this calibrated profile instead of fitting set A.")
@click.option("--allow-other-host", is_flag=True,
              help="Compare with a calibration made on another machine (warns).")
@click.option("--torch-memory", default=None, metavar="RANKS|none",
              help="Ranks of the GPT-2 XL FSDP jobs PyTorch's tracker estimates, with "
                   "grad-op and DDP at the first [8,64; none with --quick].")
@click.option("--predict-only", is_flag=True, help="Write the predictions and stop.")
@click.option("--max-time-s", type=click.FloatRange(1), default=600, show_default=True,
              help="Stop any one run after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@one_line_errors
def command(cluster, db, quick, repeats, seed, out, calibrate, profile_path, allow_other_host,
            torch_memory, predict_only, max_time_s, as_json):
    """Predict held-out configurations, measure them, and report the errors.

    Calibration set A is the calibration suite's runs (`perfmodel calibrate`); set B, disjoint
    from it, varies batch size, buckets, workload, FSDP variant, every PS mode, stragglers, a
    capped link (root only) and, beyond this machine's cores, 4-8 workers whose compute is a
    timed wait (labelled TIMED-WAIT). Set B is predicted first, then measured --repeats
    times. Without --quick, elastic runs follow: one DDP run with a killed rank calibrates
    detection, restart and checkpoint costs; a DDP run with two kills and a PS run that a
    worker leaves and a standby joins are predicted from them, then measured. The report
    (report.md, PNG figures, comparisons.csv/json) goes to --out.

    \b
    Examples:
      perfmodel compare --cluster local --calibrate
      perfmodel compare --cluster local --quick --out /tmp/first-look
      perfmodel compare --cluster local --profile ~/.local/share/perfmodel/profiles/local.toml
    """
    from measure.store import Store
    from perfmodel.compare import protocol, run
    from perfmodel.uncertainty import calibration_errors

    started = time.monotonic()
    store = Store(db)
    here = os.uname().nodename
    name = "quick" if quick else "heldout"
    out = out or Path("reports") / f"{cluster}-{protocol.today()}-{name}"
    held_out = protocol.held_out_set(quick)
    steps = protocol.STEPS[name if quick else "full"]
    data, set_a, suite_configs, notes = _profile_data(
        store, cluster, profile_path=profile_path, calibrate=calibrate, here=here,
        allow=allow_other_host, max_time_s=max_time_s, hidden=as_json, quick=quick)
    protocol.check_disjoint(held_out, suite_configs)
    out.mkdir(parents=True, exist_ok=True)
    profile = _write_profile(data, out / "profile.toml")
    errors = calibration_errors(data)
    predictions = run.predict_all(held_out, profile, errors, steps=steps, seed=seed)
    command_line = _command_line(cluster, db, quick, repeats, seed, out, calibrate,
                                 profile_path, allow_other_host, torch_memory)
    (out / "predictions.json").write_text(json.dumps(
        {"command": command_line, "cluster": cluster, "seed": seed, "steps": steps,
         "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "predictions": predictions},
        indent=1) + "\n")
    if predict_only:
        click.echo(f"wrote {len(predictions)} predictions to {out / 'predictions.json'}")
        return
    from perfmodel.compare import elastic, elastic_run

    elastic_steps = 0 if quick else elastic.CALIBRATION.steps + repeats * sum(
        i.steps for i in elastic.HELD_OUT)
    from perfmodel.commands.progress import RunsProgress

    tty = sys.stderr.isatty()
    with RunsProgress(len(held_out) * repeats * steps + elastic_steps, label="comparing",
                      command="perfmodel compare", bar=tty and not as_json,
                      lines=not as_json) as bar:
        found = run.measure_all(held_out, profile, store, repeats=repeats, steps=steps,
                                seed=seed, max_time_s=max_time_s, progress=bar.start,
                                finished=bar.finish)
        membership = None if quick else elastic_run.run_all(
            profile, errors, store, out, seed=seed, repeats=repeats, max_time_s=max_time_s,
            progress=bar.start, finished=bar.finish)
    rows = run.collect(store, predictions, found.ok, found.failed)
    rows = [r for r in rows if r.key not in found.skipped or r.run_ids]
    from perfmodel.compare import elastic_report, figures, report, summary

    torch_rows, torch_note = summary.torch_memory_rows(
        None if quick and torch_memory is None else (torch_memory or "8,64"))
    curves = summary.scaling_curves(held_out, profile, steps=steps, seed=seed)
    tl_key = summary.timeline_key(rows)
    by_key = {p["key"]: p for p in predictions}
    drawn = figures.draw_all(
        rows, out, curves=curves,
        timeline_row=next((r for r in rows if r.key == tl_key), None),
        timeline_data=by_key[tl_key]["timeline"] if tl_key else None, torch_points=torch_rows)
    meta = summary.meta(
        command=command_line, cluster=cluster, data=data, here=here, set_a=set_a,
        held_out=held_out, repeats=repeats, steps=steps, seed=seed, found=found,
        notes=notes, wall_s=time.monotonic() - started, torch_note=torch_note)
    elastic_lines: list[str] = []
    if membership is not None:
        if membership["measured"][elastic.HELD_OUT[0].key]:
            drawn["elastic"] = elastic_report.figure(membership, out)
        elastic_lines = elastic_report.markdown(
            membership, drawn.get("elastic", {}).get("file"))
    report.write_csv(rows, out / "comparisons.csv")
    report.write_json(meta, rows, drawn, torch_rows, out / "comparisons.json",
                      elastic=membership)
    report.write_markdown(out / "report.md", meta=meta, rows=rows, figures=drawn,
                          torch_rows=torch_rows, elastic_lines=elastic_lines,
                          why_missed=summary.why_missed(
                              rows, list(found.load.values()),
                              overlap_slowdown=profile.compute.overlap_slowdown))
    heads, missed = report.headline_lines(rows)
    heads += elastic_report.headline(membership) if membership else []
    if as_json:
        click.echo(json.dumps({"report": str(out / "report.md"), "missed": missed,
                               "wall_s": time.monotonic() - started}, indent=2))
    else:
        click.echo("\n".join([f"report: {out / 'report.md'}", *heads,
                              *(f"target missed: {m}" for m in missed)]))


def _profile_data(store, cluster: str, *, profile_path, calibrate: bool, here: str,
                  allow: bool, max_time_s: float, hidden: bool, quick: bool):
    """(profile data, set A description, set A configs, warnings) from --profile or the
    store's calibration runs (measured now with --calibrate)."""
    from calibration.from_store import fit_from_runs
    from perfmodel.compare import protocol

    notes: list[str] = []
    if profile_path is not None:
        from perfmodel.tomlfile import load_toml
        data = load_toml(profile_path)
        prov = data.get("provenance") or {}
        if prov.get("source") != "measured":
            raise PerfmodelError(f"{profile_path} is a spec-derived profile: a held-out check "
                                 f"needs one calibrated here (`perfmodel calibrate --cluster "
                                 f"{cluster}`)")
        warning = protocol.check_host(str(prov.get("host", "")), here, allow=allow,
                                      what=str(profile_path))
        notes += [warning] if warning else []
        ids = [int(i) for i in (data.get("calibration") or {}).get("run_ids", [])]
        stored = {r.id: r for r in store.list_runs()}
        configs = [stored[i].config for i in ids if i in stored]
        if len(configs) < len(ids) or not ids:     # not in this store: the suite's own
            from calibration.suite import build_suite
            configs += [m.config for q in (False, True)
                        for m in build_suite("cpu", suite=cluster, quick=q)]
        set_a = {"source": f"the runs behind {profile_path}", "ids": ids, "labels": []}
        return data, set_a, configs, notes
    found, configs = protocol.calibration_set(store.list_runs(), cluster, host=here,
                                             any_host=allow)
    ids = list(found.ids)
    if found.missing:
        if not calibrate:
            raise PerfmodelError(protocol.missing_calibration_message(found, cluster,
                                                                      store.path, here))
        ids = _calibrate(cluster, store, here, max_time_s, hidden, quick)
        found, configs = protocol.calibration_set(store.list_runs(), cluster, host=here,
                                                 any_host=allow)
    data = fit_from_runs(store, ids, name=cluster, base="local")
    warning = protocol.check_host(str(data["provenance"].get("host", "")), here, allow=allow,
                                  what=f"the calibration in {store.path}")
    notes += [warning] if warning else []
    set_a = {"source": f"the {found.suite} calibration suite (`perfmodel calibrate --cluster "
                       f"{cluster}`)", "ids": list(found.ids), "labels": list(found.labels)}
    return data, set_a, configs, notes


def _calibrate(cluster: str, store, here: str, max_time_s: float, hidden: bool,
               quick: bool) -> list[int]:
    from calibration.hardware import detect, torch_version
    from calibration.suite import build_suite
    from perfmodel.commands.calibrate import run_suite

    hw = detect()
    suite = build_suite(hw.kind, suite=cluster, quick=quick)
    ids, _ = run_suite(suite, db=store.path, fresh=False, host=here, torch=torch_version(),
                       torchrun=[], max_time_s=max_time_s,
                       hidden=hidden or not sys.stderr.isatty())
    return ids


def _write_profile(data: dict[str, Any], path: Path):
    from perfmodel.cluster import parse_profile
    from perfmodel.tomlfile import to_toml

    text = to_toml(data, header="Profile fitted by perfmodel compare from calibration set A.")
    path.write_text(text, encoding="utf-8")
    return parse_profile(tomllib.loads(text), path)


def _command_line(cluster, db, quick, repeats, seed, out, calibrate, profile_path, allow,
                  torch_memory) -> str:
    parts = ["perfmodel", "compare", "--cluster", cluster]
    parts += ["--calibrate"] * calibrate + ["--quick"] * quick
    parts += ["--repeats", str(repeats)] if repeats != 2 else []
    parts += ["--seed", str(seed)] if seed else []
    parts += ["--db", str(db)] if db else []
    parts += ["--profile", str(profile_path)] if profile_path else []
    parts += ["--allow-other-host"] * allow
    parts += ["--torch-memory", torch_memory] if torch_memory else []
    parts += ["--out", str(out)]
    return " ".join(parts)
