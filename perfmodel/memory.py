"""Peak memory per device, by part (ZeRO, Rajbhandari et al. 2020; PyTorch FSDP, VLDB 2023)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float          # optimizer state plus fp32 master weights
    activations_bytes: float
    comm_buffers_bytes: float       # DDP buckets, FSDP unsharded units, PS copies
    framework_bytes: float          # CUDA context, allocator reserve
    capacity_bytes: float

    @property
    def peak_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.comm_buffers_bytes + self.framework_bytes)

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity_bytes
