"""What is simulated: cluster, workload, size, heterogeneity and the random generator seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cluster import ClusterProfile
from perfmodel.errors import PerfmodelError
from perfmodel.workload import Workload

JITTER_KINDS = ("none", "lognormal", "exponential")


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    cluster: ClusterProfile
    workload: Workload
    workers: int
    batch_size: int                     # samples per worker per step
    steps: int = 20                     # per worker (ddp, fsdp, sync-ps); async-ps and ssp-ps
                                        # share workers x steps mini-batches: fast ones do more
    warmup_steps: int = 2               # per worker, left out of every summary
    speed: tuple[float, ...] = ()       # per-worker relative speed; () = all 1.0; 0.25 = 4x slower
    jitter: str = "lognormal"           # distribution of a step's compute-time multiplier
    jitter_cv: float | None = None      # its coefficient of variation; None = the profile's
    seed: int = 0

    def __post_init__(self):
        if self.workers < 1:
            raise PerfmodelError(f"workers must be at least 1, got {self.workers}")
        if self.batch_size < 1:
            raise PerfmodelError(f"batch size must be at least 1, got {self.batch_size}")
        if self.steps <= self.warmup_steps:
            raise PerfmodelError(f"steps ({self.steps}) must exceed warm-up steps "
                                 f"({self.warmup_steps})")
        if self.speed and len(self.speed) != self.workers:
            raise PerfmodelError(f"{len(self.speed)} speed factors given for "
                                 f"{self.workers} workers; give one per worker")
        if any(s <= 0 for s in self.speed):
            raise PerfmodelError("speed factors must be positive (1 = nominal, 0.5 = half speed)")
        if self.jitter not in JITTER_KINDS:
            raise PerfmodelError(f"unknown jitter '{self.jitter}'; choose from "
                                 f"{', '.join(JITTER_KINDS)}")
        if self.jitter_cv is not None and self.jitter_cv < 0:
            raise PerfmodelError("jitter CV must be >= 0")

    @property
    def speeds(self) -> np.ndarray:
        return np.array(self.speed, dtype=float) if self.speed else np.ones(self.workers)

    @property
    def cv(self) -> float:
        if self.jitter == "none":
            return 0.0
        if self.jitter == "exponential":
            return 1.0
        return self.cluster.compute.jitter_cv if self.jitter_cv is None else self.jitter_cv

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)
