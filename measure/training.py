"""Shared pieces of the real training runs: settings, data, model and optimizer, stragglers,
timing, and the data-parallel step loop that DDP and FSDP share.

- Data: the `mlp` workload trains on scikit-learn's bundled digits (1,797 8x8 images,
  Alpaydin & Kaynak 1998; `sklearn.datasets.load_digits`, no download) with one fixed 80/20
  train/test split; the other workloads use synthetic batches from the model's
  `example_batch`. Every rank draws its own batches from its own seeded generator.
- Stragglers: a worker of relative speed s < 1 sleeps compute_s·(1/s − 1) after each step's
  compute (forward + backward), so its compute takes 1/s times as long and its peers really
  wait for it. The sleep is counted in that worker's compute_s.
- Timing: `DeviceClock` marks "when the device reached this point": time.perf_counter on CPU,
  where every op is synchronous, and CUDA events on GPU.
- The step loop (`data_parallel_training`) per step: wall_s = compute_s + comm_wait_s, where
  comm_wait_s is the communication the training loop waited for, as the strategy's
  `CommMeter` defines it (see measure/runs/ddp.py and fsdp.py).
- Compute mode (config `compute_mode`): "real" trains the model. "timed-wait" stands in for a
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
import hashlib
import time
import types
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from measure.context import RunContext
from measure.memtrack import live_memory, measure_memory
from measure.models import MODELS, ModelSpec
from measure.models import make_optimizer as make_workload_optimizer
from perfmodel.errors import PerfmodelError

DIGITS_WORKLOAD = "mlp"             # the workload that trains on the real digits data
DIGITS_TEST_FRACTION = 0.2          # held-out share of the 1,797 digits images
DIGITS_SPLIT_SEED = 0               # fixed: every run is scored on the same test images
SYNTHETIC_TEST_SAMPLES = 256        # size of the synthetic held-out set
HELD_OUT_STREAM = 1_000_000         # generator stream of the held-out set (ranks use 0..)
MEMORY_STEPS = 2                    # extra steps measured under the memory tracker
COMPUTE_MODES = ("real", "timed-wait")


# ---------------------------------------------------------------- settings


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The training part of a run's config.json, checked."""

    kind: str
    workers: int                    # training workers (PS: the server is one rank more)
    workload: str
    batch_size: int                 # per worker
    steps: int                      # timed steps, after the warm-up
    warmup_steps: int
    seed: int
    speed: tuple[float, ...]        # relative speed per worker; 1.0 = full speed
    options: dict[str, Any]         # this kind's own options
    compute_mode: str = "real"      # "real" or "timed-wait" (module docstring)
    compute_wait: ComputeWait | None = None     # timed-wait: the seconds to wait

    @property
    def spec(self) -> ModelSpec:
        """The workload's model; in timed-wait mode, the same model with sleeping units."""
        if self.compute_wait is None:
            return MODELS[self.workload]
        return timed_wait_spec(MODELS[self.workload], self.compute_wait)

    @property
    def timed_wait(self) -> bool:
        return self.compute_wait is not None

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    def worker_speed(self, worker: int) -> float:
        return self.speed[worker] if self.speed else 1.0


def parse_settings(config: dict[str, Any], world_size: int) -> Settings:
    """Read and check the run's config; the world size must match the kind's process count."""
    kind = str(config.get("kind", ""))
    workload = str(config.get("workload", ""))
    if workload not in MODELS:
        raise PerfmodelError(f"unknown workload '{workload}'; known: {', '.join(MODELS)}")
    spec = MODELS[workload]
    workers = _int(config, "workers", world_size - 1 if kind == "ps" else world_size, 1)
    expected = workers + 1 if kind == "ps" else workers
    if world_size != expected:
        raise PerfmodelError(f"a {kind} run with {workers} workers needs {expected} processes, "
                             f"but torchrun started {world_size}")
    speed = tuple(float(s) for s in config.get("speed") or ())
    if speed and len(speed) != workers:
        raise PerfmodelError(f"speed lists {len(speed)} values but the run has {workers} "
                             "workers; give one relative speed per worker or none")
    if any(not s > 0 for s in speed):
        raise PerfmodelError(f"every relative speed must be positive, got {list(speed)}")
    options = (config.get("options") or {}).get(kind, {}) if kind else {}
    mode = config.get("compute_mode") or "real"
    if mode not in COMPUTE_MODES:
        raise PerfmodelError(f"config 'compute_mode' is '{mode}'; choose from: "
                             f"{', '.join(COMPUTE_MODES)}")
    wait = parse_compute_wait(config.get("compute_wait_s")) if mode == "timed-wait" else None
    return Settings(
        kind=kind, workers=workers, workload=workload,
        batch_size=_int(config, "batch_size", spec.batch_size, 1),
        steps=_int(config, "steps", 20, 1),
        warmup_steps=_int(config, "warmup_steps", 2, 0),
        seed=_int(config, "seed", 0, 0),
        speed=speed, options=dict(options), compute_mode=mode, compute_wait=wait)


def _int(config: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise PerfmodelError(f"config '{key}' must be a whole number, got {value!r}")
    if value < minimum:
        raise PerfmodelError(f"config '{key}' must be at least {minimum}, got {value}")
    return int(value)


# ---------------------------------------------------------------- timed-wait compute


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


# ---------------------------------------------------------------- model and optimizer


def build_model(spec: ModelSpec, seed: int, device: str) -> torch.nn.Sequential:
    """The workload's model with initial weights that depend on `seed` only, on every rank.

    The models initialise from torch's global generator, so it is seeded right here.
    """
    torch.manual_seed(seed)
    return spec.build().to(device)


def make_optimizer(spec: ModelSpec, params, lr: float | None = None) -> torch.optim.Optimizer:
    """The workload's optimizer (measure/models.py), optionally at another learning rate."""
    if lr is not None:
        spec = dataclasses.replace(spec, learning_rate=float(lr))
    return make_workload_optimizer(spec, params)


# ---------------------------------------------------------------- data


@cache
def digits_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): the digits scaled to [0, 1], one fixed split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.from_numpy(np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y)))
    n_test = round(DIGITS_TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def uses_digits(spec: ModelSpec) -> bool:
    return spec.name == DIGITS_WORKLOAD


class DataSource:
    """Training batches for one stream (a rank or worker), reproducible from (seed, stream).

    Digits: the training images in a fresh random order every epoch. Synthetic: the model's
    `example_batch` from a torch generator seeded by (seed, stream).
    """

    def __init__(self, spec: ModelSpec, batch_size: int, seed: int, stream: int, device: str):
        self.spec, self.batch_size, self.device = spec, batch_size, device
        self._rng = np.random.default_rng([seed, stream])
        self._generator = torch.Generator().manual_seed(int(self._rng.integers(2**62)))
        self._order: np.ndarray = np.empty(0, dtype=np.int64)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not uses_digits(self.spec):
            x, y = self.spec.example_batch(self.batch_size, self._generator)
            return x.to(self.device), y.to(self.device)
        x_train, y_train, _, _ = digits_split()
        if len(self._order) < self.batch_size:
            self._order = self._rng.permutation(len(y_train))
        take, self._order = self._order[:self.batch_size], self._order[self.batch_size:]
        index = torch.from_numpy(take)
        return x_train[index].to(self.device), y_train[index].to(self.device)


def held_out_set(spec: ModelSpec, seed: int, device: str
                 ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(inputs, targets, what they are): the digits test images, or a synthetic set."""
    if uses_digits(spec):
        _, _, x, y = digits_split()
        return x.to(device), y.to(device), f"digits-test-{len(y)}"
    source = DataSource(spec, SYNTHETIC_TEST_SAMPLES, seed, HELD_OUT_STREAM, device)
    x, y = source.next_batch()
    return x, y, f"synthetic-held-out-{SYNTHETIC_TEST_SAMPLES}"


@torch.no_grad()
def evaluate(model: torch.nn.Module, spec: ModelSpec, x: torch.Tensor, y: torch.Tensor,
             chunk: int = 256) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on (x, y); accuracy = share of argmax hits (per token
    for language models). NaN for a timed-wait model, which computes nothing."""
    if is_timed_wait(spec):
        return float("nan"), float("nan")
    hits, total, loss_sum = 0, 0, 0.0
    for start in range(0, len(x), chunk):
        out = model(x[start:start + chunk])
        target = y[start:start + chunk]
        loss_sum += float(spec.loss(out, target)) * len(target)
        hits += int((out.argmax(dim=-1) == target).sum())
        total += target.numel()
    return hits / total, loss_sum / len(x)


# ---------------------------------------------------------------- stragglers and timing


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


# ---------------------------------------------------------------- the data-parallel loop


class CommMeter(Protocol):
    """How a data-parallel strategy measures the communication its training loop waited for."""

    def start_step(self) -> None: ...

    def comm_wait_s(self, step_start: Any, backward_end: Any) -> float: ...


@dataclass(frozen=True, kw_only=True)
class LoopResult:
    elapsed_s: float                # slowest rank's time for the timed steps
    wall_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    comm_wait_s: tuple[float, ...]
    slept_s: tuple[float, ...]      # straggler sleep inside compute_s
    memory: dict[str, Any]          # the memory record's fields


def data_parallel_training(ctx: RunContext, settings: Settings, model: torch.nn.Module,
                           optimizer: torch.optim.Optimizer, comm: CommMeter) -> LoopResult:
    """Warm-up steps, timed steps (one step record each), then memory steps under the tracker.

    Every rank trains on its own batches; rank r is worker r for the straggler speed.
    """
    spec = settings.spec
    data = DataSource(spec, settings.batch_size, settings.seed, ctx.rank, ctx.device)
    straggler = Straggler(settings.worker_speed(ctx.rank))
    clock = DeviceClock(ctx.device)
    walls, computes, comms, slept = [], [], [], []
    start = 0.0
    for step in range(settings.total_steps):
        if step == settings.warmup_steps:
            dist.barrier()
            start = time.perf_counter()
        x, y = data.next_batch()
        comm.start_step()
        t0 = clock.mark()
        optimizer.zero_grad(set_to_none=True)
        loss = spec.loss(model(x), y)
        loss.backward()
        t_backward = clock.mark()
        comm_s = comm.comm_wait_s(t0, t_backward)
        slept_s = straggler.delay(clock.seconds(t0, t_backward) - comm_s)
        if settings.compute_wait is not None:
            settings.compute_wait.sleeper.sleep(settings.compute_wait.optimizer_s)
        else:
            optimizer.step()
        wall_s = clock.seconds(t0, clock.mark())
        if step >= settings.warmup_steps:
            walls.append(wall_s)
            comms.append(comm_s)
            computes.append(wall_s - comm_s)
            ctx.recorder.write("step", step=step, wall_s=wall_s, compute_s=wall_s - comm_s,
                               comm_wait_s=comm_s, loss=float(loss), samples=len(y))
            slept.append(slept_s)
    elapsed_s = allreduce_max(time.perf_counter() - start, ctx.device)

    def memory_step() -> None:
        x, y = data.next_batch()
        optimizer.zero_grad(set_to_none=True)
        spec.loss(model(x), y).backward()
        optimizer.step()

    if settings.timed_wait:     # nothing computed: count what is held, skip the tracker
        memory = live_memory(model, optimizer)
        memory["method"] += " (timed-wait: no activations)"
    else:
        memory = measure_memory(model, optimizer, memory_step, device=ctx.device,
                                steps=MEMORY_STEPS)
    return LoopResult(elapsed_s=elapsed_s, wall_s=tuple(walls), compute_s=tuple(computes),
                      comm_wait_s=tuple(comms), slept_s=tuple(slept), memory=memory)


def loop_summary(settings: Settings, result: LoopResult) -> dict[str, float]:
    """The numbers every data-parallel summary carries."""
    samples = settings.workers * settings.batch_size * settings.steps
    return {
        "throughput_samples_per_s": samples / result.elapsed_s,
        "elapsed_s": result.elapsed_s,
        "steps": settings.steps,
        "warmup_steps": settings.warmup_steps,
        "optimizer_steps": settings.total_steps + MEMORY_STEPS,
        "batch_size": settings.batch_size,
        "mean_step_s": float(np.mean(result.wall_s)),
        "median_step_s": float(np.median(result.wall_s)),
        "mean_compute_s": float(np.mean(result.compute_s)),
        "mean_comm_wait_s": float(np.mean(result.comm_wait_s)),
        "mean_slept_s": float(np.mean(result.slept_s)),
    }
