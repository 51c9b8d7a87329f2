"""Click options shared by `predict`, `sweep` and `recommend`, and turning them into a Scenario."""

from __future__ import annotations

import math
from typing import Any

import click

from perfmodel import budget
from perfmodel import strategies as strategy_records
from perfmodel.cluster import load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown
from perfmodel.sim.scenario import JITTER_KINDS, MAX_JITTER_CV, Scenario
from perfmodel.sim.scenario import parse_speeds as scenario_speeds
from perfmodel.workload import CHECKPOINTING, PRECISIONS, load_workload


class Finite(click.FloatRange):
    """A float in a range that is also a number: NaN and infinity are refused by name."""

    name = "number"

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if not math.isfinite(value):
            self.fail(f"{value} is not a finite number", param, ctx)
        return value


def scenario_options(f):
    """--cluster --workload --batch-size --steps --seed and the heterogeneity flags."""
    for opt in reversed([
        click.option("--cluster", default="a100", show_default=True,
                     help="Cluster profile name (see `perfmodel clusters`) or a profile "
                          ".toml path."),
        click.option("--workload", default="resnet50", show_default=True,
                     help="Workload name (see `perfmodel workloads`) or a workload .toml path."),
        click.option("--batch-size", type=click.IntRange(1), default=None,
                     help="Samples per worker per step [default: the workload's]."),
        click.option("--steps", type=click.IntRange(3, 100_000), default=20, show_default=True,
                     help="Steps (pushes, for PS) per worker to simulate; the first 2 are "
                          "warm-up."),
        click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
                     help="Seed of the random generator (jitter)."),
        click.option("--speed", default=None, metavar="S1,S2,...",
                     help="Relative speed of each worker (1 = nominal, 0.25 = four times "
                          "slower), one per worker."),
        click.option("--stragglers", type=click.IntRange(0), default=0,
                     help="Make this many workers stragglers (the last ones)."),
        click.option("--straggler-speed", type=Finite(0, 1, min_open=True),
                     default=0.5, show_default=True, help="Relative speed of a straggler."),
        click.option("--jitter", type=click.Choice(JITTER_KINDS), default="lognormal",
                     show_default=True,
                     help="Step-to-step compute variation: lognormal with the profile's CV, "
                          "exponential (CV 1) or none."),
        click.option("--jitter-cv", type=Finite(0, MAX_JITTER_CV), default=None,
                     help="Coefficient of variation of lognormal jitter [default: profile's]."),
        click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None,
                     help="fp32, tf32, bf16-mixed / fp16-mixed (torch.autocast with DDP and "
                          "PS, MixedPrecisionPolicy(bf16, fp32 reduce) with FSDP) or bf16 "
                          "(pure bf16: bf16 params and grads, fp32 master weights) "
                          "[default: the workload's]."),
        click.option("--activation-checkpointing", type=click.Choice(list(CHECKPOINTING)),
                     default="none", show_default=True,
                     help="full: every unit between the first and the last keeps only its "
                          "input and replays its forward in backward; selective: every other "
                          "one of them."),
        click.option("--max-events", type=Finite(1), default=budget.DEFAULT_MAX_EVENTS,
                     show_default=True,
                     help="Refuse a simulation estimated above this many events (a guard "
                          "against a typo taking the machine; perfmodel/budget.py)."),
    ]):
        f = opt(f)
    return f


def strategy_options(f):
    """Options of individual strategies; giving one to a strategy it does not fit is an error."""
    for opt in reversed([
        click.option("--bucket-cap-MiB", "bucket_cap_MiB", type=Finite(0, min_open=True),
                     default=None,
                     help="ddp: gradient bucket cap [25]."),
        click.option("--first-bucket-MiB", "first_bucket_MiB", type=Finite(0, min_open=True),
                     default=None,
                     help="ddp: first bucket size [1]."),
        click.option("--allreduce", type=click.Choice(["auto", "ring", "tree"]), default=None,
                     help="ddp: all-reduce algorithm; auto takes the faster per bucket, as "
                          "NCCL's tuner does [auto]."),
        click.option("--grad-compression", type=click.Choice(["none", "bf16"]), default=None,
                     help="ddp: bf16_compress_hook, all-reducing 2 bytes a gradient instead "
                          "of the reduce dtype's (4 under autocast) [none]."),
        click.option("--comm-hook", type=click.Choice(["none", "allreduce"]), default=None,
                     help="ddp: a Python comm hook that divides each bucket in a pass of its "
                          "own, like torch's allreduce_hook (perfmodel's own DDP runs register "
                          "one to time the buckets); none: the reducer divides while it copies "
                          "[none]."),
        click.option("--variant", type=click.Choice(["full-shard", "grad-op"]), default=None,
                     help="fsdp: full-shard (ZeRO-3) or grad-op (ZeRO-2-like) [full-shard]."),
        click.option("--prefetch", type=click.IntRange(0), default=None,
                     help="fsdp: units all-gathered ahead [1]."),
        click.option("--servers", type=click.IntRange(1), default=None,
                     help="*-ps: parameter servers the model is sharded over [1]."),
        click.option("--server-placement", type=click.Choice(["dedicated", "colocated"]),
                     default=None,
                     help="*-ps: servers on extra nodes with their own NICs (counted as "
                          "hardware), or on the workers' nodes sharing their NICs and memory "
                          "[the profile's: dedicated, colocated on one host]."),
        click.option("--staleness-bound", type=click.IntRange(0), default=None,
                     help="ssp-ps: how many clocks a worker may run ahead of the slowest [3]."),
        click.option("--staleness-aware-lr", is_flag=True, default=None,
                     help="async-ps: scale the learning rate by 1/staleness."),
        click.option("--delay-compensation", is_flag=True, default=None,
                     help="async-ps: DC-ASGD delay compensation on the server."),
    ]):
        f = opt(f)
    return f


def elastic_options(f):
    """Membership events or a failure rate, and what a change costs (perfmodel/goodput.py).
    None given: no elasticity work at all."""
    for opt in reversed([
        click.option("--events", default=None, metavar="KIND:WORKER@TIME,...|FILE.toml",
                     help="Membership events: fail, leave or join of worker i at a time in "
                          "s (or 5m, 2h), e.g. fail:3@120,join:3@300; or a TOML file of "
                          "[[events]] tables (kind, worker, time_s)."),
        click.option("--failure-rate-per-hour", type=Finite(0, min_open=True),
                     default=None, help="Poisson failures per worker per hour (sampled with "
                                        "--seed), instead of --events."),
        click.option("--replace-after-s", type=Finite(0), default=0.0,
                     show_default=True, help="With a failure rate: a failed worker's "
                                             "replacement joins this long after."),
        click.option("--run-hours", type=Finite(0, min_open=True), default=None,
                     help="Length of the run [24 with a failure rate, else twice the last "
                          "event and at least 1]."),
        click.option("--checkpoint-interval-s", type=Finite(0, min_open=True),
                     default=None, help="ddp, fsdp: training seconds between checkpoints "
                                        "[1800]."),
        click.option("--checkpoint-write-s", type=Finite(0), default=None,
                     help="ddp, fsdp: seconds one checkpoint blocks training [10]."),
        click.option("--detection-s", type=Finite(0), default=None,
                     help="Seconds until a failure is noticed [15]."),
        click.option("--restart-s", type=Finite(0), default=None,
                     help="ddp, fsdp: rendezvous, restart and reload after a change [60]."),
        click.option("--min-workers", type=click.IntRange(1), default=None,
                     help="ddp, fsdp: torchrun --nnodes MIN; fewer and the job waits [1]."),
        click.option("--sync-ps-on-departure", type=click.Choice(["drop", "wait"]),
                     default=None, help="sync-ps: drop a departed worker from the barrier "
                                        "(after detection) or wait for a joiner [drop]."),
    ]):
        f = opt(f)
    return f


ELASTIC_OPTION_NAMES = ("events", "failure_rate_per_hour", "replace_after_s", "run_hours",
                        "checkpoint_interval_s", "checkpoint_write_s", "detection_s",
                        "restart_s", "min_workers", "sync_ps_on_departure")


# Elasticity options that only one kind of scheduling has (strategies.Scheduling): a gang
# restart checkpoints, restarts and waits for MIN workers; only a synchronous PS has a barrier
# to drop a departed worker from. Given for another strategy, they would do nothing: an error.
ELASTIC_OPTION_SCHEDULING = {"checkpoint_interval_s": ("gang",), "checkpoint_write_s": ("gang",),
                             "restart_s": ("gang",), "min_workers": ("gang",),
                             "sync_ps_on_departure": ("sync",)}


def check_elastic_options_fit(given: dict[str, Any], strategy: str) -> None:
    """Refuse an elasticity option the strategy does not have (one line, naming both)."""
    record = strategy_records.get(strategy)
    for name, kinds in ELASTIC_OPTION_SCHEDULING.items():
        if given.get(name) is not None and record.scheduling not in kinds:
            fits = [r.name for r in strategy_records.REGISTRY.values() if r.scheduling in kinds]
            raise PerfmodelError(f"--{name.replace('_', '-')} does not apply to --strategy "
                                 f"{strategy}; it applies to {', '.join(fits)}")


def pop_elastic_options(kwargs: dict[str, Any], workers: int, strategy: str | None = None):
    """The elasticity config of the options given (None: none given), its size checked
    against --max-events for a pool of `workers`, each option checked to fit `strategy` (if
    given); seed and max_events stay in kwargs. Without elasticity options perfmodel.goodput
    (and sim/elastic.py) is never imported."""
    given = {k: kwargs.pop(k, None) for k in ELASTIC_OPTION_NAMES}
    if strategy is not None:
        check_elastic_options_fit(given, strategy)
    # --replace-after-s alone is no elasticity (elastic_config ignores it): nothing to build
    if all(v is None for k, v in given.items() if k != "replace_after_s"):
        return None
    from perfmodel.goodput import elastic_config

    config = elastic_config(**given, seed=kwargs.get("seed", 0))
    if config is not None:
        estimate = budget.elastic_events(
            run_s=config.run_s, checkpoint_interval_s=config.checkpoint_interval_s,
            membership_events=len(config.events),
            failure_rate_per_hour=config.failure_rate_per_hour, workers=workers)
        budget.check(estimate, kwargs.get("max_events", budget.DEFAULT_MAX_EVENTS),
                     f"the elasticity timeline ({config.run_s / 3600:,.4g} h)")
    return config


# The strategy options strategy_options() defines, in strategies.all_option_names()' order
# (tests/test_cli.py checks they agree): naming them here spares predict importing every
# strategy's simulator (DDP, FSDP and PS modules) just to learn their option names.
STRATEGY_OPTION_NAMES = ("bucket_cap_MiB", "first_bucket_MiB", "allreduce", "grad_compression",
                         "comm_hook", "variant",
                         "prefetch", "servers", "server_placement", "staleness_aware_lr",
                         "delay_compensation", "staleness_bound")


def pop_strategy_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The strategy options the user actually gave (None = not given)."""
    return {k: v for k in STRATEGY_OPTION_NAMES
            if (v := kwargs.pop(k, None)) is not None}


class StrategyName(click.ParamType):
    """A strategy name from perfmodel/strategies.py, checked when the command runs."""

    name = "strategy"

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(strategy_records.names()) + "]"

    def convert(self, value, param, ctx):
        if value not in strategy_records.REGISTRY:
            self.fail(f"'{value}' is not one of {', '.join(strategy_records.names())}",
                      param, ctx)
        return value


def parse_speeds(speed: str | None, stragglers: int, straggler_speed: float,
                 workers: int) -> tuple[float, ...]:
    if speed is not None and stragglers:
        raise PerfmodelError("give either --speed or --stragglers, not both")
    if speed is not None:
        return scenario_speeds(speed, workers)
    if stragglers > workers:
        raise PerfmodelError(f"--stragglers {stragglers} exceeds --workers {workers}")
    if not stragglers:
        return ()
    return (1.0,) * (workers - stragglers) + (straggler_speed,) * stragglers


def build_scenario(*, workers: int, cluster: str, workload: str, batch_size: int | None,
                   steps: int, seed: int, speed: str | None, stragglers: int,
                   straggler_speed: float, jitter: str, jitter_cv: float | None,
                   max_events: float = budget.DEFAULT_MAX_EVENTS, precision: str | None = None,
                   activation_checkpointing: str = "none") -> Scenario:
    if jitter_cv is not None and jitter != "lognormal":
        raise PerfmodelError("--jitter-cv applies to --jitter lognormal only")
    budget.check(budget.step_events(workers, steps), max_events,
                 f"{workers:,} workers x {steps} steps")
    w = load_workload(workload)
    if precision is not None:
        w = w.with_precision(precision)
    w = w.with_checkpointing(activation_checkpointing)
    return Scenario(
        cluster=load_cluster(cluster), workload=w, workers=workers,
        batch_size=w.batch_size if batch_size is None else batch_size,
        steps=steps, speed=parse_speeds(speed, stragglers, straggler_speed, workers),
        jitter=jitter, jitter_cv=jitter_cv, seed=seed)


def largest_fitting_batch(memory: MemoryBreakdown, batch_size: int) -> int:
    """Activations and the transient peaks grow linearly with the batch; nothing else does."""
    per_batch = memory.activations_bytes + memory.transient_bytes
    per_sample = per_batch / batch_size
    room = memory.capacity_bytes - (memory.peak_bytes - per_batch)
    if per_sample <= 0:
        return batch_size if room >= 0 else 0
    return max(0, math.floor(room / per_sample))


def _cuts(memory: MemoryBreakdown, scenario: Scenario, strategy: str) -> list[str]:
    """What to cut, the largest part first: batch, checkpointing, FSDP, precision."""
    gib, w = 2**30, scenario.workload
    batch_part = memory.activations_bytes + memory.transient_bytes
    state = memory.model_state_bytes + memory.comm_buffers_bytes + memory.cast_cache_bytes
    cuts = []
    fits = largest_fitting_batch(memory, scenario.batch_size)
    if batch_part > 0:
        cuts.append((batch_part, f"activations and the loss's gradients take "
                     f"{batch_part / gib:.1f} GiB: cut the batch (largest that fits: {fits})"
                     + ("" if w.activation_checkpointing == "full" else
                        " or pass --activation-checkpointing full")))
    advice = []
    if strategy != "fsdp":
        advice.append("shard it with --strategy fsdp")
    if w.precision_spec.autocast:
        advice.append("--precision bf16 (pure bf16: 2-byte params and grads)")
    cuts.append((state, f"params, grads, optimizer state and buffers take "
                 f"{state / gib:.1f} GiB" + (": " + " or ".join(advice) if advice else
                                              ": add workers or use a larger device")))
    return [text for _, text in sorted(cuts, key=lambda c: -c[0])]


def oom_message(role: str, memory: MemoryBreakdown, scenario: Scenario, strategy: str) -> str:
    gib = 2**30
    return (f"{strategy} {role} needs {memory.peak_bytes / gib:.1f} GiB per device at batch "
            f"{scenario.batch_size} ({scenario.workload.precision}, peak at the "
            f"{memory.phase}) but {scenario.cluster.name} has "
            f"{memory.capacity_bytes / gib:.1f} GiB the allocator can hand out; " + "; ".join(
                _cuts(memory, scenario, strategy)) + " (or pass --allow-oom)")
