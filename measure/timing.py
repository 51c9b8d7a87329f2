"""Stragglers and time on the device, for every training run.

Stragglers: a worker of relative speed s < 1 sleeps compute_s·(1/s − 1) after each step's
compute (forward + backward), so its compute takes 1/s times as long and its peers really
wait for it. The sleep is counted in that worker's compute_s. On a CPU host a DDP or FSDP
straggler sleeps inside its passes instead (`SlowUnits`): after each unit's forward and
before each unit's backward, that pass's time·(1/s − 1), so its gradients become ready as
late as a slower device's would, and its collectives overlap its longer backward as they
would there (one sleep after backward() comes after every DDP all-reduce has finished).

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


class SlowUnits:
    """A slower device on a CPU host: each unit of `units` (the model's top-level modules)
    sleeps its own pass's time x (1/speed − 1) after its forward and before its backward.

    A unit's backward time is known only once it has run, so its sleep uses the time it took
    in the previous step (the time between the gradient reaching its output and reaching the
    unit before it), and twice its forward time until then and for the first unit, whose
    backward nothing after it marks (backward ≈ 2 x forward in FLOPs, as the model assumes).
    `slept_s` counts this step's sleeps (reset by `start_step`)."""

    def __init__(self, units: list[torch.nn.Module], speed: float):
        self.factor = 1.0 / speed - 1.0
        self.slept_s = 0.0
        self.forward_s = [0.0] * len(units)
        self.backward_s: list[float | None] = [None] * len(units)
        self._start = 0.0
        self._reached: tuple[int, float] | None = None   # (unit, when its backward began)
        for i, unit in enumerate(units):
            unit.register_forward_pre_hook(self._before_forward)
            unit.register_forward_hook(lambda m, a, out, i=i: self._after_forward(i, out))

    def start_step(self) -> None:
        self.slept_s, self._reached = 0.0, None

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            start = time.perf_counter()
            time.sleep(seconds)
            self.slept_s += time.perf_counter() - start

    def _before_forward(self, module, args) -> None:
        self._start = time.perf_counter()

    def _after_forward(self, i: int, output):
        self.forward_s[i] = time.perf_counter() - self._start
        self._sleep(self.forward_s[i] * self.factor)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad, i=i: self.backward_reached(i))

    def backward_reached(self, i: int) -> None:
        """The gradient reached unit i's output: unit i + 1's backward has just ended."""
        now = time.perf_counter()
        if self._reached is not None and self._reached[0] == i + 1:
            self.backward_s[i + 1] = now - self._reached[1]
        previous = self.backward_s[i] if i > 0 else None
        self._sleep(self.factor * (previous if previous is not None
                                   else 2.0 * self.forward_s[i]))
        self._reached = (i, time.perf_counter())


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
