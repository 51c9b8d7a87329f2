"""Compute under core sharing: how many processes a computing worker shares its cores with.

On a CPU host every busy process — the workers and any parameter server on the node — runs
on the node's `compute_cpu_cores_per_node` cores, and a worker's compute is stretched by
`ClusterProfile.compute_share(b)` for b busy processes (processor sharing and contention;
the formula and its derivation are in perfmodel/cluster.py and docs/model.md "Compute under
core sharing"). On a GPU a colocated parameter server's apply runs on the device of the
worker it sits beside, and the two share that one device: one "core", b = 1 + d.

b is a time average over the worker's compute: the processes computing beside it (1 for
itself, plus the node's other workers while they compute) plus each sharing server's duty
cycle d, the fraction of the worker's compute during which that server is applying an
update. A server whose applies happen while the workers wait (sync-ps at a barrier) has
d ≈ 0 and costs the workers nothing; one applying another worker's gradient while this one
computes (async-ps) has d up to 1. The PS simulation (ps.py) finds b as a fixed point:
simulate, measure b from the spans below, stretch, simulate again (`mean_busy`).

Pure functions over (start, end) spans; no simpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def busy_integral(starts: np.ndarray, ends: np.ndarray):
    """For spans [starts_i, ends_i], a function of query times t giving ∫_0^t (number of
    spans covering τ) dτ: the busy-time integral, evaluated by `np.interp` on its
    breakpoints (it is piecewise linear)."""
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    count = np.cumsum(steps)                         # spans covering (times[i], times[i+1])
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(times))])

    def integral(t: np.ndarray) -> np.ndarray:
        if times.size == 0:
            return np.zeros_like(t, dtype=float)
        return np.interp(t, times, area, left=0.0, right=area[-1])

    return integral


def overlap_fraction(compute: Sequence[tuple[float, float]],
                     busy: Sequence[tuple[float, float]]) -> float:
    """Time-average, over the `compute` spans, of how many `busy` spans cover them:
    Σ ∫ count / Σ compute time (0 with no compute time)."""
    c = np.asarray(compute, dtype=float).reshape(-1, 2)
    total = float((c[:, 1] - c[:, 0]).sum())
    if total <= 0:
        return 0.0
    b = np.asarray(busy, dtype=float).reshape(-1, 2)
    integral = busy_integral(b[:, 0], b[:, 1])
    return float((integral(c[:, 1]) - integral(c[:, 0])).sum() / total)


def mean_busy(compute: Sequence[tuple[float, float]],
              servers: Sequence[Sequence[tuple[float, float]]]) -> float:
    """Busy processes a computing worker sees, time-averaged over `compute` (every worker's
    compute spans on one node or device): the workers computing (itself included) plus each
    server's duty cycle during them. 1 for a lone worker with no server at work."""
    if not len(compute):
        return 1.0
    busy = overlap_fraction(compute, compute)
    return max(1.0, busy + sum(overlap_fraction(compute, s) for s in servers if len(s)))


def device_share(busy: float) -> float:
    """Stretch of work on one device (a GPU) shared by `busy` processes on average:
    processor sharing on one "core", max(1, b)."""
    return max(1.0, busy)


def ranks_note(cluster, ranks: int) -> tuple[str, ...]:
    """DDP/FSDP: a note when the node's ranks share its cores (none on GPUs or when they fit)."""
    share = cluster.compute_share(ranks)
    if share <= 1.0:
        return ()
    return (f"{ranks} ranks share {cluster.compute_cpu_cores_per_node} cores per node: "
            f"compute x{share:.2f} (core sharing)",)
