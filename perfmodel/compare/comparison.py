"""One held-out comparison, start to end: what `perfmodel compare` runs.

Steps: find calibration set A in the store (or measure it, calibration/driver.py) and fit
the profile from it (or take --profile): a set A measured now whose fit fails the overlap
check (compute.overlap_slowdown below 1: the host changed speed under it) is measured once
more and the first kept in the store, unfitted (report 43's set A fitted 0.70 and its rows
missed by up to 23 %); predict every configuration of set B
(perfmodel/data/heldout/local.toml) and write the predictions before any run starts;
measure set B `repeats` times through measure/session.py (run.py); the elastic part
(elastic_run.py); pair runs with predictions; PyTorch's own memory estimate for GPT-2 XL at
scale (measure/torch_memory.py, in its own process); figures and the report. Progress goes
to measure.session.Progress callbacks; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration import driver
from calibration.from_store import fit_from_runs, inconsistent_overlap
from calibration.hardware import detect, torch_version
from calibration.pool import PooledStore, PoolSource
from calibration.suite import build_suite
from measure.protocol import RunProtocol
from measure.session import NoProgress, Progress
from measure.store import Store
from perfmodel.cluster import ClusterProfile, parse_profile
from perfmodel.compare import (
    anchor,
    bracket,
    elastic,
    elastic_report,
    elastic_run,
    figures,
    protocol,
    report,
    run,
    summary,
)
from perfmodel.compare.matching import measured_run
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml, to_toml
from perfmodel.uncertainty import calibration_errors

# set A measured now is measured at most this often (`profile_data`): once more where the
# first fails the overlap check, never a third time, so a host that keeps changing speed
# gives a report that says so rather than a session that never ends
SET_A_ATTEMPTS = 2


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a comparison wrote and found."""

    out: Path                               # the report folder
    predictions: int                        # configurations predicted
    predict_only: bool                      # stopped after writing the predictions
    headlines: tuple[str, ...] = ()         # one line per headline error
    missed: tuple[str, ...] = ()            # targets missed
    wall_s: float = 0.0

    @property
    def report(self) -> Path:
        return self.out / "report.md"

    @property
    def predictions_file(self) -> Path:
        return self.out / "predictions.json"


def default_out(cluster: str, quick: bool) -> Path:
    return Path("reports") / f"{cluster}-{protocol.today()}-{'quick' if quick else 'heldout'}"


def compare(store: Store, cluster: str, *, out: Path, quick: bool = False, repeats: int = 3,
            seed: int = 0, calibrate: bool = False, profile_path: Path | None = None,
            allow_other_host: bool = False, torch_memory: str | None = None,
            predict_only: bool = False, max_time_s: float | None = 600,
            command_line: str = "", calibration_progress: Progress | None = None,
            progress: Progress | None = None, run_protocol: RunProtocol | None = None,
            pool: tuple[Store, ...] = (), bracketed: bool = False) -> Outcome:
    """Predict set B, measure it, write the report into `out` (see the module docstring).

    `pool`: earlier stores whose complete set A is fitted together with this store's
    (calibration/pool.py): one calibration on a shared machine is a snapshot of its state.

    `calibration_progress` follows the measurement of a missing set A (with `calibrate`),
    `progress` the runs of set B and the elastic part. `run_protocol` (measure/protocol.py):
    wait for the load to settle and pin ranks before each run of set A and set B.
    `bracketed`: measure set A again after set B and predict from both (bracket.py).
    """
    if bracketed and (pool or profile_path is not None or predict_only):
        raise PerfmodelError("--bracket measures set A before and after set B and fits both: "
                             "it takes neither --pool, --profile nor --predict-only")
    started = time.monotonic()
    here = os.uname().nodename
    held_out = protocol.held_out_set(quick)
    steps = protocol.STEPS["quick" if quick else "full"]
    ps_steps = protocol.PS_STEPS["quick" if quick else "full"]
    data, set_a, suite_configs, notes = profile_data(
        store, cluster, profile_path=profile_path, calibrate=calibrate, here=here,
        allow=allow_other_host, max_time_s=max_time_s, quick=quick,
        progress=calibration_progress, run_protocol=run_protocol, pool=pool)
    notes = [*notes, *(f"Calibration {w}" for w in
                       (data.get("calibration") or {}).get("self_check_warnings") or [])]
    protocol.check_disjoint(held_out, suite_configs)
    out.mkdir(parents=True, exist_ok=True)
    profile = write_profile(data, out / "profile.toml")
    errors = calibration_errors(data)
    predictions = run.predict_all(held_out, profile, errors, steps=steps, seed=seed,
                                  repeats=repeats, ps_steps=ps_steps)
    _write_predictions(out / "predictions.json", predictions, command_line, cluster, seed,
                       steps, ps_steps)
    if predict_only:
        return Outcome(out=out, predictions=len(predictions), predict_only=True,
                       wall_s=time.monotonic() - started)
    progress = progress or NoProgress()
    elastic_steps = 0 if quick else elastic.CALIBRATION.steps + repeats * sum(
        i.steps for i in elastic.HELD_OUT)
    # the drift anchor (perfmodel/compare/anchor.py): the held-out file's [anchor], if any
    spec = None if quick else anchor.load_anchor(protocol.HELD_OUT_FILE)
    drift = None if spec is None else anchor.suite_measurement(
        spec, build_suite("cpu", suite=cluster))
    anchor_steps = 0 if drift is None else repeats * int(drift.config.get("steps") or 0)
    progress.begin(repeats * sum(protocol.timed_steps(h, steps, ps_steps) for h in held_out)
                   + elastic_steps + anchor_steps)
    found = run.measure_all(held_out, profile, store, repeats=repeats, steps=steps, seed=seed,
                            max_time_s=max_time_s, progress=progress,
                            protocol=run_protocol, anchor=drift, ps_steps=ps_steps)
    membership = None if quick else elastic_run.run_all(
        profile, errors, store, out, seed=seed, repeats=repeats, max_time_s=max_time_s,
        progress=progress, protocol=run_protocol)
    bracket_meta = None
    if bracketed:
        closing, notes = close_bracket(
            store, cluster, set_a, here=here, max_time_s=max_time_s, quick=quick,
            progress=calibration_progress, run_protocol=run_protocol, notes=notes)
        predictions, bracket_meta = (predictions, {"refused": notes[-1]}) if closing is None \
            else predict_bracketed(closing, profile, data, predictions, store, found, out,
                                   held_out=held_out, steps=steps, ps_steps=ps_steps,
                                   seed=seed, repeats=repeats, command_line=command_line,
                                   cluster=cluster)
    rows = paired(store, predictions, found)
    twins = summary.memory_twins(held_out, predictions, profile, suite_configs, seed=seed)
    rows = [dataclasses.replace(r, memory_twin=twins.get(r.key, "")) for r in rows]
    torch_rows, torch_note = summary.torch_memory_rows(
        None if quick and torch_memory is None else (torch_memory or "8,64"))
    curves = summary.scaling_curves(held_out, profile, steps=steps, seed=seed,
                                    ps_steps=ps_steps)
    tl_key = summary.timeline_key(rows)
    by_key = {p["key"]: p for p in predictions}
    drawn = figures.draw_all(
        rows, out, curves=curves,
        timeline_row=next((r for r in rows if r.key == tl_key), None),
        timeline_data=by_key[tl_key]["timeline"] if tl_key else None, torch_points=torch_rows)
    meta = summary.meta(
        command=command_line, cluster=cluster, data=data, here=here, set_a=set_a,
        held_out=held_out, repeats=repeats, steps=steps, ps_steps=ps_steps, seed=seed,
        found=found, notes=notes, wall_s=time.monotonic() - started, torch_note=torch_note)
    if drift is not None:
        meta["anchor"] = {**anchor.result(store, drift, set_a["ids"], found.anchor,
                                          anchor_prediction(drift, profile, seed)).as_dict(),
                          "why": spec.why}
    meta["by_round"] = by_round(store, predictions, found, meta.get("anchor"))
    if bracket_meta is not None:
        meta["bracket"] = bracket_meta
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
                          elastic_head=([f"- {line}" for line in
                                         elastic_report.headline(membership)] + [""]
                                        if membership else []),
                          why_missed=summary.why_missed(
                              rows, list(found.load.values()),
                              overlap_slowdown=profile.compute.overlap_slowdown)
                          + anchor.drift_lines(meta))
    heads, missed = report.headline_lines(rows)
    heads += [report.anchor_line(meta["anchor"])] if "anchor" in meta else []
    heads += elastic_report.headline(membership) if membership else []
    return Outcome(out=out, predictions=len(predictions), predict_only=False,
                   headlines=tuple(heads), missed=tuple(missed),
                   wall_s=time.monotonic() - started)


def by_round(store, predictions: list[dict[str, Any]], found: run.Measurements,
             drift: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Set B's errors round by round beside the drift anchor's (anchor.round_errors): each
    successful run's step time as the report takes it (matching.measured_run), its round
    from its compare marker."""
    def round_of(run_id: int) -> int:
        return int((store.get_run(run_id).row.config.get("compare") or {}).get("repeat", 0))

    by_key = {p["key"]: p for p in predictions}
    measured: dict[str, dict[int, float]] = {}
    for key, ids in found.ok.items():
        p = by_key.get(key)
        if p is None:
            continue
        for i in ids:
            run_ = store.get_run(i)
            if run_.row.status != "ok" or not run_.table("steps"):
                continue
            m = measured_run(run_, ps=p["kind"] == "ps", timed_wait=p["mode"] == "timed-wait",
                             warmup_steps=protocol.WARMUP_STEPS)
            measured.setdefault(key, {})[round_of(i)] = m.step_time_s
    ratios = {}
    if drift:
        ratios = {round_of(i): r for i, r in zip(drift["run_ids"], drift["ratios"],
                                                  strict=False)}
    return anchor.round_errors({k: p["step_time_s"] for k, p in by_key.items()},
                               {k: p["mode"] for k, p in by_key.items()}, measured, ratios)


def anchor_prediction(drift, profile: ClusterProfile, seed: int) -> float | None:
    """The model's step time for the drift anchor's own configuration (in-sample: set A ran
    it), with the anchor's own timed steps; None where the anchor is not DDP or FSDP."""
    h = anchor.as_held_out(drift)
    if h is None:
        return None
    steps = int(drift.config.get("steps") or protocol.STEPS["full"])
    return run.predict_all((h,), profile, None, steps=steps, seed=seed)[0]["step_time_s"]


def _write_predictions(path: Path, predictions: list[dict[str, Any]], command_line: str,
                       cluster: str, seed: int, steps: int, ps_steps: int) -> None:
    path.write_text(json.dumps(
        {"command": command_line, "cluster": cluster, "seed": seed, "steps": steps,
         "ps_steps": ps_steps,
         "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "predictions": predictions},
        indent=1) + "\n")


def close_bracket(store, cluster: str, set_a: dict[str, Any], *, here: str,
                  max_time_s: float | None, quick: bool, progress: Progress | None,
                  run_protocol: RunProtocol | None, notes: list[str]):
    """Measure set A again and fit it (bracket.py): (the Bracket, notes), or (None, notes +
    why) where its fit fails, and every row keeps the first set A's predictions."""
    ids_after = calibrate_set_a(cluster, store, here, max_time_s=max_time_s, quick=quick,
                                progress=progress, run_protocol=run_protocol, fresh=True)
    try:
        return bracket.fit(store, set_a["ids"], ids_after, cluster), notes
    except PerfmodelError as e:
        return None, [*notes, f"Set A measured again after set B (runs {min(ids_after)}-"
                              f"{max(ids_after)}) could not be fitted: {e}. Every "
                              f"row is predicted from the first set A alone."]


def predict_bracketed(closing: bracket.Bracket, first_profile: ClusterProfile,
                      first_data: dict[str, Any], first: list[dict[str, Any]], store,
                      found: run.Measurements, out: Path, *, held_out, steps: int,
                      ps_steps: int, seed: int, repeats: int, command_line: str, cluster: str):
    """(bracketed predictions, meta['bracket']): set B predicted from the closing set A
    (timed waits with the waits their runs slept), each record combined with the first's
    (bracket.combine), both written before any run is paired with a prediction; the first
    predictions' headline kept for the report."""
    after_profile = write_profile(closing.data, out / bracket.PROFILE)
    after = run.predict_all(held_out, after_profile, calibration_errors(closing.data),
                            steps=steps, seed=seed, repeats=repeats, ps_steps=ps_steps,
                            waits=first_profile)
    _write_predictions(out / bracket.AFTER, after, command_line, cluster, seed, steps,
                       ps_steps)
    predictions = [bracket.combine(a, b) for a, b in zip(first, after, strict=True)]
    _write_predictions(out / bracket.PREDICTIONS, predictions, command_line, cluster, seed,
                       steps, ps_steps)
    return predictions, bracket.meta(first_data, closing,
                                     *report.headline_lines(paired(store, first, found)))


def paired(store, predictions: list[dict[str, Any]], found: run.Measurements):
    """Each prediction paired with its runs (run.collect), less the configurations skipped
    before any run."""
    return [r for r in run.collect(store, predictions, found.ok, found.failed)
            if r.key not in found.skipped or r.run_ids]


def profile_data(store, cluster: str, *, profile_path, calibrate: bool, here: str,
                 allow: bool, max_time_s: float | None, quick: bool,
                 progress: Progress | None = None, run_protocol: RunProtocol | None = None,
                 pool: tuple[Store, ...] = ()):
    """(profile data, set A description, set A configs, warnings) from --profile or the
    store's calibration runs (measured now with --calibrate), pooled with the complete set A
    of each store in `pool`."""
    notes: list[str] = []
    if profile_path is not None and pool:
        raise PerfmodelError("--pool fits set A from several stores; --profile takes a fitted "
                             "profile instead: give one or the other")
    if profile_path is not None:
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
            configs += [m.config for q in (False, True)
                        for m in build_suite("cpu", suite=cluster, quick=q)]
        set_a = {"source": f"the runs behind {profile_path}", "ids": ids, "labels": []}
        return data, set_a, configs, notes
    found, configs = protocol.calibration_set(store.list_runs(), cluster, host=here,
                                             any_host=allow)
    ids = list(found.ids)
    measured_now = bool(found.missing)
    if found.missing:
        if not calibrate:
            raise PerfmodelError(protocol.missing_calibration_message(found, cluster,
                                                                      store.path, here))
        ids = calibrate_set_a(cluster, store, here, max_time_s=max_time_s, quick=quick,
                              progress=progress, run_protocol=run_protocol)
        found, configs = protocol.calibration_set(store.list_runs(), cluster, host=here,
                                                 any_host=allow)
    others = pooled_sources(pool, cluster, found.suite, here=here, allow=allow)
    pooled, data = _fit_set_a(store, ids, others, cluster)
    discarded: list[dict[str, Any]] = []
    while measured_now and len(discarded) < SET_A_ATTEMPTS - 1:
        overlap = inconsistent_overlap(data)
        if overlap is None:
            break
        discarded.append({"run_ids": list(ids), "overlap_slowdown": overlap})
        notes.append(_discarded_note(discarded[-1], len(discarded) + 1))
        ids = calibrate_set_a(cluster, store, here, max_time_s=max_time_s, quick=quick,
                              progress=progress, run_protocol=run_protocol, fresh=True)
        pooled, data = _fit_set_a(store, ids, others, cluster)
    warning = protocol.check_host(str(data["provenance"].get("host", "")), here, allow=allow,
                                  what=f"the calibration in {store.path}")
    notes += [warning] if warning else []
    suite = f"the {found.suite} calibration suite (`perfmodel calibrate --cluster {cluster}`)"
    if pool:
        suite += (f", pooled over {len(others) + 1} stores' complete set A "
                  f"({'; '.join(pooled.describe())})")
    set_a = {"source": suite, "ids": pooled.ids,
             "labels": list(found.labels) * (len(others) + 1), "discarded": discarded}
    return data, set_a, configs, notes


def _fit_set_a(store, ids, others: list[PoolSource], cluster: str):
    """(the pooled store, its fitted profile data) of this store's set A `ids` and `others`."""
    pooled = PooledStore([PoolSource(store, tuple(ids)), *others])
    return pooled, fit_from_runs(pooled, pooled.ids, name=cluster, base="local")


def _discarded_note(discarded: dict[str, Any], attempt: int) -> str:
    ids = discarded["run_ids"]
    return (f"Set A measured again (attempt {attempt} of {SET_A_ATTEMPTS}): the set A measured "
            f"first (runs {min(ids)}-{max(ids)}, kept in the store, not fitted) fitted "
            f"compute.overlap_slowdown {discarded['overlap_slowdown']:.2f}, below 1, which "
            f"interference cannot give: the host changed speed while it was measured "
            f"(calibration/from_store.py `overlap_warning`). The rule was fixed before any "
            f"held-out run: it looks at set A only.")


def pooled_sources(pool: tuple[Store, ...], cluster: str, suite: str, *, here: str,
                   allow: bool) -> list[PoolSource]:
    """Each pooled store's set A: the same suite as this store's, complete, from this host
    (or any host with `allow`), else a one-line error naming the store."""
    out = []
    for other in pool:
        found, _ = protocol.calibration_set(other.list_runs(), cluster, host=here,
                                            any_host=allow)
        if found.missing or found.suite != suite:
            raise PerfmodelError(
                f"--pool {other.path}: it holds no complete {suite} calibration set A for "
                f"'{cluster}' from this host ({len(found.missing)} of its runs missing"
                f"{', measured on ' + ', '.join(found.elsewhere) if found.elsewhere else ''})")
        out.append(PoolSource(other, tuple(found.ids)))
    return out


def calibrate_set_a(cluster: str, store, here: str, *, max_time_s: float | None, quick: bool,
                    progress: Progress | None = None, run_protocol: RunProtocol | None = None,
                    fresh: bool = False) -> list[int]:
    """Measure the calibration suite's runs the store lacks (every one with `fresh`:
    calibration/driver.py)."""
    suite = build_suite(detect().kind, suite=cluster, quick=quick)
    ids, _ = driver.run_suite(suite, store, fresh=fresh, host=here, torch=torch_version(),
                              max_time_s=max_time_s, progress=progress,
                              protocol=run_protocol)
    return ids


def write_profile(data: dict[str, Any], path: Path) -> ClusterProfile:
    """Write set A's fitted profile into the report folder and parse it back."""
    text = to_toml(data, header="Profile fitted by perfmodel compare from calibration set A.")
    path.write_text(text, encoding="utf-8")
    return parse_profile(tomllib.loads(text), path)
