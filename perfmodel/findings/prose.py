"""The findings report's prose that depends on the numbers: one function per paragraph."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibration.fit_accuracy import held_out_check
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import AccuracyModel
from perfmodel.cluster import load_cluster
from perfmodel.findings.common import MEASURE_COMMAND, MODEL_ONLY_COMMAND, penalty_text
from perfmodel.findings.records import AccuracyPenalty, MeasuredPs, Mitigations, Saving

MODEL_ONLY_NOTE = (f"Not in this report: it was written by `{MODEL_ONLY_COMMAND}`, which "
                   f"reads no measurement store. `{MEASURE_COMMAND}` makes the runs (needs "
                   "torch) and writes the full report.")


def no_runs_note(what: str) -> str:
    return f"No {what} runs in the store: run `{MEASURE_COMMAND}` to add them."


def local_source() -> str:
    prov = load_cluster("local").provenance
    return ("spec-derived (not calibrated on this machine)" if prov.source == "spec"
            else f"calibrated here on {prov.date}")


def saving_text(saving: Saving) -> str:
    sav = saving.savings
    steady = [v for (c, label), sv in sav.items() if label.startswith("jitter CV") for v in sv]
    slow = [v for (c, label), sv in sav.items() if "straggler" in label for v in sv]
    expo = [v for (c, label), sv in sav.items() if "exponential" in label for v in sv]
    return (f"Even with dedicated GPUs (2 % jitter) async saves {_pct_span(steady)}: sync PS "
            "runs push-all, apply, pull-all in lock step and leaves the server link idle "
            "while the workers compute, which async pipelines; the saving shrinks at 32 "
            "workers, where the one server link saturates under both. A straggler at half "
            f"speed makes it {_pct_span(slow)}, and exponential step times (CV 1, where a "
            f"synchronous step waits for E[max] = H_N/μ) {_pct_span(expo)}. The study's "
            "\"up to 28 %\" sits in the dedicated-GPU and one-straggler range; only "
            "strongly variable workers go beyond it.")


def accuracy_text(acc: AccuracyPenalty) -> str:
    check = held_out_check(acc.runs, acc.model)
    stable = [r for r in check if not (r["predicted_unstable"] or r["observed_unstable"])]
    errors = [abs(r["predicted_penalty_points"] - r["observed_penalty_points"]) for r in stable]
    agree = sum(r["predicted_unstable"] == r["observed_unstable"] for r in check)
    within = sum(e <= 2.0 for e in errors)
    rows = "\n".join(
        f"| {r['optimizer']} lr {r['lr']:g} | {r['profile']} | {r['mitigation']} | "
        f"{r['seeds']} | {r['observed_penalty_points']:.1f} ± {r['observed_spread_points']:.1f}"
        f" | {r['predicted_penalty_points']:.1f} |" for r in stable)
    return f"""What the runs show:

- **Instability, not slow learning, is the main cost of a fixed rate.** At lr 0.05 one
  stale step (2 workers, τ ≈ 1) already makes test accuracy swing by tens of points, and
  every fixed-rate profile from 2 workers up is unstable; at lr 0.01 only τ ≤ 1 stays
  stable. Heavy momentum compounds staleness (asynchrony acts like extra momentum,
  Mitliagkas et al. 2016); this is the divergence Zhang et al. 2016 saw with fixed rates.
- **The staleness-aware rate α₀/τ keeps large-N runs stable** but makes each update worth
  far less: its penalty grows steadily with N.
- **DC-ASGD with the server's λ = 0.04 changes nothing measurable** here: λ·g⊙g is a
  vanishing fraction of the step, so its runs track the unmitigated ones.

Held-out check ({len(check)} held-out profile × mitigation groups): stable-or-unstable
predicted correctly for {agree} of {len(check)}; where both model and runs are stable, the
penalty error is {_span(errors)} points: {within} of {len(errors)} within the issue's 2 points.
{_beyond_text(stable)} One run of a profile is ±3–10 points from its seeds' mean, so the
stable held-out groups were run with {_seed_span(stable)} seeds (the model predicts the
mean); `tests/test_accuracy_model.py` asserts every error within 2 points plus two standard
errors of that mean:

| setting | profile | mitigation | seeds | observed penalty | model |
|---|---|---|---|---|---|
{rows}"""


def longer_budgets(model: AccuracyModel) -> str:
    """The model's staleness-aware penalty at the fitted budget and at ten times it."""
    lines = ["| setting | N | mean τ | penalty at U | penalty at 10 U |", "|---|---|---|---|---|"]
    for s in model.settings:
        for n in (4, 8, 16, 64):
            taus = np.full(64, n - 1)
            cost = [staleness_cost(taus, mitigation="staleness-aware", optimizer=s.optimizer,
                                   lr=s.lr, updates=u, model=model)
                    for u in (s.budget_updates, 10 * s.budget_updates)]
            lines.append(f"| {s.name} (U = {s.budget_updates}) | {n} | {n - 1} | "
                         + " | ".join(penalty_text(c) for c in cost) + " |")
    return "\n".join(lines)


def mitigation_text(mit: Mitigations) -> str:
    sync_t = mit.protocol("sync-ps").costs[-1].time_to_target_s
    plain, aware = mit.protocol("async-ps"), mit.protocol("async-ps staleness-aware")
    ssp0, ssp3 = mit.protocol("ssp-ps s=0"), mit.protocol("ssp-ps s=3")
    return (f"Plain async is {100 * plain.saving:.0f} % faster per sample but unstable at "
            f"both rates with 8 workers. The staleness-aware rate keeps the "
            f"{100 * aware.saving:.0f} % throughput gain and stays stable at lr 0.01, but each "
            f"update is worth {aware.costs[-1].worth:.2f} of a synchronous one, so it reaches "
            f"95 % in {aware.costs[-1].time_to_target_s:.1f} s against sync-ps's "
            f"{sync_t:.1f} s. Bounded staleness gives the gain back as the bound tightens "
            f"(s = 3: {round(100 * ssp3.saving)} %, s = 0: {round(100 * ssp0.saving)} %) "
            f"while its version staleness stays at {ssp0.costs[0].mean_staleness:.1f} (SSP "
            "bounds clock differences, not how many updates land between a pull and its "
            "push), and DC-ASGD costs the server four plain applies per update for no "
            "accuracy gain at λ = 0.04. That is the study's finding: the mitigated protocols "
            "spend the asynchronous gain on synchronisation or on slower progress.")


def measured_text(measured: MeasuredPs | None) -> str:
    if measured is None:
        return MODEL_ONLY_NOTE
    found = measured.runs
    if not found:
        return no_runs_note("async mlp parameter-server")
    inside = sum(f.agrees for f in found)
    missed = [f for f in found if not f.agrees]
    kinds = []
    stable_unseen = [f for f in missed
                     if f.divergence_risk == "unstable" and not f.observed_unstable]
    if stable_unseen:
        kinds.append(f"run{'s' if len(stable_unseen) > 1 else ''} "
                     f"{', '.join(str(f.run_id) for f in stable_unseen)} predicted unstable "
                     "but showing none of the harness's instability signs")
    rest = [f for f in missed if f not in stable_unseen]
    if rest:
        kinds.append(f"run{'s' if len(rest) > 1 else ''} "
                     f"{', '.join(str(f.run_id) for f in rest)} outside the predicted band or "
                     "stability")
    marginal = (f" Missed: {'; '.join(kinds)}. Why is not known: the model's stability "
                "threshold and band were fitted on the harness, not on real parameter-server "
                "runs." if kinds else "")
    return (f"Real runs (`perfmodel measure ps --workload mlp`, async and ssp, gloo on this "
            f"2-core machine, one thread per rank, momentum at the workload's lr 0.05 or, where "
            f"the row says, at lr 0.01 (`--lr`)), each "
            f"predicted from its own measured staleness and number of updates. Where the model "
            f"predicts a stable run the measured accuracy must fall in the band (± 2 × (seed "
            f"spread ⊕ fit residual)); where it predicts an unstable one, the run's own "
            f"evaluations must show it (test accuracy falling 0.2 below its best, or the loss "
            f"blowing up: the harness's criterion). {inside} of {len(found)} agree.{marginal}"
            f"\n\n{measured.table}\n\n![measured](measured_ps.png)")


def _pct_span(values: list[float]) -> str:
    return f"{100 * min(values):.0f}–{100 * max(values):.0f} %"


def _span(values: list[float]) -> str:
    return f"{min(values):.1f} to {max(values):.1f}" if values else "(none)"


def _beyond_text(stable: list[dict[str, Any]]) -> str:
    """What the errors above 2 points amount to, against the observed means' noise."""
    beyond = []
    for r in stable:
        err = abs(r["predicted_penalty_points"] - r["observed_penalty_points"])
        se = r["observed_spread_points"] / math.sqrt(r["seeds"]) if r["seeds"] > 1 else 0.0
        if err > 2.0:
            beyond.append((r, err, se))
    if not beyond:
        return "The 2-point target is **met** on every stable held-out group."
    listed = "; ".join(f"{r['profile']} at lr {r['lr']:g}: {err:.1f} points, standard error "
                       f"of its {r['seeds']}-seed mean {se:.1f}" for r, err, se in beyond)
    if all(err <= 2.0 + se for _, err, se in beyond):
        one = len(beyond) == 1
        return (f"The other{'' if one else 's'} ({listed}) {'is' if one else 'are'} within "
                f"one standard error of 2 points: these seeds cannot tell "
                f"{'it' if one else 'them'} from the target, nor rule out a small bias.")
    return f"The 2-point target is **not met**: {listed}."


def _seed_span(stable: list[dict[str, Any]]) -> str:
    seeds = sorted({r["seeds"] for r in stable})
    return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
