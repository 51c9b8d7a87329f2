"""Which strategy: DDP, FSDP or a parameter server, ranked by predicted time to accuracy.

Every candidate (DDP; FSDP full-shard and grad-op; sync-, async- and ssp-PS, async with the
staleness-aware rate or delay compensation) is simulated on the same scenario (perfmodel
predict). A candidate is excluded when any of its devices (PS: workers and server) needs more
than the memory budget. The rest are ranked by time to the target accuracy: the synchronous
learning curve's updates to the target, divided by what a stale update is worth and by the
updates per second (perfmodel/accuracy/cost.py). Synchronous strategies pay no staleness but
wait for the slowest worker every step; asynchronous PS keeps stragglers from holding the
others, and pays in staleness, divergence risk and the server's link. Times within
TIE_FRACTION of the fastest are a tie, won by the simpler strategy (weighed()' order).

The decision framework this turns into numbers (DESIGN.md): DDP for homogeneous
gang-scheduled clusters, FSDP when memory binds, PS under heterogeneity. The accuracy part is
fitted on mlp/digits (perfmodel/accuracy/model.py) and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfmodel import strategies as strategy_records
from perfmodel.accuracy.cost import StalenessCost, staleness_cost
from perfmodel.accuracy.model import AccuracyModel, load_accuracy_model
from perfmodel.errors import PerfmodelError
from perfmodel.predict import Prediction, predict
from perfmodel.sim import psnet
from perfmodel.sim.scenario import Scenario

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
    cost: StalenessCost
    devices: int                    # devices occupied, PS servers on their own included

    @property
    def time_to_target_s(self) -> float:
        t = self.cost.time_to_target_s
        return math.inf if t is None else t

    def to_json(self) -> dict[str, Any]:
        t = self.time_to_target_s
        return {"label": self.label, "strategy": self.strategy, "options": self.options,
                "throughput_samples_per_s": self.throughput_samples_per_s,
                "step_time_s": self.step_time_s, "wait_s": self.wait_s,
                "comm_exposed_s": self.comm_exposed_s, "peak_GiB": self.peak_GiB,
                "peak_role": self.peak_role, "fits": self.fits, "devices": self.devices,
                "time_to_target_s": t if math.isfinite(t) else "inf",
                "accuracy": self.cost.to_json()}


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    scenario: Scenario
    memory_budget_GiB: float
    target_accuracy: float
    ranked: tuple[Candidate, ...]       # fitting ones by time to target, then the rest
    choice: Candidate | None
    reasons: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        sc = self.scenario
        return {"cluster": sc.cluster.name, "cluster_source": sc.cluster.provenance.source,
                "workload": sc.workload.name, "workers": sc.workers,
                "batch_size": sc.batch_size, "speeds": list(sc.speeds),
                "memory_budget_GiB": self.memory_budget_GiB,
                "target_accuracy": self.target_accuracy,
                "choice": None if self.choice is None else self.choice.label,
                "reasons": list(self.reasons),
                "candidates": [c.to_json() for c in self.ranked]}


def evaluate(label: str, prediction: Prediction, budget_GiB: float, *,
             target_accuracy: float | None, optimizer: str | None, lr: float | None,
             model: AccuracyModel) -> Candidate:
    """One strategy's numbers: throughput, memory against the budget, time to accuracy."""
    s, options = prediction.summary, prediction.options
    role, peak = max(((r, m.peak_bytes) for r, m in prediction.memory.items()),
                     key=lambda rm: rm[1])
    mitigation = ("staleness-aware" if options.get("staleness_aware_lr") else
                  "dc" if options.get("delay_compensation") else "none")
    cost = staleness_cost(s.staleness_values, mitigation=mitigation,
                          target_accuracy=target_accuracy, optimizer=optimizer, lr=lr,
                          samples_per_s=s.throughput_samples_per_s,
                          batch_size=prediction.scenario.batch_size, model=model)
    return Candidate(label=label, strategy=prediction.strategy, options=dict(options),
                     throughput_samples_per_s=s.throughput_samples_per_s,
                     step_time_s=s.step_time_s.mean, wait_s=s.wait_s,
                     comm_exposed_s=s.comm_exposed_s, peak_GiB=peak / GIB, peak_role=role,
                     fits=peak / GIB <= budget_GiB, cost=cost,
                     devices=(prediction.scenario.workers if prediction.hardware is None
                              else prediction.hardware.devices))


def recommend(scenario: Scenario, *, memory_budget_GiB: float | None = None,
              target_accuracy: float | None = None, optimizer: str | None = None,
              lr: float | None = None) -> Recommendation:
    """Rank every candidate strategy on `scenario` by time to the target accuracy."""
    budget = scenario.cluster.device.memory_GiB if memory_budget_GiB is None \
        else float(memory_budget_GiB)
    if not budget > 0:
        raise PerfmodelError(f"the memory budget must be positive, got {budget} GiB")
    model = load_accuracy_model()
    target = model.target_accuracy if target_accuracy is None else target_accuracy
    candidates = [evaluate(label, predict(strategy, scenario, **options), budget,
                           target_accuracy=target, optimizer=optimizer, lr=lr, model=model)
                  for label, strategy, options in weighed(scenario)]
    fitting = sorted((c for c in candidates if c.fits), key=lambda c: c.time_to_target_s)
    rest = sorted((c for c in candidates if not c.fits), key=lambda c: c.peak_GiB)
    reachable = [c for c in fitting if math.isfinite(c.time_to_target_s)]
    choice = None
    if reachable:
        tied = [c for c in reachable
                if c.time_to_target_s <= reachable[0].time_to_target_s * (1 + TIE_FRACTION)]
        choice = min(tied, key=candidates.index)
    ranked = tuple(fitting + rest)
    return Recommendation(scenario=scenario, memory_budget_GiB=budget, target_accuracy=target,
                          ranked=ranked, choice=choice,
                          reasons=tuple(explain(scenario, budget, ranked, choice)))


# ---------------------------------------------------------------- the explanation


def explain(scenario: Scenario, budget_GiB: float, ranked: tuple[Candidate, ...],
            choice: Candidate | None) -> list[str]:
    """A few lines, with the numbers, saying why `choice` beats the others."""
    by = {c.label: c for c in ranked}
    ddp = by["ddp"]
    if choice is None:
        least = min(ranked, key=lambda c: c.peak_GiB)
        return [f"Nothing both fits in {budget_GiB:g} GiB per device and reaches the target; "
                f"the smallest footprint is {least.label} at {least.peak_GiB:.1f} GiB "
                "(more workers, a smaller batch or a larger device would help)."]
    usable = [c for c in ranked if c.fits and math.isfinite(c.time_to_target_s)]
    fastest = usable[0]
    other = next((c for c in usable if c.strategy != choice.strategy), None)
    head = (f"{choice.label}: {_pct(choice.cost.target_accuracy)} accuracy in "
            f"{_dur(choice.time_to_target_s)}")
    if other is None:
        head += "; no other strategy both fits and gets there."
    elif other.time_to_target_s >= choice.time_to_target_s:
        head += (f", {other.time_to_target_s / choice.time_to_target_s:.2f}x sooner than "
                 f"{other.label} ({_dur(other.time_to_target_s)}).")
    else:
        head += "."
    lines = [head]
    if fastest.strategy != choice.strategy:
        gain = 1 - fastest.time_to_target_s / choice.time_to_target_s
        lines.append(f"{fastest.label} is predicted {100 * gain:.0f} % sooner, within the "
                     f"{100 * TIE_FRACTION:.0f} % the model does not resolve on a "
                     f"{_source(scenario)} profile: a tie, and {choice.label} is the simpler "
                     "strategy.")
    if not ddp.fits:
        fsdp = choice if choice.strategy == "fsdp" else min(
            (c for c in ranked if c.strategy == "fsdp" and c.fits),
            key=lambda c: c.time_to_target_s, default=None)
        lines.append(f"Memory binds: DDP needs {ddp.peak_GiB:.1f} GiB per device, over the "
                     f"{budget_GiB:g} GiB budget"
                     + (f"; {fsdp.label} shards the model state down to {fsdp.peak_GiB:.1f} "
                        f"GiB ({ddp.peak_GiB / fsdp.peak_GiB:.1f}x less) at "
                        f"{_ms(fsdp.comm_exposed_s)} of exposed communication per step."
                        if fsdp else "; no FSDP variant fits either."))
    sync = choice if is_synchronous(choice.strategy) else min(
        (c for c in ranked if is_synchronous(c.strategy) and c.fits),
        key=lambda c: c.time_to_target_s, default=ddp)
    stale = [c for c in ranked if not is_synchronous(c.strategy) and c.fits]
    best_async = min(stale, key=lambda c: c.time_to_target_s, default=None)
    slowest = float(scenario.speeds.min())
    if slowest < 1 and best_async is not None:
        lines.append(f"Stragglers (slowest worker at speed {slowest:g}) hold every synchronous "
                     f"step: {sync.label} waits {_ms(sync.wait_s)} of its "
                     f"{_ms(sync.step_time_s)} step ({sync.throughput_samples_per_s:,.0f} "
                     f"samples/s); {best_async.label} keeps "
                     f"{best_async.throughput_samples_per_s:,.0f} samples/s.")
        lines.append(_staleness_line(best_async, sync))
    elif best_async is not None:
        lines.append(f"Homogeneous workers: {sync.label} waits only {_ms(sync.wait_s)} per "
                     "step for the others and every update is fresh; the best PS mode, "
                     f"{best_async.label}, moves {best_async.throughput_samples_per_s:,.0f} "
                     f"samples/s against {sync.throughput_samples_per_s:,.0f} through one "
                     "server link and pays for staleness on top.")
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
    lines.append(f"accuracy model: {cost.workload} on {cost.data_set} (times count the updates "
                 f"it needs: compare them, they are not {scenario.workload.name}'s training "
                 f"time); {cost.caveat}.")
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
