"""Set A measured before and after set B; set B predicted from each (`perfmodel compare --bracket`).

Why: on this 2-core VM the host changes speed over a session, and a set A measured only
before set B fits the host of its own 17 minutes. Report 53's set A ran slower than every
round of its set B (every timed-wait row over-predicted, 14-19 % a round); report 52's
first round, next to set A, missed its timed-wait rows by 4.8 % (median) and its later
rounds by 16 and 12 %. A set A measured again after set B brackets the window set B ran in,
as a reference measured before and after a sample does.

How the two are used: each set A is fitted alone and predicts set B (a timed-wait run slept
the first fit's unit times, protocol.run_config, so its prediction from the closing set A
takes those waits and its real work from the closing fit: protocol.with_waits_of); the
bracketed prediction of a step time or throughput is the geometric mean of the two, its
interval the geometric mean of their bounds, the step's breakdown their mean (`combine`).
Staleness, memory, the timeline and the server phases stay the first set A's. Not a pooled
fit (calibration/pool.py): it takes a compute curve's best rate from either set, so a set A
in a fast phase outweighs one in a slow phase (report 50's set A pooled with 51's, measured
ten minutes after 50's set B, predicted 50's real rows 27 % fast; the mean of the two fits'
predictions, 20 %: explorations on seen data, session 35).

What stays held out: set B is never fitted. The closing set A is the calibration suite's
own configurations measured afresh (calibration/driver.py `fresh`), disjoint from set B as
the first is (protocol.check_disjoint). Its predictions (predictions-after.json) and the
bracketed ones (predictions-bracketed.json) are written after the closing set A and before
any set B run is paired with a prediction (comparison.py). The predictions made before set B
ran (predictions.json, from the first set A alone) are kept, and their headline stands in
the report beside the bracketed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.from_store import fit_from_runs

PREDICTIONS = "predictions-bracketed.json"  # in the report folder, beside predictions.json
AFTER = "predictions-after.json"            # set B from the closing set A alone
PROFILE = "profile-after.toml"              # the closing set A's fit, beside profile.toml

# fitted values the report prints from each fit (a host phase shows in them)
SHOWN = ("compute.overlap_slowdown", "compute.whole_step_factor",
         "compute.ddp_cpu_work_factor", "compute.copy_GBps", "compute.optimizer_GBps",
         "compute.timed_wait_spread_ms", "server.crowded_message_factor",
         "server.crowded_update_factor")


@dataclass(frozen=True, kw_only=True)
class Bracket:
    """The closing set A and its fit."""

    ids_before: tuple[int, ...]      # store ids of the first set A
    ids_after: tuple[int, ...]       # store ids of the closing set A
    data: dict[str, Any]             # the closing set A fitted alone (profile data)


def fit(store, ids_before: Sequence[int], ids_after: Sequence[int], cluster: str) -> Bracket:
    """Fit the closing set A alone."""
    return Bracket(ids_before=tuple(ids_before), ids_after=tuple(ids_after),
                   data=fit_from_runs(store, list(ids_after), name=cluster, base="local"))


def _geo(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else float(np.sqrt(a * b))


def combine(first: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One bracketed predicted record (run.predicted_record) from the first set A's and the
    closing one's for the same configuration: step time, throughput and the interval's
    bounds their geometric means, the breakdown's parts their means; the rest the first's.
    `bracket` keeps both step times."""
    if first["key"] != after["key"]:
        raise ValueError(f"{first['key']} is not {after['key']}")
    out = dict(first)
    for k in ("step_time_s", "throughput_samples_per_s"):
        out[k] = _geo(first[k], after[k])
    out["breakdown"] = {k: (v + after["breakdown"][k]) / 2
                        for k, v in first["breakdown"].items()}
    a, b = first.get("step_time_interval_s"), after.get("step_time_interval_s")
    if a and b:
        out["step_time_interval_s"] = {**a, "low": _geo(a["low"], b["low"]),
                                       "high": _geo(a["high"], b["high"])}
    out["bracket"] = {"step_time_s_before": first["step_time_s"],
                      "step_time_s_after": after["step_time_s"]}
    return out


def fitted_values(before: dict[str, Any], b: Bracket) -> list[dict[str, Any]]:
    """The SHOWN fields ("table.field") as the first set A and the closing one fitted them."""
    def value(data: dict[str, Any], name: str) -> float | None:
        table, field = name.split(".")
        v = (data.get(table) or {}).get(field)
        return None if v is None else float(v)
    return [{"field": name, "before": value(before, name), "after": value(b.data, name)}
            for name in SHOWN if value(before, name) is not None or value(b.data, name)
            is not None]


def meta(before: dict[str, Any], b: Bracket, headline_before: Sequence[str],
         missed_before: Sequence[str]) -> dict[str, Any]:
    """comparisons.json's meta['bracket']."""
    return {"ids_before": list(b.ids_before), "ids_after": list(b.ids_after),
            "fitted": fitted_values(before, b), "headline_before": list(headline_before),
            "missed_before": list(missed_before)}


def markdown(m: dict[str, Any]) -> list[str]:
    """The report's section on the bracket, from meta['bracket']."""
    ids = m["ids_after"]
    out = ["## Set A before and after set B (--bracket)", "",
           f"Set A was measured again after every held-out run (runs {min(ids)}-{max(ids)}) "
           "and fitted alone; the headline above and every row below are the geometric mean "
           "of the two set As' predictions (perfmodel/compare/bracket.py), set B never "
           "fitted. The timed-wait rows keep the waits their runs slept (the first fit's "
           "unit times). The predictions made before any held-out run, from the first set "
           "A alone (predictions.json), scored:", ""]
    out += list(m["headline_before"]) + [""]
    out += [f"- missed before: {line}" for line in m["missed_before"]]
    out += [""] if m["missed_before"] else []
    out += ["Fitted by each set A (a host that changed speed shows here):", "",
            "| field | set A before | set A after |", "|---|---|---|"]
    out += [f"| {r['field']} | {_num(r['before'])} | {_num(r['after'])} |"
            for r in m["fitted"]]
    return out + [""]


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"
