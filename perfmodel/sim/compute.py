"""Compute time of a worker's units, and the per-step noise that makes workers differ.

Time of one unit pass = overhead + FLOPs / (peak x efficiency(FLOPs)), the roofline-style
model of llm-analysis/Calculon with the efficiency curve stored in the cluster profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cluster import ClusterProfile
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import Workload


@dataclass(frozen=True, slots=True)
class UnitTimes:
    """Nominal (speed 1, no jitter) seconds per unit, in forward order."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    optimizer_s: float          # optimizer step over this worker's share of the parameters

    @property
    def step_s(self) -> float:
        return float(self.forward_s.sum() + self.backward_s.sum() + self.optimizer_s)


def pass_seconds(cluster: ClusterProfile, flops: float, precision_key: str) -> float:
    """Seconds for one unit pass of `flops` FLOPs on one device."""
    peak = cluster.device.peak_TFLOPS.get(precision_key, cluster.device.peak_TFLOPS["fp32"])
    overhead = cluster.compute.overhead_us_per_unit * 1e-6
    if flops <= 0:
        return overhead
    return overhead + flops / (peak * 1e12 * cluster.compute.efficiency(flops))


def unit_times(cluster: ClusterProfile, workload: Workload, batch_size: int,
               optimizer_param_fraction: float = 1.0,
               overlapped: tuple[str, ...] = ()) -> UnitTimes:
    """Per-unit forward and backward seconds for `batch_size` samples on one device.

    `optimizer_param_fraction` is the share of parameters this worker updates
    (1 for DDP, 1/N for FSDP, 0 for a PS worker whose server applies the update).
    Passes named in `overlapped` ("forward", "backward") run while communication is in
    flight and are stretched by the profile's calibrated `compute.overlap_slowdown`.
    """
    key = workload.precision_spec.compute_key
    ratio = cluster.compute.backward_flops_ratio
    stretch = {p: cluster.compute.overlap_slowdown if p in overlapped else 1.0
               for p in ("forward", "backward")}
    fwd = stretch["forward"] * np.array(
        [pass_seconds(cluster, u.forward_flops_per_sample * batch_size, key)
         for u in workload.units])
    bwd = stretch["backward"] * np.array(
        [pass_seconds(cluster, ratio * u.forward_flops_per_sample * batch_size, key)
         for u in workload.units])
    return UnitTimes(fwd, bwd, optimizer_seconds(cluster, workload, optimizer_param_fraction))


def optimizer_seconds(cluster: ClusterProfile, workload: Workload, param_fraction: float) -> float:
    """The optimizer step over `param_fraction` of the parameters: memory-bound, every byte of
    model state (params, grads, fp32 master, optimizer moments: 16 per param for mixed-precision
    Adam) touched at `compute.optimizer_GBps`. DDP's step (fraction 1), FSDP's shard (1/N) and a
    parameter server's shard are charged alike."""
    opt_bytes = workload.model_state_bytes_per_param * workload.params * param_fraction
    return opt_bytes / (cluster.compute.optimizer_GBps * 1e9)


class StepNoise:
    """Per-worker multipliers on a step's compute time: 1/speed x a jitter draw of mean 1."""

    def __init__(self, scenario: Scenario, rng: np.random.Generator):
        self.slowdown = 1.0 / scenario.speeds
        self.kind, self.cv, self.rng = scenario.jitter, scenario.cv, rng

    def draw(self, workers: np.ndarray | None = None) -> np.ndarray:
        """One step's multipliers for `workers` (indices; default all)."""
        slow = self.slowdown if workers is None else self.slowdown[workers]
        n = slow.shape[0]
        if self.kind == "exponential":
            return slow * self.rng.exponential(1.0, n)
        if self.cv == 0.0:
            return slow.copy()
        sigma2 = np.log1p(self.cv**2)          # lognormal with mean 1 and this CV
        return slow * self.rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), n)
