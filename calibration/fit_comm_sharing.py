"""Fit `topology.comm_cpu_bound_fraction` u: how much of a CPU-driven collective shares the cores.

The model (perfmodel.cluster.ClusterProfile.comm_cpu_share): p ranks of a gloo collective on
c < p cores take (1 − u + u·p/c) times their unshared time. The ranks of a ring work in lock
step, so their CPU bursts (copies, reductions, polling) coincide and share the cores; their
waits for wake-ups and peers overlap and do not. u = 1 stretches everything by p/c.

The fit: the links are fitted on sweeps with no more ranks than cores (unshared); a sweep
with more ranks on one node (the calibration suite's: twice the cores) gives, per op and
size, the stretch s = measured / unshared model and u = (s − 1)/(p/c − 1); u is their
median, held to [0, 1].

Why not p/c (u = 1): on this 2-core host (2026-12-03, gloo, torch 2.13, all-reduce,
all-gather and reduce-scatter at 64 KiB-16 MiB) 4 ranks took about 1.3x and 8 ranks about
1.9x the ring model fitted on 2 ranks (single sweeps, 0.8-3.7x per point), where p/c says 2x
and 4x; the held-out timed-wait runs at 4 and 8 ranks were over-predicted by 35-63 % with
p/c. Each rank's CPU time over its wall time (the sweep's `cpu_busy_fraction`) was 0.6-0.8 at
2 ranks, 0.35-0.44 at 4 and 0.21-0.23 at 8: from 4 ranks on the two cores run near
saturation, yet the times stretch far less than p/c, so much of a 2-rank collective's CPU
time is polling and waiting that gives way under contention. u is fitted, not read off
that fraction: a bound of (2-rank busy fraction) x p/c over-predicted the 8-rank sweep by
a median 66 %. Where u misses: 8 ranks with 12-16 MiB messages stretch about 2.5x where
u from 4 ranks says 1.5-1.8x (docs/model.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from calibration.fit import FitResult, fit_result
from calibration.fit_network import CollectiveSample
from perfmodel.cluster import ClusterProfile
from perfmodel.errors import PerfmodelError
from perfmodel.sim import collectives

PARAMETER = "topology.comm_cpu_bound_fraction"
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
                                 comm_cpu_bound_fraction=0.0)
    return _TIME[sample.op](layout, sample.ranks, sample.bytes)


def fit_comm_cpu_bound_fraction(samples: Sequence[CollectiveSample], unshared: ClusterProfile,
                                cores: int) -> FitResult:
    """u from the samples whose ranks outnumber `cores`, against the links of `unshared`
    (fitted on the other samples); see the module docstring."""
    use = [s for s in samples if s.op in _TIME and shared(s, cores)]
    if len(use) < 2:
        raise PerfmodelError(f"{PARAMETER}: need >= 2 collective timings with more ranks on a "
                             f"node than its {cores} core(s); found {len(use)}")
    model = np.array([unshared_s(unshared, s) for s in use])
    measured = np.array([s.time_s for s in use])
    excess = np.array([ranks_per_node(s) / cores - 1.0 for s in use])   # p/c − 1
    per_point = (measured / model - 1.0) / excess
    u = float(np.clip(np.median(per_point), 0.0, 1.0))
    # the standard error of a median of n normal points: 1.2533 σ / √n
    stderr = 1.2533 * float(np.std(per_point, ddof=1)) / np.sqrt(len(use))
    rel = (model * (1.0 + u * excess) - measured) / measured
    return fit_result(PARAMETER, u, stderr, rel)
