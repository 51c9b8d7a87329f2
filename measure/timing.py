"""Stragglers and time on the device, for every training run.

Stragglers: a worker of relative speed s < 1 sleeps compute_s·(1/s − 1) after each step's
compute (forward + backward), so its compute takes 1/s times as long and its peers really
wait for it. The sleep is counted in that worker's compute_s.

Timing: `DeviceClock` marks "when the device reached this point": time.perf_counter on CPU,
where every op is synchronous, and CUDA events on GPU.

Also the robust summaries of repeated timings (median and IQR, as torch.utils.benchmark),
a checksum of parameters (replicas that must agree) and the slowest rank's time.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Straggler:
    """Makes a worker of relative speed `speed` take 1/speed times as long to compute."""

    speed: float

    def delay(self, compute_s: float) -> float:
        """Sleep compute_s·(1/speed − 1); return the seconds slept."""
        extra_s = compute_s * (1.0 / self.speed - 1.0)
        if extra_s <= 0:
            return 0.0
        start = time.perf_counter()
        time.sleep(extra_s)
        return time.perf_counter() - start


class DeviceClock:
    """Timestamps of when the device reached a point of the program (CPU: perf_counter;
    CUDA: an event recorded on the current stream)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def median_iqr(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range) as torch.utils.benchmark reports them."""
    q1, median, q3 = np.percentile(np.asarray(samples, dtype=float), [25, 50, 75])
    return float(median), float(q3 - q1)


def param_checksum(tensors: list[torch.Tensor]) -> tuple[float, int]:
    """(float64 sum of all values, 48-bit hash of their bytes): equal hashes = identical bits."""
    digest = hashlib.sha256()
    total = 0.0
    for t in tensors:
        t = t.detach().to("cpu", torch.float32).contiguous()
        total += float(t.double().sum())
        digest.update(t.numpy().tobytes())
    return total, int(digest.hexdigest()[:12], 16)


def allreduce_max(value: float, device: str) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
