"""What practitioners do with a straggler: train without it, or drop its gradient each step.

Two straggler-aware variants of a synchronous strategy, for `perfmodel recommend`:

- **exclude the k slowest workers**: the same strategy simulated on the N − k fastest (the k
  devices stay idle); `exclusions` lists the k worth trying, one per speed level.
- **synchronous PS with b backup workers** (Chen et al. 2016, "Revisiting distributed
  synchronous SGD"): every worker computes, the server applies the average of the first
  N − b gradients to arrive and drops the rest; the late workers restart on the new version.
  A step then waits for the (N − b)-th fastest worker instead of the slowest. Modelled
  analytically around the simulator: sync-ps simulated on the N − b fastest workers gives the
  communication of N − b pushes arriving together, and its compute wait is corrected from
  E[max of those N − b] to E[(N − b)-th order statistic of all N], both drawn from the
  simulator's own step-noise model (perfmodel/sim/compute.py StepNoise) with an explicit
  generator. With exponential compute times the k-th order statistic of N has mean
  Σ_{i=N−k+1}^{N} 1/(iμ) and the maximum H_N/μ (tests/test_stragglers.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import StepNoise, ps_worker_seconds
from perfmodel.sim.scenario import Scenario

ORDER_DRAWS = 4000          # steps drawn for an order statistic's mean (SE ≈ 1 % of it)
BACKUP_STREAM = 7           # generator stream of the draws, apart from the simulation's


def fastest(scenario: Scenario, keep: int) -> Scenario:
    """`scenario` on its `keep` fastest workers (ties: the lower index stays)."""
    if not 1 <= keep <= scenario.workers:
        raise PerfmodelError(f"cannot keep {keep} of {scenario.workers} workers")
    order = np.argsort(-scenario.speeds, kind="stable")[:keep]
    speeds = tuple(float(s) for s in scenario.speeds[np.sort(order)])
    return replace(scenario, workers=keep, speed=speeds if scenario.speed else ())


def exclusions(scenario: Scenario) -> list[int]:
    """How many slowest workers to leave out: one k per speed level below the fastest."""
    speeds = scenario.speeds
    ks = {int((speeds < level).sum()) for level in np.unique(speeds)}
    return sorted(k for k in ks if 0 < k < scenario.workers)


def order_statistic_mean(scenario: Scenario, k: int, *, draws: int = ORDER_DRAWS) -> float:
    """E[k-th smallest of one step's N compute-time multipliers] (1 = nominal step)."""
    if not 1 <= k <= scenario.workers:
        raise PerfmodelError(f"order statistic {k} of {scenario.workers} workers")
    noise = StepNoise(scenario, np.random.default_rng([scenario.seed, BACKUP_STREAM]))
    steps = np.sort(np.stack([noise.draw() for _ in range(draws)]), axis=1)
    return float(steps[:, k - 1].mean())


@dataclass(frozen=True, kw_only=True, slots=True)
class BackupStep:
    """Synchronous PS with `backups` of N workers' gradients dropped every step."""

    backups: int
    used_workers: int               # gradients averaged per step: N − b
    step_time_s: float
    throughput_samples_per_s: float
    compute_saved_s: float          # per step, against waiting for N − b fastest's maximum


def backup_step(scenario: Scenario, backups: int, step_time_fastest_s: float) -> BackupStep:
    """The step of sync PS with `backups` backup workers, from `step_time_fastest_s`: the
    simulated sync-ps step on fastest(scenario, N − b)."""
    n = scenario.workers
    if not 1 <= backups < n:
        raise PerfmodelError(f"backup workers must be 1..{n - 1} of {n}, got {backups}")
    used = n - backups
    nominal = ps_worker_seconds(scenario.cluster, scenario.workload, scenario.batch_size)
    kept = fastest(scenario, used)
    saved = nominal * (order_statistic_mean(kept, used)
                       - order_statistic_mean(scenario, used))
    step = step_time_fastest_s - saved
    return BackupStep(backups=backups, used_workers=used, step_time_s=step,
                      throughput_samples_per_s=used * scenario.batch_size / step,
                      compute_saved_s=saved)
