"""Set A measured before and after set B, fitted as one (`perfmodel compare --bracket`).

Why: on this 2-core VM the host changes speed over a session, and a set A measured only
before set B fits the host of its own 17 minutes. Report 53's set A ran slower than every
round of its set B (every timed-wait row over-predicted, 14-19 % a round); report 52's
first round, next to set A, missed its timed-wait rows by 4.8 % (median) and its later
rounds by 16 and 12 %. A set A measured again after set B and fitted together with the first
(calibration/pool.py: two sources of one store) describes the host over the whole window
set B ran in, as a reference measured before and after a sample does.

What stays held out: set B is never fitted. The closing set A is the calibration suite's
own configurations measured afresh (calibration/driver.py `fresh`), disjoint from set B as
the first is (protocol.check_disjoint). The bracketed predictions are written to
predictions-bracketed.json after the closing set A and before any set B run is paired with
a prediction (comparison.py). The predictions made before set B ran (predictions.json, from
the first set A alone) are kept, and their headline stands in the report beside the
bracketed one.

A timed-wait run slept the first fit's unit times (protocol.run_config): its bracketed
prediction takes those waits (protocol.with_waits_of) and its real work from the pooled
fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibration.from_store import fit_from_runs
from calibration.pool import PooledStore, PoolSource

PREDICTIONS = "predictions-bracketed.json"     # in the report folder, beside predictions.json
PROFILE = "profile-bracketed.toml"              # the pooled fit, beside profile.toml

# fitted values the report prints from each fit (a host phase shows in them)
SHOWN = ("overlap_slowdown", "whole_step_factor", "ddp_cpu_work_factor", "copy_GBps",
         "optimizer_GBps", "timed_wait_spread_ms")


@dataclass(frozen=True, kw_only=True)
class Bracket:
    """Set A before and after set B, and their fits."""

    ids_before: tuple[int, ...]      # store ids of the first set A
    ids_after: tuple[int, ...]       # store ids of the closing set A
    pooled_ids: tuple[int, ...]      # both under calibration/pool.py's unique ids
    data: dict[str, Any]             # the pooled fit: what the bracketed predictions use
    after_alone: dict[str, Any]      # the closing set A fitted alone: printed, never used


def fit(store, ids_before: Sequence[int], ids_after: Sequence[int], cluster: str) -> Bracket:
    """Fit both set As as one (and the closing one alone, for the report)."""
    pooled = PooledStore([PoolSource(store, tuple(ids_before)),
                          PoolSource(store, tuple(ids_after))])
    return Bracket(ids_before=tuple(ids_before), ids_after=tuple(ids_after),
                   pooled_ids=tuple(pooled.ids),
                   data=fit_from_runs(pooled, pooled.ids, name=cluster, base="local"),
                   after_alone=fit_from_runs(store, list(ids_after), name=cluster,
                                             base="local"))


def fitted_values(before: dict[str, Any], b: Bracket) -> list[dict[str, Any]]:
    """The SHOWN compute fields as the first set A, the closing one and both fitted them."""
    def value(data: dict[str, Any], name: str) -> float | None:
        v = (data.get("compute") or {}).get(name)
        return None if v is None else float(v)
    return [{"field": f"compute.{name}", "before": value(before, name),
             "after": value(b.after_alone, name), "pooled": value(b.data, name)}
            for name in SHOWN if value(b.data, name) is not None]


def meta(before: dict[str, Any], b: Bracket, headline_before: Sequence[str],
         missed_before: Sequence[str]) -> dict[str, Any]:
    """comparisons.json's meta['bracket']."""
    return {"ids_before": list(b.ids_before), "ids_after": list(b.ids_after),
            "pooled_ids": list(b.pooled_ids), "fitted": fitted_values(before, b),
            "headline_before": list(headline_before), "missed_before": list(missed_before)}


def markdown(m: dict[str, Any]) -> list[str]:
    """The report's section on the bracket, from meta['bracket']."""
    ids = m["ids_after"]
    out = ["## Set A before and after set B (--bracket)", "",
           f"Set A was measured again after every held-out run (runs {min(ids)}-{max(ids)}) "
           "and fitted together with the first (perfmodel/compare/bracket.py); the headline "
           "above and every row below are predicted from that pooled fit, set B never "
           "fitted. The timed-wait rows keep the waits their runs slept (the first fit's "
           "unit times). The predictions made before any held-out run, from the first set "
           "A alone (predictions.json), scored:", ""]
    out += list(m["headline_before"]) + [""]
    out += [f"- missed before: {line}" for line in m["missed_before"]]
    out += [""] if m["missed_before"] else []
    out += ["Fitted by each set A (a host that changed speed shows here):", "",
            "| field | set A before | set A after | both (used) |", "|---|---|---|---|"]
    out += [f"| {r['field']} | {_num(r['before'])} | {_num(r['after'])} | "
            f"{_num(r['pooled'])} |" for r in m["fitted"]]
    return out + [""]


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"
