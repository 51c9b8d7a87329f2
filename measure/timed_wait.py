"""Timed-wait compute: a worker that sleeps the calibrated compute time instead of computing.

Compute mode (config `compute_mode`): "real" trains the model. "timed-wait" stands in for a
GPU on a machine with fewer cores than workers: each unit's forward and backward become a
sleep of the seconds given in config `compute_wait_s` ({"forward": [per unit], "backward":
[per unit], "optimizer": s}, forward order; `perfmodel compare` computes them from the
calibrated profile), and the DDP/FSDP optimizer step a sleep of "optimizer" seconds. The
model keeps its real parameters, so gradients, buckets, all-gathers, reduce-scatters, PS
pushes and pulls, the server's apply and every synchronisation stay real; the sleeping
worker leaves its core free, as a GPU leaves the CPU (oversleep and the CPU work between
sleeps are paid back from later sleeps: `Sleeper`). Every parameter still gets a (zero)
gradient, made ready when its unit's backward sleep ends, so DDP's buckets fire and FSDP's
reduce-scatters run in the real order. Losses are 0 and accuracy is not evaluated (NaN);
DDP/FSDP memory records count the live params, grads and optimizer state (no tracker).
"""

from __future__ import annotations

import dataclasses
import time
import types
from dataclasses import dataclass
from typing import Any

import torch

from measure.models import ModelSpec
from perfmodel.errors import PerfmodelError


class Sleeper:
    """Timed-wait compute that adds up to the calibrated time, not to more.

    Two things would stretch a worker's emulated compute beyond the waits it is given: waking
    late from a sleep when the cores are busy, and the CPU work the worker does between its
    sleeps (autograd bookkeeping, writing the zero gradients, DDP copying them into buckets,
    a PS worker packing them) — work a GPU would do on the device, alongside its kernels.
    Both are counted as debt and slept less next time: oversleep from the wall clock, the CPU
    work from this thread's CPU time (`time.thread_time`, which excludes time spent blocked
    in communication, so waiting for peers is never paid back as compute). A worker whose
    CPU work exceeds its waits computes longer, as it must.
    """

    def __init__(self):
        self.debt_s = 0.0
        self.cpu_mark_s: float | None = None    # this thread's CPU time after the last sleep

    def sleep(self, seconds: float) -> None:
        if self.cpu_mark_s is not None:
            self.debt_s += max(time.thread_time() - self.cpu_mark_s, 0.0)
        want = seconds - self.debt_s
        if want <= 0:
            self.debt_s = -want
        else:
            start = time.perf_counter()
            time.sleep(want)
            self.debt_s = max(time.perf_counter() - start - want, 0.0)
        self.cpu_mark_s = time.thread_time()


@dataclass(frozen=True, kw_only=True)
class ComputeWait:
    """Seconds a timed-wait worker sleeps in place of computing (one step, speed 1)."""

    forward_s: tuple[float, ...]        # per unit, forward order
    backward_s: tuple[float, ...]       # per unit, forward order
    optimizer_s: float                  # the DDP/FSDP optimizer step (PS: the server's, real)
    sleeper: Sleeper = dataclasses.field(default_factory=Sleeper, compare=False)


def parse_compute_wait(value: Any) -> ComputeWait:
    """config `compute_wait_s` -> ComputeWait, refusing anything but seconds >= 0."""
    if not isinstance(value, dict) or not {"forward", "backward"} <= set(value):
        raise PerfmodelError("compute_mode 'timed-wait' needs config 'compute_wait_s' = "
                             "{\"forward\": [s per unit], \"backward\": [s per unit], "
                             "\"optimizer\": s}")
    lists = {}
    for key in ("forward", "backward"):
        v = value[key]
        if not isinstance(v, list) or not v or not all(_seconds(x) for x in v):
            raise PerfmodelError(f"config 'compute_wait_s.{key}' must be a list of seconds "
                                 f">= 0, one per unit, got {v!r}")
        lists[key] = tuple(float(x) for x in v)
    if len(lists["forward"]) != len(lists["backward"]):
        raise PerfmodelError("config 'compute_wait_s': forward and backward list "
                             f"{len(lists['forward'])} and {len(lists['backward'])} units")
    optimizer = value.get("optimizer", 0.0)
    if not _seconds(optimizer):
        raise PerfmodelError(f"config 'compute_wait_s.optimizer' must be seconds >= 0, "
                             f"got {optimizer!r}")
    return ComputeWait(forward_s=lists["forward"], backward_s=lists["backward"],
                       optimizer_s=float(optimizer))


def _seconds(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < float("inf")


class _WaitInBackward(torch.autograd.Function):
    """Identity in forward; sleeps `backward_s` when the gradient passes back through it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, backward_s: float, sleeper: Sleeper) -> torch.Tensor:
        ctx.backward_s, ctx.sleeper = backward_s, sleeper
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.sleeper.sleep(ctx.backward_s)
        return grad, None, None


def _waiting_forward(unit: torch.nn.Module, x: torch.Tensor, *, forward_s: float,
                     backward_s: float, sleeper: Sleeper) -> torch.Tensor:
    """A unit's forward in timed-wait mode: sleep, then a one-element output that depends on
    one element of every parameter, behind a node that sleeps `backward_s` in backward. So
    backward sleeps unit by unit in reverse order, and a unit's parameters get their (zero)
    gradients right after its sleep, when DDP and FSDP hooks fire as in real training."""
    sleeper.sleep(forward_s)
    h = x.reshape(-1)[:1].float()
    for p in unit.parameters():
        h = h + p.reshape(-1)[:1] * 0.0
    return _WaitInBackward.apply(h, backward_s, sleeper)


@dataclass(frozen=True)
class _TimedWaitBuild:
    """ModelSpec.build for timed-wait mode: the real model, each unit's forward replaced."""

    build_real: Any
    wait: ComputeWait

    def __call__(self) -> torch.nn.Sequential:
        model = self.build_real()
        units = list(model.children())
        if len(units) != len(self.wait.forward_s):
            raise PerfmodelError(f"config 'compute_wait_s' lists {len(self.wait.forward_s)} "
                                 f"units but the model has {len(units)}")
        self_wait = self.wait
        for unit, f, b in zip(units, self.wait.forward_s, self.wait.backward_s, strict=True):
            unit.forward = types.MethodType(
                lambda self, x, f=f, b=b: _waiting_forward(
                    self, x, forward_s=f, backward_s=b, sleeper=self_wait.sleeper), unit)
        return model


def timed_wait_spec(spec: ModelSpec, wait: ComputeWait) -> ModelSpec:
    """`spec` whose units sleep instead of computing (module docstring); same parameters."""
    def example_batch(batch_size: int, generator: torch.Generator):
        return torch.zeros(batch_size, 1), torch.zeros(batch_size, dtype=torch.long)

    return dataclasses.replace(
        spec, description=f"timed wait standing in for {spec.name}",
        build=_TimedWaitBuild(spec.build, wait), example_batch=example_batch,
        loss=lambda outputs, targets: outputs.sum())


def is_timed_wait(spec: ModelSpec) -> bool:
    return isinstance(spec.build, _TimedWaitBuild)
