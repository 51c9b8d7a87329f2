"""`perfmodel predict`: one configuration, as a table for people or JSON for scripts."""

from __future__ import annotations

import json

import click

from perfmodel import strategies as strategy_records
from perfmodel.commands.options import (
    StrategyName,
    build_scenario,
    elastic_options,
    oom_message,
    pop_elastic_options,
    pop_strategy_options,
    scenario_options,
    strategy_options,
)
from perfmodel.errors import PerfmodelError
from perfmodel.predict import Prediction, predict

GIB = 2**30


@click.command("predict")
@click.option("--strategy", required=True, type=StrategyName(),
              help="Distributed training strategy.")
@click.option("--workers", required=True, type=int,
              help="Number of training workers (GPUs; PS servers come on top).")
@scenario_options
@strategy_options
@elastic_options
@click.option("--allow-oom", is_flag=True,
              help="Report a configuration that does not fit in device memory instead of "
                   "refusing it.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output, byte-identical for the same inputs and --seed.")
@click.option("--timings", is_flag=True,
              help="Add the simulation's host wall time and event rate to --json (they differ "
                   "from run to run).")
def command(strategy, workers, allow_oom, as_json, timings, **kwargs):
    """Predict throughput, step time, memory and staleness of one configuration.

    The numbers come from a SimPy discrete-event simulation of every worker's compute and
    every transfer on the cluster's links, using the cluster profile's parameters
    (spec-derived or calibrated; the output says which).

    \b
    Examples:
      perfmodel predict --strategy async-ps --workers 16
      perfmodel predict --strategy ddp --workers 64 --cluster a10g --workload bert-large
      perfmodel predict --strategy fsdp --workers 8 --workload gpt2-xl --variant grad-op
      perfmodel predict --strategy fsdp --workers 8 --workload gpt2-xl \\
          --activation-checkpointing full --precision bf16-mixed
      perfmodel predict --strategy ddp --workers 8 --workload gpt2-xl --precision bf16 \\
          --grad-compression bf16
      perfmodel predict --strategy sync-ps --workers 8 --stragglers 1 --straggler-speed 0.25
      perfmodel predict --strategy ddp --workers 512 --json
      perfmodel predict --strategy ddp --workers 64 --failure-rate-per-hour 0.01 --run-hours 72
      perfmodel predict --strategy async-ps --workers 16 --events fail:3@120,join:3@300
    """
    if workers < 1:
        raise PerfmodelError(f"--workers must be at least 1, got {workers}")
    options = pop_strategy_options(kwargs)
    elastic = pop_elastic_options(kwargs, workers, strategy)
    scenario = build_scenario(workers=workers, **kwargs)
    p = predict(strategy, scenario, **options)
    if not allow_oom:
        for role, m in p.memory.items():
            if m.oom:
                raise PerfmodelError(oom_message(role, m, scenario, strategy))
    elasticity = None
    if elastic is not None:
        from perfmodel.goodput import predict_elasticity

        elasticity = predict_elasticity(p, elastic)
    accuracy = None
    if strategy_records.get(strategy).is_ps:    # staleness's accuracy cost (perfmodel/accuracy/)
        from perfmodel.accuracy.cost import for_prediction, render_lines

        accuracy = for_prediction(p)
    if as_json:
        out = p.to_json(host_timings=timings)
        if accuracy is not None:
            out["accuracy"] = accuracy.to_json()
        if elasticity is not None:
            out["elasticity"] = elasticity.to_json()
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(render(p))
        if accuracy is not None:
            click.echo("\n".join(render_lines(accuracy)))
        if elasticity is not None:
            from perfmodel.goodput import render_elasticity

            click.echo(render_elasticity(elasticity))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def interval_line(p: Prediction) -> str:
    if p.interval is None:
        return f"  interval         none: {p.interval_source}"
    iv = p.interval
    return (f"  {iv.coverage:.0%} interval     {_ms(iv.low_s)} - {_ms(iv.high_s)} for the mean "
            f"step (calibration residuals and run-to-run spread; --json says more)")


def render(p: Prediction) -> str:
    s, sc = p.summary, p.scenario
    prov = sc.cluster.provenance
    source = ("spec-derived, not calibrated" if prov.source == "spec"
              else f"measured {prov.date} on {prov.host}")
    lines = [
        f"{p.strategy} on {sc.cluster.name} ({source}): {sc.workload.name}, "
        f"{sc.workers} workers x batch {sc.batch_size}",
        f"  throughput       {s.throughput_samples_per_s:,.1f} samples/s  "
        f"({p.speedup:.2f}x one worker)",
        f"  step time        mean {_ms(s.step_time_s.mean)}   p50 {_ms(s.step_time_s.p50)}"
        f"   p95 {_ms(s.step_time_s.p95)}",
        interval_line(p),
        f"  per step         compute {_ms(s.compute_s)} | exposed comm "
        f"{_ms(s.comm_exposed_s)} | waiting {_ms(s.wait_s)}",
    ]
    for role, m in p.memory.items():
        flag = "  OUT OF MEMORY" if m.oom else ""
        lines.append(
            f"  memory/{role:<8} {m.peak_bytes / GIB:,.2f} of {m.capacity_bytes / GIB:,.0f} GiB"
            f"{flag}: params {m.params_bytes / GIB:.2f}, grads {m.grads_bytes / GIB:.2f}, "
            f"optimizer {m.optimizer_bytes / GIB:.2f}, activations "
            f"{m.activations_bytes / GIB:.2f}, buffers {m.comm_buffers_bytes / GIB:.2f}, "
            f"weight cache {m.cast_cache_bytes / GIB:.2f}, transient "
            f"{m.transient_bytes / GIB:.2f}, framework {m.framework_bytes / GIB:.2f} "
            f"(peak at the {m.phase})")
    if p.hardware is not None:
        hw = p.hardware
        lines.append(f"  hardware         {hw.worker_devices} worker + {hw.server_devices} server "
                     f"devices on {hw.nodes} nodes ({len(hw.shard_params)} {hw.placement} "
                     f"server(s)): {p.throughput_per_device:,.1f} samples/s per device")
    if s.staleness.max > 0:
        per = s.staleness_per_worker
        shown = ", ".join(f"{v:.1f}" for v in per[:8]) + (", ..." if len(per) > 8 else "")
        lines.append(f"  staleness        mean {s.staleness.mean:.2f}  p50 {s.staleness.p50:.0f}"
                     f"  p95 {s.staleness.p95:.0f}  max {s.staleness.max:.0f}  "
                     f"(per worker: {shown})")
    else:
        lines.append("  staleness        0 (synchronous)")
    lines.append(f"  simulated        {sc.steps} steps/worker, {p.result.events:,} events in "
                 f"{p.wall_s:.2f} s")
    return "\n".join(lines)
