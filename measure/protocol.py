"""A measurement protocol for a shared machine: settle, pin, interleave, and say the noise.

On a host that other work shares (this project's development machines: 2 cores, several
sessions), a run's timings move with whatever else runs. Four habits make the noise smaller
and, above all, visible (issue 14; torch.utils.benchmark and nccl-tests report the median
and its spread for the same reason):

- **Settle.** Before each run, wait until the 1-minute load average is below
  `cores × max_load_per_core`, polling every `poll_s`, but never longer than `max_wait_s`
  (`wait_for_load`). The load before and after the wait, the seconds waited and whether it
  settled are recorded with the run (config.json's `protocol`, so the store keeps them beside
  the run). The 1-minute load is an exponentially damped average with a 60 s time constant
  (Linux kernel/sched/loadavg.c), so the load a run leaves behind decays by e after a
  minute: waiting helps back-to-back runs most.
- **Pin.** When this process may use at least as many cores as the run has busy processes
  (every rank x its threads), rank i of the node is pinned to its own cores with
  `os.sched_setaffinity` (`pin_plan`; the worker applies it, measure/worker.py), so the
  scheduler does not move ranks between cores or stack two on one. With fewer cores (the
  timed-wait runs of 4-8 workers on 2 cores) nothing is pinned and the record says so.
- **Interleave.** Repeats of several configurations alternate (A, B, C, A, B, C, ...) rather
  than run back to back (`interleave`), so a change of load over the session spreads over
  every configuration instead of biasing one. At least `MIN_REPEATS` repeats by default.
- **Noise floor.** Per configuration, the repeats' spread: (max − min) / median and a robust
  standard deviation relative to the median, 1.4826 × MAD / median (MAD: the median absolute
  deviation; 1.4826 = 1/Φ⁻¹(3/4) makes it estimate σ for normal data; Huber, Robust
  Statistics, 1981) (`noise_floor`).

No torch here; the functions take the clock, the sleep and the load average as parameters
so tests run them on fake sequences.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from perfmodel.errors import PerfmodelError

T = TypeVar("T")
MIN_REPEATS = 3             # default repeats per configuration: a spread needs >= 3 to mean much
MAD_TO_SD = 1.4826          # 1 / Φ⁻¹(3/4): MAD x this estimates σ of normal data


@dataclass(frozen=True, kw_only=True, slots=True)
class Settle:
    """How long to wait for the machine to quieten before a run."""

    max_load_per_core: float = 0.5     # settled: 1-minute load < cores x this
    max_wait_s: float = 30.0           # give up waiting after this many seconds (0: never wait)
    poll_s: float = 5.0                # seconds between looks at the load

    def __post_init__(self) -> None:
        for name in ("max_load_per_core", "max_wait_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise PerfmodelError(f"{name} must be a finite number >= 0, got {value}")
        if not math.isfinite(self.poll_s) or self.poll_s <= 0:
            raise PerfmodelError(f"poll_s must be a finite number > 0, got {self.poll_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunProtocol:
    """What `measure.session.run` does around a launch on a shared machine."""

    settle: Settle | None = None       # None: launch at once
    pin: bool = True                   # pin ranks to cores when there are enough


@dataclass(frozen=True, kw_only=True, slots=True)
class SettleRecord:
    """What the wait before a run saw."""

    load_before: float                 # 1-minute load average when the wait began
    load_after: float                  # ... when the run was launched
    waited_s: float
    settled: bool                      # load_after below the threshold (False: timed out)
    threshold_load: float              # cores x max_load_per_core
    cores: int


def wait_for_load(settle: Settle, *, cores: int,
                  loadavg: Callable[[], float] = lambda: os.getloadavg()[0],
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> SettleRecord:
    """Wait until the 1-minute load is below `cores x settle.max_load_per_core`, or until
    `settle.max_wait_s` have passed, whichever comes first (module docstring)."""
    if cores < 1:
        raise PerfmodelError(f"cores must be >= 1, got {cores}")
    threshold = cores * settle.max_load_per_core
    t0 = clock()
    before = load = loadavg()
    while load >= threshold:
        left = settle.max_wait_s - (clock() - t0)
        if left <= 0:
            break
        sleep(min(settle.poll_s, left))
        load = loadavg()
    return SettleRecord(load_before=before, load_after=load, waited_s=clock() - t0,
                        settled=load < threshold, threshold_load=threshold, cores=cores)


def available_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), in order."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):           # not Linux: every core, unpinnable
        return tuple(range(os.cpu_count() or 1))


def pin_plan(nproc: int, threads_per_rank: int, cores: Sequence[int]
             ) -> tuple[tuple[int, ...], ...] | None:
    """Cores of each local rank (rank i gets `threads_per_rank` cores of its own), or None
    when the `nproc x threads_per_rank` busy processes outnumber `cores`."""
    if nproc < 1 or threads_per_rank < 1:
        raise PerfmodelError(f"need >= 1 rank and >= 1 thread per rank, got {nproc} and "
                             f"{threads_per_rank}")
    if nproc * threads_per_rank > len(cores):
        return None
    return tuple(tuple(cores[i * threads_per_rank:(i + 1) * threads_per_rank])
                 for i in range(nproc))


PIN_OFFSET_ENV = "PERFMODEL_PIN_OFFSET"


def apply_pin(config: dict[str, Any], local_rank: int,
              setaffinity: Callable[[int, set[int]], None] | None = None,
              offset: int = 0) -> tuple[int, ...]:
    """Pin this process as config.json's `protocol.pin_cores` says for its place among the
    host's ranks, `offset + local_rank`; return the cores (empty: not pinned). Called by each
    rank before torch starts its threads. `offset` is the ranks of this host's earlier
    torchruns (measure/netem.py runs two emulated nodes on one host, each a torchrun whose
    local ranks start at 0: without it both nodes' rank 0 shared core 0, the other idle)."""
    plan = (config.get("protocol") or {}).get("pin_cores")
    index = offset + local_rank
    if not plan or index >= len(plan):
        return ()
    cores = tuple(int(c) for c in plan[index])
    try:
        (setaffinity or os.sched_setaffinity)(0, set(cores))
    except (AttributeError, OSError, ValueError):   # the cores went away: run unpinned
        return ()
    return cores


def protocol_record(protocol: RunProtocol, config: dict[str, Any], nproc: int, *,
                    cores: Sequence[int] | None = None,
                    wait: Callable[[Settle, int], SettleRecord] | None = None
                    ) -> dict[str, Any]:
    """Settle (if asked), then plan the pinning: config.json's `protocol` entry of a run."""
    cores = tuple(cores) if cores is not None else available_cores()
    out: dict[str, Any] = {}
    if protocol.settle is not None:
        waiter = wait or (lambda s, n: wait_for_load(s, cores=n))
        out |= asdict(waiter(protocol.settle, len(cores)))
    else:
        out["load_before"] = out["load_after"] = _load_now()
    threads = int(config.get("threads_per_worker", 1))
    plan = pin_plan(nproc, threads, cores) if protocol.pin else None
    out["pinned"] = plan is not None
    out["pin_cores"] = [list(c) for c in plan] if plan else []
    if plan is None:
        out["pin_skipped"] = ("not asked" if not protocol.pin else
                              f"{nproc * threads} busy processes on {len(cores)} cores")
    return out


def _load_now() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def interleave(groups: Sequence[Sequence[T]]) -> list[T]:
    """Round-robin over `groups`: the first of each, then the second of each, ... (groups
    run out at different lengths: those left carry on)."""
    out: list[T] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class NoiseFloor:
    """The spread of one configuration's repeats."""

    runs: int
    median: float
    spread_rel: float           # (max − min) / median
    robust_sd_rel: float        # 1.4826 x MAD / median


def noise_floor(values: Sequence[float]) -> NoiseFloor | None:
    """The repeats' noise floor (module docstring); None for fewer than 2 values or a
    median of 0."""
    v = np.asarray([float(x) for x in values if x is not None], dtype=float)
    if v.size < 2:
        return None
    med = float(np.median(v))
    if med == 0 or not math.isfinite(med):
        return None
    mad = float(np.median(np.abs(v - med)))
    return NoiseFloor(runs=int(v.size), median=med,
                      spread_rel=float((v.max() - v.min()) / abs(med)),
                      robust_sd_rel=MAD_TO_SD * mad / abs(med))
