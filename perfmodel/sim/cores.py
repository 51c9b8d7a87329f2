"""Compute under core sharing: how many processes a computing worker shares its cores with.

On a CPU host every busy process — the workers and any parameter server on the node — runs
on the node's `compute_cpu_cores_per_node` cores, and a worker's compute is stretched by
`ClusterProfile.compute_share(b)` for b busy processes (processor sharing and contention;
the formula and its derivation are in perfmodel/cluster.py and docs/model.md "Compute under
core sharing"). On a GPU a colocated parameter server's apply runs on the device of the
worker it sits beside, and the two share that one device: one "core", b = 1 + d.

b(t) changes over a worker's compute: the processes computing beside it (1 for itself, plus
the node's other workers while they compute) plus every sharing server while it applies an
update. Under processor sharing a process progresses at 1/s(b(t)) of its solo speed, so a
span of length T does ∫ dt / s(b(t)) of solo work, and the stretch over a set of spans is
ΣT / Σ∫ dt/s(b(t)) (`fluid_stretch`): exact for processor sharing given when everyone is
busy, where a stretch from the average b (`mean_busy`) would miss the moments b exceeds the
cores (3 busy on 2 cores half the time costs 1.2x; an average b of 2.5 would cost 1.25x,
an average below 2 nothing). A server's duty cycle d — the fraction of the workers' compute
during which it applies — is what it adds: a server whose applies happen while the workers
wait (sync-ps at a barrier) has d ≈ 0 and costs them nothing; one applying a gradient of
one worker while the others compute (async-ps) costs them its share. The PS simulation
(ps.py) finds the stretch as a fixed point: simulate, measure from the spans below,
stretch, simulate again.

Pure functions over (start, end) spans; no simpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def busy_integral(starts: np.ndarray, ends: np.ndarray, rate=None):
    """For spans [starts_i, ends_i], a function of query times t giving ∫_0^t g(n(τ)) dτ,
    n(τ) the number of spans covering τ and g = `rate` (default g(n) = n: the busy-time
    integral), evaluated by `np.interp` on its breakpoints (it is piecewise linear)."""
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    count = np.cumsum(steps)                         # spans covering (times[i], times[i+1])
    height = count[:-1] if rate is None else rate(np.round(count[:-1]))
    area = np.concatenate([[0.0], np.cumsum(height * np.diff(times))])

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


def own_work_s_per_byte(cluster, ranks: int, workload: str | None = None,
                        bytes_per_s: float | None = None) -> float:
    """Seconds per byte of a rank's own memory-bound host work (DDP's and FSDP2's copies, one
    read and write each at `bytes_per_s`, default compute.optimizer_GBps) while `ranks` ranks
    of a node do it at once: times 1 on a GPU, the core-sharing factor on a CPU host, and that
    factor less 1 in a timed wait, where measure/timed_wait.py's Sleeper pays the work's CPU
    time back from the next sleeps, leaving only the waits for a core
    (compute_occupies_cores = False)."""
    factor = 1.0
    if cluster.compute_cpu_cores_per_node:
        share = cluster.compute_share(ranks, workload)
        factor = share if cluster.compute_occupies_cores else share - 1.0
    return factor / (bytes_per_s or cluster.compute.optimizer_GBps * 1e9)


def node_cpu_work_s(cluster, ranks: int, collectives_s: float, own_cpu_s: float,
                    workload: str | None = None) -> float:
    """The CPU work, in core-seconds, that a node of `ranks` ranks does in one step beside its
    collectives, as `node_cpu_floor_s` counts it for DDP: the crowded collectives' time on
    the share β of the c cores they keep busy, and every rank's own host work slowed by
    contention, c·β·collectives_s + ranks·own_cpu_s·k (k = 1 + κ(c − 1)). What a crowded
    DDP timed wait really burns per step is compute.ddp_cpu_work_factor times this
    (calibration/fit_cores.py `fit_ddp_cpu_work_factor`)."""
    cores = cluster.compute_cpu_cores_per_node
    contention = 1.0 + cluster.compute.contention(workload) * (cores - 1.0)
    return (cores * cluster.comm_cpu_busy(ranks) * collectives_s
            + ranks * own_cpu_s * contention)


def node_cpu_floor_s(cluster, ranks: int, idle_s: float, collectives_s: float,
                     own_cpu_s: float, workload: str | None = None,
                     paid_back_s: float = 0.0, beside_collectives: bool = False,
                     work_factor: float = 1.0) -> float:
    """The shortest step a timed wait's node can make when its ranks outnumber its cores,
    by conserving CPU work. The step's collectives, timed by the crowded sweeps
    (`ClusterProfile.comm_cpu_stretch`), take `collectives_s` (a crowded gloo collective is
    CPU-bound: it stretches ~p/c) and keep a share β of the c cores busy meanwhile
    (`ClusterProfile.comm_cpu_busy`, measured by the same sweeps: ~0.85-0.9 on a 2-core host);
    each rank's own host work (`own_cpu_s`: copies, divides, zero gradients, which
    measure/timed_wait.py's Sleeper pays back from the sleeps, so the rank's compute does
    not show it) needs the same cores, slowed by contention as compute is; and `idle_s` of
    the step's sleeps run before any collective can start or after the last (DDP: forward,
    backward up to the first bucket, the optimizer; gloo FSDP, whose collectives block: all
    of them), less `paid_back_s`: the part of each rank's own work done right before those
    sleeps, whose CPU time the Sleeper pays back from them (DDP: the copy back after the
    last all-reduce, paid from the optimizer's and forward's sleeps), so they are that much
    shorter (gloo FSDP: every copy, each followed by a sleep). With k = 1 + κ(c − 1) and
    W = ranks·own_cpu_s·k/c (the own work on all cores):

    - `beside_collectives` (DDP: a rank's gloo thread all-reduces one bucket while its
      training thread copies the next): the own work fills the cores the collectives leave
      idle, so step >= max(0, idle_s − paid·k) + max(collectives_s, f·(β·collectives_s + W)),
      f = `work_factor` (compute.ddp_cpu_work_factor: the CPU work the calibration's crowded
      DDP timed waits burned over this count of it, `node_cpu_work_s`);
    - otherwise (gloo FSDP: every rank blocks in each collective, its copies between them):
      step >= max(0, idle_s − paid·k) + collectives_s + W.

    0 (no floor) outside a timed wait or where the ranks fit the cores: the event model's
    step holds there."""
    cores = cluster.compute_cpu_cores_per_node
    if not cluster.timed_wait or ranks <= cores:
        return 0.0
    contention = 1.0 + cluster.compute.contention(workload) * (cores - 1.0)
    if beside_collectives:
        work_s = node_cpu_work_s(cluster, ranks, collectives_s, own_cpu_s, workload)
        busy_s = max(collectives_s, work_factor * work_s / cores)
    else:
        busy_s = collectives_s + ranks * own_cpu_s * contention / cores
    return max(0.0, idle_s - paid_back_s * contention) + busy_s


def ranks_note(cluster, ranks: int, workload: str | None = None) -> tuple[str, ...]:
    """DDP/FSDP: a note when the node's ranks share its cores (none on GPUs or when they fit)."""
    share = cluster.compute_share(ranks, workload)
    if share <= 1.0:
        return ()
    return (f"{ranks} ranks share {cluster.compute_cpu_cores_per_node} cores per node: "
            f"compute x{share:.2f} (core sharing)",)


def fluid_stretch(spans: Sequence[tuple[float, float]],
                  busy: Sequence[Sequence[tuple[float, float]]], share) -> float:
    """How much longer `spans` (one kind of work, e.g. a node's worker compute) take than
    the same work alone, when every span in `spans` and in each of `busy` (the others'
    spans, e.g. servers' applies) is a busy process sharing the node: ΣT / Σ∫ dt/share(n(t)),
    n(t) the busy processes at t (`spans` included) and `share` the slowdown of n busy
    processes (`ClusterProfile.compute_share`, or `device_share` on one GPU). >= 1."""
    s = np.asarray(spans, dtype=float).reshape(-1, 2)
    total = float((s[:, 1] - s[:, 0]).sum())
    if total <= 0:
        return 1.0
    every = np.concatenate([s, *(np.asarray(b, dtype=float).reshape(-1, 2)
                                 for b in busy if len(b))])
    rate = np.vectorize(lambda n: 1.0 / share(max(float(n), 1.0)), otypes=[float])
    work = busy_integral(every[:, 0], every[:, 1], rate)
    done = float((work(s[:, 1]) - work(s[:, 0])).sum())
    return max(1.0, total / done) if done > 0 else 1.0


def beyond_pair(share):
    """The sharing slowdown beyond two busy processes, s(b)/s(2), at least 1: what a
    transfer between two processes feels when its link was calibrated with both copying
    (a 2-rank collective sweep)."""
    return lambda busy: max(1.0, share(busy) / share(2.0))
