"""The torchrun entry point of every measurement: `python -m measure.worker RUN_DIR`.

torchrun starts one process per rank; each reads RUN_DIR/config.json, joins the process group
(gloo on CPU, NCCL when CUDA devices are present), calls `measure.runs.<kind>.run(ctx)` and
records what happened in RUN_DIR/rank<R>.jsonl. A rank that fails writes an "error" record
and exits non-zero, so torchrun tears the job down and the launcher marks the run failed.
First of all a rank asks to be killed when torchrun dies (measure/lifeline.py), so no rank
outlives its launcher.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from measure.context import RunContext
from measure.lifeline import tie_rank_to_torchrun
from measure.protocol import PIN_OFFSET_ENV, apply_pin
from measure.recorder import Recorder


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m measure.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    tie_rank_to_torchrun(run_dir)       # die with torchrun, which dies with the launcher
    config = json.loads((run_dir / "config.json").read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    recorder = Recorder(run_dir, rank)
    pinned = apply_pin(config, local_rank,      # before torch starts its threads
                       offset=int(os.environ.get(PIN_OFFSET_ENV, 0)))

    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(config.get("threads_per_worker", 1)))
    torch.manual_seed(int(config.get("seed", 0)) + rank)
    if torch.cuda.is_available():
        backend, device = "nccl", f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    else:
        backend, device = "gloo", "cpu"
    timeout = datetime.timedelta(seconds=float(config.get("timeout_s", 120)))
    try:
        dist.init_process_group(backend, timeout=timeout)
        ctx = RunContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend,
                         device=device, run_dir=run_dir, recorder=recorder, config=config)
        backend_version = (".".join(map(str, torch.cuda.nccl.version()))
                           if backend == "nccl" else None)
        recorder.write("start", backend=backend, device=device, world_size=world,
                       torch_version=torch.__version__, backend_version=backend_version,
                       host=os.uname().nodename, pinned_cores=list(pinned))
        importlib.import_module(f"measure.runs.{config['kind']}").run(ctx)
        recorder.write("done")
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure must be recorded, then re-raised
        recorder.write("error", message=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc(limit=5))
        raise
    finally:
        recorder.close()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
