"""A run kind for testing the launcher and the store: it does nothing useful on purpose.

config["options"]["selftest"]["mode"]:
  "ok"    every rank records a few step records and a summary, then finishes;
  "crash" rank 1 raises an exception (recorded as an "error" record by the worker);
  "kill"  rank 1 sends SIGKILL to itself after its first step (no error record possible);
  "hang"  rank 1 sleeps far past any timeout while the other ranks wait in a barrier.
"""

from __future__ import annotations

import os
import signal
import time

MODES = ("ok", "crash", "kill", "hang")
FAULTY_RANK = 1


def run(ctx) -> None:
    import torch.distributed as dist

    mode = ((ctx.config.get("options") or {}).get("selftest") or {}).get("mode", "ok")
    if mode not in MODES:
        raise ValueError(f"selftest mode '{mode}' is not one of {', '.join(MODES)}")
    faulty = ctx.rank == FAULTY_RANK % ctx.world_size
    steps = int(ctx.config.get("steps", 3))
    for step in range(steps):
        t0 = time.perf_counter()
        if faulty and step == 1:
            if mode == "crash":
                raise RuntimeError(f"selftest crash on rank {ctx.rank}")
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "hang":
                time.sleep(3600)
        dist.barrier()
        wall_s = time.perf_counter() - t0
        ctx.recorder.write("step", step=step, wall_s=wall_s, compute_s=0.0, comm_wait_s=wall_s,
                           loss=1.0 / (step + 1), samples=1)
    ctx.recorder.write("summary", steps=steps, mode=mode)
