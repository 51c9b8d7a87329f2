"""The model and optimizer of a training run, and the data-parallel step loop that DDP and
FSDP share.

The step loop (`data_parallel_training`) per step: wall_s = compute_s + comm_wait_s, where
comm_wait_s is the communication the training loop waited for, as the strategy's
`CommMeter` defines it (see measure/runs/ddp.py and fsdp.py).

The run's settings are measure/settings.py's, its data measure/data.py's, stragglers and
the device clock measure/timing.py's, timed-wait compute measure/timed_wait.py's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from measure import cpu_meter
from measure.context import RunContext
from measure.data import DataSource
from measure.memtrack import live_memory, measure_memory
from measure.models import ModelSpec
from measure.models import make_optimizer as make_workload_optimizer
from measure.settings import Settings
from measure.timing import DeviceClock, SlowUnits, Straggler, allreduce_max

MEMORY_STEPS = 2                    # extra steps measured under the memory tracker


def build_model(spec: ModelSpec, seed: int, device: str) -> torch.nn.Sequential:
    """The workload's model with initial weights that depend on `seed` only, on every rank.

    The models initialise from torch's global generator, so it is seeded right here.
    """
    torch.manual_seed(seed)
    return spec.build().to(device)


def make_optimizer(spec: ModelSpec, params, lr: float | None = None) -> torch.optim.Optimizer:
    """The workload's optimizer (measure/models.py), optionally at another learning rate."""
    if lr is not None:
        spec = dataclasses.replace(spec, learning_rate=float(lr))
    return make_workload_optimizer(spec, params)


class CommMeter(Protocol):
    """How a data-parallel strategy measures the communication its training loop waited for."""

    def start_step(self) -> None: ...

    def comm_wait_s(self, step_start: Any, backward_end: Any) -> float: ...


@dataclass(frozen=True, kw_only=True)
class LoopResult:
    elapsed_s: float                # slowest rank's time for the timed steps
    wall_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    comm_wait_s: tuple[float, ...]
    slept_s: tuple[float, ...]      # straggler sleep inside compute_s
    memory: dict[str, Any]          # the memory record's fields
    cpu: dict[str, float] = dataclasses.field(default_factory=dict)   # cpu_meter.usage


def data_parallel_training(ctx: RunContext, settings: Settings, model: torch.nn.Module,
                           optimizer: torch.optim.Optimizer, comm: CommMeter) -> LoopResult:
    """Warm-up steps, timed steps (one step record each), then memory steps under the tracker.

    Every rank trains on its own batches; rank r is worker r for the straggler speed.
    """
    spec = settings.spec
    data = DataSource(spec, settings.batch_size, settings.seed, ctx.rank, ctx.device)
    speed = settings.worker_speed(ctx.rank)
    straggler = Straggler(speed)
    # a CPU straggler sleeps inside its passes, as a slower device (measure/timing.py)
    slow = (SlowUnits(list(getattr(model, "module", model).children()), speed)
            if speed < 1.0 and not ctx.device.startswith("cuda") else None)
    clock = DeviceClock(ctx.device)
    walls, computes, comms, slept = [], [], [], []
    start = 0.0
    cpu_start = cpu_meter.mark()
    for step in range(settings.total_steps):
        if step == settings.warmup_steps:
            dist.barrier()
            start = time.perf_counter()
            cpu_start = cpu_meter.mark()
        x, y = data.next_batch()
        comm.start_step()
        if slow is not None:
            slow.start_step()
        t0 = clock.mark()
        optimizer.zero_grad(set_to_none=True)
        loss = spec.loss(model(x), y)
        loss.backward()
        t_backward = clock.mark()
        comm_s = comm.comm_wait_s(t0, t_backward)
        slept_s = (slow.slept_s if slow is not None
                   else straggler.delay(clock.seconds(t0, t_backward) - comm_s))
        if settings.compute_wait is not None:
            settings.compute_wait.sleeper.sleep(settings.compute_wait.optimizer_s)
        else:
            optimizer.step()
        wall_s = clock.seconds(t0, clock.mark())
        if step >= settings.warmup_steps:
            walls.append(wall_s)
            comms.append(comm_s)
            computes.append(wall_s - comm_s)
            ctx.recorder.write("step", step=step, wall_s=wall_s, compute_s=wall_s - comm_s,
                               comm_wait_s=comm_s, loss=float(loss), samples=len(y))
            slept.append(slept_s)
    cpu = cpu_meter.usage(cpu_start)
    elapsed_s = allreduce_max(time.perf_counter() - start, ctx.device)

    def memory_step() -> None:
        x, y = data.next_batch()
        optimizer.zero_grad(set_to_none=True)
        spec.loss(model(x), y).backward()
        optimizer.step()

    if settings.timed_wait:     # nothing computed: count what is held, skip the tracker
        memory = live_memory(model, optimizer)
        memory["method"] += " (timed-wait: no activations)"
    else:
        memory = measure_memory(model, optimizer, memory_step, device=ctx.device,
                                steps=MEMORY_STEPS)
    return LoopResult(elapsed_s=elapsed_s, wall_s=tuple(walls), compute_s=tuple(computes),
                      comm_wait_s=tuple(comms), slept_s=tuple(slept), memory=memory, cpu=cpu)


def loop_summary(settings: Settings, result: LoopResult) -> dict[str, float]:
    """The numbers every data-parallel summary carries."""
    samples = settings.workers * settings.batch_size * settings.steps
    return {
        "throughput_samples_per_s": samples / result.elapsed_s,
        "elapsed_s": result.elapsed_s,
        "steps": settings.steps,
        "warmup_steps": settings.warmup_steps,
        "optimizer_steps": settings.total_steps + MEMORY_STEPS,
        "batch_size": settings.batch_size,
        "mean_step_s": float(np.mean(result.wall_s)),
        "median_step_s": float(np.median(result.wall_s)),
        "mean_compute_s": float(np.mean(result.compute_s)),
        "mean_comm_wait_s": float(np.mean(result.comm_wait_s)),
        "mean_slept_s": float(np.mean(result.slept_s)),
        **result.cpu,
    }
