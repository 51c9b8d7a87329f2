"""`perfmodel compare`: predict held-out configurations, measure them, report the errors.

The comparison itself (set A, predictions, runs, report) is perfmodel/compare/comparison.py;
this module parses the options, shows progress and prints the headlines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from perfmodel.commands.options import Finite
from perfmodel.commands.progress import RunsProgress
from perfmodel.commands.protocol_options import make_protocol, protocol_options


@click.command("compare")
@click.option("--cluster", required=True, help="Profile to check, calibrated on this machine "
              "(local).")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Measurement store [$PERFMODEL_DB or the per-user default].")
@click.option("--quick", is_flag=True, help="Three 2-worker configurations, fewer steps, no "
              "PyTorch memory estimate: a first look or a test (a few minutes).")
@click.option("--repeats", type=click.IntRange(2), default=3, show_default=True,
              help="Runs per configuration (>= 2, so the noise floor shows), interleaved: "
                   "every configuration once, then every one again, ...")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the predictions and of the runs' data.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder [reports/<cluster>-<date>-heldout].")
@click.option("--calibrate", is_flag=True, help="Measure calibration set A now where the "
              "store lacks it (as `perfmodel calibrate` would).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Use this calibrated profile instead of fitting set A.")
@click.option("--pool", "pool", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              multiple=True, help="Also fit the complete calibration set A stored in this "
              "earlier store (repeatable): one session's calibration on a shared machine is a "
              "snapshot of its state, and sessions pooled steady it.")
@click.option("--bracket", is_flag=True, help="With --calibrate: measure set A again after "
              "set B and predict set B from both set As (set B never fitted), so the fit "
              "sees the host over the window set B ran in; the predictions made before set B "
              "are kept and scored beside (about 17 more minutes here).")
@click.option("--allow-other-host", is_flag=True,
              help="Compare with a calibration made on another machine (warns).")
@click.option("--torch-memory", default=None, metavar="RANKS|none",
              help="Ranks of the GPT-2 XL FSDP jobs PyTorch's tracker estimates, with "
                   "grad-op and DDP at the first [8,64; none with --quick].")
@click.option("--predict-only", is_flag=True, help="Write the predictions and stop.")
@click.option("--max-time-s", type=Finite(1), default=600, show_default=True,
              help="Stop any one run after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@protocol_options
def command(cluster, db, quick, repeats, seed, out, calibrate, profile_path, pool, bracket,
            allow_other_host, torch_memory, predict_only, max_time_s, as_json, settle_load,
            settle_max_s, no_pin):
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
      perfmodel compare --cluster local --calibrate --db today.sqlite --pool monday.sqlite
      perfmodel compare --cluster local --calibrate --bracket --db today.sqlite
    """
    from measure.launch import require_torch
    from measure.store import Store
    from perfmodel.compare.comparison import compare, default_out

    if not predict_only:
        require_torch()             # before the store is looked at: torch is what is missing
    out = out or default_out(cluster, quick)
    lines = not as_json
    with RunsProgress(command="perfmodel calibrate", label="calibrating",
                      bar=not as_json and sys.stderr.isatty(), lines=True,
                      announce=True) as calibrating, \
            RunsProgress(command="perfmodel compare", label="comparing",
                         bar=not as_json and sys.stderr.isatty(), lines=lines) as comparing:
        done = compare(
            Store(db), cluster, out=out, quick=quick, repeats=repeats, seed=seed,
            calibrate=calibrate, profile_path=profile_path, allow_other_host=allow_other_host,
            pool=tuple(Store(p) for p in pool), bracketed=bracket,
            torch_memory=torch_memory, predict_only=predict_only, max_time_s=max_time_s,
            command_line=_command_line(cluster, db, quick, repeats, seed, out, calibrate,
                                       profile_path, allow_other_host, torch_memory, pool,
                                       bracket)
            + _protocol_args(settle_load, settle_max_s, no_pin),
            calibration_progress=calibrating, progress=comparing,
            run_protocol=make_protocol(settle_load, settle_max_s, no_pin))
    if done.predict_only:
        click.echo(f"wrote {done.predictions} predictions to {done.predictions_file}")
    elif as_json:
        click.echo(json.dumps({"report": str(done.report), "missed": list(done.missed),
                               "wall_s": done.wall_s}, indent=2))
    else:
        click.echo("\n".join([f"report: {done.report}", *done.headlines,
                              *(f"target missed: {m}" for m in done.missed)]))


def _protocol_args(settle_load: float, settle_max_s: float, no_pin: bool) -> str:
    """The measurement protocol's options where they differ from the defaults (an env var
    may have set --settle-max-s: the report shows the value used)."""
    parts = [f" --settle-load {settle_load:g}"] if settle_load != 0.5 else []
    parts += [f" --settle-max-s {settle_max_s:g}"] if settle_max_s != 30 else []
    parts += [" --no-pin"] if no_pin else []
    return "".join(parts)


def _command_line(cluster, db, quick, repeats, seed, out, calibrate, profile_path, allow,
                  torch_memory, pool=(), bracket=False) -> str:
    parts = ["perfmodel", "compare", "--cluster", cluster]
    parts += ["--calibrate"] * calibrate + ["--quick"] * quick
    parts += ["--repeats", str(repeats)] if repeats != 3 else []
    parts += ["--seed", str(seed)] if seed else []
    parts += ["--db", str(db)] if db else []
    parts += ["--profile", str(profile_path)] if profile_path else []
    parts += [x for p in pool for x in ("--pool", str(p))]
    parts += ["--bracket"] * bracket
    parts += ["--allow-other-host"] * allow
    parts += ["--torch-memory", torch_memory] if torch_memory else []
    parts += ["--out", str(out)]
    return " ".join(parts)
