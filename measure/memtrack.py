"""Peak memory of one rank during training steps, split into the parts of the memory model
(params, grads, optimizer state, activations, other), and which method measured it.

- "cuda.max_memory_allocated": on CUDA, the caching allocator's peak over the measured steps
  (its peak statistic reset before each step). Params, grads and optimizer state are counted
  from the live tensors after a step, activations as the bytes autograd saved for backward
  (`torch.autograd.graph.saved_tensors_hooks`), and other = peak − all of those.
- "MemTracker" / "FSDPMemTracker": on CPU, where torch keeps no allocator statistics,
  PyTorch's own trackers (`torch.distributed._tools.mem_tracker`, `fsdp2_mem_tracker`): a
  TorchDispatchMode that sees every tensor storage created and freed and categorises it.
  The fields are the categories at the moment of the total peak, so they add up to
  peak_bytes. MemTracker: params = Parameter + Buffer, grads = Gradient, optimizer = Optstate,
  activations = Activation, other = Temp (backward temporaries, DDP buckets) + Other.
  FSDPMemTracker: params = Sharded Param + Buffer, grads = Sharded Grad, optimizer = OptState,
  activations = Activation, other = unsharded params and grads, all-gather and reduce-scatter
  buffers, Temp and Inputs. `reset_mod_stats()` is called between steps.
- "live-storage-count": the fallback when a tracker fails: params + grads + optimizer state
  counted from the live tensors plus the saved activations; peak_bytes is their sum (an upper
  bound: in a real step some activations are freed before all gradients exist).

The tracker slows every op down, so the measured steps are extra steps after the timed ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# Category names of MemTracker / FSDPMemTracker (torch/distributed/_tools) -> our parts.
TRACKER_PARTS = {
    "Parameter": "params", "Buffer": "params", "Sharded Param": "params",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations",
}   # everything else (Unsharded Param/Grad, Temp, All Gather, ...) is "other"
PARTS = ("params", "grads", "optimizer", "activations", "other")


def measure_memory(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   step: Callable[[], Any], *, device: str, steps: int = 2,
                   extra: Iterable[torch.Tensor] = ()) -> dict[str, Any]:
    """Run `step` `steps` times and return the memory record's fields.

    `extra`: buffers outside the model and optimizer (e.g. a PS worker's flat gradient),
    counted as other.
    """
    extra = list(extra)
    if device.startswith("cuda"):
        return _cuda_peak(model, optimizer, step, steps, extra)
    fsdp = _is_fsdp(model)
    name = "FSDPMemTracker" if fsdp else "MemTracker"
    try:
        return _tracker_peak(model, optimizer, step, steps, extra, fsdp)
    except Exception as e:  # noqa: BLE001 - any tracker failure falls back to counting
        log.warning("%s failed (%s: %s); counting live storages instead",
                    name, type(e).__name__, e)
        fields = _live_count(model, optimizer, step, extra)
        fields["method"] = f"live-storage-count ({name} failed: {type(e).__name__})"
        return fields


def _tracker_peak(model, optimizer, step, steps, extra, fsdp: bool) -> dict[str, Any]:
    if fsdp:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        tracker = FSDPMemTracker(model, optimizer)
    else:
        from torch.distributed._tools.mem_tracker import MemTracker
        tracker = MemTracker()
        tracker.track_external(model, *([optimizer] if optimizer is not None else []))
    if extra:
        # FSDPMemTracker.track_external is a no-op; its base class's method tracks them.
        from torch.distributed._tools.mem_tracker import MemTracker
        MemTracker.track_external(tracker, *extra)
    with tracker:
        for _ in range(steps):
            step()
            tracker.reset_mod_stats()
    peak, parts = snapshot_parts(tracker.get_tracker_snapshot("peak"))
    if peak == 0:
        raise RuntimeError("the tracker saw no memory at all")
    return _fields(peak, parts, "FSDPMemTracker" if fsdp else "MemTracker")


def _cuda_peak(model, optimizer, step, steps, extra) -> dict[str, Any]:
    peak = 0
    activations = 0
    for i in range(steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if i == 0:
            activations = saved_activation_bytes(step)
        else:
            step()
        torch.cuda.synchronize()
        peak = max(peak, torch.cuda.max_memory_allocated())
    parts = _live_parts(model, optimizer, extra)
    parts["activations"] = activations
    parts["other"] += max(0, peak - sum(parts.values()))
    return _fields(peak, parts, "cuda.max_memory_allocated")


def _live_count(model, optimizer, step, extra) -> dict[str, Any]:
    activations = saved_activation_bytes(step)
    parts = _live_parts(model, optimizer, extra)
    parts["activations"] = activations
    return _fields(sum(parts.values()), parts, "live-storage-count")


def live_memory(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                extra: Iterable[torch.Tensor] = ()) -> dict[str, Any]:
    """The memory record for a process that runs no backward (a PS server): its live
    params, grads, optimizer state and `extra` buffers, counted now."""
    parts = _live_parts(model, optimizer, list(extra))
    return _fields(sum(parts.values()), parts, "live-storage-count")


def _fields(peak: int, parts: dict[str, int], method: str) -> dict[str, Any]:
    return {"peak_bytes": int(peak), **{f"{k}_bytes": int(v) for k, v in parts.items()},
            "method": method}


# ---------------------------------------------------------------- counting live tensors


def saved_activation_bytes(step: Callable[[], Any]) -> int:
    """Run `step` once and return the bytes of the storages autograd saved for backward,
    each storage once, parameters excluded (as measure/make_workloads.py counts them)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):
            storage = _local(t).untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def _live_parts(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                extra: list[torch.Tensor]) -> dict[str, int]:
    params = list(model.parameters()) + list(model.buffers())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    state = [v for s in (optimizer.state.values() if optimizer is not None else ())
             for v in s.values() if isinstance(v, torch.Tensor)]
    return {"params": storage_bytes(params), "grads": storage_bytes(grads),
            "optimizer": storage_bytes(state), "activations": 0,
            "other": storage_bytes(extra)}


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = _local(t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def snapshot_parts(snapshot: dict) -> tuple[int, dict[str, int]]:
    """(peak bytes, bytes by part) of a MemTracker/FSDPMemTracker "peak" snapshot."""
    parts = dict.fromkeys(PARTS, 0)
    peak = 0
    for categories in snapshot.values():
        for key, nbytes in categories.items():
            name = key.value if isinstance(key, Enum) else str(key)
            if name == "Total":
                peak += nbytes
            else:
                parts[TRACKER_PARTS.get(name, "other")] += nbytes
    return peak, parts
