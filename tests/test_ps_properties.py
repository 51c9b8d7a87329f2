"""Properties the parameter-server network must have, as a systems engineer would probe it
(issue 13; STYLE.md practice 9): hypothesis over sizes, link speeds, apply rates, servers.

Throughput is the work done (workers x steps mini-batches, the same in every run) over the
makespan. Workers are identical and jitter-free here: run by run, asynchronous PS with
unequal workers has list-scheduling anomalies (Graham 1969; see test_sim_ps.py), which say
nothing about the network. Exact MVA under exponential service is checked in
test_sim_ps.py (test_async_throughput_matches_exact_mva, within 2 %).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from perfmodel.sim.ps import SSPPS, AsyncPS, SyncPS
from perfmodel.sim.scenario import Scenario
from tests.test_sim_ps import PAYLOAD_BYTES, STATE_BYTES, WORKLOAD, cluster

TOL = 1e-9              # deterministic runs: float rounding only
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def settings_(draw):
    """(scenario, servers): identical workers, every speed of link, apply and latency."""
    workers = draw(st.integers(1, 12))
    sc = Scenario(cluster=cluster(draw(st.floats(0.2, 50.0)), draw(st.floats(0.0, 500.0)),
                                  draw(st.floats(0.2, 200.0)), per_node=draw(st.integers(1, 8))),
                  workload=WORKLOAD, workers=workers, batch_size=32, steps=6, jitter="none")
    return sc, draw(st.integers(1, 4))


def makespan(strategy, sc: Scenario) -> float:
    return max(r.end_s for r in strategy.simulate(sc).steps)


def strategies(servers: int):
    return [SyncPS(SyncPS.Options(servers=servers)), AsyncPS(AsyncPS.Options(servers=servers)),
            SSPPS(SSPPS.Options(servers=servers, staleness_bound=1))]


def with_cluster(sc: Scenario, **changes) -> Scenario:
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, **changes))


@SETTINGS
@given(settings_(), st.floats(1.0, 8.0))
def test_slower_server_apply_never_raises_throughput(case, factor):
    sc, servers = case
    slower = with_cluster(sc, compute=dataclasses.replace(
        sc.cluster.compute, optimizer_GBps=sc.cluster.compute.optimizer_GBps / factor))
    for strategy in strategies(servers):
        assert makespan(strategy, slower) >= makespan(strategy, sc) * (1 - TOL)


@SETTINGS
@given(settings_(), st.floats(1.0, 8.0))
def test_slower_link_never_raises_throughput(case, factor):
    sc, servers = case
    link = sc.cluster.inter_node
    slower = with_cluster(sc, inter_node=dataclasses.replace(
        link, bandwidth_GBps=link.bandwidth_GBps / factor))
    for strategy in strategies(servers):
        assert makespan(strategy, slower) >= makespan(strategy, sc) * (1 - TOL)


@SETTINGS
@given(settings_(), st.floats(1.0, 4.0))
def test_slower_workers_never_raise_throughput(case, factor):
    sc, servers = case
    slower = dataclasses.replace(sc, speed=(1 / factor,) * sc.workers)
    for strategy in strategies(servers):
        assert makespan(strategy, slower) >= makespan(strategy, sc) * (1 - TOL)


@SETTINGS
@given(settings_())
def test_delay_compensation_never_raises_throughput(case):
    sc, servers = case
    plain = AsyncPS(AsyncPS.Options(servers=servers))
    dc = AsyncPS(AsyncPS.Options(servers=servers, delay_compensation=True))
    assert makespan(dc, sc) >= makespan(plain, sc) * (1 - TOL)


@SETTINGS
@given(settings_())
def test_async_at_least_as_fast_as_sync(case):
    # Async applies the optimizer for every gradient, sync sums N gradients (one cheap pass
    # each) and applies once: where the server's apply is the bottleneck sync can win
    # (hypothesis found 6 workers, a 1 GB/s server: sync 1 % faster). So: wherever a
    # gradient's apply takes no longer than its push through the server's NIC.
    sc, servers = case
    c = sc.cluster
    apply_s = STATE_BYTES * WORKLOAD.params / (c.compute.optimizer_GBps * 1e9)
    assume(apply_s <= PAYLOAD_BYTES / (c.inter_node.bandwidth_GBps * 1e9))
    sync = makespan(SyncPS(SyncPS.Options(servers=servers)), sc)
    assert makespan(AsyncPS(AsyncPS.Options(servers=servers)), sc) <= sync * (1 + TOL)


@SETTINGS
@given(settings_(), st.integers(1, 3))
def test_more_dedicated_servers_never_lower_throughput(case, extra):
    # Each dedicated server brings its own NIC; links are flat (no small-message
    # efficiency loss, which would make smaller shards slower per byte: a real cost).
    # Nodes hold equal numbers of workers: with unequal nodes (10 workers, 7 per node: 7 + 3
    # sharing two NICs) the workers are not alike, and async FCFS has a list-scheduling
    # anomaly (Graham 1969): 3 servers finished 0.037 % later than 2 (hypothesis found it).
    sc, servers = case
    per_node = sc.cluster.devices_per_node
    assume(sc.workers % per_node == 0 or per_node >= sc.workers)
    for cls in (AsyncPS, SyncPS):
        few = cls(cls.Options(servers=servers, server_placement="dedicated"))
        more = cls(cls.Options(servers=servers + extra, server_placement="dedicated"))
        assert makespan(more, sc) <= makespan(few, sc) * (1 + TOL)
