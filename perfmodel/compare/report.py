"""The report folder: report.md for people, comparisons.csv and comparisons.json for
machines, all from the same Comparison rows, so the three always agree (tests check it).

Number formats in report.md (the CSV keeps full precision): throughput samples/s with 1
decimal, step time ms with 2, memory MiB with 1, staleness with 2, errors and spreads in %
with 1 decimal. Targets (issue 5) are judged on the held-out configurations as they are:
none is dropped for being hard.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import scipy.stats

from perfmodel.compare import bracket
from perfmodel.compare.anchor import AnchorResult, round_lines
from perfmodel.compare.matching import (
    QUANTITIES,
    SERVER_PHASES,
    Comparison,
    Headline,
    counts,
    headline,
)
from perfmodel.uncertainty import DEFAULT_COVERAGE

MiB = 2**20
# quantity -> (median target, max target or None); issue 5
TARGETS = {"step_time": (0.05, 0.15), "throughput": (0.05, 0.15), "peak_memory": (0.10, None),
           "staleness_mean": (0.10, None)}
# issue 14: the held-out coverage of the 90 % intervals should lie in this band
COVERAGE_BAND = (0.80, 0.97)
NAMES = {"throughput": "throughput", "step_time": "step time", "peak_memory": "peak memory",
         "staleness_mean": "PS mean staleness"}
# the headline's names: what is counted where it can be wrong (matching.counts)
HEAD_NAMES = {"throughput": "throughput", "step_time": "step time",
              "peak_memory": "peak memory, configurations unlike set A",
              "staleness_mean": "PS staleness (SSP: pooled and per-speed means; async with "
                                "stragglers: per-speed means)"}
W1_LEGEND = ("W1 = Wasserstein-1 (earth mover's) distance between the predicted and the "
             "measured staleness distributions, in versions: how far, on average, each "
             "update's staleness must move to turn one distribution into the other (0: the "
             "same distribution; 1: every update one version off).")
UNITS = {"throughput": ("samples/s", 1.0, 1), "step_time": ("ms", 1e3, 2),
         "peak_memory": ("MiB", 1 / MiB, 1), "staleness_mean": ("", 1.0, 2)}
CSV_FIELDS = ("predicted", "measured", "low", "high", "error", "spread", "robust_sd", "inside")


def fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value * scale:,.{digits}f}"


def pct(value: float | None, sign: bool = True) -> str:
    if value is None:
        return "–"
    return f"{value * 100:+.1f} %" if sign else f"{value * 100:.1f} %"


# ---------------------------------------------------------------- CSV and JSON


def row_values(r: Comparison) -> dict[str, Any]:
    """One configuration as a flat dict: the CSV row (and a JSON entry)."""
    out: dict[str, Any] = {"key": r.key, "label": r.label, "what": r.what,
                           "strategy": r.strategy, "mode": r.mode, "workers": r.workers,
                           "runs": " ".join(map(str, r.run_ids)),
                           "failed_runs": " ".join(str(i) for i, _ in r.failed)}
    for q in QUANTITIES:
        v = r.quantities[q]
        values = {"predicted": v.predicted, "measured": v.measured, "low": v.low,
                  "high": v.high, "error": v.error, "spread": v.spread,
                  "robust_sd": v.robust_sd, "inside": v.inside}
        out |= {f"{q}_{k}": values[k] for k in CSV_FIELDS}
    out["staleness_w1"] = r.staleness_w1
    worst = r.staleness_worst_worker
    out["staleness_worst_worker"] = None if worst is None else worst[0]
    out["staleness_worst_worker_predicted"] = None if worst is None else worst[1]
    out["staleness_worst_worker_measured"] = None if worst is None else worst[2]
    speed = r.staleness_worst_speed
    out["staleness_worst_speed"] = None if speed is None else speed[0]
    out["staleness_worst_speed_predicted"] = None if speed is None else speed[1]
    out["staleness_worst_speed_measured"] = None if speed is None else speed[2]
    out["staleness_headline_error"] = counts(r, "staleness_mean")[0]
    counted = r.staleness_counted
    band = None if counted is None else counted.interval
    out["staleness_headline_low"] = None if band is None else band[0]
    out["staleness_headline_high"] = None if band is None else band[1]
    out["staleness_headline_inside"] = r.staleness_inside
    out["speed"] = " ".join(f"{v:g}" for v in r.speed)
    out["memory_method"] = r.memory_method
    out["memory_twin"] = r.memory_twin
    for k, v in r.predicted_breakdown.items():
        out[f"predicted_{k}"] = v
    for k in ("compute_s", "comm_wait_s"):
        out[f"measured_{k}"] = r.measured_breakdown.get(k)
    out["own_cores"] = r.own_cores
    out["host_cores"] = r.host_cores
    out["thread_cores"] = r.thread_cores
    for k in SERVER_PHASES:
        model, measured = r.server_phases.get(k, (None, None))
        out[f"server_{k}_model"] = model
        out[f"server_{k}_measured"] = measured
    out["diagnosis"] = r.diagnosis
    return out


def write_csv(rows: Sequence[Comparison], path: Path) -> None:
    flat = [row_values(r) for r in rows]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["key"])
        writer.writeheader()
        for row in flat:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def headlines(rows: Sequence[Comparison]) -> dict[str, dict[str, Headline]]:
    """quantity -> {"all", "real", "timed-wait"} -> Headline."""
    return {q: {"all": headline(rows, q), "real": headline(rows, q, "real"),
                "timed-wait": headline(rows, q, "timed-wait")} for q in QUANTITIES}


def target_verdict(q: str, h: Headline) -> tuple[bool | None, str]:
    """(met?, the target as words)."""
    median_t, max_t = TARGETS[q]
    words = f"median ≤ {median_t:.0%}" + (f", max ≤ {max_t:.0%}" if max_t else "")
    if h.count == 0:
        return None, words
    met = h.median_abs <= median_t and (max_t is None or h.max_abs <= max_t)
    return met, words


def write_json(meta: dict[str, Any], rows: Sequence[Comparison], figures: dict[str, Any],
               torch_points: Sequence[dict[str, Any]], path: Path, *,
               elastic: dict[str, Any] | None = None) -> None:
    heads = headlines(rows)
    doc = {
        "meta": meta,
        "headline": {q: {k: vars_of(h) | {
            "target_met": target_verdict(q, h)[0], "coverage_in_band": in_band(h),
            "coverage_band_probability": (band_probability(h.with_interval)
                                          if h.with_interval else None)}
            for k, h in by.items()} for q, by in heads.items()},
        "comparisons": [row_values(r) | {
            "failed": [{"run_id": i, "reason": why} for i, why in r.failed],
            "measured_staleness": list(r.measured_staleness),
            "staleness_per_worker": {str(w): list(v) for w, v in
                                     r.staleness_per_worker.items()},
            "predicted_staleness": list(r.predicted_staleness)} for r in rows],
        "torch_memory": list(torch_points),
        "figures": figures,
    }
    if elastic is not None:
        doc["elastic"] = elastic
    path.write_text(json.dumps(doc, indent=1, default=_plain) + "\n", encoding="utf-8")


def vars_of(h: Headline) -> dict[str, Any]:
    return {k: getattr(h, k) for k in h.__dataclass_fields__}


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


# ---------------------------------------------------------------- Markdown


def table(rows: Sequence[Comparison]) -> list[str]:
    """The table of every configuration: predicted | measured median [min–max] | error."""
    head = ["config", "mode", "runs"]
    for q in QUANTITIES:
        unit = UNITS[q][0]
        name = NAMES[q] + (f" ({unit})" if unit else "")
        head += [f"{name} pred", f"{name} meas [min–max]", f"{name} err"]
    head.append("staleness W1")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.key, r.mode, f"{len(r.run_ids)}" + (f" (+{len(r.failed)} failed)"
                                                      if r.failed else "")]
        for q in QUANTITIES:
            v = r.quantities[q]
            _, scale, digits = UNITS[q]
            meas = fmt(v.measured, scale, digits)
            if v.measured is not None:
                meas += f" [{fmt(v.low, scale, digits)}–{fmt(v.high, scale, digits)}]"
            err = pct(v.error)
            if v.inside is False:
                err += " ◦"
            cells += [fmt(v.predicted, scale, digits), meas, err]
        cells.append(fmt(r.staleness_w1, 1.0, 2))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def band_probability(n: int, coverage: float = DEFAULT_COVERAGE,
                     band: tuple[float, float] = COVERAGE_BAND) -> float:
    """The chance that k of n measured medians inside their intervals puts k/n in `band`
    when every interval's true coverage is `coverage` and the rows are independent:
    k ~ Binomial(n, coverage). With a dozen rows the band is close to a coin toss even for
    a perfect interval (n = 14: 61 %; all 14 inside, 23 %), so one report's coverage
    outside it says little; the width beside it and the reports together say more."""
    if n < 1:
        raise ValueError(f"need at least one row, got {n}")
    ks = [k for k in range(n + 1) if within_band(k / n, band)]
    return float(sum(scipy.stats.binom.pmf(k, n, coverage) for k in ks))


def within_band(fraction: float, band: tuple[float, float] = COVERAGE_BAND) -> bool:
    return band[0] - 1e-12 <= fraction <= band[1] + 1e-12     # 12 of 15 is 80 %, not less


def in_band(h: Headline) -> bool | None:
    """Whether the headline's coverage lies in COVERAGE_BAND (None: no intervals)."""
    return within_band(h.inside / h.with_interval) if h.with_interval else None


def interval_cell(h: Headline) -> str:
    """Coverage with the width beside it (a wide interval covers anything) and whether it
    lies in the target band, with the chance a perfect 90 % interval would."""
    if not h.with_interval:
        return "no interval"
    width = (f" (median half-width ±{h.half_width_median:.0%})"
             if h.half_width_median is not None else "")
    lo, hi = COVERAGE_BAND
    return (f"{h.inside} of {h.with_interval}{width}; {lo:.0%}–{hi:.0%} band: "
            f"{'in' if in_band(h) else 'OUT'} (a true 90 % interval lands in it with "
            f"P = {band_probability(h.with_interval):.0%} at n = {h.with_interval})")


def memory_method(rows: Sequence[Comparison]) -> str:
    found = sorted({r.memory_method for r in rows if r.memory_method})
    return ("measured by " + ("; ".join(found) if found else "a tracker not recorded here")
            + "; model: perfmodel/memory.py's analytic tensor count")


ANCHOR_LEGEND = (
    "One calibration (set A) run, launched again with its very config at the start of every "
    "round of the held-out runs (perfmodel/compare/anchor.py): its step time against set "
    "A's says whether the machine kept its set-A speed while set B ran. Above 1: set B's "
    "rounds ran slower than set A, for reasons no held-out configuration caused. Nothing is "
    "fitted on it and no prediction uses it.")


def anchor_line(a: dict[str, Any]) -> str:
    """The drift anchor's one line from comparisons.json's meta['anchor']."""
    return AnchorResult.from_dict(a).line()


def headline_lines(rows: Sequence[Comparison]) -> tuple[list[str], list[str]]:
    """(the headline table and what it leaves out, one line per missed target)."""
    heads = headlines(rows)
    lines = ["| quantity | configs | median abs error | worst (config, signed error) | target "
             "| met? | inside 90 % interval (median half-width) | noise floor (median "
             "spread of repeats; robust SD) |",
             "|---|---|---|---|---|---|---|---|"]
    missed, left = [], []
    for q in QUANTITIES:
        for scope in ("all", "real", "timed-wait"):
            h = heads[q][scope]
            if h.count == 0 or (scope != "all" and heads[q]["all"].count == h.count):
                continue
            met, words = target_verdict(q, h)
            name = HEAD_NAMES[q] + ("" if scope == "all" else f" — {scope} only")
            if q == "peak_memory" and scope == "all":
                name += f" ({memory_method(rows)})"
            lines.append(f"| {name} | {h.count} | {pct(h.median_abs, False)} | "
                         f"{h.worst} {pct(h.worst_error)} | {words} | "
                         f"{'yes' if met else 'NO'} | {interval_cell(h)} | "
                         f"{pct(h.noise_median, False)}; "
                         f"{pct(h.noise_robust_sd_median, False)} |")
            if scope == "all" and met is False:
                missed.append(f"{NAMES[q]}: median {pct(h.median_abs, False)}, worst "
                              f"{h.worst} {pct(h.worst_error)} against {words}")
        if heads[q]["all"].left_out:
            left.append(f"{HEAD_NAMES[q]} leaves out: " + "; ".join(heads[q]["all"].left_out))
    if left:
        lines += [""] + [f"- {x}" for x in left]
    return lines, missed


def noise_table(rows: Sequence[Comparison], protocol: dict[str, Any] | None = None
                ) -> list[str]:
    """The noise floor of every configuration: its step time's repeats, their spread and
    robust SD (measure/protocol.py), and the load and pinning its runs saw."""
    protocol = protocol or {}
    out = ["## Noise floor per configuration", "",
           "Step time over each configuration's successful repeats: spread = (max − min) / "
           "median; robust SD = 1.4826 × MAD / median (MAD: median absolute deviation; "
           "estimates the SD of normal data, unmoved by one outlying run). An error smaller "
           "than these cannot be told from noise. Load: the 1-minute load average when each "
           "run started, after the wait for a quiet machine (`--settle-load`, "
           "`--settle-max-s`); pinned: runs whose ranks had cores of their own. Cores busy "
           "during the timed steps (measure/cpu_meter.py, medians over repeats): the run's "
           "own processes (their CPU seconds over the steps' wall time, summed over ranks; "
           "in brackets the part their training threads did — autograd, hooks, copies, the "
           "optimizer, a PS server's applies — the rest being gloo's communication threads) "
           "and the whole host (/proc/stat); the difference is other work.", "",
           "| config | runs | step time median (ms) | spread | robust SD | load at start | "
           "waited (s) | pinned | cores busy: run (training threads) / host |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r.quantities["step_time"]
        seen = [protocol[str(i)] for i in r.run_ids if str(i) in protocol]
        loads = [p["load_after"] for p in seen if p.get("load_after") is not None]
        waits = [p.get("waited_s") or 0.0 for p in seen]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"
        waited = f"{sum(waits):.0f}" if seen else "–"
        pinned = f"{sum(bool(p.get('pinned')) for p in seen)} of {len(seen)}" if seen else "–"
        threads = "" if r.thread_cores is None else f" ({fmt(r.thread_cores, 1, 2)})"
        cores = (f"{fmt(r.own_cores, 1, 2)}{threads} / {fmt(r.host_cores, 1, 2)}"
                 if r.own_cores is not None or r.host_cores is not None else "–")
        out.append(f"| {r.key} | {len(r.run_ids)} | {fmt(q.measured, 1e3, 2)} | "
                   f"{pct(q.spread, False)} | {pct(q.robust_sd, False)} | {load} | {waited} | "
                   f"{pinned} | {cores} |")
    return out + [""]


def server_phase_table(rows: Sequence[Comparison]) -> list[str]:
    """A PS server's time per update by phase, measured (the mean over the steady updates,
    then the median over repeats) beside the model's closed-form counterpart of each phase."""
    chosen = [r for r in rows if any(m is not None for _, m in r.server_phases.values())]
    if not chosen:
        return []
    out = ["## Parameter server: time per update by phase", "",
           "Measured: the server's own clock around each update (measure/runs/ps.py), the "
           "mean over the steady updates, then the median over repeats. Model: each phase alone, "
           "before core sharing and queueing (perfmodel/compare/run.py "
           "`model_server_phases`): a one-way transfer of the push and of the reply (as "
           "measured on the 1-worker PS runs where `server.push` and `server.reply` are in "
           "the profile, else on the server's link), the optimizer step over the model with "
           "the copy into the reply buffer (calibrated at the server where `server.update` "
           "is in the profile). A "
           "measured receive also holds the wait for the next push (whole when the server "
           "idles). Synchronous: apply + pack and reply are per version (a reply to every "
           "worker, one after another); asynchronous: one reply per update, SSP's on "
           "average.", "",
           "| config | step time error | " + " | ".join(
               f"{name} ms model / measured" for name in SERVER_PHASES.values())
           + " | sum ms model / measured |", "|---|---|" + "---|" * (len(SERVER_PHASES) + 1)]
    for r in chosen:
        cells = [f"{fmt(a, 1e3, 2)} / {fmt(b, 1e3, 2)}" for a, b in
                 (r.server_phases[k] for k in SERVER_PHASES)]
        model = [a for a, _ in r.server_phases.values()]
        meas = [b for _, b in r.server_phases.values()]
        total = (f"{fmt(sum(model), 1e3, 2) if None not in model else '–'} / "
                 f"{fmt(sum(meas), 1e3, 2) if None not in meas else '–'}")
        out.append(f"| {r.key} | {pct(r.quantities['step_time'].error)} | "
                   + " | ".join(cells) + f" | {total} |")
    return out + [""]


def staleness_table(rows: Sequence[Comparison]) -> list[str]:
    """Staleness where it can be wrong: means, the worst worker's mean, W1, the worst case."""
    chosen = [r for r in rows if r.staleness_can_be_wrong and r.predicted_staleness]
    if not chosen:
        return []
    out = ["## Staleness where it can be wrong", "",
           "A synchronous PS has staleness 0 by construction and an asynchronous PS with one "
           "gradient in flight per worker has a pooled mean of N − 1 whatever its "
           "implementation, so neither is a test. Listed: SSP, and asynchronous PS with "
           "workers of different speeds, where the mean of each speed's workers and the "
           "distribution can be wrong. The mean over the workers of one speed is counted, "
           "not one worker's own: workers of one speed are exchangeable, and which of them "
           "pushes first after a synchronisation releases them is the server's reply order "
           "reshuffled by step-time noise, which the model carries only as its jitter; the "
           "worst single worker is shown beside it, not counted. A PS row is predicted at "
           "several seeds and the medians compared, as the measured side takes the median "
           "over its repeats; the range over the seeds stands beside the range over the "
           "runs (an SSP run with a straggler flips between two orders of service, so its "
           "runs spread: docs/model.md). The worst speed's 90 % interval is for the median "
           "of the runs, from the seeds' own spread (perfmodel/uncertainty.py "
           "`median_of_runs_interval`); the headline's coverage counts the counted "
           "quantity's interval. " + W1_LEGEND, "",
           "| config | why it can be wrong | pooled mean pred [seeds min–max] | pooled mean "
           "meas [runs min–max] | worst speed: pred / meas | counted error | worst worker: "
           "pred / meas (not counted) | W1 (versions) |", "|---|---|---|---|---|---|---|---|"]
    errs = []
    for r in chosen:
        q = r.quantities["staleness_mean"]
        w = r.staleness_worst_worker
        worst = (f"worker {w[0]}: {w[1]:.2f} / {w[2]:.2f} ({pct(w[3])})" if w else
                 "not recorded")
        c = r.staleness_worst_speed
        band = r.staleness_speed_intervals.get(c[0]) if c else None
        speed = (f"speed {c[0]:g}: {c[1]:.2f} / {c[2]:.2f} ({pct(c[3])})" if c else
                 "not recorded") + (f" [90 %: {band[0]:.2f}–{band[1]:.2f}]" if band else "")
        err, _ = counts(r, "staleness_mean")
        if err is not None:
            errs.append((abs(err), r.key, err))
        seeds = r.staleness_seed_range
        pred = fmt(q.predicted) + (f" [{fmt(seeds[0])}–{fmt(seeds[1])}]" if seeds else "")
        meas = fmt(q.measured) + (f" [{fmt(q.low)}–{fmt(q.high)}]"
                                  if q.low is not None and q.high is not None else "")
        out.append(f"| {r.key} | {r.staleness_can_be_wrong} | {pred} | {meas} | {speed} | "
                   f"{pct(err)} | {worst} | {fmt(r.staleness_w1)} |")
    w1 = [(r.staleness_w1, r.key) for r in chosen if r.staleness_w1 is not None]
    worst_lines = []
    if errs:
        _, key, err = max(errs)
        worst_lines.append(f"largest counted error {pct(err)} ({key})")
    if w1:
        value, key = max(w1)
        worst_lines.append(f"largest W1 {value:.2f} versions ({key})")
    return out + ["", "Worst case: " + ("; ".join(worst_lines) or "none counted") + ".", ""]


def write_markdown(path: Path, *, meta: dict[str, Any], rows: Sequence[Comparison],
                   figures: dict[str, Any], torch_rows: Sequence[dict[str, Any]],
                   why_missed: Sequence[str], elastic_lines: Sequence[str] = (),
                   elastic_head: Sequence[str] = ()) -> None:
    heads, missed = headline_lines(rows)
    m = meta
    out = [f"# perfmodel compare: `{m['cluster']}`, {m['date']} — predicted vs measured on "
           f"held-out configurations", "",
           "Produced by this command (run from the repository root):", "",
           "```", m["command"], "```", "",
           f"Host {m['host']} ({m['hardware']}), {m['versions']}; {m['wall_s'] / 60:.1f} min "
           f"in all. 1-minute load average before the runs: {m['load_range']} (the 2 cores "
           f"may be shared with other work, which adds to the measured spread).", "",
           "## Headline", "",
           "Each quantity is counted only on configurations where it can be wrong (left-out "
           "ones are named below the table); the worst configuration and its signed error "
           "stand beside the median; a prediction interval's coverage stands beside its "
           "median half-width (a wide interval covers anything).", ""] + heads + [""]
    out += list(elastic_head)
    if missed:
        out += ["**Targets missed** (issue 5; no configuration was left out to look better):",
                ""] + [f"- {line}" for line in missed] + [""]
        out += ["What the measurements say about the misses:", ""]
        out += [f"- {w}" for w in why_missed] + ([""] if why_missed else [])
    else:
        out += ["Every target of issue 5 is met on these configurations.", ""]
    out += ["## Protocol", ""] + [f"- {line}" for line in m["protocol"]] + [""]
    if m.get("anchor"):
        out += ["## Drift anchor", "", ANCHOR_LEGEND, "", f"- {anchor_line(m['anchor'])}"]
        out += [f"- Why this run: {m['anchor']['why']}"] if m["anchor"].get("why") else []
        out += [""]
    if (m.get("bracket") or {}).get("ids_after"):
        out += bracket.markdown(m["bracket"])
    if m.get("by_round"):
        out += ["Round by round (each configuration's run of that round against its prediction; "
                "the medians above hide a host that changed speed between rounds):", ""]
        out += [f"- {line}" for line in round_lines(m["by_round"])] + [""]
    if m.get("skipped"):
        out += ["Skipped configurations:", ""] + [f"- `{k}`: {why}" for k, why in
                                                  m["skipped"].items()] + [""]
    failed = [(r.key, i, why) for r in rows for i, why in r.failed]
    if failed:
        out += ["Failed runs, left out of every number above (not averaged in):", ""]
        out += [f"- `{k}` run {i}: {why}" for k, i, why in failed] + [""]
    out += ["## Every configuration", "",
            "Predicted, measured median over the repeats with [min–max], and error = "
            "(predicted − measured) / measured. ◦ marks a measured median outside the "
            "prediction's 90 % interval. Memory is not compared for timed-wait runs (their "
            "model computes nothing); staleness only for parameter servers. Full precision: "
            "comparisons.csv.", ""] + table(rows) + [""]
    out += ["What each configuration changes from the calibration set:", ""]
    out += [f"- `{r.key}`: {r.what} — {r.label}" for r in rows] + [""]
    diagnosed = [r for r in rows if r.diagnosis]
    out += ["## Where the model is off by more than 15 %", ""]
    out += ([f"- `{r.key}`: {r.diagnosis}" for r in diagnosed] or
            ["No configuration: every step-time and throughput error is within 15 %."])
    out += ["", "Measured breakdown: compute = forward + backward + optimizer (+ straggler "
            "sleep); communication + waiting = the time the training loop stood still for "
            "communication (DDP: after the last bucket was ready; FSDP: inside its "
            "collectives; PS worker: push to reply). The model splits that time into exposed "
            "communication and waiting for other workers.", ""]
    out += noise_table(rows, m.get("run_protocol"))
    out += server_phase_table(rows)
    out += staleness_table(rows)
    out += list(elastic_lines)
    out += ["## Figures", ""]
    captions = {
        "scatter": "Predicted against measured (bars: min–max of repeats; solid: y = x, "
                   "a perfect prediction; dotted: ±15 %, the error beyond which a "
                   "configuration is diagnosed). Staleness: only where it can be wrong, "
                   "per-worker means (one point per worker).",
        "scaling": "Throughput against workers: line = predicted, circles = measured "
                   "(filled: real compute; hollow: timed-wait; bars: min–max of repeats).",
        "memory": "Peak memory per worker by part: model (left) and measured (right, "
                  "hatched).",
        "staleness": "Staleness distributions: model (line) over measured (bars). " + W1_LEGEND,
        "timeline": "One simulated steady step per worker and the transfers on the links, "
                    "beside the measured mean step breakdown.",
        "torch_memory": "Peak memory per rank of GPT-2 XL at scale: perfmodel against "
                        "PyTorch's own estimate.",
    }
    for name, info in ((k, v) for k, v in figures.items() if k != "elastic"):
        out += [f"![{name}]({info['file']})", "", captions.get(name, ""), ""]
    out += ["## Peak memory at scale: perfmodel vs PyTorch's own estimate", ""]
    if torch_rows:
        out += [m["torch_memory_note"], "",
                "| job | ranks | perfmodel (GiB) | PyTorch (GiB) | error | PyTorch's parts at "
                "its peak (GiB: params / grads / optimizer / activations / other) |",
                "|---|---|---|---|---|---|"]
        for t in torch_rows:
            parts = " / ".join(f"{t['torch_parts'][k] / 2**30:.2f}" for k in
                               ("params", "grads", "optimizer", "activations", "other"))
            err = (t["model_bytes"] - t["torch_bytes"]) / t["torch_bytes"]
            out.append(f"| {t['label']} | {t['ranks']} | {t['model_bytes'] / 2**30:.2f} | "
                       f"{t['torch_bytes'] / 2**30:.2f} | {pct(err)} | {parts} |")
        worst = max(torch_rows, key=lambda t: abs(t["model_bytes"] - t["torch_bytes"])
                    / t["torch_bytes"])
        out += ["", f"Worst case: {worst['label']} at {worst['ranks']} ranks, "
                    f"{pct((worst['model_bytes'] - worst['torch_bytes']) / worst['torch_bytes'])}."]
        out.append("")
    else:
        out += [m.get("torch_memory_note") or "Not computed in this run.", ""]
    out += ["## Files", "",
            "- `predictions.json`: every prediction, written before the first run started.",
            "- `comparisons.csv`, `comparisons.json`: the table above at full precision (the "
            "JSON also holds each figure's plotted numbers and the headline).",
            "- `profile.toml`: the profile fitted from calibration set A and used for every "
            "prediction.",
            "- `elastic_predictions.json` (without --quick): the elastic runs' predictions, "
            "written after the elastic calibration run and before the held-out ones.", ""]
    path.write_text("\n".join(out), encoding="utf-8")
