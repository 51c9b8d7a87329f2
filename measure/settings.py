"""The training part of a run's config.json, read and checked once (`parse_settings`).

Every training run (measure/runs/ddp.py, fsdp.py, ps.py, elastic_*.py, compute.py) reads its
kind, workers, workload, batch, steps, seed, relative worker speeds, its own options and the
compute mode from here. Compute mode (config `compute_mode`): "real" trains the model;
"timed-wait" replaces each unit's compute by a calibrated wait (measure/timed_wait.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from measure.models import MODELS, ModelSpec
from measure.timed_wait import ComputeWait, parse_compute_wait, timed_wait_spec
from perfmodel.errors import PerfmodelError

COMPUTE_MODES = ("real", "timed-wait")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The training part of a run's config.json, checked."""

    kind: str
    workers: int                    # training workers (PS: the server is one rank more)
    workload: str
    batch_size: int                 # per worker
    steps: int                      # timed steps, after the warm-up
    warmup_steps: int
    seed: int
    speed: tuple[float, ...]        # relative speed per worker; 1.0 = full speed
    options: dict[str, Any]         # this kind's own options
    compute_mode: str = "real"      # "real" or "timed-wait" (module docstring)
    compute_wait: ComputeWait | None = None     # timed-wait: the seconds to wait

    @property
    def spec(self) -> ModelSpec:
        """The workload's model; in timed-wait mode, the same model with sleeping units."""
        if self.compute_wait is None:
            return MODELS[self.workload]
        return timed_wait_spec(MODELS[self.workload], self.compute_wait)

    @property
    def timed_wait(self) -> bool:
        return self.compute_wait is not None

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    def worker_speed(self, worker: int) -> float:
        return self.speed[worker] if self.speed else 1.0


def parse_settings(config: dict[str, Any], world_size: int) -> Settings:
    """Read and check the run's config; the world size must match the kind's process count."""
    kind = str(config.get("kind", ""))
    workload = str(config.get("workload", ""))
    if workload not in MODELS:
        raise PerfmodelError(f"unknown workload '{workload}'; known: {', '.join(MODELS)}")
    spec = MODELS[workload]
    workers = _int(config, "workers", world_size - 1 if kind == "ps" else world_size, 1)
    expected = workers + 1 if kind == "ps" else workers
    if world_size != expected:
        raise PerfmodelError(f"a {kind} run with {workers} workers needs {expected} processes, "
                             f"but torchrun started {world_size}")
    speed = tuple(float(s) for s in config.get("speed") or ())
    if speed and len(speed) != workers:
        raise PerfmodelError(f"speed lists {len(speed)} values but the run has {workers} "
                             "workers; give one relative speed per worker or none")
    if any(not s > 0 for s in speed):
        raise PerfmodelError(f"every relative speed must be positive, got {list(speed)}")
    options = (config.get("options") or {}).get(kind, {}) if kind else {}
    mode = config.get("compute_mode") or "real"
    if mode not in COMPUTE_MODES:
        raise PerfmodelError(f"config 'compute_mode' is '{mode}'; choose from: "
                             f"{', '.join(COMPUTE_MODES)}")
    wait = parse_compute_wait(config.get("compute_wait_s")) if mode == "timed-wait" else None
    return Settings(
        kind=kind, workers=workers, workload=workload,
        batch_size=_int(config, "batch_size", spec.batch_size, 1),
        steps=_int(config, "steps", 20, 1),
        warmup_steps=_int(config, "warmup_steps", 2, 0),
        seed=_int(config, "seed", 0, 0),
        speed=speed, options=dict(options), compute_mode=mode, compute_wait=wait)


def _int(config: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise PerfmodelError(f"config '{key}' must be a whole number, got {value!r}")
    if value < minimum:
        raise PerfmodelError(f"config '{key}' must be at least {minimum}, got {value}")
    return int(value)
