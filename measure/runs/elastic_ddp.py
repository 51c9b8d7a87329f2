"""A DDP run that recovers from killed workers: torchrun elastic mode plus checkpoints.

measure/elastic_launch.py starts it under `torchrun --nnodes MIN:MAX --max-restarts R` and
kills worker processes on schedule. torchrun's agent then stops the surviving workers,
rendezvouses again and starts a new worker group (an "attempt",
TORCHELASTIC_RESTART_COUNT), which reloads the last checkpoint and trains on
(torch/distributed/elastic/agent/server/api.py `_invoke_run`; the torchrun docs ask scripts to
checkpoint for exactly this).

Training is measure/runs/ddp.py's DDP (same bucket options and timed comm hook), on the
workload's model and data; every `checkpoint_every` steps rank 0 writes the model and
optimizer state to RUN_DIR/checkpoint.pt (written to a temporary file, then renamed, so a kill
mid-write leaves the previous checkpoint). A restarted attempt resumes at the saved step with
the saved state; each attempt draws its batches from its own stream (seed, rank, attempt).

Options (config options.elastic_ddp): checkpoint_every (steps, default 10), bucket_cap_MiB,
first_bucket_MiB (as ddp). Records, besides worker.py's start/done/error:
- "step": as ddp, plus attempt and end_time (epoch seconds, comparable between processes on
  one host: recovery times are differences of such times).
- "elastic" with event =
  "attempt"    attempt, pid, spawned_at (process start, from /proc), entered_at (after
               init_process_group), world_size;
  "ready"      attempt, step (resumed from), build_s (data, model, DDP, optimizer), reload_s
               (checkpoint load), barrier_s, time (every rank ready: after a barrier);
  "checkpoint" attempt, step (steps done), write_s, time (rank 0);
  "stopped"    attempt, time, how ("SIGTERM" from the agent, or "peer lost" when a collective
               failed because a peer died).
- "summary" (rank 0, per attempt): steps trained, median step time.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from measure.context import RunContext
from measure.data import DataSource, digits_split, uses_digits
from measure.runs.ddp import BucketTimer, bucket_arguments, timed_allreduce
from measure.settings import parse_settings
from measure.timing import DeviceClock
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

CHECKPOINT = "checkpoint.pt"
DEFAULT_CHECKPOINT_EVERY = 10
ATTEMPT_STREAM = 1000           # data stream = rank + ATTEMPT_STREAM x attempt


def attempt_number() -> int:
    """torchrun's restart count: 0 for the first worker group, 1 after one restart, ..."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def process_start_time() -> float | None:
    """Epoch seconds when this process started (Linux /proc/self/stat field 22), else None."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + since_boot_s
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def checkpoint_every(options: dict[str, Any]) -> int:
    every = options.get("checkpoint_every", DEFAULT_CHECKPOINT_EVERY)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise PerfmodelError(f"elastic_ddp option checkpoint_every must be a whole number of "
                             f"steps >= 1, got {every!r}")
    return every


def save_checkpoint(path: Path, module: torch.nn.Module, optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": module.state_dict(),
                "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, module: torch.nn.Module, optimizer) -> int:
    """Load the state saved at `path` if there is one; return the step to resume from."""
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def run(ctx: RunContext) -> None:
    entered_at, attempt = time.time(), attempt_number()
    recorder = ctx.recorder

    def stopped(signum, frame):     # the agent stops the survivors of a failed attempt
        try:
            recorder.write("elastic", event="stopped", attempt=attempt, time=time.time(),
                           how="SIGTERM")
        except (ValueError, OSError):   # the record file may already be closed
            pass
        finally:
            os._exit(128 + signum)      # at once: unwinding a torch process can take seconds

    signal.signal(signal.SIGTERM, stopped)
    settings = parse_settings({**ctx.config, "kind": "ddp"}, ctx.world_size)
    options = dict((ctx.config.get("options") or {}).get("elastic_ddp", {}))
    every = checkpoint_every(options)
    recorder.write("elastic", event="attempt", attempt=attempt, pid=os.getpid(),
                   spawned_at=process_start_time(), entered_at=entered_at,
                   world_size=ctx.world_size)
    spec = settings.spec
    kwargs, _, _ = bucket_arguments(options)
    t_build = time.perf_counter()
    data = DataSource(spec, settings.batch_size, settings.seed,
                      ctx.rank + ATTEMPT_STREAM * attempt, ctx.device)
    if uses_digits(spec):
        digits_split()                  # load the data now: it is part of getting ready
    module = build_model(spec, settings.seed, ctx.device)
    model = DistributedDataParallel(module, **kwargs)
    timer = BucketTimer(DeviceClock(ctx.device))
    model.register_comm_hook(timer, timed_allreduce)
    optimizer = make_optimizer(spec, model.parameters())

    path = ctx.run_dir / CHECKPOINT
    t_load = time.perf_counter()
    start = load_checkpoint(path, module, optimizer)
    t_barrier = time.perf_counter()
    dist.barrier()
    recorder.write("elastic", event="ready", attempt=attempt, step=start,
                   build_s=t_load - t_build, reload_s=t_barrier - t_load,
                   barrier_s=time.perf_counter() - t_barrier, time=time.time())
    walls = []
    try:
        for step in range(start, settings.total_steps):
            walls.append(train_step(ctx, spec, model, optimizer, timer, data, step, attempt))
            if (step + 1) % every == 0 and ctx.rank == 0:
                t_write = time.perf_counter()
                save_checkpoint(path, module, optimizer, step + 1)
                recorder.write("elastic", event="checkpoint", attempt=attempt, step=step + 1,
                               write_s=time.perf_counter() - t_write, time=time.time())
    except RuntimeError:
        recorder.write("elastic", event="stopped", attempt=attempt, time=time.time(),
                       how="peer lost")
        raise
    if ctx.rank == 0:
        recorder.write("summary", attempt=attempt, resumed_at_step=start,
                       steps_trained=len(walls), batch_size=settings.batch_size,
                       median_step_s=float(np.median(walls)) if walls else float("nan"),
                       checkpoint_every=every)


def train_step(ctx: RunContext, spec, model, optimizer, timer: BucketTimer,
               data: DataSource, step: int, attempt: int) -> float:
    """One DDP step and its record; returns its wall time."""
    clock = timer.clock
    x, y = data.next_batch()
    timer.start_step()
    t0 = clock.mark()
    optimizer.zero_grad(set_to_none=True)
    loss = spec.loss(model(x), y)
    loss.backward()
    loss = loss.detach()
    comm_s = timer.comm_wait_s(t0, clock.mark())
    optimizer.step()
    wall_s = clock.seconds(t0, clock.mark())
    ctx.recorder.write("step", step=step, wall_s=wall_s, compute_s=wall_s - comm_s,
                       comm_wait_s=comm_s, loss=loss.item(), samples=len(y),
                       attempt=attempt, end_time=time.time())
    return wall_s
