"""Which strategy: DDP, FSDP or a parameter server, ranked by time to accuracy or throughput.

Every candidate (DDP; FSDP full-shard and grad-op; sync-, async- and ssp-PS, async with the
staleness-aware rate or delay compensation; where workers differ in speed, DDP and FSDP
without the k slowest and sync-PS with b backup workers, perfmodel/stragglers.py) is
simulated on the same scenario (perfmodel predict). A candidate is excluded when any of its
devices (PS: workers and server) needs more than the memory budget.

Where an accuracy model applies to the workload (perfmodel/accuracy/lookup.py) the rest are
ranked by time to the target accuracy: the synchronous learning curve's updates to the
target, divided by what a stale update (or one batch of a large synchronous step) is worth
and by the updates per second (perfmodel/accuracy/cost.py), with a range from the seed
spread. Where none applies they are ranked by throughput, staleness and its risk flag shown
and not costed, and the recommendation says so in one line. Either way a candidate within
TIE_FRACTION of the best (or, by time, whose range overlaps the best's) ties, and a tie goes
to the simpler strategy (weighed()' order, a straggler-aware variant after its base).

The decision framework this turns into numbers (DESIGN.md): DDP for homogeneous
gang-scheduled clusters, FSDP when memory binds, PS or a straggler-aware variant under
heterogeneity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfmodel import strategies as strategy_records
from perfmodel.accuracy.cost import StalenessCost, StalenessRisk, staleness_cost, staleness_risk
from perfmodel.accuracy.lookup import accuracy_model_for, no_model_line
from perfmodel.accuracy.model import AccuracyModel
from perfmodel.errors import PerfmodelError
from perfmodel.predict import Prediction, predict
from perfmodel.sim import psnet
from perfmodel.sim.scenario import Scenario
from perfmodel.stragglers import backup_step, exclusions, fastest

GIB = 2**30


def weighed(scenario: Scenario | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, strategy, options) of every variant weighed, in the registry's order; with a
    scenario, each PS variant also with 2, 4, ... servers up to the worker nodes, each
    dedicated (extra nodes, counted as hardware) and colocated (on the workers' nodes)."""
    out = []
    for r in strategy_records.REGISTRY.values():
        for label, options in r.candidates:
            out.append((label, r.name, dict(options)))
            if r.is_ps and scenario is not None:
                out.extend(_server_variants(label, r.name, dict(options), scenario))
    return out


def _server_variants(label: str, strategy: str, options: dict[str, Any],
                     scenario: Scenario) -> list[tuple[str, str, dict[str, Any]]]:
    nodes = scenario.cluster.nodes_for(scenario.workers)
    counts = [1] + [2**k for k in range(1, 16) if 2**k <= nodes]
    out = []
    for servers in counts:
        for placement in ("dedicated", "colocated"):
            if servers == 1 and placement == psnet.default_placement(scenario.cluster):
                continue                          # the plain variant above
            out.append((f"{label} {servers} {placement}", strategy,
                        {**options, "servers": servers, "server_placement": placement}))
    return out


def is_synchronous(strategy: str) -> bool:
    return strategy_records.get(strategy).synchronous

# Predicted times closer than this fraction are a tie: the simulator's error on spec-derived
# profiles is larger (README: absolute numbers are a first estimate), and a tie goes to the
# simpler strategy, in weighed()' order (fewest moving parts first).
TIE_FRACTION = 0.10


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    label: str
    strategy: str
    options: dict[str, Any]
    throughput_samples_per_s: float
    step_time_s: float
    wait_s: float                   # per step, waiting for other workers
    comm_exposed_s: float
    peak_GiB: float                 # largest over the strategy's devices (PS: worker, server)
    peak_role: str
    fits: bool
    cost: StalenessCost | StalenessRisk
    devices: int                    # devices occupied, PS servers on their own included
    workers_used: int               # devices whose gradients count
    idle: str = ""                  # the hardware a straggler-aware variant leaves unused

    @property
    def time_to_target_s(self) -> float:
        t = getattr(self.cost, "time_to_target_s", None)
        return math.inf if t is None else t

    @property
    def time_range_s(self) -> tuple[float, float]:
        r = getattr(self.cost, "time_range_s", None)
        return (self.time_to_target_s,) * 2 if r is None else r

    def to_json(self) -> dict[str, Any]:
        t = self.time_to_target_s
        return {"label": self.label, "strategy": self.strategy, "options": self.options,
                "throughput_samples_per_s": self.throughput_samples_per_s,
                "step_time_s": self.step_time_s, "wait_s": self.wait_s,
                "comm_exposed_s": self.comm_exposed_s, "peak_GiB": self.peak_GiB,
                "peak_role": self.peak_role, "fits": self.fits, "devices": self.devices,
                "time_to_target_s": t if math.isfinite(t) else "inf",
                "workers_used": self.workers_used, "idle": self.idle,
                "accuracy": self.cost.to_json()}


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    scenario: Scenario
    memory_budget_GiB: float
    target_accuracy: float | None       # None where no accuracy model applies
    ranked: tuple[Candidate, ...]       # fitting ones by time to target, then the rest
    choice: Candidate | None
    ranked_by: str = "time to target"   # or "throughput" where no accuracy model applies
    accuracy_model: str | None = None   # the model file that applies, None where none does
    reasons: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        sc = self.scenario
        return {"cluster": sc.cluster.name, "cluster_source": sc.cluster.provenance.source,
                "workload": sc.workload.name, "workers": sc.workers,
                "batch_size": sc.batch_size, "speeds": list(sc.speeds),
                "memory_budget_GiB": self.memory_budget_GiB,
                "target_accuracy": self.target_accuracy,
                "ranked_by": self.ranked_by, "accuracy_model": self.accuracy_model,
                "choice": None if self.choice is None else self.choice.label,
                "reasons": list(self.reasons),
                "candidates": [c.to_json() for c in self.ranked]}


def evaluate(label: str, prediction: Prediction, budget_GiB: float, *,
             target_accuracy: float | None, optimizer: str | None, lr: float | None,
             model: AccuracyModel | None, idle: str = "",
             backup: tuple[float, float, int] | None = None) -> Candidate:
    """One strategy's numbers: throughput, memory against the budget, time to accuracy (or
    the staleness risk where `model` is None). `backup` = (step s, samples/s, workers used)
    replaces the simulated step of a sync-PS with backup workers."""
    s, options, sc = prediction.summary, prediction.options, prediction.scenario
    role, peak = max(((r, m.peak_bytes) for r, m in prediction.memory.items()),
                     key=lambda rm: rm[1])
    step_s, samples_per_s, used = backup or (s.step_time_s.mean, s.throughput_samples_per_s,
                                             sc.workers)
    sync = is_synchronous(prediction.strategy)
    if model is None:
        cost = staleness_risk(s.staleness_values, sc.workload)
    else:
        mitigation = ("staleness-aware" if options.get("staleness_aware_lr") else
                      "dc" if options.get("delay_compensation") else "none")
        cost = staleness_cost(s.staleness_values, mitigation=mitigation,
                              target_accuracy=target_accuracy, optimizer=optimizer, lr=lr,
                              samples_per_s=samples_per_s, batch_size=sc.batch_size,
                              model=model, sync_workers=used if sync else 1)
    return Candidate(label=label, strategy=prediction.strategy, options=dict(options),
                     throughput_samples_per_s=samples_per_s, step_time_s=step_s,
                     wait_s=s.wait_s, comm_exposed_s=s.comm_exposed_s, peak_GiB=peak / GIB,
                     peak_role=role, fits=peak / GIB <= budget_GiB, cost=cost,
                     workers_used=used, idle=idle,
                     devices=(sc.workers if prediction.hardware is None
                              else prediction.hardware.devices))


def straggler_variants(label: str, strategy: str, options: dict[str, Any],
                       scenario: Scenario) -> list[tuple[str, Prediction, str, Any]]:
    """(label, prediction, idle hardware, backup step or None) of the straggler-aware
    variants of one weighed candidate: DDP and FSDP (full shard) without the k slowest
    workers, sync-PS with b backup workers (perfmodel/stragglers.py)."""
    ks = exclusions(scenario)
    out = []
    if strategy in ("ddp", "fsdp") and not options:
        for k in ks:
            kept = fastest(scenario, scenario.workers - k)
            out.append((f"{label} without {k} slowest", predict(strategy, kept),
                        f"{k} of {scenario.workers} devices idle", None))
    if strategy == "sync-ps" and not options:
        for b in ks:
            kept = fastest(scenario, scenario.workers - b)
            p = predict(strategy, kept)
            step = backup_step(scenario, b, p.summary.step_time_s.mean)
            out.append((f"{label} {b} backup", p,
                        f"{b} of {scenario.workers} workers' gradients dropped each step",
                        (step.step_time_s, step.throughput_samples_per_s, step.used_workers)))
    return out


def recommend(scenario: Scenario, *, memory_budget_GiB: float | None = None,
              target_accuracy: float | None = None, optimizer: str | None = None,
              lr: float | None = None) -> Recommendation:
    """Rank every candidate strategy on `scenario` by time to the target accuracy, or by
    throughput where no accuracy model applies to the workload."""
    budget = scenario.cluster.device.memory_GiB if memory_budget_GiB is None \
        else float(memory_budget_GiB)
    if not budget > 0:
        raise PerfmodelError(f"the memory budget must be positive, got {budget} GiB")
    model = accuracy_model_for(scenario.workload)
    if model is None and (optimizer, lr, target_accuracy) != (None, None, None):
        raise PerfmodelError("--optimizer, --lr and --target-accuracy choose a fitted "
                             f"accuracy model's setting, and {no_model_line(scenario.workload)}")
    target = (model.target_accuracy if target_accuracy is None else target_accuracy) \
        if model is not None else None
    acc = {"target_accuracy": target_accuracy, "optimizer": optimizer, "lr": lr,
           "model": model}
    candidates = []
    for label, strategy, options in weighed(scenario):
        candidates.append(evaluate(label, predict(strategy, scenario, **options), budget,
                                   **acc))
        candidates += [evaluate(v_label, p, budget, idle=idle, backup=backup, **acc)
                       for v_label, p, idle, backup in straggler_variants(label, strategy,
                                                                            options, scenario)]
    by_time = model is not None
    fitting = sorted((c for c in candidates if c.fits),
                     key=(lambda c: c.time_to_target_s) if by_time
                     else (lambda c: -c.throughput_samples_per_s))
    rest = sorted((c for c in candidates if not c.fits), key=lambda c: c.peak_GiB)
    tied = ties(fitting, by_time)
    choice = min(tied, key=candidates.index) if tied else None
    ranked = tuple(fitting + rest)
    return Recommendation(scenario=scenario, memory_budget_GiB=budget, target_accuracy=target,
                          ranked=ranked, choice=choice,
                          ranked_by="time to target" if by_time else "throughput",
                          accuracy_model=None if model is None else str(model.path),
                          reasons=tuple(explain(scenario, budget, ranked, choice, by_time)))


def ties(fitting: list[Candidate], by_time: bool) -> list[Candidate]:
    """The candidates the model cannot tell from the best: within TIE_FRACTION of it, or (by
    time) whose seed-spread range overlaps the best's."""
    if by_time:
        reachable = [c for c in fitting if math.isfinite(c.time_to_target_s)]
        if not reachable:
            return []
        best = reachable[0]
        return [c for c in reachable
                if c.time_to_target_s <= best.time_to_target_s * (1 + TIE_FRACTION)
                or c.time_range_s[0] <= best.time_range_s[1]]
    if not fitting:
        return []
    top = fitting[0].throughput_samples_per_s
    return [c for c in fitting if c.throughput_samples_per_s * (1 + TIE_FRACTION) >= top]


# ---------------------------------------------------------------- the explanation


def explain(scenario: Scenario, budget_GiB: float, ranked: tuple[Candidate, ...],
            choice: Candidate | None, by_time: bool = True) -> list[str]:
    """A few lines, with the numbers, saying why `choice` beats the others."""
    by = {c.label: c for c in ranked}
    ddp = by["ddp"]
    if choice is None:
        least = min(ranked, key=lambda c: c.peak_GiB)
        what = "fits in" if not by_time else "both fits in"
        tail = "" if not by_time else " and reaches the target"
        return [f"Nothing {what} {budget_GiB:g} GiB per device{tail}; "
                f"the smallest footprint is {least.label} at {least.peak_GiB:.1f} GiB "
                "(more workers, a smaller batch or a larger device would help)."]
    usable = [c for c in ranked if c.fits and (not by_time or math.isfinite(c.time_to_target_s))]
    lines = [_head(choice, usable, by_time)]
    best = usable[0]
    if best.label != choice.label:
        gap = (1 - best.time_to_target_s / choice.time_to_target_s if by_time
               else best.throughput_samples_per_s / choice.throughput_samples_per_s - 1)
        what = "sooner" if by_time else "more throughput"
        lines.append(f"{best.label} is predicted {100 * gap:.0f} % {what}, within what the "
                     f"model does not resolve ({100 * TIE_FRACTION:.0f} % on a "
                     f"{_source(scenario)} profile" + (", or overlapping seed-spread ranges"
                                                       if by_time else "")
                     + f"): a tie, and {choice.label} is the simpler strategy.")
    if not ddp.fits:
        fsdp = choice if choice.strategy == "fsdp" else min(
            (c for c in ranked if c.strategy == "fsdp" and c.fits),
            key=lambda c: -c.throughput_samples_per_s, default=None)
        lines.append(f"Memory binds: DDP needs {ddp.peak_GiB:.1f} GiB per device, over the "
                     f"{budget_GiB:g} GiB budget"
                     + (f"; {fsdp.label} shards the model state down to {fsdp.peak_GiB:.1f} "
                        f"GiB ({ddp.peak_GiB / fsdp.peak_GiB:.1f}x less) at "
                        f"{_ms(fsdp.comm_exposed_s)} of exposed communication per step."
                        if fsdp else "; no FSDP variant fits either."))
    lines += _straggler_lines(scenario, ranked, choice, by_time)
    diverging = [c for c in ranked if c.cost.divergence_risk == "unstable"]
    if diverging:
        c = diverging[0]
        lines.append(f"{', '.join(d.label for d in diverging)}: unstable with {c.cost.setting} "
                     f"at mean staleness {c.cost.mean_staleness:.1f} (instability "
                     f"{c.cost.instability:.2f} >= {c.cost.divergence_threshold:.2f}): "
                     "training oscillates or diverges.")
    if choice.devices > scenario.workers:
        lines.append(f"Hardware: {choice.label} needs {choice.devices - scenario.workers} "
                     f"server device(s) on their own node(s) beside the {scenario.workers} "
                     f"workers: {choice.throughput_samples_per_s / choice.devices:,.0f} "
                     "samples/s per device.")
    cost = choice.cost
    if isinstance(cost, StalenessRisk):
        lines.append(cost.note + ".")
    else:
        lines.append(f"accuracy model: {cost.workload} on {cost.data_set}; {cost.caveat}.")
    return lines


def _head(choice: Candidate, usable: list[Candidate], by_time: bool) -> str:
    other = next((c for c in usable if c.strategy != choice.strategy), None)
    if not by_time:
        head = (f"{choice.label}: {choice.throughput_samples_per_s:,.0f} samples/s "
                "(ranked by throughput: no accuracy model applies)")
        if other is not None:
            head += (f", {choice.throughput_samples_per_s / other.throughput_samples_per_s:.2f}"
                     f"x {other.label}")
        return head + (f"; {choice.idle}." if choice.idle else ".")
    lo, hi = choice.time_range_s
    head = (f"{choice.label}: {_pct(choice.cost.target_accuracy)} accuracy in "
            f"{_dur(choice.time_to_target_s)} ({_dur(lo)} - {_dur(hi)} over seeds)")
    if other is None:
        head += "; no other strategy both fits and gets there"
    elif other.time_to_target_s >= choice.time_to_target_s:
        head += (f", {other.time_to_target_s / choice.time_to_target_s:.2f}x sooner than "
                 f"{other.label} ({_dur(other.time_to_target_s)})")
    return head + (f"; {choice.idle}." if choice.idle else ".")


def _straggler_lines(scenario: Scenario, ranked: tuple[Candidate, ...], choice: Candidate,
                     by_time: bool) -> list[str]:
    """Why the choice, where stragglers hold the synchronous step or where they do not."""
    key = (lambda c: c.time_to_target_s) if by_time else (lambda c: -c.throughput_samples_per_s)
    ddp = next(c for c in ranked if c.label == "ddp")
    plain_sync = [c for c in ranked if is_synchronous(c.strategy) and c.fits and not c.idle]
    sync = (choice if choice in plain_sync else ddp if ddp.fits
            else min(plain_sync, key=key, default=ddp))
    aware = min((c for c in ranked if c.idle and c.fits), key=key, default=None)
    best_async = min((c for c in ranked if not is_synchronous(c.strategy) and c.fits),
                     key=key, default=None)
    slowest = float(scenario.speeds.min())
    if slowest >= 1:
        if best_async is None:
            return []
        return [f"Homogeneous workers: {sync.label} waits only {_ms(sync.wait_s)} per "
                "step for the others and every update is fresh; the best PS mode, "
                f"{best_async.label}, moves {best_async.throughput_samples_per_s:,.0f} "
                f"samples/s against {sync.throughput_samples_per_s:,.0f} through the "
                "server's link" + (" and pays for staleness on top." if by_time else ".")]
    lines = [f"Stragglers (slowest worker at speed {slowest:g}) hold every synchronous step "
             f"over all {scenario.workers}: {sync.label} waits {_ms(sync.wait_s)} of its "
             f"{_ms(sync.step_time_s)} step ({sync.throughput_samples_per_s:,.0f} samples/s)"
             + (f"; {aware.label} runs {aware.throughput_samples_per_s:,.0f} samples/s with "
                f"{aware.idle}" if aware else "")
             + (f"; {best_async.label} keeps {best_async.throughput_samples_per_s:,.0f} "
                f"samples/s, staleness {best_async.cost.mean_staleness:.1f}"
                if best_async else "") + "."]
    if best_async is not None and by_time:
        lines.append(_staleness_line(best_async, aware if aware and key(aware) < key(sync)
                                     else sync))
    return lines


def _staleness_line(stale: Candidate, sync: Candidate) -> str:
    c = stale.cost
    verdict = ("pays off" if stale.time_to_target_s < sync.time_to_target_s
               else "does not pay off")
    body = (f"it is unstable (instability {c.instability:.2f})" if c.divergence_risk == "unstable"
            else f"each update is worth {c.worth:.2f} of a synchronous one (penalty "
                 f"{c.penalty_points:.1f} points after {c.updates} updates, divergence risk "
                 f"{c.divergence_risk})")
    return (f"Staleness: {stale.label} runs at mean staleness {c.mean_staleness:.1f}; {body}: "
            f"{_dur(stale.time_to_target_s)} against {_dur(sync.time_to_target_s)}, so it "
            f"{verdict}.")


def _source(scenario: Scenario) -> str:
    return "spec-derived" if scenario.cluster.provenance.source == "spec" else "measured"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _dur(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds:,.2f} s" if seconds < 600 else f"{seconds / 60:,.1f} min"
