"""A CPU host's parameter server is one thread (measure/runs/ps.py serve_async): it receives
a push, applies it and replies at once to every worker the apply leaves free to go on, in
worker order, before it receives the next push. perfmodel/sim/ps.py `serial_worker` books
each reply with the push it answers; these tests hold it to the real server's rules."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.sim import psnet
from perfmodel.sim.ps import SSPPS, AsyncPS, SyncPS, _PSRun, server_pass_s
from perfmodel.sim.scenario import Scenario
from tests.test_sim_ps import WORKLOAD, cluster

TOL = 1e-9
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def serial_cluster(link_GBps: float = 5.0, apply_GBps: float = 20.0):
    """test_sim_ps's cluster with CPU-host servers (serial) on one node's loopback, and cores
    enough that sharing never slows anything (a pure test of the server's order)."""
    base = cluster(link_GBps, 10.0, apply_GBps)
    c = dataclasses.replace(base, compute_cpu_cores_per_node=1000,
                            compute_occupies_cores=False,
                            server=dataclasses.replace(base.server, link="intra_node"),
                            intra_node=base.inter_node)
    assert psnet.serial_server(c)
    return c


def scenario(workers: int, speeds=(), steps: int = 8, **kw) -> Scenario:
    return Scenario(cluster=kw.pop("cluster", serial_cluster()), workload=WORKLOAD,
                    workers=workers, batch_size=32, steps=steps, speed=speeds,
                    jitter="none", **kw)


def real_server_ready(pushes: list[int], workers: int, bound: int | None) -> list[list[int]]:
    """measure/runs/ps.py serve_async's rule, transcribed: after each push, the workers it
    replies to."""
    clocks, held, out = [0] * workers, set(), []
    for w in pushes:
        clocks[w] += 1
        held.add(w)
        slowest = min(clocks)
        ready = sorted(v for v in held if bound is None or clocks[v] - slowest <= bound)
        held.difference_update(ready)
        out.append(ready)
    return out


@SETTINGS
@given(st.integers(1, 6), st.one_of(st.none(), st.integers(0, 3)), st.data())
def test_the_model_releases_whom_the_real_server_releases(workers, bound, data):
    run = _PSRun(scenario(workers), 1, None, staleness_bound=bound)
    waiting = set(range(workers))               # workers with their parameters, free to push
    pushes, model = [], []
    for _ in range(data.draw(st.integers(1, 40))):
        if not waiting:
            break
        w = data.draw(st.sampled_from(sorted(waiting)))
        waiting.discard(w)
        pushes.append(w)
        ready = run._ready_after(0, w, True)
        model.append(ready)
        waiting.update(ready)
    assert model == real_server_ready(pushes, workers, bound)


def _pulls(result):
    by_start = defaultdict(list)
    for c in result.comms:
        if c.kind == "pull":
            by_start[round(c.start_s, 12)].append(c)
    return by_start


def test_an_ssp_release_is_one_batch_of_replies_in_worker_order():
    # bound 1, the last worker at half speed: the others wait for it, and its apply releases
    # them; the real server then answers them and it in one loop, worker 0 first
    result = SSPPS(SSPPS.Options(staleness_bound=1)).simulate(
        scenario(4, speeds=(1.0, 1.0, 1.0, 0.5), steps=10))
    batches = [b for b in _pulls(result).values() if len(b) > 1]
    assert batches, "the straggler never released anyone"
    for batch in batches:
        order = sorted(batch, key=lambda c: c.end_s)
        assert [c.worker for c in order] == sorted(c.worker for c in batch)
    # the straggler, released with the others, waits for their replies before its own
    late = [b for b in batches if any(c.worker == 3 for c in b)]
    assert late and all(max(b, key=lambda c: c.end_s).worker == 3 for b in late)


def test_an_async_reply_never_queues_behind_pushes_that_came_during_its_apply():
    # many workers, a slow apply: pushes pile up while one is applied; the real server still
    # replies to that worker before it receives the next push, so every reply takes exactly
    # one transfer, never a wait behind the queue
    sc = scenario(6, steps=6, cluster=serial_cluster(link_GBps=5.0, apply_GBps=0.5))
    result = AsyncPS().simulate(sc)
    # (the first parameters go to everyone at t = 0, one after another: left out)
    durations = [c.end_s - c.start_s for c in result.comms if c.kind == "pull" and c.start_s]
    assert len(durations) == 6 * 6            # every push answered, the last ones too
    assert max(durations) <= min(durations) * (1 + TOL)
    queued = [c.end_s - c.start_s for c in result.comms if c.kind == "push"]
    assert max(queued) > min(queued) * 1.5       # the pushes did queue


@SETTINGS
@given(st.integers(1, 8), st.floats(1.0, 8.0), st.sampled_from([None, 0, 1, 3]))
def test_on_a_serial_server_a_slower_apply_never_raises_throughput(workers, factor, bound):
    sc = scenario(workers, steps=6)
    slower = dataclasses.replace(sc, cluster=dataclasses.replace(
        sc.cluster, compute=dataclasses.replace(
            sc.cluster.compute, optimizer_GBps=sc.cluster.compute.optimizer_GBps / factor)))
    strategy = (AsyncPS() if bound is None
                else SSPPS(SSPPS.Options(staleness_bound=bound)))
    end = lambda s: max(r.end_s for r in strategy.simulate(s).steps)   # noqa: E731
    assert end(slower) >= end(sc) * (1 - TOL)


@SETTINGS
@given(st.integers(1, 8), st.integers(0, 3))
def test_on_a_serial_server_async_is_at_least_as_fast_as_ssp(workers, bound):
    sc = scenario(workers, speeds=tuple([1.0] * (workers - 1) + [0.5]), steps=6)
    end = lambda strategy: max(r.end_s for r in strategy.simulate(sc).steps)   # noqa: E731
    assert end(AsyncPS()) <= end(SSPPS(SSPPS.Options(staleness_bound=bound))) * (1 + TOL)


def test_every_step_is_simulated_once_and_staleness_is_whole():
    sc = scenario(5, speeds=(1.0, 1.0, 0.7, 1.0, 0.4), steps=7)
    for strategy in (AsyncPS(), SSPPS(SSPPS.Options(staleness_bound=1))):
        result = strategy.simulate(sc)
        assert len(result.steps) == 5 * 7                 # the shared budget, all of it
        assert all(u.version_applied >= u.version_read for u in result.updates)
        assert sorted(u.version_applied for u in result.updates) == list(range(5 * 7))


def test_a_serial_servers_message_moves_only_when_both_sides_are_free():
    # gloo over loopback has no buffer between the two processes' copies: a push posted while
    # the server receives another waits for it, and the pushing worker's side is held for
    # the same span the server's receive is (that span is what core sharing counts as the
    # sender copying); a NIC with a switch between (not serial) lets the sender finish
    # into the buffer and the receiver drain it later
    for serial in (True, False):
        c = serial_cluster()
        if not serial:
            c = dataclasses.replace(c, compute_cpu_cores_per_node=0)
        assert psnet.serial_server(c) is serial
        run = _PSRun(scenario(3, cluster=c), 1, None)    # (not serial: server on worker 0's)
        first = run.send(1, 0, "push", run.push_routes)            # the server takes it first
        second = run.send(2, 0, "push", run.push_routes)           # posted at the same moment
        out, into, carry_s, latency_s, _, _ = run.push_routes[2 * run.nservers]
        assert carry_s > 0 and first == pytest.approx(carry_s + latency_s, rel=TOL)
        assert second == pytest.approx(2 * carry_s + latency_s, rel=TOL)   # the receiver's
        assert run.link_free[into] == pytest.approx(2 * carry_s, rel=TOL)
        sender_done = run.link_free[out]
        assert sender_done == pytest.approx(2 * carry_s if serial else carry_s, rel=TOL)


def test_a_serial_sync_server_sums_a_steps_first_push_for_free():
    # measure/runs/ps.py serve_sync receives a step's first push into the sum and adds each
    # later one: with one worker there is no pass at all, so a synchronous step takes what
    # an asynchronous one does (push, apply, reply), and with N workers N - 1 passes
    one = scenario(1, steps=6, cluster=serial_cluster(apply_GBps=0.5))
    sync_steps = [s.end_s - s.start_s for s in SyncPS().simulate(one).steps]
    async_steps = [s.end_s - s.start_s for s in AsyncPS().simulate(one).steps]
    assert sync_steps == pytest.approx(async_steps, rel=TOL)
    fast_links = serial_cluster(link_GBps=1e6, apply_GBps=0.5)      # transfers ~ 0
    step = {n: SyncPS().simulate(scenario(n, steps=6, cluster=fast_links)).steps[-1]
            for n in (1, 3)}
    passes = (step[3].end_s - step[3].start_s) - (step[1].end_s - step[1].start_s)
    assert passes == pytest.approx(2 * server_pass_s(fast_links, WORKLOAD, WORKLOAD.params),
                                   rel=1e-3)
