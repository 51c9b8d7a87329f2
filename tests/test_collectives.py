"""Collective cost formulas against hand-computed values and nccl-tests' busbw definition.

Sources: Thakur, Rabenseifner & Gropp, IJHPCA 2005 (ring and binomial costs); NCCL
src/graph/tuning.cc (hierarchical latency, tree = half the bus bandwidth); nccl-tests
doc/PERFORMANCE.md (busbw factors).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from factories import flat_link, make_cluster
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import (
    allgather_s,
    allreduce_s,
    broadcast_s,
    busbw_factor,
    collective_s,
    reduce_scatter_s,
    sendrecv_s,
)

REL = 1e-12                 # closed forms: only float rounding separates them
ALPHA_INTRA, ALPHA_INTER = 5e-6, 20e-6
B_INTRA, B_INTER = 100e9, 10e9          # bytes per second
N = 1e8                                 # bytes


@pytest.fixture(scope="module")
def cluster():
    """a100 topology (8 devices per node) with flat links: β = 1/B exactly."""
    return make_cluster(intra_node=flat_link(B_INTRA / 1e9, ALPHA_INTRA * 1e6),
                        inter_node=flat_link(B_INTER / 1e9, ALPHA_INTER * 1e6))


def test_ring_allreduce_one_node(cluster):
    # Thakur et al.: 2(p-1)α + 2(p-1)/p·nβ, p = 4 inside one node
    expected = 2 * 3 * ALPHA_INTRA + 2 * 3 / 4 * N / B_INTRA
    assert allreduce_s(cluster, 4, N) == pytest.approx(expected, rel=REL)


def test_ring_allreduce_across_nodes_is_bounded_by_the_nic(cluster):
    # 16 ranks on 2 nodes: bandwidth of the slowest link (the NIC); NCCL tuning.cc counts
    # 2(k-1) = 2 of the 2(p-1) = 30 steps at the inter-node latency
    expected = 28 * ALPHA_INTRA + 2 * ALPHA_INTER + 2 * 15 / 16 * N / B_INTER
    assert allreduce_s(cluster, 16, N) == pytest.approx(expected, rel=REL)


def test_tree_allreduce(cluster):
    # NCCL tuning.cc: latency 2((p/k - 1)α_intra + floor(lg k)α_inter), algbw = busbw / 2
    one_node = 2 * 3 * ALPHA_INTRA + 2 * N / B_INTRA
    assert allreduce_s(cluster, 4, N, "tree") == pytest.approx(one_node, rel=REL)
    four_nodes = 2 * (7 * ALPHA_INTRA + 2 * ALPHA_INTER) + 2 * N / B_INTER
    assert allreduce_s(cluster, 32, N, "tree") == pytest.approx(four_nodes, rel=REL)


def test_tree_beats_ring_on_latency_at_scale():
    # small messages on many nodes: lg k latency steps against 2(p-1)
    c = make_cluster()
    assert allreduce_s(c, 512, 1e4, "tree") < allreduce_s(c, 512, 1e4, "ring")
    assert allreduce_s(c, 8, 1e9, "tree") > allreduce_s(c, 8, 1e9, "ring")


def test_allgather_and_reduce_scatter(cluster):
    # Thakur et al.: (p-1)α + (p-1)/p·nβ (γ = 0)
    one_node = 3 * ALPHA_INTRA + 3 / 4 * N / B_INTRA
    assert allgather_s(cluster, 4, N) == pytest.approx(one_node, rel=REL)
    assert reduce_scatter_s(cluster, 4, N) == pytest.approx(one_node, rel=REL)
    # 16 ranks on 2 nodes: k-1 = 1 of the p-1 = 15 steps crosses the NIC
    two_nodes = 14 * ALPHA_INTRA + ALPHA_INTER + 15 / 16 * N / B_INTER
    assert allgather_s(cluster, 16, N) == pytest.approx(two_nodes, rel=REL)


def test_broadcast(cluster):
    # pipelined ring (NCCL, busbw factor 1): (p-1)α + nβ; binomial: ceil(lg p)(α + nβ)
    assert broadcast_s(cluster, 4, N) == pytest.approx(3 * ALPHA_INTRA + N / B_INTRA, rel=REL)
    assert broadcast_s(cluster, 5, N, "binomial") == pytest.approx(
        3 * (ALPHA_INTRA + N / B_INTRA), rel=REL)


def test_sendrecv(cluster):
    assert sendrecv_s(cluster, N) == pytest.approx(ALPHA_INTRA + N / B_INTRA, rel=REL)
    assert sendrecv_s(cluster, N, across_nodes=True) == pytest.approx(
        ALPHA_INTER + N / B_INTER, rel=REL)


def test_one_rank_costs_nothing(cluster):
    for f in (allreduce_s, allgather_s, reduce_scatter_s, broadcast_s):
        assert f(cluster, 1, N) == 0.0


def test_size_dependent_efficiency_is_used():
    # a100 NVLink: 77 % of 300 GB/s at 1.3e8 bytes (profile curve), 3 µs per step
    c = make_cluster()
    expected = 2 * 7 * 3e-6 + 2 * 7 / 8 * 1.3e8 / (300e9 * 0.77)
    assert allreduce_s(c, 8, 1.3e8) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("op", "ranks", "factor"), [
    ("all-reduce", 8, 1.75), ("all-gather", 8, 0.875), ("reduce-scatter", 4, 0.75),
    ("broadcast", 8, 1.0), ("send-recv", 2, 1.0), ("all-reduce", 1, 0.0)])
def test_busbw_factors(op, ranks, factor):
    # nccl-tests doc/PERFORMANCE.md
    assert busbw_factor(op, ranks) == pytest.approx(factor, rel=REL)


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 64])
def test_busbw_equals_link_bandwidth_without_latency(ranks):
    # nccl-tests: busbw = S/t x factor is what the bottleneck link carries; with α = 0 and a
    # flat link the ring formulas give exactly the link bandwidth
    c = make_cluster(intra_node=flat_link(B_INTRA / 1e9), inter_node=flat_link(B_INTER / 1e9))
    bandwidth = B_INTRA if ranks <= 8 else B_INTER
    for op, f in (("all-reduce", allreduce_s), ("all-gather", allgather_s),
                  ("reduce-scatter", reduce_scatter_s), ("broadcast", broadcast_s)):
        busbw = N / f(c, ranks, N) * busbw_factor(op, ranks)
        assert busbw == pytest.approx(bandwidth, rel=REL), op


def test_bad_input_is_a_perfmodel_error(cluster):
    with pytest.raises(PerfmodelError):
        allreduce_s(cluster, 0, N)
    with pytest.raises(PerfmodelError):
        allgather_s(cluster, 4, -1.0)
    with pytest.raises(PerfmodelError):
        allreduce_s(cluster, 4, N, "butterfly")
    with pytest.raises(PerfmodelError):
        broadcast_s(cluster, 4, N, "tree")
    with pytest.raises(PerfmodelError):
        busbw_factor("all-to-all", 4)


@given(bw=st.floats(0.1, 1000.0), more=st.floats(1.0, 100.0), workers=st.integers(1, 200),
       nbytes=st.floats(0.0, 1e10), algorithm=st.sampled_from(["ring", "tree"]))
def test_more_bandwidth_is_never_slower(bw, more, workers, nbytes, algorithm):
    # property (STYLE.md): times are non-negative and monotone in bandwidth
    slow = make_cluster(intra_node=flat_link(bw, 2.0), inter_node=flat_link(bw / 4, 10.0))
    fast = make_cluster(intra_node=flat_link(bw * more, 2.0),
                        inter_node=flat_link(bw * more / 4, 10.0))
    for f in (allgather_s, reduce_scatter_s, broadcast_s):
        assert 0.0 <= f(fast, workers, nbytes) <= f(slow, workers, nbytes)
    t_fast = allreduce_s(fast, workers, nbytes, algorithm)
    assert 0.0 <= t_fast <= allreduce_s(slow, workers, nbytes, algorithm)
    assert math.isfinite(t_fast)


@pytest.mark.parametrize("workers", [2, 8, 64, 1024])
@pytest.mark.parametrize("nbytes", [1e3, 1e6, 1e9])
def test_auto_allreduce_takes_the_faster_algorithm(workers, nbytes):
    # NCCL's tuner (src/graph/tuning.cc) picks the algorithm with the lowest predicted time.
    cluster = make_cluster("a100")
    ring = allreduce_s(cluster, workers, nbytes, "ring")
    tree = allreduce_s(cluster, workers, nbytes, "tree")
    assert allreduce_s(cluster, workers, nbytes, "auto") == min(ring, tree)


@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "reduce-scatter", "broadcast"])
def test_cpu_driven_collectives_share_the_nodes_cores(op):
    # p ranks on c < p cores: each gets c/p of a core, so the byte term (the copies and
    # reductions) takes p/c as long and the latency steps (waits) do not stretch; up to c
    # ranks, nothing changes; across nodes only the ranks per node count
    free = make_cluster("local", comm_cpu_cores_per_node=0)
    cpu = make_cluster("local", comm_cpu_cores_per_node=2)
    n = 4e6

    def stretched(c_free, p, factor):
        latency = collective_s(op, c_free, p, 0.0)
        return latency + factor * (collective_s(op, c_free, p, n) - latency)

    for p, factor in ((2, 1.0), (4, 2.0), (8, 4.0)):
        assert collective_s(op, cpu, p, n) == pytest.approx(stretched(free, p, factor))
        assert collective_s(op, cpu, p, 0.0) == pytest.approx(collective_s(op, free, p, 0.0))
    nodes = make_cluster("local", comm_cpu_cores_per_node=2, devices_per_node=4)
    nodes_free = make_cluster("local", comm_cpu_cores_per_node=0, devices_per_node=4)
    assert collective_s(op, nodes, 16, n) == pytest.approx(stretched(nodes_free, 16, 2.0))
    assert sendrecv_s(cpu, n) == sendrecv_s(free, n)       # one message: one core each end


def test_a_measured_time_factor_scales_only_its_kind():
    base = make_cluster("local", comm_cpu_cores_per_node=0)
    slow_rs = make_cluster("local", comm_cpu_cores_per_node=0, intra_node=dataclasses.replace(
        base.intra_node, time_factor_by_op=(("reduce-scatter", 3.0),)))
    n = 4e6
    assert reduce_scatter_s(slow_rs, 2, n) == pytest.approx(3 * reduce_scatter_s(base, 2, n))
    assert allgather_s(slow_rs, 2, n) == allgather_s(base, 2, n)
    assert allreduce_s(slow_rs, 2, n) == allreduce_s(base, 2, n)
