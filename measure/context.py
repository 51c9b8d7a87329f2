"""What a measurement function is handed inside each torchrun worker process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from measure.recorder import Recorder


@dataclass(frozen=True, kw_only=True)
class RunContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str                # "gloo" on CPU, "nccl" with CUDA devices
    device: str                 # "cpu" or "cuda:<local_rank>"
    run_dir: Path
    recorder: Recorder
    config: dict[str, Any]      # the run's configuration (config.json), as stored in the runs
                                # table; strategy options nested by kind: options["ps"]["mode"]
