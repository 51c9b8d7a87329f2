"""Count the bytes FSDP2 copies in a training step on gloo, with torch.profiler (torchrun
script for tests/test_fsdp_copies.py): per variant, the elements of every copy-type op
(aten::copy_, aten::cat) a step runs on rank 0, in bytes, over the model's parameter bytes.
Usage: torchrun --nproc-per-node N tests/fsdp_copy_probe.py WORKLOAD OUT.json"""

from __future__ import annotations

import json
import math
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from measure.data import DataSource
from measure.models import MODELS
from measure.runs.fsdp import VARIANTS, shard
from measure.training import build_model, make_optimizer

COPIES = ("aten::copy_", "aten::cat")   # what FSDP2 and gloo copy with (cat: _chunk_cat)
STEPS = 2


def copied_bytes(spec, variant: str, rank: int, world: int) -> float:
    model = build_model(spec, 0, "cpu")
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shard(model, "cpu", world, VARIANTS[variant], False)
    optimizer = make_optimizer(spec, model.parameters())
    data = DataSource(spec, spec.batch_size, 0, rank, "cpu")

    def step():
        x, y = data.next_batch()
        spec.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(STEPS):
            step()
    total = 0.0
    for e in p.events():
        shapes = [s for s in e.input_shapes or [] if s]
        if e.name in COPIES and shapes:
            # copy_(dst, src): the destination; cat(tensors, dim, out): the largest operand
            total += max(math.prod(s) for s in shapes) * 4      # fp32 on CPU
    return total / STEPS / param_bytes


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = MODELS[sys.argv[1]]
    out = {variant: copied_bytes(spec, variant, rank, world) for variant in VARIANTS}
    if rank == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
