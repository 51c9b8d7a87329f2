"""Closed-form α–β times of one collective on the cluster's two-level topology.

Costs (α = per-step latency, β = seconds per byte, p ranks, n bytes; Thakur, Rabenseifner &
Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005):

- ring all-reduce         2(p−1)·α + 2(p−1)/p · n·β
- ring all-gather         (p−1)·α  + (p−1)/p · n·β      n = the gathered (output) size
- ring reduce-scatter     (p−1)·α  + (p−1)/p · n·β      n = the input size
- ring (pipelined) bcast  (p−1)·α  + n·β                 NCCL's broadcast; busbw factor 1
- binomial broadcast      ⌈lg p⌉·(α + n·β)
- send/recv               α + n·β

The reduction term γ is taken as 0: NCCL fuses the reduction into the copy, and a calibrated
β (gloo on CPU) already contains it.

"tree" all-reduce is NCCL's double binary tree (Sanders, Speck & Träff, Parallel Computing
2009; NCCL 2.4): a chain inside each node and two complementary binary trees across nodes,
reduce up and broadcast down, pipelined. Its cost follows NCCL's own tuning model
(src/graph/tuning.cc, ncclTopoTuneModel): latency 2·((d−1)·α_intra + ⌊lg k⌋·α_inter) for d
ranks per node and k nodes, and algorithm bandwidth half the bus bandwidth, i.e. 2·n·β.
So tree beats ring on latency (logarithmic in nodes) and loses to it on bandwidth.

Hierarchy: ranks are packed onto nodes of `cluster.devices_per_node`. Inside one node every
step uses `cluster.intra_node` (per device). A ring over k > 1 nodes is bounded by the slowest
link it uses: β = max(β_intra, β_inter), where the node NIC `cluster.inter_node` is shared by
the node's devices but a ring crosses each NIC once in each direction, so the NIC carries
about one rank's ring traffic. Latency counts the steps that cross nodes at α_inter and the
rest at α_intra, as NCCL's tuner does (2(k−1) crossing steps of an all-reduce, k−1 of an
all-gather or reduce-scatter).

CPU-driven communication (gloo on a CPU host, `cluster.comm_cpu_cores_per_node` = c > 0):
every rank's copies and reductions run on the node's cores, and a ring step finishes when
the slowest rank's does, so with p ranks on c < p cores the CPU-bound part u of the byte
term n·β takes p/c times as long (processor sharing; `ClusterProfile.comm_cpu_share`); the
latency steps (waits for wake-ups and peers) do not share. u grows with the message size
where measured (topology.comm_cpu_bound_by_bytes): on 2 cores, 4 ranks' byte term stretched
by u = 0.1-0.3 at 2-4 MiB and 0.4-0.6 at 8-16 MiB (calibration/fit_comm_sharing.py).
Where calibration swept several crowding levels (topology.comm_cpu_stretch_by_level) the
measured stretch of the whole collective by kind, level and size replaces u
(`ClusterProfile.comm_cpu_stretch`), applied with the kind's time factor.

Implementations that are no ring (gloo's reduce-scatter, say) are carried by a measured
`Link.time_factor_by_op`: the kind's time over the α–β ring model fitted on all-reduce
(calibration/fit_network.py), applied to the whole collective; 1 where not measured.

β comes from `Link.seconds_per_byte(n)`: efficiency is looked up at the collective's total
size n, the size nccl-tests reports busbw at (doc/PERFORMANCE.md).

No torch and no simpy here: the measurement layer imports `busbw_factor`.
"""

from __future__ import annotations

import math

from perfmodel.cluster import ClusterProfile, Link
from perfmodel.errors import PerfmodelError

ALLREDUCE_ALGORITHMS = ("auto", "ring", "tree")
BROADCAST_ALGORITHMS = ("ring", "binomial")
# nccl-tests (doc/PERFORMANCE.md): busbw = algbw x factor(n ranks)
_BUSBW_FACTORS = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send-recv": lambda n: 1.0,
    "ping-pong": lambda n: 1.0,
}
# (steps, steps that cross a node boundary) of each collective's ring over p ranks on k nodes
_RING_STEPS = {
    "all-reduce": lambda p, k: (2 * (p - 1), 2 * (k - 1)),
    "all-gather": lambda p, k: (p - 1, k - 1),
    "reduce-scatter": lambda p, k: (p - 1, k - 1),
    "broadcast": lambda p, k: (p - 1, k - 1),      # pipelined ring (NCCL)
    "send-recv": lambda p, k: (1, 1 if k > 1 else 0),
    "ping-pong": lambda p, k: (1, 1 if k > 1 else 0),      # one way: half the round trip
}


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests' factor turning algorithm bandwidth S/t into bus bandwidth."""
    if op not in _BUSBW_FACTORS:
        raise PerfmodelError(f"unknown collective '{op}'; choose from: "
                             f"{', '.join(_BUSBW_FACTORS)}")
    _check(ranks, 0.0)
    return _BUSBW_FACTORS[op](ranks)


def ring_steps(op: str, ranks: int, nodes: int) -> tuple[int, int]:
    """(latency steps, those crossing a node boundary) of `op`'s ring over `ranks` ranks
    packed onto `nodes` nodes; the fit of calibration/fit_network.py uses the same counts."""
    if op not in _RING_STEPS:
        raise PerfmodelError(f"unknown collective '{op}'; choose from: "
                             f"{', '.join(_RING_STEPS)}")
    return _RING_STEPS[op](ranks, nodes)


def _check(workers: int, nbytes: float) -> None:
    if workers < 1:
        raise PerfmodelError(f"a collective needs at least 1 rank, got {workers}")
    if nbytes < 0:
        raise PerfmodelError(f"message size must be >= 0 bytes, got {nbytes}")


def _nodes(cluster: ClusterProfile, workers: int) -> int:
    return cluster.nodes_for(workers)


def _beta(cluster: ClusterProfile, workers: int, nbytes: float) -> float:
    """Seconds per byte of the slowest link a ring over `workers` packed ranks uses."""
    beta = cluster.intra_node.seconds_per_byte(nbytes)
    if _nodes(cluster, workers) > 1:
        beta = max(beta, cluster.inter_node.seconds_per_byte(nbytes))
    return beta


def _op_factor(cluster: ClusterProfile, workers: int, op: str, nbytes: float) -> float:
    """The measured time factor of `op` on the bottleneck link, times the measured stretch
    of the whole collective where its ranks outnumber a CPU host's cores."""
    link = cluster.intra_node if _nodes(cluster, workers) == 1 else cluster.inter_node
    return link.time_factor(op) * cluster.comm_cpu_stretch(workers, nbytes, op)


def _bytes_s(cluster: ClusterProfile, workers: int, nbytes: float, byte_seconds: float) -> float:
    """A collective's byte term, stretched where its ranks share the node's CPU cores."""
    return byte_seconds * cluster.comm_cpu_share(workers, nbytes)


def _ring_latency(cluster: ClusterProfile, workers: int, steps: int, inter_steps: int) -> float:
    """`steps` ring steps, `inter_steps` of them crossing a node boundary (NCCL tuning.cc)."""
    if _nodes(cluster, workers) == 1:
        inter_steps = 0
    return ((steps - inter_steps) * cluster.intra_node.latency_s
            + inter_steps * cluster.inter_node.latency_s)


def allreduce_s(cluster: ClusterProfile, workers: int, nbytes: float,
                algorithm: str = "ring") -> float:
    """Seconds for an all-reduce of `nbytes` (per rank, in and out) over `workers` ranks."""
    _check(workers, nbytes)
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise PerfmodelError(f"unknown all-reduce algorithm '{algorithm}'; choose from: "
                             f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    p = workers
    if p == 1:
        return 0.0
    if algorithm == "auto":  # NCCL's tuner picks the fastest predicted algorithm per size
        return min(allreduce_s(cluster, p, nbytes, "ring"), allreduce_s(cluster, p, nbytes,
                                                                          "tree"))
    k = _nodes(cluster, p)
    beta = _beta(cluster, p, nbytes)
    factor = _op_factor(cluster, p, "all-reduce", nbytes)
    if algorithm == "ring":
        latency = _ring_latency(cluster, p, *ring_steps("all-reduce", p, k))
        return (latency + _bytes_s(cluster, p, nbytes, 2 * (p - 1) / p * nbytes * beta)) * factor
    per_node = min(p, cluster.devices_per_node)
    latency = 2 * ((per_node - 1) * cluster.intra_node.latency_s
                   + int(math.log2(k)) * cluster.inter_node.latency_s)
    return (latency + _bytes_s(cluster, p, nbytes, 2 * nbytes * beta)) * factor


def _half_ring_s(cluster: ClusterProfile, workers: int, nbytes: float, op: str) -> float:
    _check(workers, nbytes)
    p = workers
    if p == 1:
        return 0.0
    latency = _ring_latency(cluster, p, *ring_steps(op, p, _nodes(cluster, p)))
    byte_seconds = (p - 1) / p * nbytes * _beta(cluster, p, nbytes)
    return (latency + _bytes_s(cluster, p, nbytes, byte_seconds)) \
        * _op_factor(cluster, p, op, nbytes)


def allgather_s(cluster: ClusterProfile, workers: int, nbytes: float) -> float:
    """Seconds for a ring all-gather whose gathered output is `nbytes` (n/p from each rank)."""
    return _half_ring_s(cluster, workers, nbytes, "all-gather")


def reduce_scatter_s(cluster: ClusterProfile, workers: int, nbytes: float) -> float:
    """Seconds for a ring reduce-scatter of `nbytes` per rank in (n/p out); γ = 0."""
    return _half_ring_s(cluster, workers, nbytes, "reduce-scatter")


def broadcast_s(cluster: ClusterProfile, workers: int, nbytes: float,
                algorithm: str = "ring") -> float:
    """Seconds to broadcast `nbytes` from one rank: pipelined ring (NCCL) or binomial tree."""
    _check(workers, nbytes)
    if algorithm not in BROADCAST_ALGORITHMS:
        raise PerfmodelError(f"unknown broadcast algorithm '{algorithm}'; choose from: "
                             f"{', '.join(BROADCAST_ALGORITHMS)}")
    p = workers
    if p == 1:
        return 0.0
    k = _nodes(cluster, p)
    beta = _beta(cluster, p, nbytes)
    factor = _op_factor(cluster, p, "broadcast", nbytes)
    if algorithm == "ring":
        return (_ring_latency(cluster, p, *ring_steps("broadcast", p, k))
                + _bytes_s(cluster, p, nbytes, nbytes * beta)) * factor
    alpha = cluster.intra_node.latency_s
    if k > 1:
        alpha = max(alpha, cluster.inter_node.latency_s)
    return math.ceil(math.log2(p)) * (alpha + _bytes_s(cluster, p, nbytes, nbytes * beta)) \
        * factor


def link_transfer_s(link: Link, nbytes: float) -> float:
    """Seconds for one point-to-point message of `nbytes` over `link`: α + n·β."""
    _check(1, nbytes)
    return link.latency_s + nbytes * link.seconds_per_byte(nbytes)


def sendrecv_s(cluster: ClusterProfile, nbytes: float, across_nodes: bool = False) -> float:
    """Seconds for one send/recv of `nbytes` between two ranks, in one node or across two."""
    return link_transfer_s(cluster.inter_node if across_nodes else cluster.intra_node, nbytes)


def collective_s(kind: str, cluster: ClusterProfile, workers: int, nbytes: float,
                 algorithm: str = "ring") -> float:
    """Dispatch by the CommRecord kind: all-reduce, all-gather, reduce-scatter, broadcast."""
    if kind == "all-reduce":
        return allreduce_s(cluster, workers, nbytes, algorithm)
    if kind == "all-gather":
        return allgather_s(cluster, workers, nbytes)
    if kind == "reduce-scatter":
        return reduce_scatter_s(cluster, workers, nbytes)
    if kind == "broadcast":
        return broadcast_s(cluster, workers, nbytes, algorithm)
    raise PerfmodelError(f"unknown collective '{kind}'; choose from: all-reduce, all-gather, "
                         f"reduce-scatter, broadcast")
