"""One GPU's measurements for `perfmodel gpu-check`: per-unit compute, step time and peak
memory of a shipped workload at one precision, in one process.

Per case (workload, precision, batch, depth):
- unit passes: every unit's forward and backward alone, at the batch and at half of it,
  timed as the compute profile times them (measure/runs/compute.py `time_per_run`: warm-up,
  blocks of >= 5 ms, the median of `repeats` blocks, CUDA synchronised around each block);
- optimizer: the optimizer step alone over the model's gradients (median of `repeats`);
- training steps: the model in DistributedDataParallel at world size 1 (NCCL on CUDA, gloo
  on CPU, an in-process HashStore; DDP's bucket exists as in a real job), forward under the
  precision, backward, optimizer step; warm-up steps, then `steps` timed steps (median,
  IQR);
- peak memory: `torch.cuda.reset_peak_memory_stats()` before one more step, then
  `max_memory_allocated()` (tensors, the part perfmodel's memory model predicts) and
  `max_memory_reserved()` (what the caching allocator took from the driver), through
  measure/memtrack.py's CUDA path; on CPU (tests) PyTorch's MemTracker.

Precisions: "fp32" (TF32 off), "tf32" (TF32 on for matmul and cuDNN), "bf16-mixed"
(`torch.autocast(bfloat16)`, fp32 parameters, gradients and optimizer state: the DDP recipe).

Depth: `blocks` keeps the first unit (embeddings/stem), the first `blocks` middle units and
the last one (head), from the full model, so a tied LM head stays tied. perfmodel's side of
the comparison cuts the workload file the same way (perfmodel/compare/gpu_check.py).

Every stage checks a deadline (time.monotonic()); a case past it stops where it is and says
what it skipped, so the whole check keeps its time budget.
"""

from __future__ import annotations

import gc
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from measure.memtrack import measure_memory
from measure.models import MODELS, ModelSpec
from measure.runs.compute import time_per_run, unit_pass_times
from measure.timing import median_iqr
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

PRECISIONS = ("fp32", "tf32", "bf16-mixed")
REPEATS = 5
WARMUP = 2
MIN_BLOCK_S = 0.005
WARMUP_STEPS = 3
STEPS = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    workload: str
    precision: str
    batch_size: int
    blocks: int | None = None       # middle units kept; None = the full model

    def __post_init__(self) -> None:
        if self.workload not in MODELS:
            raise PerfmodelError(f"unknown workload '{self.workload}'; known: "
                                 f"{', '.join(MODELS)}")
        if self.precision not in PRECISIONS:
            raise PerfmodelError(f"gpu-check precision '{self.precision}' is not one of "
                                 f"{', '.join(PRECISIONS)}")
        if self.batch_size < 1 or (self.blocks is not None and self.blocks < 1):
            raise PerfmodelError(f"batch size and blocks must be >= 1, got {self.batch_size} "
                                 f"and {self.blocks}")


def cuda_device() -> str:
    """"cuda:0", or a PerfmodelError saying why there is none (one line)."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no visible CUDA device"
        raise PerfmodelError(f"gpu-check needs a CUDA GPU: torch {torch.__version__} reports "
                             f"{build}; run it on a GPU machine")
    return "cuda:0"


def device_info(device: str) -> dict[str, Any]:
    if not device.startswith("cuda"):
        return {"name": "cpu", "memory_bytes": 0, "torch": torch.__version__}
    props = torch.cuda.get_device_properties(torch.device(device))
    return {"name": props.name, "memory_bytes": int(props.total_memory),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def cut(model: nn.Sequential, blocks: int | None) -> nn.Sequential:
    """The first unit, the first `blocks` middle units and the last unit of `model`."""
    names = list(model._modules)
    if blocks is None or blocks >= len(names) - 2:
        return model
    keep = [names[0], *names[1:1 + blocks], names[-1]]
    return nn.Sequential(OrderedDict((n, model._modules[n]) for n in keep))


def precision_context(precision: str, device: str) -> AbstractContextManager:
    """Sets the TF32 switches for `precision`; returns the forward's autocast context."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if precision == "bf16-mixed":
        return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
    return nullcontext()


def _process_group(device: str) -> None:
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                store=dist.HashStore(), rank=0, world_size=1)


def measure_case(case: Case, device: str, deadline: float,
                 say: Callable[[str], None] = print, seed: int = 0) -> dict[str, Any]:
    """The measurements of one case (module docstring); stops at `deadline` (monotonic)."""
    spec = MODELS[case.workload]
    start = time.monotonic()
    if device.startswith("cuda"):           # the last case's blocks back to the driver
        gc.collect()
        torch.cuda.empty_cache()
    out: dict[str, Any] = {"workload": case.workload, "precision": case.precision,
                           "batch_size": case.batch_size, "blocks": case.blocks,
                           "unit_passes": [], "skipped": []}
    autocast = precision_context(case.precision, device)
    model = cut(build_model(spec, seed, device), case.blocks)
    out["units"] = list(model._modules)
    out["params"] = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(seed)
    timing = {"repeats": REPEATS, "warmup": WARMUP, "min_block_s": MIN_BLOCK_S,
              "cuda": device.startswith("cuda")}
    for batch in sorted({max(1, case.batch_size // 2), case.batch_size}):
        if time.monotonic() > deadline:
            out["skipped"].append(f"unit passes at batch {batch} (past its deadline)")
            continue
        out["unit_passes"] += _unit_passes(spec, model, batch, device, autocast, timing,
                                           generator)
        say(f"  unit passes at batch {batch}: {len(model._modules)} units "
            f"({time.monotonic() - start:.0f} s)")
    _process_group(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    optimizer = make_optimizer(spec, ddp.parameters())
    x, y = (t.to(device) for t in spec.example_batch(case.batch_size, generator))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out_ = ddp(x)
        spec.loss(out_, y).backward()
        optimizer.step()

    if time.monotonic() > deadline:
        out["skipped"].append("training steps, optimizer and memory (past its deadline)")
        return out
    out["step"] = _steps(step, timing["cuda"])
    say(f"  {STEPS} training steps: median {out['step']['median_s'] * 1e3:.1f} ms")
    out["optimizer"] = _optimizer_pass(optimizer, timing)
    out["memory"] = measure_memory(ddp, optimizer, step, device=device, steps=1)
    if timing["cuda"]:
        out["memory"]["max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    out["seconds"] = time.monotonic() - start
    return out


def _unit_passes(spec: ModelSpec, model: nn.Sequential, batch: int, device: str, autocast,
                 timing: dict, generator: torch.Generator) -> list[dict[str, Any]]:
    """Forward and backward median seconds of every unit alone (measure/runs/compute.py)."""
    rows = [{"unit": name, "phase": phase, "batch_size": batch, "median_s": median_s,
             "iqr_s": iqr_s}
            for name, phase, median_s, iqr_s in unit_pass_times(
                spec, model, batch, device, autocast, timing, generator)]
    for p in model.parameters():
        p.grad = None
    return rows


def _steps(step: Callable[[], None], cuda: bool) -> dict[str, Any]:
    samples = []
    for i in range(WARMUP_STEPS + STEPS):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= WARMUP_STEPS:
            samples.append(time.perf_counter() - t0)
    median_s, iqr_s = median_iqr(samples)
    return {"median_s": median_s, "iqr_s": iqr_s, "samples_s": samples}


def _optimizer_pass(optimizer: torch.optim.Optimizer, timing: dict) -> dict[str, Any]:
    median_s, iqr_s = median_iqr(time_per_run(optimizer.step, **timing))
    return {"median_s": median_s, "iqr_s": iqr_s}


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
