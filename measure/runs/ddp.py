"""A real DistributedDataParallel run (torch.nn.parallel.DistributedDataParallel, torch 2.13).

Gradient buckets (torch/nn/parallel/distributed.py, `_BucketCapacityConfig`): the cap is
`bucket_cap_mb` (default 25 MiB); torch makes the first bucket — the first one reduced, holding
the last layers' gradients — 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`) only while the cap is
left at its default, and as large as the cap otherwise. Options: ddp.bucket_cap_MiB sets the
cap; ddp.first_bucket_MiB sets the first bucket through torch 2.13's `bucket_cap_mb_list`
([first, cap]: the first bucket gets the first limit, every later one the last), which the
reducer also uses when it rebuilds the buckets in gradient-ready order after step one.

comm_wait_s, the communication the training loop waited for: a comm hook (the stock
`allreduce_hook`, wrapped) timestamps the moment each bucket becomes ready, i.e. when its
last gradient is computed. Once the last bucket is ready, every gradient exists and backward
has nothing left to compute, so comm_wait_s = (backward returns) − (last bucket ready): the
all-reduce time not hidden behind backward. compute_s = wall_s − comm_wait_s (forward,
backward, the straggler sleep, the optimizer step). On CUDA the timestamps are CUDA events on
the compute stream, so they mark when the GPU got there, not when the CPU queued the work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from measure.context import RunContext
from measure.settings import parse_settings
from measure.timing import DeviceClock, param_checksum
from measure.training import build_model, data_parallel_training, loop_summary, make_optimizer
from perfmodel.errors import PerfmodelError
from perfmodel.sim.ddp import HARNESS_COMM_HOOK

MiB = 1024 * 1024
TORCH_DEFAULT_CAP_MiB = 25.0        # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB


class BucketTimer:
    """Comm hook state: when each bucket of this step became ready, and its size."""

    def __init__(self, clock: DeviceClock):
        self.clock = clock
        self.last_ready: Any = None
        self.bucket_bytes: dict[int, int] = {}

    def start_step(self) -> None:
        self.last_ready = None
        self.bucket_bytes.clear()       # DDP rebuilds its buckets after the first step

    def comm_wait_s(self, step_start: Any, backward_end: Any) -> float:
        if self.last_ready is None:         # no bucket was reduced (cannot happen in training)
            return 0.0
        return max(0.0, self.clock.seconds(self.last_ready, backward_end))


# The hook that times the buckets is itself a comm hook, which changes how the reducer
# divides the gradients (perfmodel/sim/ddp.py); the model is told which (HARNESS_COMM_HOOK).
HOOKS = {"allreduce": allreduce_hook}


def timed_allreduce(state: BucketTimer, bucket):   # bucket: dist.GradBucket (torch checks
    # the annotation against the class itself, which `from __future__ import annotations` breaks)
    state.last_ready = state.clock.mark()
    buffer = bucket.buffer()
    state.bucket_bytes[bucket.index()] = buffer.numel() * buffer.element_size()
    return HOOKS[HARNESS_COMM_HOOK](None, bucket)


def bucket_arguments(options: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
    """(DDP keyword arguments, effective cap MiB, effective first-bucket MiB)."""
    cap, first = options.get("bucket_cap_MiB"), options.get("first_bucket_MiB")
    for name, value in (("bucket_cap_MiB", cap), ("first_bucket_MiB", first)):
        if value is not None and not (isinstance(value, int | float) and value > 0):
            raise PerfmodelError(f"ddp option {name} must be a positive number, got {value!r}")
    if cap is None and first is None:
        default_first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / MiB
        return {}, TORCH_DEFAULT_CAP_MiB, default_first
    cap = float(cap if cap is not None else TORCH_DEFAULT_CAP_MiB)
    if first is None or float(first) == cap:
        return {"bucket_cap_mb": cap}, cap, cap
    return {"bucket_cap_mb_list": [float(first), cap]}, cap, float(first)


def run(ctx: RunContext) -> None:
    settings = parse_settings(ctx.config, ctx.world_size)
    spec = settings.spec
    kwargs, cap_MiB, first_MiB = bucket_arguments(settings.options)
    module = build_model(spec, settings.seed, ctx.device)
    device_ids = [ctx.local_rank] if ctx.device.startswith("cuda") else None
    model = DistributedDataParallel(module, device_ids=device_ids, **kwargs)
    timer = BucketTimer(DeviceClock(ctx.device))
    model.register_comm_hook(timer, timed_allreduce)
    optimizer = make_optimizer(spec, model.parameters())

    result = data_parallel_training(ctx, settings, model, optimizer, timer)
    ctx.recorder.write("memory", **result.memory)

    checksum, digest = param_checksum(list(module.parameters()))
    buckets = [timer.bucket_bytes[i] for i in sorted(timer.bucket_bytes)]
    ctx.recorder.write(
        "summary", **loop_summary(settings, result),
        param_checksum=checksum, param_hash=digest,
        bucket_cap_MiB=cap_MiB, first_bucket_MiB=first_MiB,
        bucket_count=len(buckets), first_bucket_bytes=buckets[0] if buckets else 0,
        largest_bucket_bytes=max(buckets, default=0))
    if settings.options.get("save_params") and ctx.rank == 0:
        torch.save({k: v.detach().cpu() for k, v in module.named_parameters()},
                   ctx.run_dir / "params.pt")
