"""Section 8 of the findings report: the study's accuracy penalty of async PS per workload
class, at the same epochs and at the same wall-clock time (perfmodel/accuracy/penalty.py).

Per class (the held-out classes of perfmodel/data/heldout/accuracy_plan.toml, each with its
fitted model in perfmodel/data/accuracy/), fitted setting, mitigation and worker count: the
model's two penalties with the simulator's throughput ratio r = X_async / X_sync and async
staleness (ResNet-50 batch 64, as in section 3), and the same two numbers read off the class's
recorded harness runs of the homogeneous N-worker profile (homo-N), where they exist.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np

from calibration.fit_accuracy import accuracy_unstable, curve_points, observed
from perfmodel.accuracy.model import ACCURACY_DIR, Setting, load_accuracy_model
from perfmodel.accuracy.penalty import ObservedPenalty, observed_penalties, study_penalty
from perfmodel.findings.common import ASYNC_WORKERS, STUDY, scenario
from perfmodel.findings.predicted import STRAGGLER
from perfmodel.findings.records import ClassPenalties, ClassPenalty, CsvRow
from perfmodel.predict import predict

# class name -> (its accuracy model, its runs files); mlp-digits is the shipped mlp.toml and
# its runs (the plan's mlp-digits class), plus the held-out seeds recorded for the plan
CLASSES = {"mlp-digits": ("mlp", ("mlp_runs.json", "mlp-digits_runs.json")),
           "cnn-digits": ("cnn-digits", ("cnn-digits_runs.json",)),
           "logreg-tabular": ("logreg-tabular", ("logreg-tabular_runs.json",)),
           "transformer-seq": ("transformer-seq", ("transformer-seq_runs.json",))}
SHOWN_MITIGATIONS = ("none", "staleness-aware")
HOMOGENEOUS = "jitter CV 0.02 (profile)"
TABLE_CLUSTER = "a10g"          # the commodity cluster (PCIe, 40 Gbit/s), as in section 5
STUDY_RANGE_POINTS = (4.0, 17.0)
# a class whose synchronous accuracy at the budget is this close to chance learned nothing
# in it: no penalty can show (a display rule, not a fitted or tested bound)
LEARNS_NOTHING_POINTS = 5.0
LONG_BUDGET = 10               # x the class's budget: does the penalty last?


def class_penalties(classes: dict[str, tuple[str, tuple[str, ...]]] = CLASSES) -> ClassPenalties:
    """Every class x setting x mitigation x cluster x variation x worker count."""
    ratios = {(TABLE_CLUSTER, v, n): _ratio(TABLE_CLUSTER, v, n)
              for v in (HOMOGENEOUS, STRAGGLER) for n in ASYNC_WORKERS}
    points = []
    for name, (model_name, runs_files) in classes.items():
        model = load_accuracy_model(model_name)
        runs = _runs(runs_files)
        for setting in model.settings:
            for mitigation in SHOWN_MITIGATIONS:
                for (cluster, variation, n), (r, taus) in ratios.items():
                    obs, shaky = (_observed(runs, setting, mitigation, n, r)
                                  if variation == HOMOGENEOUS else (None, False))
                    kw = dict(throughput_ratio=r, workers=n, mitigation=mitigation)
                    points.append(ClassPenalty(
                        klass=name, cluster=cluster, variation=variation,
                        model=study_penalty(model, setting, taus, **kw),
                        noise_scaled=study_penalty(model, setting, taus, noise_scaled=True,
                                                   **kw),
                        long_budget=study_penalty(model, setting, taus, **kw,
                                                  updates=LONG_BUDGET * setting.budget_updates),
                        observed=obs, observed_unstable=shaky))
    points = tuple(points)
    return ClassPenalties(text=section_text(points, classes), points=points,
                          rows=tuple(_csv_rows(points)))


def _ratio(cluster: str, variation: str, n: int) -> tuple[float, np.ndarray]:
    """(X_async / X_sync, async staleness) on ResNet-50 at n workers."""
    extra = {"speed": (1.0,) * (n - 1) + (0.5,)} if variation == STRAGGLER else {}
    sc = scenario(cluster, "resnet50", n, **extra)
    sync, stale = predict("sync-ps", sc), predict("async-ps", sc)
    r = stale.summary.throughput_samples_per_s / sync.summary.throughput_samples_per_s
    return r, np.asarray(stale.summary.staleness_values, dtype=float)


def _runs(files: Iterable[str]) -> list[dict]:
    """The runs of `files`, each once (mlp-digits_runs.json holds copies of the mlp_runs.json
    runs the plan reuses)."""
    runs = {}
    for f in files:
        path = ACCURACY_DIR / f
        if path.is_file():
            for r in json.loads(path.read_text())["runs"]:
                key = (r["optimizer"], r["lr"], r["updates"], r["profile"], r["mitigation"],
                       r["seed"])
                runs.setdefault(key, r)
    return list(runs.values())


def _observed(runs: list[dict], setting: Setting, mitigation: str, n: int,
              r: float) -> tuple[ObservedPenalty | None, bool]:
    """Both penalties from the homo-n runs of `setting`, and whether they were unstable (by
    fit_accuracy.accuracy_unstable, the rule the class models are fitted under since
    accuracy_plan_v2.toml)."""
    mine = [x for x in runs if x["optimizer"] == setting.optimizer
            and math.isclose(x["lr"], setting.lr) and x["updates"] == setting.budget_updates]
    sync = [x for x in mine if x["profile"] == "sync"]
    stale = [x for x in mine if x["profile"] == f"homo-{n}" and x["mitigation"] == mitigation]
    if not sync or not stale or r < 1:
        return None, False
    u = curve_points(sync[0])[0]
    acc = np.mean([curve_points(x)[1] for x in sync], axis=0)
    obs = observed_penalties(u, acc, [observed(x, setting.budget_updates) for x in stale],
                             budget_updates=setting.budget_updates, throughput_ratio=r)
    return obs, 2 * sum(accuracy_unstable(x) for x in stale) >= len(stale)


def _csv_rows(points: tuple[ClassPenalty, ...]) -> Iterable[CsvRow]:
    for p in points:
        m = p.model
        base = dict(finding="accuracy_loss", cluster=p.cluster, workload=p.klass,
                    workers=m.workers, config=f"{m.setting} {m.mitigation}; {p.variation}")
        values = {"throughput_ratio": m.throughput_ratio,
                  "model_unstable": float(m.unstable),
                  "same_epochs_points": m.same_epochs_points,
                  "same_time_points": m.same_time_points,
                  "same_epochs_points_noise_scaled": p.noise_scaled.same_epochs_points,
                  "same_time_points_noise_scaled": p.noise_scaled.same_time_points,
                  "same_epochs_points_long_budget": p.long_budget.same_epochs_points,
                  "same_time_points_long_budget": p.long_budget.same_time_points}
        if p.observed is not None:
            values |= {"observed_same_epochs_points": p.observed.same_epochs_points,
                       "observed_same_time_points": p.observed.same_time_points,
                       "observed_unstable": float(p.observed_unstable)}
        for metric, value in values.items():
            yield CsvRow(metric=metric, value=value, **base)


# ---------------------------------------------------------------- the section's Markdown


def in_study_range(points: float) -> bool:
    return STUDY_RANGE_POINTS[0] <= points <= STUDY_RANGE_POINTS[1]


def _num(value: float) -> str:
    """One decimal, without a minus sign on a value that rounds to zero."""
    text = f"{value:.1f}"
    return "0.0" if text == "-0.0" else text


def _cell(value: float, shaky: bool) -> str:
    if shaky:
        return "U"
    text = _num(value)
    return f"**{text}**" if in_study_range(value) else text


def _pair(epochs: float, time: float, shaky: bool) -> str:
    return "U" if shaky else f"{_cell(epochs, False)} / {_cell(time, False)}"


def _select(points, cluster: str, variation: str):
    return [p for p in points if p.cluster == cluster and p.variation == variation]


def _table(points, cell, title_row: str) -> str:
    """Rows class x setting x mitigation, columns ASYNC_WORKERS; `cell(p)` fills one."""
    head = ["| class | setting | mitigation | " + " | ".join(f"N={n}" for n in ASYNC_WORKERS)
            + " |", "|---|---|---|" + "---|" * len(ASYNC_WORKERS), title_row]
    rows: dict[tuple[str, str, str], dict[int, str]] = {}
    for p in points:
        key = (p.klass, p.model.setting, p.model.mitigation)
        rows.setdefault(key, {})[p.model.workers] = cell(p)
    return "\n".join(head + [f"| {k} | {s} | {m} | " + " | ".join(
        cells.get(n, "–") for n in ASYNC_WORKERS) + " |" for (k, s, m), cells in rows.items()])


def _ratio_row(points) -> str:
    by_n = {p.model.workers: p.model.throughput_ratio for p in points}
    return ("| r = X_async / X_sync | | | " + " | ".join(f"{by_n[n]:.2f}" for n in ASYNC_WORKERS)
            + " |")


def _observed_cell(p: ClassPenalty) -> str:
    o = p.observed
    if o is None:
        return "–"
    flag = " U" if p.observed_unstable else ""
    return (f"{_cell(o.same_epochs_points, False)} / {_cell(o.same_time_points, False)}{flag}"
            f" ({o.seeds})")


def section_text(points: tuple[ClassPenalty, ...],
                 classes: dict[str, tuple[str, tuple[str, ...]]] = CLASSES) -> str:
    """Section 8's body: definitions, the four tables and what they show."""
    homo = _select(points, TABLE_CLUSTER, HOMOGENEOUS)
    slow = _select(points, TABLE_CLUSTER, STRAGGLER)
    model_t = _table(homo, lambda p: _pair(p.model.same_epochs_points,
                                           p.model.same_time_points, p.model.unstable),
                     _ratio_row(homo))
    slow_t = _table(slow, lambda p: _pair(p.model.same_epochs_points,
                                          p.model.same_time_points, p.model.unstable),
                    _ratio_row(slow))
    noise_t = _table(homo, lambda p: _pair(p.noise_scaled.same_epochs_points,
                                           p.noise_scaled.same_time_points,
                                           p.noise_scaled.unstable), _ratio_row(homo))
    seen_t = _table(homo, _observed_cell, _ratio_row(homo))
    low, high = STUDY_RANGE_POINTS
    return f"""The study's async-PS penalty, read the two ways a practitioner reads it, at each
class's budget of U asynchronous updates (batch 64; `perfmodel/accuracy/penalty.py`):

- **same epochs** (E): synchronous PS and async PS have seen the same samples;
  E = acc_sync(U) − acc_async(U);
- **same wall-clock time** (T): async PS processes r = X_async / X_sync times the samples per
  second of synchronous PS (the simulator's ratio for ResNet-50 batch 64 on the cluster, as
  in section 3), so in the time async makes U updates synchronous PS makes U / r;
  T = acc_sync(U / r) − acc_async(U). A negative number means async is ahead.

Each class's fitted model (perfmodel/data/accuracy/; mlp-digits rows are mlp.toml's two fitted
settings, the plan's class being its lr 0.05) gives
acc_sync(u) = curve(u) and acc_async(U) = curve(U · worth) with the simulator's async
staleness, or **U** where the instability index crosses the class's threshold (the run
oscillates or diverges: no accuracy is promised; the CSV gives its penalty to chance).
Cells read "E / T" in points; **bold** lies in the study's {low:g}–{high:g} %. T falls
below E only where the synchronous curve still rises between U / r and U; where it has
levelled off, the samples async gains per second buy nothing and T = E.

Model, {TABLE_CLUSTER}, homogeneous workers (2 % step jitter); synchronous steps of N batches
counted as N updates, as in the harness's synchronous runs (another cluster's r follows from
section 3's saving: r = 1 / (1 − saving)):

{model_t}

The same on {TABLE_CLUSTER} with one worker at half speed (synchronous PS waits for it, async
does not: r grows, E barely moves):

{slow_t}

Observed in the harness: each class's recorded runs of the homogeneous N-worker staleness
profile (homo-N) at its budget, mean over the seeds (in brackets), against the mean curve of
its synchronous runs read at U and at U / r (r of the first table); U = unstable in at least
half of the seeds; – = not run:

{seen_t}

Model again, counting a synchronous step of N batches with the class's measured gradient
noise scale (1/(1 + B_noise/B) of an ideal step, McCandlish et al. 2018; as `perfmodel
predict` counts it): large synchronous batches are worth less, so synchronous PS is itself
slower per epoch:

{noise_t}

{where_text(points, classes)}"""


def where_text(points: tuple[ClassPenalty, ...],
               classes: dict[str, tuple[str, tuple[str, ...]]] = CLASSES) -> str:
    """Where the study's range arises (table cluster, homogeneous): in one list per
    reading, then per class and setting, then what the noise-scaled counting changes."""
    homo = [p for p in _select(points, TABLE_CLUSTER, HOMOGENEOUS) if p.klass in classes]
    steady = [p for p in homo if not p.model.unstable]
    seen = [p for p in homo if p.observed is not None]
    lines = [f"Where the study's {STUDY['accuracy_loss']} arises ({TABLE_CLUSTER}, "
             "homogeneous):", "",
             "- model, same epochs: " + _where(steady, lambda p: p.model.same_epochs_points),
             "- model, same time: " + _where(steady, lambda p: p.model.same_time_points),
             "- runs, same epochs: " + _where(seen, lambda p: p.observed.same_epochs_points),
             "- runs, same time: " + _where(seen, lambda p: p.observed.same_time_points),
             "", f"Per class (\"{LONG_BUDGET} U\": the model at {LONG_BUDGET} times the "
             "budget, same epochs):", ""]
    for name in classes:
        mine = [p for p in homo if p.klass == name]
        if mine:
            lines += [f"- **{name}**"] + [f"  - {line}" for line in _class_lines(mine)]
    ns = [p for p in homo if not p.noise_scaled.unstable and p.noise_scaled.sync_efficiency < 1]
    ahead = [p for p in ns if p.noise_scaled.same_time_points < 0]
    lines += ["", f"Counted with the measured noise scale (last table), async is ahead at the "
              f"same wall-clock time in {len(ahead)} of the {len(ns)} stable cells where "
              "a synchronous step counts for less than N updates: where B_noise is small "
              "against N·64 a synchronous step of N batches is worth little more than one "
              "batch, so the penalty shrinks or turns into a gain. Whether it does in "
              "practice depends on whether the synchronous learning rate is scaled with the "
              "batch, which the harness did not measure."]
    return "\n".join(lines)


def _where(ps: list[ClassPenalty], value) -> str:
    hits = [f"{p.klass} {p.model.setting} {p.model.mitigation} N = {p.model.workers} "
            f"({_num(value(p))})" for p in ps if in_study_range(value(p))]
    return "; ".join(hits) if hits else "nowhere"


def _class_lines(mine: list[ClassPenalty]) -> list[str]:
    lines = []
    for setting in dict.fromkeys(p.model.setting for p in mine):
        ps = [p for p in mine if p.model.setting == setting]
        learned = 100 * (ps[0].model.sync_accuracy_same_epochs - ps[0].model.chance_accuracy)
        if learned < LEARNS_NOTHING_POINTS:
            lines.append(f"{setting}: synchronous training ends only {_num(learned)} points "
                         "above chance in its budget; it learns nothing there, so no penalty "
                         "can show")
            continue
        for mitigation in SHOWN_MITIGATIONS:
            group = [p for p in ps if p.model.mitigation == mitigation]
            if group:
                lines.append(f"{setting}, {mitigation}: " + _summary(group))
    return lines


def _span(values: list[float]) -> str:
    lo, hi = _num(min(values)), _num(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def _summary(ps: list[ClassPenalty]) -> str:
    shaky = [p.model.workers for p in ps if p.model.unstable]
    steady = [p for p in ps if not p.model.unstable]
    bits = [f"model unstable at N = {_ns(shaky)}"] if shaky else []
    if steady:
        bits.append(f"model E {_span([p.model.same_epochs_points for p in steady])}, T "
                    f"{_span([p.model.same_time_points for p in steady])} points at N = "
                    f"{_ns([p.model.workers for p in steady])} ({LONG_BUDGET} U: "
                    f"{_span([p.long_budget.same_epochs_points for p in steady])})")
    seen = [p for p in ps if p.observed is not None]
    if seen:
        shaky_seen = [p.model.workers for p in seen if p.observed_unstable]
        bits.append(f"runs E {_span([p.observed.same_epochs_points for p in seen])}, T "
                    f"{_span([p.observed.same_time_points for p in seen])} at N = "
                    f"{_ns([p.model.workers for p in seen])}"
                    + (f" (unstable at N = {_ns(shaky_seen)})" if shaky_seen else ""))
    return "; ".join(bits)


def _ns(ns: list[int]) -> str:
    return ", ".join(str(n) for n in ns)
