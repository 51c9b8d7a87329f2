"""Peak memory per device, by part, for DDP, FSDP and parameter-server training.

Sources:
- ZeRO (Rajbhandari et al. 2020, sec. 3.1 and 5): model state per replica is
  (param + grad + master + optimizer) bytes per parameter Ψ; mixed-precision Adam
  2 + 2 + (4 + 8) = 16Ψ, fp32 Adam 4 + 4 + 8 = 16Ψ. Full sharding divides it by N.
- PyTorch FSDP (Zhao et al., VLDB 2023) and the FSDP2 source in torch 2.13
  (torch/distributed/fsdp/_fully_shard/): a wrapped unit's parameters are all-gathered into
  an unsharded buffer before use, the next unit is prefetched, and a unit's unsharded gradient
  lives until its reduce-scatter.
- DDP in torch 2.13 (torch/csrc/distributed/c10d/reducer.cpp, Reducer::initialize_buckets:
  "Allocate the bucket's flattened `gradients` tensor", `bucket.gradients = at::empty(...)`;
  torch/nn/parallel/distributed.py, `gradient_as_bucket_view`: "the saved memory size will be
  equal to the total gradients size"): with the default gradient_as_bucket_view=False the
  buckets are flat tensors covering every gradient, one extra gradient-sized copy.

Accounting conventions (the same for every strategy):
- `params_bytes` is the stored copy (4 bytes under fp32/tf32 and autocast, 2 under pure bf16).
- `optimizer_bytes` holds pure bf16's fp32 master weights *and* the optimizer state
  (momentum; Adam's two moments), as ZeRO's "K" term does.
- Activations = Σ unit.activation_bytes_per_sample × batch size; FSDP does not shard them.
- `framework_bytes` is the profile's device.framework_overhead_GiB (CUDA context, workspaces);
  capacity is the device's less its allocator reserve, so a peak over capacity is a peak
  over usable memory = capacity - context - allocator reserve.

This is an analytic peak, not an allocator trace: it ignores fragmentation, the allocator's
caching, temporary tensors inside kernels and collectives, and padding of shards to a
multiple of N. The peak is taken at two moments of a step (_peak): the start of backward
(no gradients, zero_grad(set_to_none=True)) and the end of backward (no activations).

Checked against torch 2.13's own trackers on CPU (8 x Linear(1024, 1024), fp32 Adam, batch
64; `MemTracker` with DDP on 1 gloo rank, `FSDPMemTracker` with FSDP2 under FakeTensorMode):
DDP 162 MiB modelled vs 168 tracked; full-shard 142/46/30 MiB vs 144/47/32 at 1/4/8 ranks;
grad-op 70/54 vs 66/54 at 4/8 ranks, but 166 vs 144 at 1 rank (see fsdp_memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.errors import PerfmodelError
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import OPTIMIZER_STATE_BYTES

FSDP_VARIANTS = ("full-shard", "grad-op")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """The parts alive at the peak (`phase` says when it is)."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float          # optimizer state plus fp32 master weights
    activations_bytes: float        # saved for backward (checkpointed units: their input)
    comm_buffers_bytes: float       # DDP buckets, FSDP unsharded units, PS copies
    framework_bytes: float          # CUDA context, allocator reserve
    capacity_bytes: float
    overhead_bytes: float = 0.0     # measured excess over the analytic parts (calibration)
    cast_cache_bytes: float = 0.0   # autocast's bf16 weight copies during the step
    transient_bytes: float = 0.0    # loss gradient over the logits, backward temporaries
    phase: str = "end of backward"  # when the peak is: "start of backward" or this

    @property
    def peak_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.comm_buffers_bytes + self.framework_bytes
                + self.overhead_bytes + self.cast_cache_bytes + self.transient_bytes)

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity_bytes

    @property
    def model_state_bytes(self) -> float:
        """Params + grads + optimizer (with master weights): ZeRO's (2 + 2 + K)Ψ, or its share."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _with_overhead(m: MemoryBreakdown, scenario: Scenario) -> MemoryBreakdown:
    """Add the calibrated overhead: device.memory_overhead_fraction x the analytic parts
    (allocator rounding and caching, temporaries; 0 in spec-derived profiles)."""
    fraction = scenario.cluster.device.memory_overhead_fraction
    return replace(m, overhead_bytes=fraction * (m.peak_bytes - m.framework_bytes))


@dataclass(frozen=True, slots=True)
class _Activations:
    kept_bytes: float           # saved for backward at its start (checkpointed: inputs only)
    cache_bytes: float          # autocast weight copies of the units not checkpointed
    loss_bytes: float           # fp32 gradient of the log-softmax and of its input
    backward_bytes: float       # the worst unit's recomputed activations + gradient temporaries


def _activations(scenario: Scenario, autocast: bool) -> _Activations:
    """What the forward leaves for backward, and the transient peaks of backward.

    Per unit the workload file has the bytes autograd saves and the unit's output, counted
    at the file's precision (bf16 parameters and inputs, as FSDP's param_dtype computes) and
    again under torch.autocast with fp32 parameters (DDP, PS). fp32/tf32 doubles bytes counted
    at 2 per element; pure bf16 halves bytes counted at 4.
    - A checkpointed unit keeps only its input (the previous unit's output); its forward is
      replayed in its backward, so its activations exist again, one unit at a time.
    - The loss: cross-entropy upcasts the last unit's output to fp32; in backward the fp32
      gradient of the log-softmax's output and of its input (2 x 4 bytes an element, the
      4·b·s·V of an LM head twice) are alive with everything saved (MemTracker's "Temp").
    - A unit's backward holds the gradient of its output and of its input (2 x its output).
    - Dropout masks (workload files' dropout_mask_bytes_per_sample): PyTorch's native_dropout,
      what F.dropout runs on a GPU, saves a bool mask, 1 byte an element whatever the
      precision (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable; the CUDA
      kernel's mask is kBool); kept with the unit's activations, replayed with a
      checkpointed unit's forward.
    """
    w, b = scenario.workload, scenario.batch_size
    use_autocast = autocast and w.precision_spec.autocast and any(
        u.autocast_activation_bytes_per_sample for u in w.units)
    if use_autocast:
        saved = [u.autocast_activation_bytes_per_sample for u in w.units]
        out = [u.autocast_output_bytes_per_sample for u in w.units]
    else:
        scale = w.precision_spec.compute_bytes / w.activation_element_bytes
        saved = [scale * u.activation_bytes_per_sample for u in w.units]
        out = [scale * u.output_bytes_per_sample for u in w.units]
    # Dropout's bool masks: 1 byte an element at every precision (not scaled).
    saved = [s + u.dropout_mask_bytes_per_sample for s, u in zip(saved, w.units, strict=True)]
    kept = cache = 0.0
    backward = 0.0
    for i, u in enumerate(w.units):
        if w.checkpointed(i):
            kept += out[i - 1] * b
            backward = max(backward, (saved[i] + 2 * out[i]) * b)
        else:
            kept += saved[i] * b
            cache += u.autocast_weight_cache_bytes if use_autocast else 0.0
            backward = max(backward, 2 * out[i] * b)
    last = w.units[-1].output_bytes_per_sample / w.activation_element_bytes
    return _Activations(kept, cache, 2 * 4 * last * b, backward)


def _peak(scenario: Scenario, *, params: float, optimizer: float, grads: float,
          start_buffers: float, end_buffers: float, autocast: bool) -> MemoryBreakdown:
    """The larger of two moments of a step (zero_grad(set_to_none=True), torch's default):

    - start of backward: no gradients yet; parameters, optimizer state, everything the
      forward saved, autocast's weight cache and the loss's fp32 gradients (or, if larger, a
      checkpointed unit replaying its forward) and the buffers alive then;
    - end of backward: every gradient exists, the activations are freed.
    """
    device = scenario.cluster.device
    a = _activations(scenario, autocast)
    common = {"params_bytes": params, "optimizer_bytes": optimizer,
              "framework_bytes": device.framework_overhead_GiB * 2**30,
              # What the allocator can hand out; the context is charged in the peak, so a
              # peak over this is a peak over usable memory (capacity - context - reserve).
              "capacity_bytes": device.allocatable_bytes}
    start = MemoryBreakdown(grads_bytes=0.0, activations_bytes=a.kept_bytes,
                            cast_cache_bytes=a.cache_bytes,
                            transient_bytes=max(a.loss_bytes, a.backward_bytes),
                            comm_buffers_bytes=start_buffers, phase="start of backward",
                            **common)
    end = MemoryBreakdown(grads_bytes=grads, activations_bytes=0.0,
                          comm_buffers_bytes=end_buffers, **common)
    return _with_overhead(max(start, end, key=lambda m: m.peak_bytes), scenario)


def _optimizer_bytes_per_param(scenario: Scenario) -> int:
    """fp32 master weights (pure bf16 only) + optimizer state, bytes per parameter."""
    w = scenario.workload
    return w.precision_spec.master_bytes + OPTIMIZER_STATE_BYTES[w.optimizer]


def ddp_memory(scenario: Scenario, bucket_cap_MiB: float,
               first_bucket_MiB: float) -> MemoryBreakdown:
    """Peak bytes of one DDP replica: full model state + one flat copy of every gradient.

    The reducer's buckets partition all gradients (in the gradients' dtype: fp32 under
    autocast), so their total is the gradient size whatever the cap: `bucket_cap_MiB` and
    `first_bucket_MiB` are checked but do not change the total. They are allocated when DDP
    is built and live all step. Assumes gradient_as_bucket_view=False (torch's default);
    with True the bucket copy would vanish. A bf16 compression hook casts a bucket for the
    wire only: the buckets stay fp32.
    """
    if bucket_cap_MiB <= 0 or first_bucket_MiB <= 0:
        raise PerfmodelError("DDP bucket sizes must be positive (torch defaults: 25 MiB cap, "
                             "1 MiB first bucket)")
    w = scenario.workload
    p = w.precision_spec
    bucket = w.params * p.grad_bytes
    return _peak(scenario, params=w.params * p.param_bytes,
                 optimizer=w.params * _optimizer_bytes_per_param(scenario),
                 grads=w.params * p.grad_bytes, start_buffers=bucket, end_buffers=bucket,
                 autocast=True)


def _largest_window(unit_params: list[int], window: int) -> int:
    """Most parameters in `window` consecutive units (units alive together under prefetch)."""
    window = min(window, len(unit_params))
    return max(sum(unit_params[i:i + window]) for i in range(len(unit_params) - window + 1))


def fsdp_memory(scenario: Scenario, variant: str, prefetch: int) -> MemoryBreakdown:
    """Peak bytes of one FSDP rank: model state / N + unsharded units + activations.

    full-shard (reshard_after_forward=True, ZeRO-3): the comm buffers hold the unsharded
    parameters of the 1 + `prefetch` consecutive units with the most parameters (the unit in
    use and those prefetched) plus the unsharded gradient of the largest unit before its
    reduce-scatter.

    grad-op (reshard_after_forward=False, ZeRO-2-like): parameters stay unsharded from
    forward through backward, so at the start of backward every unit's unsharded parameters
    are held, plus the unsharded gradient of the largest unit.

    At 1 worker the state is not divided (N = 1) and the unsharded buffers are still counted:
    FSDP2 in torch 2.13 copies the shard into a separate unsharded tensor even at world size 1
    (_fsdp_param_group.py, FSDPParamGroup.wait_for_unshard, `world_size == 1` branch), so
    FSDP at 1 worker is never reported smaller than the model state.

    Approximations: FSDP2 also briefly holds its flat all-gather output and reduce-scatter
    input next to the per-parameter tensors (a unit twice for a moment), which is not counted;
    shard padding to a multiple of N is ignored; activations are counted in full at the peak.
    grad-op overstates the peak by up to the sharded gradient bytes: in reality units reshard
    during backward while the sharded gradients fill in, so the two never peak together
    (about +15 % at 1 worker, negligible from 8 on).
    """
    if variant not in FSDP_VARIANTS:
        raise PerfmodelError(f"unknown FSDP variant '{variant}'; choose from "
                             f"{', '.join(FSDP_VARIANTS)}")
    if prefetch < 0:
        raise PerfmodelError(f"FSDP prefetch must be 0 or more units, got {prefetch}")
    w, n = scenario.workload, scenario.workers
    p = w.precision_spec
    unit_params = [u.params for u in w.units]
    if variant == "full-shard":
        unsharded_params = _largest_window(unit_params, 1 + prefetch)
    else:
        unsharded_params = w.params
    # Unsharded gradient of the largest unit in param_dtype, and its copy in reduce_dtype
    # when they differ (the reduce-scatter input).
    grad_buffer = max(unit_params) * (p.compute_bytes + (
        p.reduce_bytes if p.reduce_bytes != p.compute_bytes else 0))
    gathered = unsharded_params * p.compute_bytes
    return _peak(scenario, params=w.params * p.param_bytes / n,
                 optimizer=w.params * _optimizer_bytes_per_param(scenario) / n,
                 grads=w.params * p.grad_bytes / n,
                 start_buffers=gathered, end_buffers=gathered + grad_buffer, autocast=False)


def ps_memory(scenario: Scenario, servers: int = 1, *, shard_params: tuple[float, ...] = (),
              colocated: bool = False) -> dict[str, MemoryBreakdown]:
    """Peak bytes of a parameter-server worker and of the fullest server's device.

    Worker: full parameters and gradients, no optimizer state (the server applies the
    update), activations, and two flat buffers of the model: the gradient it sends and the
    parameters it receives (measured on CPU: one buffer undercounted a PS worker by 14-25 %).

    Server: the largest shard's parameters, fp32 master weights and optimizer state, an
    incoming gradient buffer and the flat parameter reply of that shard (`shard_params`,
    perfmodel/sim/psnet.py; default: `servers` even shards). It runs on the same kind of
    device as the workers (same capacity and framework overhead). Colocated, it shares a
    worker's device: that device holds the worker's parts plus the servers it hosts.

    Approximation: the server takes one push at a time (FIFO apply), so it holds a single
    incoming buffer; a server serving many concurrent pushes could hold more.
    """
    if servers < 1:
        raise PerfmodelError(f"a parameter server setup needs at least 1 server, got {servers}")
    w = scenario.workload
    p = w.precision_spec
    flat = w.params * (p.param_bytes + p.grad_bytes)        # flat send + receive
    worker = _peak(scenario, params=w.params * p.param_bytes, optimizer=0.0,
                   grads=w.params * p.grad_bytes, start_buffers=flat, end_buffers=flat,
                   autocast=True)
    common = {"framework_bytes": worker.framework_bytes, "capacity_bytes": worker.capacity_bytes}
    share = max(shard_params) if shard_params else w.params / servers
    hosted = -(-servers // scenario.workers) if colocated else 1    # servers on one device
    server = MemoryBreakdown(
        params_bytes=hosted * share * p.param_bytes,
        grads_bytes=0.0,
        optimizer_bytes=hosted * share * _optimizer_bytes_per_param(scenario),
        activations_bytes=0.0,
        comm_buffers_bytes=hosted * share * (p.grad_bytes + p.param_bytes),   # inbox + reply
        framework_bytes=common["framework_bytes"],
        capacity_bytes=common["capacity_bytes"],
    )
    if colocated:
        server = replace(server, params_bytes=server.params_bytes + worker.params_bytes,
                         grads_bytes=worker.grads_bytes,
                         activations_bytes=worker.activations_bytes,
                         cast_cache_bytes=worker.cast_cache_bytes,
                         transient_bytes=worker.transient_bytes, phase=worker.phase,
                         comm_buffers_bytes=server.comm_buffers_bytes
                         + worker.comm_buffers_bytes)
    return {"worker": worker, "server": _with_overhead(server, scenario)}
