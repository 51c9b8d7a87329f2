"""`perfmodel recommend`: rank DDP, FSDP, the PS modes and the straggler-aware variants by
time to accuracy (or throughput where no accuracy model applies), and say why."""

from __future__ import annotations

import json
import math

import click

from perfmodel.accuracy.cost import StalenessRisk
from perfmodel.commands.options import Finite, build_scenario, scenario_options
from perfmodel.errors import PerfmodelError
from perfmodel.recommend import Recommendation, recommend


@click.command("recommend")
@click.option("--workers", required=True, type=int,
              help="Number of training workers (GPUs; PS servers come on top).")
@scenario_options
@click.option("--memory-budget-GiB", "memory_budget_GiB", type=Finite(0, min_open=True),
              default=None, help="Memory per device a strategy may use [default: the device's].")
@click.option("--target-accuracy", type=Finite(0, 1, min_open=True, max_open=True),
              default=None,
              help="Accuracy to reach [the accuracy model's: 0.95 for mlp]; needs one.")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum"]), default=None,
              help="Optimizer of the accuracy model's fitted setting [the workload's: momentum].")
@click.option("--lr", type=Finite(0, min_open=True), default=None,
              help="Learning rate of the accuracy model's fitted setting [0.05].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(workers, memory_budget_GiB, target_accuracy, optimizer, lr, as_json, **kwargs):
    """Recommend a strategy: DDP, FSDP or a parameter server, by time to accuracy.

    Simulates every strategy on the scenario (and, where workers differ in speed, DDP and
    FSDP without the slowest workers and sync-PS with backup workers that drop the slowest
    gradients each step), drops those that need more memory per device than the budget, and
    ranks the rest. Where the workload has a fitted accuracy model (shipped: mlp; yours: a
    file its workload TOML names with accuracy_model) by predicted time to the target
    accuracy: throughput times what a (possibly stale) update, or one batch of a large
    synchronous step, is worth, with a range from the seed spread. Where it has
    none, by throughput, with each candidate's staleness and risk flag, and says so.
    Candidates the model cannot tell apart tie; a tie goes to the simpler strategy.

    \b
    Examples:
      perfmodel recommend --cluster a100 --workload resnet50 --workers 16
      perfmodel recommend --cluster a100 --workload gpt2-xl --workers 8 --memory-budget-GiB 20
      perfmodel recommend --workers 4 --stragglers 1 --straggler-speed 0.1 --json
    """
    if workers < 1:
        raise PerfmodelError(f"--workers must be at least 1, got {workers}")
    scenario = build_scenario(workers=workers, **kwargs)
    rec = recommend(scenario, memory_budget_GiB=memory_budget_GiB,
                    target_accuracy=target_accuracy, optimizer=optimizer, lr=lr)
    click.echo(json.dumps(rec.to_json(), indent=2) if as_json else render(rec))


def render(rec: Recommendation) -> str:
    sc = rec.scenario
    source = ("spec-derived, not calibrated" if sc.cluster.provenance.source == "spec"
              else f"measured {sc.cluster.provenance.date}")
    slow = [s for s in sc.speeds if s < 1]
    hetero = f", {len(slow)} straggler(s) at speed {min(slow):g}" if slow else ""
    goal = (f"target {100 * rec.target_accuracy:.0f} % accuracy" if rec.accuracy_model
            else "ranked by throughput (no accuracy model)")
    last = ("penalty", "to target") if rec.accuracy_model else ("risk", "")
    lines = [f"recommend on {sc.cluster.name} ({source}): {sc.workload.name}, {sc.workers} "
             f"workers x batch {sc.batch_size}{hetero}; budget {rec.memory_budget_GiB:g} GiB "
             f"per device; {goal}",
             f"  {'':2}{'strategy':<38}{'samples/s':>12}{'peak GiB':>10}{'staleness':>10}"
             f"{last[0]:>9}{last[1]:>12}"]
    for c in rec.ranked:
        mark = ">>" if c is rec.choice else "  "
        lines.append(f"  {mark}{c.label:<38}{c.throughput_samples_per_s:>12,.0f}"
                     f"{c.peak_GiB:>10.1f}{c.cost.mean_staleness:>10.1f}{_verdict(c)}")
    lines.append("")
    lines += [f"  {line}" for line in rec.reasons]
    return "\n".join(lines)


def _verdict(c) -> str:
    """The last two columns: penalty and time to target, or the staleness risk flag."""
    if isinstance(c.cost, StalenessRisk):
        return f"{c.cost.divergence_risk:>9}{'' if c.fits else 'over budget':>12}"
    t = c.time_to_target_s
    when = ("unstable" if c.cost.divergence_risk == "unstable"
            else "never" if not math.isfinite(t) else _dur(t))
    if not c.fits:
        when = "over budget"
    penalty = ("–" if c.cost.divergence_risk == "unstable" else f"{c.cost.penalty_points:.1f}p")
    return f"{penalty:>9}{when:>12}"


def _dur(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds:,.2f} s" if seconds < 600 else f"{seconds / 60:,.1f} min"
