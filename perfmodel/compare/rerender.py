"""Render a comparison report folder again from what it stored, without the measurement
store: `python -m perfmodel.compare.rerender reports/local-...-heldout`.

comparisons.json keeps every row's predicted and measured numbers, the staleness values, the
plotted numbers of each figure and the elastic part; predictions.json keeps the intervals,
memory parts and timeline; profile.toml the fitted profile. From them the rows are rebuilt
(no number is measured or predicted again, and each rebuilt row is checked against the stored
one), then the current report code writes report.md, comparisons.csv, comparisons.json and
the figures. What an old report did not store (per-worker staleness means, the memory
tracker's name, the load before each run) stays unrecorded and the report says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

from perfmodel.cluster import parse_profile
from perfmodel.compare import anchor, elastic_report, figures, report, summary
from perfmodel.compare.matching import (
    QUANTITIES,
    SERVER_PHASES,
    Comparison,
    Quantity,
    seed_range,
)
from perfmodel.compare.protocol import HeldOut, today
from perfmodel.errors import PerfmodelError


def _quantities(c: dict[str, Any], pred: dict[str, Any]) -> dict[str, Quantity]:
    iv = pred.get("step_time_interval_s")
    step_iv = (iv["low"], iv["high"]) if iv else None
    thr_iv = None
    if step_iv:
        t = pred["throughput_samples_per_s"] * pred["step_time_s"]
        thr_iv = (t / step_iv[1], t / step_iv[0])
    intervals = {"step_time": step_iv, "throughput": thr_iv}
    return {q: Quantity(predicted=c[f"{q}_predicted"], measured=c[f"{q}_measured"],
                        low=c[f"{q}_low"], high=c[f"{q}_high"], interval=intervals.get(q))
            for q in QUANTITIES}


def rows_from(doc: dict[str, Any], predictions: dict[str, dict[str, Any]]
              ) -> list[Comparison]:
    """The Comparison rows of a stored report; raises if one does not reproduce its stored
    errors and interval flags."""
    bars = doc.get("figures", {}).get("memory", {}).get("bars", {})
    rows = []
    for c in doc["comparisons"]:
        pred = predictions[c["key"]]
        q = _quantities(c, pred)
        for name in QUANTITIES:
            for field, value in (("error", q[name].error), ("inside", q[name].inside)):
                stored = c[f"{name}_{field}"]
                same = (stored == value if not isinstance(stored, float) or value is None
                        else math.isclose(stored, value, rel_tol=1e-9, abs_tol=1e-15))
                if not same:
                    raise PerfmodelError(f"{c['key']}: {name} {field} {value} rebuilt, "
                                         f"{stored} stored")
        per_worker = {int(w): tuple(v) for w, v in (c.get("staleness_per_worker") or {}).items()}
        rows.append(Comparison(
            key=c["key"], label=c["label"], what=c["what"], strategy=c["strategy"],
            mode=c["mode"], workers=int(c["workers"]),
            run_ids=tuple(int(i) for i in str(c["runs"]).split()),
            failed=tuple((f["run_id"], f["reason"]) for f in c.get("failed", [])),
            quantities=q, staleness_w1=c["staleness_w1"],
            predicted_breakdown=dict(pred["breakdown"]),
            measured_breakdown={} if c["measured_compute_s"] is None else {
                "compute_s": c["measured_compute_s"], "comm_wait_s": c["measured_comm_wait_s"]},
            predicted_memory_parts=dict(pred.get("memory_parts") or {}),
            measured_memory_parts=(bars.get(c["key"]) or {}).get("measured"),
            predicted_staleness=tuple(c["predicted_staleness"]),
            measured_staleness=tuple(c["measured_staleness"]),
            speed=tuple(float(v) for v in pred.get("speed") or ()),
            staleness_per_worker=per_worker, memory_method=c.get("memory_method") or "",
            own_cores=c.get("own_cores"), host_cores=c.get("host_cores"),
            thread_cores=c.get("thread_cores"),
            server_phases={k: (c.get(f"server_{k}_model"), c.get(f"server_{k}_measured"))
                           for k in SERVER_PHASES
                           if c.get(f"server_{k}_measured") is not None},
            staleness_seed_range=seed_range(pred)))
    return rows


def _held_out(pred: dict[str, Any]) -> HeldOut:
    return HeldOut(key=pred["key"], what=pred["what"], strategy=pred["strategy"],
                   workload=pred["workload"], workers=int(pred["workers"]),
                   batch_size=int(pred["batch_size"]),
                   speed=tuple(pred.get("speed") or ()),
                   timed_wait=pred["mode"] == "timed-wait")


def _curves(doc: dict[str, Any], predictions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for s, c in (doc.get("figures", {}).get("scaling", {}).get("curves") or {}).items():
        keys = [k for k, _, _ in c["measured"]]
        first = predictions[keys[0]] if keys else None
        label = (f"{first['workload']} b{first['batch_size']}, timed-wait" if first else "")
        out[s] = {"workers": c["model"][0], "throughput": c["model"][1], "keys": keys,
                  "label": label}
    return out


def rerender(folder: Path) -> Path:
    """Write the folder's report again with the current code; returns report.md's path."""
    doc = json.loads((folder / "comparisons.json").read_text())
    predictions = {p["key"]: p for p in
                   json.loads((folder / "predictions.json").read_text())["predictions"]}
    profile = parse_profile(tomllib.loads((folder / "profile.toml").read_text()),
                            folder / "profile.toml")
    rows = rows_from(doc, predictions)
    from calibration.suite import build_suite

    set_a = [m.config for m in build_suite("cpu", suite=doc["meta"]["cluster"], quick=False)]
    twins = summary.memory_twins([_held_out(p) for p in predictions.values()],
                                 list(predictions.values()), profile, set_a,
                                 seed=int(doc["meta"].get("seed", 0)))
    rows = [dataclasses.replace(r, memory_twin=twins.get(r.key, "")) for r in rows]
    tl_key = (doc.get("figures", {}).get("timeline") or {}).get("key")
    drawn = figures.draw_all(
        rows, folder, curves=_curves(doc, predictions),
        timeline_row=next((r for r in rows if r.key == tl_key), None),
        timeline_data=predictions[tl_key]["timeline"] if tl_key else None,
        torch_points=doc.get("torch_memory") or [])
    membership = doc.get("elastic")
    elastic_lines: list[str] = []
    if membership is not None:
        if doc.get("figures", {}).get("elastic"):
            drawn["elastic"] = elastic_report.figure(membership, folder)
        elastic_lines = elastic_report.markdown(membership,
                                                drawn.get("elastic", {}).get("file"))
    meta = dict(doc["meta"])
    meta["protocol"] = [*meta["protocol"], (
        f"Re-rendered on {today()} from this folder's comparisons.json, predictions.json and "
        f"profile.toml (`python -m perfmodel.compare.rerender {folder}`): nothing was "
        f"measured or predicted again and every number of the rows is the stored one; "
        f"headlines, 'why' lines and figures follow the current rules (issue 14). This "
        f"report stored no per-worker staleness means, no memory tracker name and no load "
        f"per run, so those stay unrecorded here. Protocol lines above are as written then.")]
    report.write_csv(rows, folder / "comparisons.csv")
    report.write_json(meta, rows, drawn, doc.get("torch_memory") or [],
                      folder / "comparisons.json", elastic=membership)
    report.write_markdown(
        folder / "report.md", meta=meta, rows=rows, figures=drawn,
        torch_rows=doc.get("torch_memory") or [], elastic_lines=elastic_lines,
        elastic_head=([f"- {line}" for line in elastic_report.headline(membership)] + [""]
                      if membership else []),
        why_missed=summary.why_missed(rows, (),
                                      overlap_slowdown=profile.compute.overlap_slowdown)
        + anchor.drift_lines(meta))
    return folder / "report.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    print(rerender(parser.parse_args(argv).folder))


if __name__ == "__main__":
    main()
