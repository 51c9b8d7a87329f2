"""A real FSDP2 run: `fully_shard` on each unit of the workload, then on the root.

The device mesh is `init_device_mesh("cpu" | "cuda", (world,))`. Variant (option
fsdp.variant): "full-shard" reshards each unit after forward (reshard_after_forward=True: it
is all-gathered again for backward, ZeRO-3); "grad-op" keeps it unsharded until backward
(False: no backward all-gather, ZeRO-2-like). Every rank builds the same initial weights
(seeded), so the shards start as one model's pieces.

comm_wait_s, the communication the training loop waited for: FSDP2 lets a caller replace its
all-gather and reduce-scatter (`FSDPModule.set_custom_all_gather/_reduce_scatter`); each unit
gets the stock collectives wrapped with a timer. On CPU (gloo) FSDP2 issues both
synchronously, so the time inside the call is time the loop stood still. On CUDA the timer
records CUDA events on FSDP's communication streams: that is the collectives' duration,
an upper bound on the wait, since FSDP overlaps them with compute. compute_s = wall_s −
comm_wait_s. On CUDA with a bf16-mixed workload, parameters are gathered in bf16 and
gradients reduced in fp32 (`MixedPrecisionPolicy`); on CPU everything runs in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)

from measure.context import RunContext
from measure.settings import parse_settings
from measure.timing import DeviceClock, param_checksum
from measure.training import build_model, data_parallel_training, loop_summary, make_optimizer
from perfmodel.errors import PerfmodelError

VARIANTS = {"full-shard": True, "grad-op": False}      # -> reshard_after_forward


class CommTimer:
    """Adds up this step's time spent in FSDP's collectives."""

    def __init__(self, clock: DeviceClock):
        self.clock = clock
        self.intervals: list[tuple[Any, Any]] = []

    def timed(self, collective, *args: Any, **kwargs: Any):
        start = self.clock.mark()
        work = collective(*args, **kwargs)
        if work is not None and not self.clock.cuda:
            work.wait()                 # CPU: finish it here so the time is counted here
            work = None
        self.intervals.append((start, self.clock.mark()))
        return work

    def start_step(self) -> None:
        self.intervals.clear()

    def comm_wait_s(self, step_start: Any, backward_end: Any) -> float:
        return sum(self.clock.seconds(a, b) for a, b in self.intervals)


class TimedAllGather(DefaultAllGather):
    def __init__(self, timer: CommTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return self.timer.timed(super().__call__, output_tensor, input_tensor, group,
                                async_op=async_op)


class TimedReduceScatter(DefaultReduceScatter):
    def __init__(self, timer: CommTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return self.timer.timed(super().__call__, output_tensor, input_tensor, group, op,
                                async_op=async_op)


def shard(model: torch.nn.Sequential, device: str, world: int, reshard: bool,
          mixed_bf16: bool) -> list[Any]:
    """fully_shard each unit, then the root; return the units that hold parameters."""
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard}
    if mixed_bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    units = []
    for unit in model.children():
        if any(True for _ in unit.parameters()):
            units.append(fully_shard(unit, **kwargs))
    fully_shard(model, **kwargs)
    return units


def run(ctx: RunContext) -> None:
    settings = parse_settings(ctx.config, ctx.world_size)
    spec = settings.spec
    variant = settings.options.get("variant", "full-shard")
    if variant not in VARIANTS:
        raise PerfmodelError(f"fsdp variant '{variant}' is not one of {', '.join(VARIANTS)}")
    model = build_model(spec, settings.seed, ctx.device)
    mixed_bf16 = ctx.device.startswith("cuda") and spec.precision == "bf16-mixed"
    units = shard(model, ctx.device, ctx.world_size, VARIANTS[variant], mixed_bf16)
    timer = CommTimer(DeviceClock(ctx.device))
    for unit in [*units, model]:        # a no-op on a root that holds no parameters
        unit.set_custom_all_gather(TimedAllGather(timer))
        unit.set_custom_reduce_scatter(TimedReduceScatter(timer))
    optimizer = make_optimizer(spec, model.parameters())

    result = data_parallel_training(ctx, settings, model, optimizer, timer)
    ctx.recorder.write("memory", **result.memory)

    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    checksum, digest = param_checksum(list(full.values()))
    ctx.recorder.write(
        "summary", **loop_summary(settings, result), param_checksum=checksum,
        param_hash=digest, reshard_after_forward=int(VARIANTS[variant]),
        sharded_units=len(units))
    if settings.options.get("save_params") and ctx.rank == 0:
        torch.save({k: v.detach().cpu() for k, v in full.items()}, ctx.run_dir / "params.pt")
    dist.barrier()
