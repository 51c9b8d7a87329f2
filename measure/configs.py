"""The config.json of each kind of measurement, and the torchrun flags of a multi-node job.

One place builds what a run is told to do (keys: measure/worker.py and measure/runs/*.py),
so that `perfmodel measure` (one run) and `perfmodel calibrate` (a suite of runs,
calibration/suite.py) describe the same measurement the same way, and a stored run's
config can be compared with the one a calibration wants. No torch here.

It also parses what users type for a run (sizes as nccl-tests writes them, batch-size
lists). `progress_total` is how many progress records (measure/launch.py PROGRESS_TYPES) a run
writes on its most advanced rank, for progress bars.
"""

from __future__ import annotations

import shutil
from typing import Any

from perfmodel.errors import PerfmodelError
from perfmodel.sim.scenario import parse_speeds
from perfmodel.workload import load_workload, workload_paths

SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}    # nccl-tests: -b 8 -e 128M


def check_workload(name: str) -> str:
    known = sorted(workload_paths())
    if name not in known:
        raise PerfmodelError(f"unknown workload '{name}'; choose from: {', '.join(known)}")
    return name


def parse_speed(text: str | None, workers: int) -> list[float]:
    """Relative worker speeds from "1,0.5" (one per worker); [] when not given."""
    return [] if text is None else list(parse_speeds(text, workers))


def parse_size(text: str) -> int:
    """Bytes from '8', '64K', '16M', '1G' (binary multiples, as nccl-tests) or '16MiB'."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = t[-1:] if t[-1:] in ("K", "M", "G") else ""
    try:
        value = float(t[:len(t) - len(suffix)]) * SIZE_SUFFIXES[suffix]
    except ValueError:
        raise PerfmodelError(f"'{text}' is not a size in bytes (examples: 8, 64K, 16M, 1G)"
                             ) from None
    if value < 1 or value != int(value):
        raise PerfmodelError(f"'{text}' is not a whole number of bytes >= 1")
    return int(value)


def parse_batch_sizes(text: str | None, workload: str) -> list[int]:
    """Batch sizes from "16,32,64"; without them, the workload's, its half and its double."""
    if not text:
        b = load_workload(check_workload(workload)).batch_size
        return sorted({max(1, b // 2), b, 2 * b})
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        raise PerfmodelError(f"--batch-sizes '{text}' is not a comma-separated list of whole "
                             f"numbers") from None
    if any(b < 1 for b in sizes):
        raise PerfmodelError("every batch size must be at least 1")
    return sizes


def device_kind() -> str:
    """"cuda" where NVIDIA's driver tool is installed, else "cpu" (no torch import)."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def collectives_config(*, workers: int, ops: list[str], min_bytes: int,
                       max_bytes: int | None, factor: int, iters: int | None,
                       warmup_iters: int | None, dtype: str, seed: int, timeout_s: float,
                       threads_per_worker: int) -> dict[str, Any]:
    """An nccl-tests-style sweep (measure/runs/collectives.py); None = the device default."""
    from measure.runs.collectives import DEFAULTS, DTYPES, OPS

    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise PerfmodelError(f"unknown collective '{unknown[0] if unknown else ','.join(ops)}'; "
                             f"choose from: {', '.join(OPS)}")
    if dtype not in DTYPES:
        raise PerfmodelError(f"unknown dtype '{dtype}'; choose from: {', '.join(DTYPES)}")
    top = max_bytes or DEFAULTS[device_kind()]["max_bytes"]
    if min_bytes > top:
        raise PerfmodelError(f"--min-bytes {min_bytes} exceeds --max-bytes {top}")
    return {"kind": "collectives", "workers": workers, "workload": None, "seed": seed,
            "ops": list(ops), "min_bytes": min_bytes, "max_bytes": max_bytes,
            "factor": factor, "iters": iters, "warmup_iters": warmup_iters, "dtype": dtype,
            "timeout_s": timeout_s, "threads_per_worker": threads_per_worker}


def compute_config(*, workload: str, batch_sizes: list[int], repeats: int, warmup: int,
                   seed: int, timeout_s: float, threads_per_worker: int,
                   concurrent: int = 0) -> dict[str, Any]:
    """Per-unit forward/backward timings of one workload (measure/runs/compute.py); with
    `concurrent` = p > 0, whole steps at batch_sizes[0] timed in p processes at once."""
    check_workload(workload)
    if concurrent:
        return {"kind": "compute", "workers": concurrent, "workload": workload,
                "batch_size": batch_sizes[0], "steps": repeats, "warmup_steps": warmup,
                "seed": seed, "speed": [],
                "options": {"compute": {"concurrent": True, "repeats": repeats,
                                        "warmup": warmup}},
                "timeout_s": timeout_s, "threads_per_worker": threads_per_worker}
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise PerfmodelError("every batch size must be at least 1")
    return {"kind": "compute", "workers": 1, "workload": workload,
            "batch_size": batch_sizes[0], "steps": repeats, "warmup_steps": warmup,
            "seed": seed, "speed": [],
            "options": {"compute": {"batch_sizes": list(batch_sizes), "repeats": repeats,
                                    "warmup": warmup}},
            "timeout_s": timeout_s, "threads_per_worker": threads_per_worker}


def training_config(kind: str, *, workers, workload, batch_size, steps, warmup_steps, speed,
                    seed, timeout_s, threads_per_worker, options: dict) -> dict[str, Any]:
    """A DDP, FSDP or PS training run; `options` are the kind's own (None = its default)."""
    w = load_workload(check_workload(workload))
    return {"kind": kind, "workers": workers, "workload": workload,
            "batch_size": batch_size or w.batch_size, "steps": steps,
            "warmup_steps": warmup_steps, "seed": seed, "speed": parse_speed(speed, workers),
            "options": {kind: {k: v for k, v in options.items() if v is not None}},
            "timeout_s": timeout_s, "threads_per_worker": threads_per_worker}


def processes(config: dict[str, Any]) -> int:
    """Processes a run needs: its workers, plus the server of a parameter-server run."""
    return int(config["workers"]) + (1 if config["kind"] == "ps" else 0)


def progress_total(config: dict[str, Any]) -> int:
    """Progress records the most advanced rank writes (one per collective and size, unit pass,
    or training step)."""
    from measure.runs.collectives import DEFAULTS, OPS, message_sizes

    kind = config["kind"]
    if kind == "collectives":
        cpu = DEFAULTS["cpu"]
        hi = config.get("max_bytes") or DEFAULTS[device_kind()]["max_bytes"]
        sizes = message_sizes(config.get("min_bytes") or cpu["min_bytes"], hi,
                              config.get("factor") or cpu["factor"])
        return len(config.get("ops") or OPS) * len(sizes)
    if kind == "compute" and config["options"]["compute"].get("concurrent"):
        return 1                                    # one summary per rank
    if kind == "compute":
        units = len(load_workload(config["workload"]).units)
        return 2 * units * len(config["options"]["compute"]["batch_sizes"])
    return int(config.get("steps") or 1)


def elastic_config(kind: str, *, workers: int, workload: str, batch_size: int | None,
                   steps: int, seed: int, timeout_s: float, options: dict) -> dict[str, Any]:
    """An elastic run (measure/runs/elastic_ddp.py, elastic_ps.py): no warm-up, no speeds."""
    w = load_workload(check_workload(workload))
    return {"kind": kind, "workers": workers, "workload": workload,
            "batch_size": batch_size or w.batch_size, "steps": steps, "warmup_steps": 0,
            "seed": seed, "speed": [], "options": options, "timeout_s": timeout_s,
            "threads_per_worker": 1}


def torchrun_args(nnodes, node_rank, rdzv_endpoint, rdzv_id) -> list[str]:
    """torchrun's multi-node flags from the CLI's; [] for a single-node run."""
    given = {"--nnodes": nnodes, "--node-rank": node_rank, "--rdzv-endpoint": rdzv_endpoint,
             "--rdzv-id": rdzv_id}
    if all(v is None for v in given.values()):
        return []
    if nnodes is None or rdzv_endpoint is None:
        raise PerfmodelError("a multi-node run needs --nnodes and --rdzv-endpoint (and "
                             "--node-rank on each node)")
    args = ["--rdzv-backend", "c10d"]
    for flag, value in given.items():
        if value is not None:
            args += [flag, str(value)]
    return args
