"""What is simulated: cluster, workload, size, heterogeneity and the random generator seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cluster import ClusterProfile
from perfmodel.errors import PerfmodelError
from perfmodel.workload import Workload

JITTER_KINDS = ("none", "lognormal", "exponential")
# A worker 1000x slower or faster than nominal is a typo, not a cluster: a step of a 1e-12
# speed would last billions of simulated seconds.
MIN_SPEED, MAX_SPEED = 1e-3, 1e3
MAX_JITTER_CV = 10.0            # lognormal CV; 10 already puts 1 % of steps above 148x the median


def timed_wait_jitter(spread_s: float, wait_s: float) -> tuple[str, float | None]:
    """(jitter, jitter_cv) of workers whose timed waits of `wait_s` seconds a step stray by
    `spread_s` (SD; compute.timed_wait_spread_ms on a crowded CPU host): log-normal at CV
    spread / wait (at most MAX_JITTER_CV), or no jitter where they do not stray."""
    if not spread_s > 0:
        return "none", None
    return "lognormal", min(spread_s / wait_s, MAX_JITTER_CV)


def parse_speeds(text: str, workers: int) -> tuple[float, ...]:
    """Relative worker speeds from "1,1,0.5" (one per worker; 1 = nominal, 0.5 = half speed),
    each finite and in [MIN_SPEED, MAX_SPEED]: the one parser of --speed, for predictions and
    real runs alike."""
    try:
        values = tuple(float(s) for s in text.split(","))
    except ValueError:
        raise PerfmodelError(f"--speed '{text}' is not a comma-separated list of numbers"
                             ) from None
    if len(values) != workers:
        raise PerfmodelError(f"--speed lists {len(values)} workers but --workers is {workers}")
    for v in values:
        if not MIN_SPEED <= v <= MAX_SPEED:               # False for NaN too
            raise PerfmodelError(f"speed factor {v} is outside [{MIN_SPEED:g}, {MAX_SPEED:g}] "
                                 "(1 = nominal, 0.5 = half speed)")
    return values


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
        if not all(MIN_SPEED <= s <= MAX_SPEED for s in self.speed):   # False for NaN too
            bad = next(s for s in self.speed if not MIN_SPEED <= s <= MAX_SPEED)
            raise PerfmodelError(f"speed factor {bad} is outside [{MIN_SPEED:g}, {MAX_SPEED:g}] "
                                 "(1 = nominal, 0.5 = half speed)")
        if self.jitter not in JITTER_KINDS:
            raise PerfmodelError(f"unknown jitter '{self.jitter}'; choose from "
                                 f"{', '.join(JITTER_KINDS)}")
        if self.jitter_cv is not None and not 0 <= self.jitter_cv <= MAX_JITTER_CV:
            raise PerfmodelError(f"jitter CV must be in [0, {MAX_JITTER_CV:g}], got "
                                 f"{self.jitter_cv}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise PerfmodelError(f"seed must be a whole number >= 0, got {self.seed!r}")

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
