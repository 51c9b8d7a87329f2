"""Compute profile: forward and backward time of every unit of a workload, at several batch
sizes, in one process (world size 1).

Method (torch.utils.benchmark's Timer.blocked_autorange, simplified): warm-up runs, then a
block size chosen so one block lasts at least `min_block_s`, then `repeats` blocks; a
sample is a block's time divided by its runs. Reported: the median and the interquartile
range of the samples; where IQR/median > 10 % the record carries a warning (and it is
logged), as torch.utils.benchmark and nccl-tests do. On CUDA the device is synchronised
around every block.

Each unit runs on the previous unit's output (detached, so only this unit's graph is
timed); its input requires grad except for the first unit, as in training. Backward is
timed on one retained graph with the gradients reset to None before each run, so every run
allocates its parameter gradients as a training step does. The summary adds the whole
model's optimizer step time, which a parameter server pays per update.

Concurrent mode (option compute.concurrent, any world size p): every rank times the whole
model's forward + backward at the run's batch size at the same time, after a barrier, and
writes its median seconds per step and CPU seconds per step. Runs with p = 1, 2, 3 on one
host measure compute under core sharing (calibration/fit_cores.py): wall time over the
1-process time is the slowdown; CPU time per step over the 1-process CPU time is the
contention alone (time waiting for a core is not CPU time).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from measure.context import RunContext
from measure.settings import parse_settings
from measure.timing import median_iqr
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

log = logging.getLogger(__name__)

NOISY_IQR_FRACTION = 0.10       # warn when IQR/median exceeds this (torch.utils.benchmark)
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3
DEFAULT_MIN_BLOCK_S = 0.005
CONCURRENT_MIN_BLOCK_S = 0.05           # a concurrent run's block of whole steps


def time_per_run(fn: Callable[[], Any], *, repeats: int, warmup: int, min_block_s: float,
                 cuda: bool) -> list[float]:
    """`repeats` samples of the seconds one call of `fn` takes."""
    def block(number: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(warmup):
        fn()
    number = max(1, math.ceil(min_block_s / max(block(1), 1e-9)))
    return [block(number) / number for _ in range(repeats)]


def noise_warning(what: str, median_s: float, iqr_s: float) -> str | None:
    if median_s > 0 and iqr_s / median_s > NOISY_IQR_FRACTION:
        message = (f"{what}: IQR/median = {iqr_s / median_s:.0%} > "
                   f"{NOISY_IQR_FRACTION:.0%}; the timing is noisy")
        log.warning(message)
        return message
    return None


def run(ctx: RunContext) -> None:
    settings = parse_settings(ctx.config, ctx.world_size)
    if settings.options.get("concurrent"):
        run_concurrent(ctx, settings)
        return
    if ctx.world_size != 1:
        raise PerfmodelError(f"a compute profile runs in one process, not {ctx.world_size}")
    spec, options = settings.spec, settings.options
    batch_sizes = [int(b) for b in options.get("batch_sizes") or
                   sorted({max(1, settings.batch_size // 2), settings.batch_size,
                           2 * settings.batch_size})]
    if any(b < 1 for b in batch_sizes):
        raise PerfmodelError(f"compute batch_sizes must be positive, got {batch_sizes}")
    timing = {"repeats": int(options.get("repeats", DEFAULT_REPEATS)),
              "warmup": int(options.get("warmup", DEFAULT_WARMUP)),
              "min_block_s": float(options.get("min_block_s", DEFAULT_MIN_BLOCK_S)),
              "cuda": ctx.device.startswith("cuda")}
    if timing["repeats"] < 2:
        raise PerfmodelError("compute repeats must be at least 2 to give an IQR")
    model = build_model(spec, settings.seed, ctx.device)
    generator = torch.Generator().manual_seed(settings.seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16,
                              enabled=timing["cuda"] and spec.precision == "bf16-mixed")
    step_s: dict[int, float] = {}
    for batch_size in batch_sizes:
        step_s[batch_size] = 0.0
        for name, pass_name, median_s, iqr_s in unit_pass_times(
                spec, model, batch_size, ctx.device, autocast, timing, generator):
            step_s[batch_size] += median_s
            ctx.recorder.write(
                "compute", unit=name, batch_size=batch_size, **{"pass": pass_name},
                median_s=median_s, iqr_s=iqr_s, repeats=timing["repeats"],
                warning=noise_warning(f"{name} {pass_name} at batch {batch_size}",
                                      median_s, iqr_s))

    optimizer = make_optimizer(spec, model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer_s, optimizer_iqr_s = median_iqr(time_per_run(optimizer.step, **timing))
    reference = settings.batch_size if settings.batch_size in step_s else batch_sizes[-1]
    ctx.recorder.write(
        "summary", throughput_samples_per_s=reference / step_s[reference],
        batch_size=reference, forward_backward_s=step_s[reference],
        optimizer_step_s=optimizer_s, optimizer_step_iqr_s=optimizer_iqr_s,
        params=sum(p.numel() for p in model.parameters()))


def run_concurrent(ctx: RunContext, settings) -> None:
    """Every rank times whole forward + backward steps at once (module docstring)."""
    import os

    import torch.distributed as dist

    spec, options = settings.spec, settings.options
    repeats = int(options.get("repeats", DEFAULT_REPEATS))
    if repeats < 2:
        raise PerfmodelError("compute repeats must be at least 2 to give an IQR")
    model = build_model(spec, settings.seed, ctx.device)
    generator = torch.Generator().manual_seed(settings.seed + ctx.rank)
    x, _ = spec.example_batch(settings.batch_size, generator)
    x = x.to(ctx.device)
    params = list(model.parameters())
    cpu: list[float] = []

    def step() -> None:
        for p in params:
            p.grad = None
        c0 = time.process_time()
        model(x).float().sum().backward()
        cpu.append(time.process_time() - c0)

    if dist.is_available() and dist.is_initialized():
        dist.barrier()                  # start together: the steps overlap
    load_before = os.getloadavg()[0]
    walls = time_per_run(step, repeats=repeats, warmup=int(options.get("warmup", DEFAULT_WARMUP)),
                         min_block_s=float(options.get("min_block_s", CONCURRENT_MIN_BLOCK_S)),
                         cuda=ctx.device.startswith("cuda"))
    median_s, iqr_s = median_iqr(walls)
    cpu_s, _ = median_iqr(cpu[-max(repeats, 1):])
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    ctx.recorder.write(
        "summary", busy_processes=ctx.world_size, concurrent_step_s=median_s,
        concurrent_step_iqr_s=iqr_s, concurrent_cpu_s=cpu_s, batch_size=settings.batch_size,
        host_cores=os.cpu_count() or 1, load1_before=load_before,
        load1_after=os.getloadavg()[0],
        warning=noise_warning(f"concurrent step, {ctx.world_size} processes", median_s, iqr_s))


def unit_pass_times(spec, model, batch_size: int, device: str, autocast, timing: dict,
                    generator: torch.Generator):
    """(unit, "forward" | "backward", median s, IQR s) of every unit of `model` alone, fed
    the previous unit's output for `batch_size` samples (time_per_run with `timing`)."""
    x, _ = spec.example_batch(batch_size, generator)
    h = x.to(device)
    for index, (name, unit) in enumerate(model.named_children()):
        inp = h.detach().requires_grad_(index > 0 and h.is_floating_point())
        with autocast:
            out = unit(inp)
        grad_out = torch.randn(out.shape, generator=generator).to(out)
        params = list(unit.parameters())

        def forward(unit=unit, inp=inp):
            with autocast:
                unit(inp)

        def backward(out=out, grad_out=grad_out, inp=inp, params=params):
            for p in [*params, inp]:
                p.grad = None
            out.backward(grad_out, retain_graph=True)

        for pass_name, fn in (("forward", forward), ("backward", backward)):
            median_s, iqr_s = median_iqr(time_per_run(fn, **timing))
            yield name, pass_name, median_s, iqr_s
        h = out.detach()
        del out, grad_out
