"""PyTorch's own estimate of per-rank peak memory for jobs far larger than this machine.

    python -m measure.torch_memory --workload gpt2-xl --fsdp 8,64 --ddp 8 [--json]

How (DESIGN.md, "What this machine can and cannot measure"; torchtitan's memory estimator
does the same): one process joins a fake process group of N ranks
(`torch.testing._internal.distributed.fake_pg.FakeStore`, backend "fake": collectives are
no-ops), builds the device mesh OUTSIDE fake mode, then under `FakeTensorMode` builds the
workload's real module (measure/models.py; FSDP: on the meta device, then `to_empty` after
sharding), wraps it, creates the optimizer state (one optimizer step on zero gradients, so
the tracked step is a steady-state one) and trains one step under PyTorch's tracker. No
tensor holds data, so GPT-2 XL's 1.56B parameters cost nothing; a step takes ~20-60 s of
CPU for the fake-tensor bookkeeping.

- FSDP: FSDP2 `fully_shard` on every unit but the embeddings and the head, which stay in the
  root's group because GPT-2's head is tied to the token embedding (measure/models.py,
  LMHead); reshard_after_forward True (full-shard) or False (grad-op);
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) for bf16-mixed workloads.
  Tracker: `FSDPMemTracker`.
- DDP: DistributedDataParallel with `torch.autocast(bfloat16)` for bf16-mixed workloads (the
  usual DDP recipe: fp32 parameters, gradients and optimizer state, bf16 compute). Under fake
  tensors DDP cannot check parameters across ranks (init_sync=False), reduce (a no-op comm
  hook that returns the bucket, so the bucket buffers still exist) nor rebuild its buckets
  (the reducer's `_rebuild_buckets` reads tensor data; skipped, the first order stays).
  Tracker: `MemTracker`. DDP's per-rank memory does not depend on N.

Reported per configuration: the tracker's categories at the peak, summed into the parts
perfmodel/memory.py uses (params, grads, optimizer, activations, other), and the peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def estimate(workload, strategy: str, ranks: int, variant: str = "full-shard",
             batch_size: int | None = None, precision: str | None = None,
             checkpointing: str = "none") -> dict[str, Any]:
    """One estimate: {"peak_bytes", "parts", "method", ...} of rank 0 of an N-rank job.

    `workload`: a name in measure.models.MODELS or a ModelSpec (e.g. a reduced-depth one).
    `precision` (default the spec's): "bf16-mixed" is autocast for DDP and
    MixedPrecisionPolicy(bf16, fp32) for FSDP; "bf16" builds the model in bf16 (pure bf16;
    the optimizer's fp32 master copy is not part of torch.optim and is not tracked);
    "fp32" neither. `checkpointing`: "full" wraps every unit but the first and the last
    in checkpoint_wrapper (non-reentrant), "selective" every other one of those."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from measure.memtrack import snapshot_parts
    from measure.models import MODELS, make_optimizer

    spec = MODELS[workload] if isinstance(workload, str) else workload
    precision = precision or spec.precision
    batch = batch_size or spec.batch_size
    start = time.perf_counter()
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        mesh = None
        if strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cpu", (ranks,))        # outside fake mode
        with FakeTensorMode():
            if strategy == "fsdp":
                with torch.device("meta"):
                    model = _checkpointed(spec.build(), checkpointing)
                if precision == "bf16":
                    model = model.to(torch.bfloat16)
                model, tracker_of, autocast = _fsdp(precision, model, mesh, variant), \
                    _fsdp_tracker, False
                model.to_empty(device="cpu")
            else:
                model = _checkpointed(spec.build(), checkpointing)
                if precision == "bf16":
                    model = model.to(torch.bfloat16)
                model, tracker_of, autocast = _ddp(model), _ddp_tracker, \
                    precision == "bf16-mixed"
            optimizer = make_optimizer(spec, model.parameters())
            for p in model.parameters():                    # optimizer state now exists,
                p.grad = torch.zeros_like(p)                # as in steady state
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            x, y = spec.example_batch(batch, torch.Generator().manual_seed(0))
            tracker = tracker_of(model, optimizer)
            with tracker:                                   # one training step
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = spec.loss(model(x), y)       # no reference kept to the output
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            snapshot = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    peak, parts = snapshot_parts(snapshot)
    method = ("FSDPMemTracker" if strategy == "fsdp" else "MemTracker") + \
        " under FakeTensorMode, fake process group" + (", autocast bf16" if autocast else "")
    return {"workload": spec.name, "strategy": strategy, "precision": precision,
            "checkpointing": checkpointing,
            "variant": variant if strategy == "fsdp" else "", "ranks": ranks,
            "batch_size": batch, "peak_bytes": int(peak),
            "parts": {k: int(v) for k, v in parts.items()}, "method": method,
            "categories": {str(getattr(k, "value", k)): int(v) for cats in snapshot.values()
                           for k, v in cats.items()},
            "torch_version": torch.__version__, "seconds": time.perf_counter() - start}


def _checkpointed(model, mode: str):
    """`model` with its middle units (not the embeddings nor the head) in checkpoint_wrapper:
    all of them ("full"), every other one ("selective"), none ("none")."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "none":
        return model
    middle = list(model._modules)[1:-1]      # as perfmodel's Workload.checkpointed()
    for i, name in enumerate(middle):
        if mode == "full" or i % 2 == 0:
            model._modules[name] = checkpoint_wrapper(model._modules[name])
    return model


def _fsdp(precision: str, model, mesh, variant: str):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": variant == "full-shard"}
    if precision == "bf16-mixed":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    for name, unit in model.named_children():
        if name not in ("embeddings", "head") and any(True for _ in unit.parameters()):
            fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _fsdp_tracker(model, optimizer):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    return FSDPMemTracker(model, optimizer)


class _NoRebuild:
    """DDP's reducer, except `_rebuild_buckets`, which reads tensor data (absent when fake)."""

    def __init__(self, reducer):
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str):
        return getattr(self._reducer, name)


def _ddp(model):
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, init_sync=False)
    ddp.register_comm_hook(None, noop_hook)
    ddp.reducer = _NoRebuild(ddp.reducer)
    return ddp


def _ddp_tracker(model, optimizer):
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()] if text else []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m measure.torch_memory",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2-xl")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--fsdp", default="8,16,32,64", help="ranks of full-shard FSDP jobs")
    parser.add_argument("--grad-op", default="", help="ranks of grad-op FSDP jobs")
    parser.add_argument("--ddp", default="8", help="ranks of DDP jobs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    jobs = ([("fsdp", n, "full-shard") for n in _ints(args.fsdp)]
            + [("fsdp", n, "grad-op") for n in _ints(args.grad_op)]
            + [("ddp", n, "") for n in _ints(args.ddp)])
    out = []
    for strategy, n, variant in jobs:
        out.append(estimate(args.workload, strategy, n, variant or "full-shard",
                            args.batch_size))
        if not args.json:
            r = out[-1]
            print(f"{strategy} {variant} {n} ranks: {r['peak_bytes'] / 2**30:.2f} GiB "
                  f"({r['seconds']:.0f} s)", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
