"""The elastic part of the comparison report: a Markdown section and one figure.

elastic.png: for the elastic DDP run, useful progress (steps done, as a restart throws work
away it drops back to the checkpoint) against time since every rank was first ready, the
model's line over each measured run; below it, throughput over time (samples/s of forward
progress in quarter-second bins; work thrown away at a restart shows as the drop above, never
as a negative rate): the plot of a run's throughput over time that shows what
a restart costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.compare.elastic import HELD_OUT
from perfmodel.compare.figures import _save, plt
from perfmodel.compare.report import pct

BIN_S = 0.25


def throughput_series(t_s: list[float], steps: list[float], samples_per_step: int,
                      bin_s: float = BIN_S) -> tuple[np.ndarray, np.ndarray]:
    """Samples/s of useful progress in bins of `bin_s` (negative where work was lost)."""
    t, s = np.asarray(t_s, float), np.asarray(steps, float)
    if t.size < 2:
        return np.zeros(0), np.zeros(0)
    edges = np.arange(0.0, t.max() + bin_s, bin_s)
    done = np.interp(edges, t, s, left=0.0)
    return (edges[:-1] + edges[1:]) / 2, np.diff(done) * samples_per_step / bin_s


def figure(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    item = next(i for i in HELD_OUT if i.kind == "elastic_ddp")
    pred = doc["predictions"][item.key]
    runs = doc["measured"][item.key]
    per_step = item.workers * item.batch
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 5.5), sharex=True)
    top.plot(pred["progress"]["t_s"], pred["progress"]["steps"], color="black", lw=2,
             label="model")
    for k, m in enumerate(runs):
        top.plot(m["progress"]["t_s"], m["progress"]["steps"], ".", ms=3,
                 label=f"measured, run {k + 1}")
    for kill in pred["kills"]:
        top.axvline(kill["time_s"], color="gray", ls=":", lw=1)
    top.set_ylabel("steps done (useful)")
    top.set_title(f"{item.key}: {item.label}", fontsize=8)
    top.legend(fontsize=7)
    pt, pv = throughput_series(pred["progress"]["t_s"], pred["progress"]["steps"], per_step)
    pv = np.clip(pv, 0.0, None)
    bottom.step(pt, pv, where="mid", color="black", lw=2, label="model")
    plotted = {"model": {"t_s": pt.tolist(), "samples_per_s": pv.tolist()}, "measured": []}
    for k, m in enumerate(runs):
        mt, mv = throughput_series(m["progress"]["t_s"], m["progress"]["steps"], per_step)
        mv = np.clip(mv, 0.0, None)         # lost work shows in the top panel's drop
        bottom.step(mt, mv, where="mid", lw=1, label=f"measured, run {k + 1}")
        plotted["measured"].append({"t_s": mt.tolist(), "samples_per_s": mv.tolist()})
    bottom.axhline(0, color="gray", lw=0.5)
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds since every rank was first ready")
    bottom.set_ylabel(f"samples/s forward ({BIN_S:g} s bins)")
    return {"file": _save(fig, out / "elastic.png"), "plotted": plotted}


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" if unit in ("s", "steps", "updates/s", "samples/s") else f"{v:.2f}"


def markdown(doc: dict[str, Any], figure_file: str | None) -> list[str]:
    cal = doc["calibration"]
    costs = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f} s"
                      for k, v in cal["costs"].items())
    out = ["## Membership changes: recovery, goodput and a PS that carries on", "",
           f"Calibration: run {cal['run_id']} (`{cal['key']}`: {cal['label']}) gave the "
           f"model's costs: {costs}. Held out, predicted from those costs and the profile "
           "before they ran (`elastic_predictions.json`):", ""]
    out += [f"- `{i.key}`: {i.label}" for i in HELD_OUT] + [""]
    out += ["| configuration | quantity | predicted [90 % interval] | measured median "
            "[min–max] | error |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        u = r["unit"]
        band = (f" [{_num(r['low'], u)}–{_num(r['high'], u)}]" if r["low"] is not None
                else "")
        vals = r["measured"]
        meas = (f"{_num(r['median'], u)} [{_num(min(vals), u)}–{_num(max(vals), u)}]"
                if vals else "no run")
        mark = " ◦" if r["inside"] is False else ""
        out.append(f"| `{r['key']}` | {r['quantity']} ({u}) | {_num(r['predicted'], u)}"
                   f"{band} | {meas}{mark} | {pct(r['error_rel'])} |")
    inside = [r for r in doc["rows"] if r["inside"] is not None]
    counted = [r for r in doc["rows"] if r["measured"] and r["error_rel"] is not None]
    if counted:
        w = max(counted, key=lambda r: abs(r["error_rel"]))
        out += ["", f"Worst case: `{w['key']}` {w['quantity']}, {pct(w['error_rel'])}."]
    out += ["", f"{sum(bool(r['inside']) for r in inside)} of {len(inside)} measured medians "
            "with an interval fall inside it (◦: outside). Recovery = kill → the progress "
            "at the kill regained: detection + restart (rendezvous, process start, process "
            "group, checkpoint reload) + redoing the lost steps; its interval is the "
            "restart's spread on a shared machine (log-normal, σ 0.6, "
            "perfmodel/goodput.py). Time to finish and goodput count from every rank first "
            "ready to the last step (process start-up before the first step is left out). "
            "The PS rows: update rates before the leave, while the worker is gone and after "
            "the joiner's first update; `gone over before` is the share of throughput kept "
            "((N−k)/N = 0.5 when the server is not the bottleneck); `join` is the joiner's "
            "first gradient after its parameters were sent (the model: the parameter pull and "
            "one step)."]
    if doc["failed"]:
        out += ["", "Failed elastic runs, left out:", ""]
        out += [f"- `{f['key']}` run {f['run_id']}: {f['reason']}" for f in doc["failed"]]
    if figure_file:
        out += ["", f"![elastic]({figure_file})", "",
                "Elastic DDP: useful progress (top) and throughput over time (bottom), the "
                "model's line over the measured runs; dotted: the predicted kills."]
    return out + [""]


def headline(doc: dict[str, Any]) -> list[str]:
    """One line for the command's output: recoveries inside their interval with the
    interval's width, goodput error, the PS's absolute update rates and the joiner, and the
    worst row; the kept-rate ratio only beside the rates it is a ratio of."""
    rows = [r for r in doc["rows"] if r["measured"] and r["error_rel"] is not None]
    rec = [r for r in rows if r["quantity"].startswith("recovery")]
    parts = []
    if rec:
        widths = [(r["high"] - r["low"]) / 2 / r["predicted"] for r in rec
                  if r["low"] is not None and r["predicted"]]
        parts.append(f"recoveries inside their interval: {sum(bool(r['inside']) for r in rec)}"
                     f" of {len(rec)}" + (f" (median half-width ±{float(np.median(widths)):.0%})"
                                         if widths else ""))
    parts += [f"{r['quantity']} error {pct(r['error_rel'])}" for r in rows
              if r["quantity"] == "goodput"]
    rates = [r for r in rows if r["unit"] == "updates/s"]
    if rates:
        parts.append("PS update rate errors " + ", ".join(
            f"{r['quantity'].removeprefix('update rate ')} {pct(r['error_rel'])}"
            for r in rates))
    parts += [f"joiner's first gradient error {pct(r['error_rel'])}" for r in rows
              if r["quantity"] == "join s"]
    keep = [r for r in rows if r["quantity"] == "gone over before"]
    parts += [f"share of throughput kept {keep[0]['predicted']:.2f} predicted vs "
              f"{keep[0]['median']:.2f} measured (a ratio of the rates above)"] if keep else []
    if rows:
        w = max(rows, key=lambda r: abs(r["error_rel"]))
        parts.append(f"worst: {w['key']} {w['quantity']} {pct(w['error_rel'])}")
    return ["elastic: " + "; ".join(parts)] if parts else ["elastic: no successful run"]
