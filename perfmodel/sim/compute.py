"""Compute time of a worker's units, and the per-step noise that makes workers differ.

Time of one unit pass, a roofline per op class (llm-analysis/Calculon style, efficiencies
stored in the cluster profile):

    overhead + kernels x launch                       (dispatch)
    + matmul FLOPs / (peak[precision] x efficiency(FLOPs))   (matmul, conv, attention)
    + other bytes / (HBM bandwidth x memory_efficiency)      (norms, activations, elementwise)

Backward has backward_flops_ratio x the FLOPs, backward_bytes_ratio x the bytes and twice
the kernels; a unit under activation checkpointing replays its forward in its backward. The
optimizer step is memory-bound traffic over its state (optimizer_GBps).
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


def pass_seconds(cluster: ClusterProfile, flops: float, precision_key: str,
                 moved_bytes: float = 0.0, kernels: float = 0.0,
                 precision: str | None = None) -> float:
    """Seconds for one unit pass of `flops` matmul FLOPs, `moved_bytes` bytes of memory-bound
    ops and `kernels` kernel launches on one device; `precision` (the workload's, e.g.
    bf16-mixed) picks the profile's own curve and kernel cost where one was fitted."""
    c = cluster.compute
    peak = cluster.device.peak_TFLOPS.get(precision_key, cluster.device.peak_TFLOPS["fp32"])
    seconds = (c.overhead_us_per_unit + kernels * c.launch_us(precision)) * 1e-6
    if flops > 0:
        seconds += flops / (peak * 1e12 * c.efficiency(flops, precision))
    if moved_bytes > 0 and c.memory_efficiency > 0:
        seconds += moved_bytes / (cluster.device.memory_bandwidth_GBps * 1e9
                                  * c.memory_efficiency)
    return seconds


def in_flight_fraction(comm_s: float, overlapped_s: float) -> float:
    """Share of the overlapped passes' time during which communication is in flight:
    the collectives' total seconds over the passes' seconds, at most 1."""
    return min(1.0, comm_s / overlapped_s) if overlapped_s > 0 else 0.0


def unit_times(cluster: ClusterProfile, workload: Workload, batch_size: int,
               optimizer_param_fraction: float = 1.0,
               overlapped: tuple[str, ...] = (), in_flight: float = 1.0,
               busy: float = 1.0) -> UnitTimes:
    """Per-unit forward and backward seconds for `batch_size` samples on one device.

    `optimizer_param_fraction` is the share of parameters this worker updates
    (1 for DDP, 1/N for FSDP, 0 for a PS worker whose server applies the update).
    Passes named in `overlapped` ("forward", "backward") overlap communication for the
    share `in_flight` of their time (in_flight_fraction) and are stretched by
    1 + (compute.overlap_slowdown - 1) x in_flight: compute runs slower only while NCCL
    kernels share its SMs and HBM (Lee, Phanishayee & Mahajan 2025, arXiv:2507.03114).
    `busy` processes share the node's compute cores (a CPU host): every pass and the
    optimizer step are stretched by `cluster.compute_share(busy, workload)` (1 on a GPU).
    Every pass is also x the workload's whole-step factor (`Compute.whole_step`: a whole
    step's passes over their sum unit by unit).
    """
    key = workload.precision_spec.compute_key
    ratio, bytes_ratio = cluster.compute.backward_flops_ratio, cluster.compute.backward_bytes_ratio
    scale = workload.element_bytes / workload.activation_element_bytes
    slow = 1.0 + (cluster.compute.overlap_slowdown - 1.0) * min(max(in_flight, 0.0), 1.0)
    whole = cluster.compute.whole_step(workload.name)
    over = {p: slow if p in overlapped else 1.0 for p in ("forward", "backward")}
    stretch = {p: whole * over[p] for p in over}
    fwd = stretch["forward"] * np.array(
        [pass_seconds(cluster, u.forward_flops_per_sample * batch_size, key,
                      scale * u.forward_bytes_per_sample * batch_size, u.forward_kernels,
                      workload.precision)
         for u in workload.units])
    bwd = stretch["backward"] * np.array(
        [pass_seconds(cluster, ratio * u.forward_flops_per_sample * batch_size, key,
                      bytes_ratio * scale * u.forward_bytes_per_sample * batch_size,
                      2 * u.forward_kernels, workload.precision)
         for u in workload.units])
    # Activation checkpointing replays a checkpointed unit's forward inside its backward.
    recompute = np.array([workload.checkpointed(i) for i in range(len(workload.units))])
    bwd = bwd + stretch["backward"] / stretch["forward"] * fwd * recompute
    # A CPU host's whole step streams each unit's weights from memory (weights_streamed_s),
    # beside the whole-step factor; GPUs skip it (the predict path stays as it was)
    if cluster.compute.weight_stream_GBps > 0:
        stream_f, stream_b = weights_streamed_s(cluster, workload)
        fwd = fwd + over["forward"] * stream_f
        bwd = bwd + over["backward"] * stream_b
    share = cluster.compute_share(busy, workload.name)
    return UnitTimes(share * fwd, share * bwd,
                     share * optimizer_seconds(cluster, workload, optimizer_param_fraction))


def weights_streamed_s(cluster: ClusterProfile, workload: Workload
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per unit of moving its weights through memory in a whole
    step: forward reads the parameters, backward reads them again and writes their
    gradients, at `compute.weight_stream_GBps` (a CPU host's calibration writes its
    optimizer rate there, the same memory-bound traffic); zero where that is 0 (GPUs,
    profiler-trace fits, whose op timings already hold it).

    Why. The compute fit times each unit apart, many times over, so a unit's weights sit in
    the cache; a whole step cycles the whole model through it (the mlp: 12.7 MB of weights,
    as much of gradients, beside the momentum, against a 32 MiB L3 two ranks share), so
    they come from memory again every step: a cost a step that does not grow with the
    batch, which the whole-step factor, a multiplier fitted at one batch, cannot carry.
    Timed here (2026-12-05, one process, one thread, pinned, idle host): the mlp's whole
    forward + backward took 3.5, 4.0 and 4.3 ms longer than its units timed apart at batch
    16, 32 and 64, where 3 x 12.7 MB at the fitted optimizer rate (13.1 GB/s) is 2.9 ms;
    cnn-small has a fifth of the weights."""
    zero = np.zeros(len(workload.units))
    rate = cluster.compute.weight_stream_GBps * 1e9
    if rate <= 0:
        return zero, zero
    p = workload.precision_spec
    params = np.array([u.params for u in workload.units], dtype=float)
    return params * p.param_bytes / rate, params * (p.param_bytes + p.grad_bytes) / rate


def optimizer_seconds(cluster: ClusterProfile, workload: Workload, param_fraction: float) -> float:
    """The optimizer step over `param_fraction` of the parameters: memory-bound, every byte of
    model state (params, grads, fp32 master, optimizer moments: 16 per param for mixed-precision
    Adam) touched at `compute.optimizer_GBps`. DDP's step (fraction 1), FSDP's shard (1/N) and a
    parameter server's shard are charged alike."""
    opt_bytes = workload.model_state_bytes_per_param * workload.params * param_fraction
    return opt_bytes / (cluster.compute.optimizer_GBps * 1e9)


def ps_worker_seconds(cluster: ClusterProfile, workload: Workload, batch_size: int) -> float:
    """A parameter-server worker's nominal compute of one step: forward + backward (no
    optimizer: the server applies) and its own CPU work (`ps_worker_host_seconds`). In a timed
    wait the harness pays that CPU work back from the sleeps (measure/timed_wait.py), so only
    the passes are left here; what the work still costs there, the wait for a core, is the
    PS simulation's (perfmodel/sim/ps.py, `_sharing_stretch`)."""
    passes = unit_times(cluster, workload, batch_size, optimizer_param_fraction=0).step_s
    if not cluster.compute_occupies_cores:
        return passes
    return passes + ps_worker_host_seconds(cluster, workload)


def ps_worker_host_seconds(cluster: ClusterProfile, workload: Workload) -> float:
    """A PS worker's own CPU work a step beside its passes (measure/runs/ps.py `work`): the
    pulled flat parameters copied into the model's parameters and the gradients
    concatenated into the flat push buffer, one read and write of their bytes each at the
    host's copy rate (compute.copy_Bps), plus what a CPU host's calibration measured beyond
    that for the workload (compute.ps_worker_extra_ms); a timed wait also writes every
    gradient as zeros (measure/timed_wait.py), one more pass over the gradient bytes."""
    p = workload.precision_spec
    copies = workload.params * (p.param_bytes + p.grad_bytes)
    if cluster.timed_wait:
        copies += workload.params * p.grad_bytes
    return copies / cluster.compute.copy_Bps() + cluster.compute.ps_worker_extra_s(workload.name)


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
