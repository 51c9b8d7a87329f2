"""Fit `topology.comm_cpu_bound_fraction` u, and u by message size
(`topology.comm_cpu_bound_by_bytes`): how much of a CPU-driven collective shares the cores.

The model (perfmodel.cluster.ClusterProfile.comm_cpu_share): with p ranks of a gloo
collective on c < p cores the byte term n·β takes (1 − u + u·p/c) times its unshared time;
the latency steps (waits for wake-ups and peers) are not stretched. The ranks of a ring work
in lock step, so their CPU bursts (copies, reductions) coincide and share the cores. u = 1
stretches the byte term by p/c.

The fit: the links are fitted on sweeps with no more ranks than cores (unshared); a sweep
with more ranks on one node (the calibration suite's: twice the cores) gives, per op and
size, u = (measured − unshared) / ((p/c − 1) · unshared byte term). Only sizes whose byte
term is at least BYTE_SHARE_MIN of the unshared time say anything about u (below it a
collective is its latency, and the noise of the latency divided by a tiny byte term gives
any u); per such size the median over ops and repeats, held to [0, 1], is one point of
the curve (flat beyond its ends); the one value u is the median over all their points.

Why the byte term only, and by size (decided 2026-12-04 from the calibration sweeps, set A
of three held-out comparisons, before the held-out comparison that tests it): on this 2-core
host a 1 KiB-64 KiB all-reduce at 4 ranks took 5.5-7 ms against 4.9 ms of unshared latency
(the latency barely stretches), while the byte term's u rose with size: medians 0.11, 0.26,
0.44, 0.63 at 2, 4, 8, 16 MiB (three crowded sweeps, all-reduce, all-gather and
reduce-scatter). One u over the whole time, fitted as the median of every size (this
module until then: 0.14 +- 0.03), held the small sizes and left a 12.9 MB DDP gradient's
all-reduce at 8 ranks far too fast (ddp-mlp-tw8: -30 % in step time in four reports).
Where the crowded sweeps span >= 2 levels p/c (the full suite: 4 and 8 ranks on 2 cores),
`fit_stretch_by_level` also gives the measured stretch of the whole collective per level and
size (topology.comm_cpu_stretch_by_level), which the model then uses instead of u: one
8-rank sweep (2026-12-04) took ~2.5x the unshared model at 1 MiB where 4 ranks took ~2x, and
~1.75x at 16 MiB where 4 ranks took ~2.2x, which no single u·(p/c − 1) law gives.

How busy a crowded collective keeps the cores (`topology.comm_cpu_busy_by_level`,
`fit_busy_by_level`): the sweeps record each rank's CPU time over its wall time. In set A of
the ten held-out reports 40-49 (2026-12-05/06) the all-reduce, all-gather and
reduce-scatter sweeps from 1 MiB kept 0.80-0.88 of the 2 cores busy at 4 ranks and
0.85-0.92 at 8, in every report. So a crowded collective leaves a tenth or more of the
cores idle, which a DDP rank's own copies (its gloo thread all-reduces while its training
thread copies the next bucket) can fill: in the held-out DDP timed-wait runs of reports
47-49 the 8 ranks used 1.85-1.91 of the 2 cores, their gloo threads ~11-16 ms of CPU a
rank and step (the sweep's all-reduce of mlp's two buckets at 8 ranks: ~13), their
training threads ~9-13 ms. perfmodel/sim/cores.py `node_cpu_floor_s` counts the step's CPU
that way.

Earlier history: 4 ranks took about 1.3x and 8 ranks about 1.9x the ring model fitted on 2
ranks where p/c says 2x and 4x (2026-12-03), and each rank's CPU time over its wall time was
0.6-0.8 at 2 ranks, 0.35-0.44 at 4 and 0.21-0.23 at 8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibration.fit import FitResult, fit_result
from calibration.fit_network import CollectiveSample
from perfmodel.cluster import ClusterProfile
from perfmodel.errors import PerfmodelError
from perfmodel.sim import collectives

PARAMETER = "topology.comm_cpu_bound_fraction"
# a size tells u only where its byte term is at least this share of its unshared time
BYTE_SHARE_MIN = 0.2
# a crowded collective's busy share is read from these sizes up (bytes, not wake-ups)
BUSY_MIN_BYTES = 2**20
_TIME = {"all-reduce": collectives.allreduce_s, "all-gather": collectives.allgather_s,
         "reduce-scatter": collectives.reduce_scatter_s, "broadcast": collectives.broadcast_s}


def ranks_per_node(sample: CollectiveSample) -> int:
    """The ranks of `sample` on each node (packed, the last node possibly fewer)."""
    return -(-sample.ranks // max(sample.nodes, 1))


def shared(sample: CollectiveSample, cores: int) -> bool:
    """Whether a sample's ranks outnumber the cores of its node."""
    return ranks_per_node(sample) > cores


def unshared_s(cluster: ClusterProfile, sample: CollectiveSample) -> float:
    """The model's time of `sample` on `cluster` with no core sharing (u = 0)."""
    layout = dataclasses.replace(cluster, devices_per_node=ranks_per_node(sample),
                                 comm_cpu_bound_fraction=0.0, comm_cpu_bound_by_bytes=(),
                                 comm_cpu_stretch_by_level=())
    return _TIME[sample.op](layout, sample.ranks, sample.bytes)


def byte_term_s(cluster: ClusterProfile, sample: CollectiveSample) -> float:
    """The unshared model's byte term of `sample` (its time less that of 0 bytes)."""
    empty = dataclasses.replace(sample, bytes=0.0)
    return unshared_s(cluster, sample) - unshared_s(cluster, empty)


@dataclass(frozen=True, slots=True)
class SharingFit:
    """u as one value (for the profile's scalar and the report) and by message size."""

    fraction: FitResult
    by_bytes: tuple[tuple[float, float], ...]
    by_level: tuple[tuple[str, tuple[tuple[float, float, float], ...]], ...] = ()  # by kind
    busy_by_level: tuple[tuple[float, float], ...] = ()     # [[p/c, share of cores busy]]


def fit_comm_sharing(samples: Sequence[CollectiveSample], unshared: ClusterProfile,
                     cores: int) -> SharingFit:
    """u and u by size from the samples whose ranks outnumber `cores`, against the links of
    `unshared` (fitted on the other samples); see the module docstring."""
    use = [s for s in samples if s.op in _TIME and shared(s, cores)]
    if len(use) < 2:
        raise PerfmodelError(f"{PARAMETER}: need >= 2 collective timings with more ranks on a "
                             f"node than its {cores} core(s); found {len(use)}")
    model = np.array([unshared_s(unshared, s) for s in use])
    byte = np.array([byte_term_s(unshared, s) for s in use])
    measured = np.array([s.time_s for s in use])
    excess = np.array([ranks_per_node(s) / cores - 1.0 for s in use])   # p/c − 1
    telling = byte >= BYTE_SHARE_MIN * model
    if telling.sum() < 2:
        raise PerfmodelError(f"{PARAMETER}: need >= 2 collective timings with more ranks than "
                             f"cores whose byte term is >= {BYTE_SHARE_MIN:.0%} of their time "
                             f"(larger messages); found {int(telling.sum())}")
    per_point = (measured - model)[telling] / (excess * byte)[telling]
    sizes = np.array([s.bytes for s in use])[telling]
    curve = tuple((float(n), float(np.clip(np.median(per_point[sizes == n]), 0.0, 1.0)))
                  for n in np.unique(sizes) if (sizes == n).sum() >= 2)
    u = float(np.clip(np.median(per_point), 0.0, 1.0))
    # the standard error of a median of n normal points: 1.2533 σ / √n
    stderr = 1.2533 * float(np.std(per_point, ddof=1)) / np.sqrt(len(per_point))
    fitted = dataclasses.replace(unshared, comm_cpu_bound_fraction=u, comm_cpu_bound_by_bytes=curve)
    u_at = np.array([fitted.comm_cpu_bound(s.bytes) for s in use])
    rel = (model + u_at * excess * byte - measured) / measured
    return SharingFit(fraction=fit_result(PARAMETER, u, stderr, rel), by_bytes=curve,
                      by_level=fit_stretch_by_level(samples, unshared, cores),
                      busy_by_level=fit_busy_by_level(samples, cores))


def fit_busy_by_level(samples: Sequence[CollectiveSample], cores: int
                      ) -> tuple[tuple[float, float], ...]:
    """topology.comm_cpu_busy_by_level: per crowding level p/c (> 1), the share of the
    node's cores that its collectives kept busy, p x (each rank's CPU time over its wall
    time) / c, the median over every kind and size from BUSY_MIN_BYTES up (where the bytes,
    not the wake-ups, take the time), held to (0, 1]; levels with fewer than 2 such timings
    are left out. What is left idle, the rest of the cores, is where DDP's reducer copies
    run beside its all-reduce (perfmodel/sim/cores.py `node_cpu_floor_s`). Measured on this
    2-core host: 0.80-0.87 at 4 ranks, 0.85-0.91 at 8 (module docstring)."""
    out = []
    use = [s for s in samples if s.op in _TIME and shared(s, cores)
           and s.cpu_busy_fraction is not None and s.bytes >= BUSY_MIN_BYTES]
    for level in sorted({ranks_per_node(s) / cores for s in use}):
        at = [ranks_per_node(s) * float(s.cpu_busy_fraction) / cores for s in use
              if ranks_per_node(s) / cores == level]
        if len(at) >= 2:
            out.append((float(level), float(np.clip(np.median(at), 1e-3, 1.0))))
    return tuple(out)


def fit_comm_cpu_bound_fraction(samples: Sequence[CollectiveSample], unshared: ClusterProfile,
                                cores: int) -> FitResult:
    """The one value u of `fit_comm_sharing`."""
    return fit_comm_sharing(samples, unshared, cores).fraction


def fit_stretch_by_level(samples: Sequence[CollectiveSample], unshared: ClusterProfile,
                         cores: int) -> tuple[tuple[str, tuple[tuple[float, float, float], ...]],
                                              ...]:
    """topology.comm_cpu_stretch_by_level: per collective kind, crowding level p/c (> 1) and
    message size, the median over repeats of measured / unshared model time of the whole
    collective, held >= 1, at every size with >= 2 timings (the whole time is what
    stretches, so a latency-bound size tells as much as a bandwidth-bound one); a kind is
    kept only where >= 2 levels were measured (one level says nothing about how the
    stretch grows with p/c). By kind because they stretch differently: gloo's all-gather
    and reduce-scatter, 2.5x and 5.8x the ring model already at 2 ranks, stretched far less
    than all-reduce at 8 ranks on 2 cores (2026-12-04)."""
    use = [s for s in samples if s.op in _TIME and shared(s, cores)]
    out = []
    for op in sorted({s.op for s in use}):
        rows = []
        for level in sorted({ranks_per_node(s) / cores for s in use if s.op == op}):
            at = [s for s in use if s.op == op and ranks_per_node(s) / cores == level]
            ratio = np.array([s.time_s / unshared_s(unshared, s) for s in at])
            sizes = np.array([s.bytes for s in at])
            for n in np.unique(sizes):
                pick = sizes == n
                if pick.sum() >= 2 and n > 0:
                    rows.append((float(level), float(n),
                                 max(1.0, float(np.median(ratio[pick])))))
        if len({r[0] for r in rows}) >= 2:
            out.append((op, tuple(rows)))
    return tuple(out)
