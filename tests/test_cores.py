"""Compute under core sharing (perfmodel/sim/cores.py, ClusterProfile.compute_share) against
processor-sharing theory and hand calculations.

Theory (Kleinrock 1976, processor sharing; docs/model.md "Compute under core sharing"):
b busy processes on c cores each get min(1, c/b) of a core, so a computation takes
max(1, b/c) times as long; a server busy a fraction d of a computation adds d to b, so c
computing workers beside it take (c + d)/c = 1 + d/c as long. Contention κ multiplies by
1 + κ·(min(b, c) − 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodel.cluster import Link
from perfmodel.sim import cores
from perfmodel.sim.collectives import allgather_s, reduce_scatter_s
from perfmodel.sim.compute import ps_worker_host_seconds, ps_worker_seconds, unit_times
from perfmodel.sim.ddp import DDP
from perfmodel.sim.fsdp import FSDP
from perfmodel.sim.ps import AsyncPS, SyncPS
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload
from tests.factories import make_cluster, make_workload

EXACT_TOL = 1e-9
WORKLOAD = make_workload()


def cpu_host(cores_: int = 2, contention: float = 0.0, **changes):
    base = make_cluster("local")
    return make_cluster("local", compute_cpu_cores_per_node=cores_,
                        compute=dataclasses.replace(base.compute, core_contention=contention),
                        **changes)


# -- the sharing factor ----------------------------------------------------------------------

@pytest.mark.parametrize("busy, c, expected", [
    (1, 2, 1.0), (2, 2, 1.0), (3, 2, 1.5), (4, 2, 2.0), (8, 2, 4.0), (5, 4, 1.25), (1, 1, 1.0)])
def test_processor_sharing_without_contention_is_max_one_p_over_c(busy, c, expected):
    assert cpu_host(c).compute_share(busy) == pytest.approx(expected, rel=EXACT_TOL)


@pytest.mark.parametrize("d", [0.0, 0.25, 0.5, 1.0])
def test_a_server_busy_d_of_the_time_beside_c_workers_costs_one_plus_d_over_c(d):
    for c in (1, 2, 4):
        assert cpu_host(c).compute_share(c + d) == pytest.approx(1 + d / c, rel=EXACT_TOL)


def test_contention_scales_every_busy_core_after_the_first():
    k = 0.2
    host = cpu_host(2, k)
    assert host.compute_share(1) == 1.0
    assert host.compute_share(2) == pytest.approx(1 + k, rel=EXACT_TOL)
    assert host.compute_share(3) == pytest.approx((1 + k) * 1.5, rel=EXACT_TOL)
    assert host.compute_share(1.5) == pytest.approx(1 + 0.5 * k, rel=EXACT_TOL)


def test_gpu_profiles_never_share_compute():
    for name in ("a100", "a10g", "h100"):
        gpu = make_cluster(name)
        assert gpu.compute_cpu_cores_per_node == 0
        assert gpu.compute_share(64) == 1.0


def test_shipped_local_profile_shares_its_two_cores():
    local = make_cluster("local")
    assert local.compute_cpu_cores_per_node == 2
    assert local.compute_share(4) == pytest.approx(2.0 * (1 + local.compute.core_contention))


# -- busy counts from spans ------------------------------------------------------------------

def test_overlap_fraction_by_hand():
    # compute [0, 10]; busy [2, 4] and [8, 12]: 2 + 2 = 4 of 10 seconds
    assert cores.overlap_fraction([(0, 10)], [(2, 4), (8, 12)]) == pytest.approx(0.4)
    # two computes [0, 10], [5, 15]: each sees the other half the time -> 1.5 on average
    spans = [(0, 10), (5, 15)]
    assert cores.overlap_fraction(spans, spans) == pytest.approx(1.5)
    assert cores.mean_busy(spans, [[(0, 20)]]) == pytest.approx(2.5)
    assert cores.mean_busy([], [[(0, 1)]]) == 1.0


def test_fluid_stretch_is_processor_sharing_given_who_is_busy():
    two = cpu_host(2)
    # two workers compute [0, 10] while a server applies [0, 5]: 3 busy on 2 cores for half
    # the time (rate 2/3), 2 busy the rest (rate 1): work 5·2/3 + 5 = 8.33 in 10 s -> 1.2
    compute = [(0, 10), (0, 10)]
    assert cores.fluid_stretch(compute, [[(0, 5)]], two.compute_share) == pytest.approx(1.2)
    # the average-b shortcut would say 1.25 (b = 2.5): Jensen; the fluid one is exact
    assert two.compute_share(cores.mean_busy(compute, [[(0, 5)]])) == pytest.approx(1.25)
    # one core, two processes always busy together: each takes twice as long
    assert cores.fluid_stretch([(0, 4)], [[(0, 4)]], cpu_host(1).compute_share) == \
        pytest.approx(2.0)
    # a GPU shared with a colocated apply for 2 of the worker's 8 s: work 6 + 2/2 = 7 -> 8/7
    assert cores.fluid_stretch([(0, 8)], [[(0, 2)]], cores.device_share) == \
        pytest.approx(8 / (6 + 1))
    assert cores.fluid_stretch([], [[(0, 1)]], two.compute_share) == 1.0


# -- the strategies --------------------------------------------------------------------------

def _compute_s(result, warmup=2) -> float:
    return float(np.mean([s.compute_s for s in result.steps if s.step >= warmup]))


def test_ddp_four_ranks_on_two_cores_compute_twice_as_long_as_two():
    host = cpu_host(2)
    runs = {n: DDP().simulate(Scenario(cluster=host, workload=WORKLOAD, workers=n,
                                       batch_size=32, jitter="none")) for n in (2, 4)}
    assert _compute_s(runs[4]) / _compute_s(runs[2]) == pytest.approx(2.0, rel=EXACT_TOL)


def test_one_ps_worker_never_computes_while_its_server_applies():
    # 1 worker: the server applies only while the worker waits for it, so its duty cycle
    # during compute is 0 and the worker computes at full speed even on one core
    host = cpu_host(1, server=dataclasses.replace(make_cluster("local").server,
                                                  link="intra_node"))
    sc = Scenario(cluster=host, workload=WORKLOAD, workers=1, batch_size=32, jitter="none")
    nominal = ps_worker_seconds(host, WORKLOAD, 32)
    for strategy in (AsyncPS(), SyncPS()):
        assert _compute_s(strategy.simulate(sc)) == pytest.approx(nominal, rel=EXACT_TOL)


def test_async_ps_compute_stretch_stays_within_processor_sharing_bounds():
    # 2 workers + a colocated server on c cores: b lies in [1, 3], so the stretch lies in
    # [1, max(1, 3/c)]; fewer cores never raise throughput
    thr = {}
    for c in (1, 2, 3):
        host = cpu_host(c)
        sc = Scenario(cluster=host, workload=WORKLOAD, workers=2, batch_size=32,
                      jitter="none")
        nominal = ps_worker_seconds(host, WORKLOAD, 32)
        res = AsyncPS().simulate(sc)
        stretch = _compute_s(res) / nominal
        assert 1.0 - 1e-9 <= stretch <= max(1.0, 3 / c) + 1e-9, (c, stretch)
        done = [s for s in res.steps if s.step >= 2]
        thr[c] = len(done) / (max(s.end_s for s in done) - min(s.start_s for s in done))
    assert thr[1] <= thr[2] * 1.001 <= thr[3] * 1.002


def test_gpu_colocated_server_slows_only_the_worker_whose_device_it_shares():
    gpu = make_cluster("a100")
    sc = Scenario(cluster=gpu, workload=WORKLOAD, workers=4, batch_size=32, jitter="none")
    colocated = AsyncPS(AsyncPS.Options(server_placement="colocated")).simulate(sc)
    dedicated = AsyncPS(AsyncPS.Options(server_placement="dedicated")).simulate(sc)
    per_worker = {w: np.mean([s.compute_s for s in colocated.steps if s.worker == w])
                  for w in range(4)}
    nominal = ps_worker_seconds(gpu, WORKLOAD, 32)
    assert per_worker[0] > nominal * (1 + 1e-6)             # the host shares its device
    for w in (1, 2, 3):
        assert per_worker[w] == pytest.approx(nominal, rel=EXACT_TOL)
    assert _compute_s(dedicated) == pytest.approx(nominal, rel=EXACT_TOL)


def test_fsdp_on_gloo_blocks_so_step_is_compute_plus_every_collective():
    # CPU-driven communication: every all-gather and reduce-scatter stands the rank still,
    # so one step = all compute + FSDP2's copies + every collective, nothing hidden
    host = cpu_host(2)
    n = 2
    sc = Scenario(cluster=host, workload=WORKLOAD, workers=n, batch_size=32, jitter="none")
    res = FSDP().simulate(sc)
    t = unit_times(host, WORKLOAD, 32, optimizer_param_fraction=1 / n, busy=n)
    comm = sum(2 * allgather_s(host, n, u.params * 4) + reduce_scatter_s(host, n, u.params * 4)
               for u in WORKLOAD.units)
    # 2 gathers and 1 scatter, each copying (2 + 1/N) x its bytes on gloo, at the FSDP copy
    # rate (here unmeasured: the optimizer's), and the whole gradient divided in place
    copies = sum(3 * u.params * 4 * (2 + 1 / n) + u.params * 4 for u in WORKLOAD.units) \
        / (host.compute.optimizer_GBps * 1e9) * host.compute_share(n)
    steps = [s.end_s - s.start_s for s in res.steps if s.step >= 2]
    assert np.mean(steps) == pytest.approx(t.step_s + copies + comm, rel=1e-9)
    gpu = FSDP().simulate(dataclasses.replace(sc, cluster=make_cluster(
        "local", comm_cpu_cores_per_node=0)))
    assert np.mean([s.end_s - s.start_s for s in gpu.steps if s.step >= 2]) < np.mean(steps)


def test_a_straggler_on_a_cpu_host_holds_a_core_only_while_it_computes():
    # measure/timing.py's Straggler: a worker of speed s computes, then sleeps
    # compute·(1/s − 1), which holds no core. 2 async workers on 1 core (no CPU copies):
    # an equal partner is busy nearly all the time, so the fast worker's compute stretches
    # by about 2; a partner of speed 0.25 computes a quarter of its span, so the fast
    # worker's stretch beyond 1 is about a quarter of that (processor sharing), well under
    # half. The slow worker's own busy part runs while the fast worker computes nearly all
    # the time, so it is stretched as much as two equal workers are: each speed class has
    # its own stretch (a stretch pooled over both, as until session 25, would sit between)
    host = cpu_host(1, comm_cpu_cores_per_node=0)
    nominal = ps_worker_seconds(host, WORKLOAD, 32)
    extra, extra_slow = {}, {}
    for slow in (1.0, 0.25):
        sc = Scenario(cluster=host, workload=WORKLOAD, workers=2, batch_size=32,
                      jitter="none", speed=(1.0, slow))
        res = AsyncPS().simulate(sc)
        fast = np.mean([s.compute_s for s in res.steps if s.step >= 2 and s.worker == 0])
        other = np.mean([s.compute_s for s in res.steps if s.step >= 2 and s.worker == 1])
        extra[slow] = fast / nominal - 1.0
        extra_slow[slow] = other * slow / nominal - 1.0
    assert extra[1.0] > 0.8
    assert extra_slow[1.0] == pytest.approx(extra[1.0], rel=1e-9)     # alike: one stretch
    assert 0.0 < extra[0.25] < 0.5 * extra[1.0]
    assert extra_slow[0.25] > 0.8 > 2 * extra[0.25]


@pytest.mark.parametrize("strategy", ["async", "ssp"])
def test_a_timed_wait_straggler_waits_for_a_core_as_the_fast_workers_do(strategy):
    # A timed wait's worker holds a core only for its own CPU work (copies, zero gradients),
    # the same at any speed: the node's workers share one stretch (sim/ps.py
    # `_stretch_classes`), and a straggler's sleep is its compute so far x (1/s − 1),
    # that compute including the wait for a core (measure/timing.py `Straggler.delay`).
    # So with exact draws a straggler's compute x its speed is the fast workers' compute
    # exactly: the wait slowed down with the rest. Until session 28 the straggler had a
    # stretch of its own (smaller: its copies met fewer others) added after the slowdown,
    # its compute before the sleep 18.5 ms against the fast workers' 24.1 where the runs
    # measured 24.8 against 23.9-26.1 (docs/model.md)
    from perfmodel.sim.ps import SSPPS, SSPPSOptions
    host = dataclasses.replace(cpu_host(2), compute_occupies_cores=False)
    host = dataclasses.replace(host, compute=dataclasses.replace(host.compute,
                                                                 sharing_delay_cv=0.0))
    sc = Scenario(cluster=host, workload=WORKLOAD, workers=4, batch_size=32, jitter="none",
                  speed=(1.0, 1.0, 1.0, 0.5), steps=40)
    sim = AsyncPS() if strategy == "async" else SSPPS(SSPPSOptions(staleness_bound=1))
    res = sim.simulate(sc)
    done = [s for s in res.steps if s.step >= 2]
    fast = [s.compute_s for s in done if s.worker < 3]
    slow = [s.compute_s * 0.5 for s in done if s.worker == 3]
    nominal = ps_worker_seconds(host, WORKLOAD, 32)
    assert min(fast) > nominal * (1 + 1e-6)                 # the workers do wait for a core
    assert max(fast) == pytest.approx(min(fast), rel=EXACT_TOL)
    assert slow and all(x == pytest.approx(fast[0], rel=EXACT_TOL) for x in slow)


def test_cpu_copies_of_ps_transfers_count_as_busy_processes():
    # gloo on a CPU host: both sides of a push or pull keep a core busy copying. 2 async
    # workers on 2 cores: without copies b never exceeds 2 (the applied worker waits), so
    # compute is not stretched; with them, one worker's transfer (2 copying processes)
    # overlaps the other's compute: b up to 3 -> stretch in (1, 1.5]
    stretch = {}
    for comm_cores in (0, 2):
        host = cpu_host(2, comm_cpu_cores_per_node=comm_cores)
        sc = Scenario(cluster=host, workload=WORKLOAD, workers=2, batch_size=32, jitter="none")
        nominal = ps_worker_seconds(host, WORKLOAD, 32)
        stretch[comm_cores] = _compute_s(AsyncPS().simulate(sc)) / nominal
    assert stretch[0] == pytest.approx(1.0, rel=EXACT_TOL)
    assert 1.0 < stretch[2] <= 1.5 + 1e-9


def test_timed_wait_workers_sleep_and_wait_for_a_core_only_for_their_own_cpu_work():
    # perfmodel compare's timed-wait runs: the workers' compute is a sleep (no core), their
    # own CPU work (copies, zero gradients: paid back from the sleeps), the server's applies
    # and the messages' CPU copies are real work on the host's cores; a worker's compute is
    # its sleeps plus the wait for a core of its own work: paid x (stretch - 1), the stretch
    # at most that of every process busy at once
    host = dataclasses.replace(cpu_host(2), compute_occupies_cores=False)
    sc = Scenario(cluster=host, workload=WORKLOAD, workers=8, batch_size=32, jitter="none")
    nominal = ps_worker_seconds(host, WORKLOAD, 32)
    paid = ps_worker_host_seconds(host, WORKLOAD)
    result = AsyncPS().simulate(sc)
    assert paid > 0
    assert nominal < _compute_s(result) <= \
        nominal + paid * (host.compute_share(8 + 1 + 2 * 8) - 1.0) + 1e-12
    assert ps_worker_host_seconds(cpu_host(2), WORKLOAD) < paid         # + the zero gradients
    free = dataclasses.replace(host, compute_cpu_cores_per_node=0, comm_cpu_cores_per_node=0,
                               server=dataclasses.replace(host.server, link="inter_node"))
    done = [s for s in result.steps if s.step >= 2]
    unshared = [s for s in AsyncPS().simulate(dataclasses.replace(sc, cluster=free)).steps
                if s.step >= 2]
    assert np.mean([s.end_s - s.start_s for s in done]) >= \
        np.mean([s.end_s - s.start_s for s in unshared]) * (1 - 1e-9)
    ddp_sc = dataclasses.replace(sc, workers=4)     # + the reducer's copies' core sharing
    ddp = DDP().simulate(ddp_sc)
    assert _compute_s(ddp) == pytest.approx(unit_times(host, WORKLOAD, 32).step_s
                                            + DDP().host_compute_s(ddp_sc), rel=EXACT_TOL)
    assert DDP().host_compute_s(ddp_sc) > 0


def test_on_a_cpu_host_even_the_sharing_worker_reaches_its_server_over_loopback():
    # measure/runs/ps.py: the server is rank 0, a process of its own; every worker, the one
    # whose cores it shares included, pushes and pulls over gloo on loopback. One worker:
    # the step is compute + push + apply + pack + pull, each transfer alpha + n beta of
    # intra_node, the pack (torch.cat of the parameters into the reply) a copy of the
    # parameter bytes at compute.optimizer_GBps.
    from perfmodel.sim.collectives import link_transfer_s
    from perfmodel.sim.compute import optimizer_seconds
    host = cpu_host(2)
    sc = Scenario(cluster=host, workload=WORKLOAD, workers=1, batch_size=32, jitter="none")
    nbytes = WORKLOAD.params * 4
    expected = (ps_worker_seconds(host, WORKLOAD, 32)
                + 2 * link_transfer_s(host.intra_node, nbytes)
                + optimizer_seconds(host, WORKLOAD, 1.0)
                + nbytes / (host.compute.optimizer_GBps * 1e9))
    # sync-ps: no summing pass, as the one push lands in the sum (measure/runs/ps.py)
    for strategy in (AsyncPS(), SyncPS()):
        result = strategy.simulate(sc)
        assert len(result.comms) > 0
        steps = [s.end_s - s.start_s for s in result.steps if s.step >= 2]
        assert np.mean(steps) == pytest.approx(expected, rel=1e-6), strategy.name
    # with a ping-pong fit of its own (Link.p2p), every push and pull is charged that
    # message's alpha + n beta instead of the all-reduce fit's
    p2p = Link(bandwidth_GBps=1.8, latency_us=200.0, efficiency_by_bytes=((1.0, 1.0),))
    own = dataclasses.replace(host, intra_node=dataclasses.replace(host.intra_node, p2p=p2p))
    result = AsyncPS().simulate(dataclasses.replace(sc, cluster=own))
    steps = [s.end_s - s.start_s for s in result.steps if s.step >= 2]
    assert np.mean(steps) == pytest.approx(
        expected - 2 * link_transfer_s(host.intra_node, nbytes) + 2 * (200e-6 + nbytes / 1.8e9),
        rel=1e-6)
    # a GPU: a colocated server on the worker's own device needs no transfer at all
    gpu = Scenario(cluster=make_cluster("a100"), workload=WORKLOAD, workers=1, batch_size=32,
                   jitter="none")
    assert all(c.bytes == 0 or c.end_s == c.start_s for c in AsyncPS(AsyncPS.Options(
        server_placement="colocated")).simulate(gpu).comms)


def test_a_cpu_hosts_server_receives_applies_and_sends_one_at_a_time():
    # measure/runs/ps.py's server is one thread: a blocking recv, the apply, a blocking send.
    # On its loopback slot a push in and a pull out share one pool; GPU servers keep both.
    from perfmodel.sim import psnet
    host = cpu_host(2)
    layout = psnet.Layout(host, 4, psnet.hardware(host, WORKLOAD, 4, 1, "colocated"))
    push, pull = layout.route(0, 0, "push"), layout.route(1, 0, "pull")
    assert push.pools[1] == pull.pools[0]                     # the server's one slot
    assert layout.route(0, 0, "pull").pools[1] != push.pools[0]   # each worker: both ways
    gpu = make_cluster("a100")
    g = psnet.Layout(gpu, 4, psnet.hardware(gpu, WORKLOAD, 4, 1, "dedicated"))
    assert g.route(0, 0, "push").pools[1] != g.route(1, 0, "pull").pools[0]
    # with zero compute, the server's slot carries a push and a pull per update, in turn:
    # any 4 updates of 4 workers take at least 4 pushes + 4 pulls (full duplex: 4 pushes)
    free = dataclasses.replace(host, compute=dataclasses.replace(
        host.compute, overhead_us_per_unit=0.0, optimizer_GBps=1e30, launch_us_per_kernel=0.0),
        device=dataclasses.replace(host.device, peak_TFLOPS={"fp32": 1e30, "bf16": 1e30}),
        server=dataclasses.replace(host.server, apply_GBps=1e30))
    sc = Scenario(cluster=free, workload=WORKLOAD, workers=4, batch_size=32, jitter="none",
                  steps=20, warmup_steps=5)
    result = AsyncPS().simulate(sc)
    times = sorted(u.time_s for u in result.updates if u.step >= 5)
    from perfmodel.sim.collectives import link_transfer_s
    from perfmodel.sim.compute import optimizer_seconds
    nbytes = WORKLOAD.params * 4
    transfer = link_transfer_s(free.intra_node, nbytes) - free.intra_node.latency_s
    gaps = [b - a for a, b in zip(times, times[4:], strict=False)]
    assert min(gaps) >= 8 * transfer * (1 - 1e-9)
    # and it applies between them: with a real apply (and pack), no message is carried
    # meanwhile, so any 4 updates take 4 x (push + apply + pull); full duplex with the
    # apply beside the messages would take 4 pushes, or 4 applies, whichever is longer
    busy = dataclasses.replace(free, server=host.server, compute=dataclasses.replace(
        free.compute, optimizer_GBps=host.compute.optimizer_GBps))
    result = AsyncPS().simulate(dataclasses.replace(sc, cluster=busy))
    times = sorted(u.time_s for u in result.updates if u.step >= 5)
    apply_s = (optimizer_seconds(busy, WORKLOAD, 1.0)
               + nbytes / (busy.compute.optimizer_GBps * 1e9))
    gaps = [b - a for a, b in zip(times, times[4:], strict=False)]
    assert min(gaps) >= 4 * (2 * transfer + apply_s) * (1 - 1e-9)
    assert apply_s > 0.2 * transfer        # the apply is no rounding error here


# -- the node's CPU floor in a timed wait ----------------------------------------------------

def test_node_cpu_floor_conserves_cpu_work_by_hand():
    # 8 ranks on 2 cores, κ = 0.1: 10 ms idle + 60 ms of collectives on both cores + each
    # rank's 7 ms of own work, x 1.1 contention, shared by 2 cores: 10 + 60 + 8·7·1.1/2
    host = dataclasses.replace(cpu_host(2, contention=0.1), compute_occupies_cores=False)
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007) == \
        pytest.approx(0.010 + 0.060 + 8 * 0.007 * 1.1 / 2, rel=EXACT_TOL)
    # own work the Sleeper pays back from the idle sleeps shortens them, at its CPU time
    # (x 1.1), never below none
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, paid_back_s=0.002) == \
        pytest.approx(0.010 - 0.002 * 1.1 + 0.060 + 8 * 0.007 * 1.1 / 2, rel=EXACT_TOL)
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, paid_back_s=1.0) == \
        pytest.approx(0.060 + 8 * 0.007 * 1.1 / 2, rel=EXACT_TOL)
    # no floor where the ranks fit the cores, nor where the workers really compute
    assert cores.node_cpu_floor_s(host, 2, 0.010, 0.060, 0.007) == 0.0
    assert cores.node_cpu_floor_s(cpu_host(2), 8, 0.010, 0.060, 0.007) == 0.0


def test_node_cpu_floor_beside_collectives_fills_the_cores_they_leave_idle_by_hand():
    # DDP: a rank's training thread copies while its gloo thread all-reduces. Crowded
    # collectives that keep 0.9 of the cores busy leave 0.1 x 60 ms = 6 ms of both cores
    # for the ranks' own work: 10 + max(60, 0.9·60 + 8·7·1.1/2)
    host = dataclasses.replace(cpu_host(2, contention=0.1), compute_occupies_cores=False,
                               comm_cpu_busy_by_level=((2.0, 0.85), (4.0, 0.9)))
    own = 8 * 0.007 * 1.1 / 2
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, beside_collectives=True) == \
        pytest.approx(0.010 + 0.9 * 0.060 + own, rel=EXACT_TOL)
    # gloo FSDP (every rank blocked in its collective): no overlap, whatever the share
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007) == \
        pytest.approx(0.010 + 0.060 + own, rel=EXACT_TOL)
    # never shorter than the collectives themselves: little own work cannot speed them up
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.0001, beside_collectives=True) == \
        pytest.approx(0.010 + 0.060, rel=EXACT_TOL)
    # every core busy (nothing measured): the same floor either way
    plain = dataclasses.replace(host, comm_cpu_busy_by_level=())
    assert cores.node_cpu_floor_s(plain, 8, 0.010, 0.060, 0.007, beside_collectives=True) == \
        pytest.approx(0.010 + 0.060 + own, rel=EXACT_TOL)


def _mean_step(result) -> float:
    return float(np.mean([s.end_s - s.start_s for s in result.steps if s.step >= 2]))


def test_crowded_timed_wait_ddp_step_is_at_least_the_node_cpu_floor(monkeypatch):
    # 8 timed-wait ranks on 2 cores with communication CPU-bound on them: the step cannot be
    # shorter than the sleeps before the first bucket and after the last all-reduce (less
    # the copy back, which the harness pays back from them), plus the node's CPU work (every
    # all-reduce on both cores, every rank's reducer copies) shared by the 2 cores; with 2
    # ranks (they fit) the event model stands alone
    host = dataclasses.replace(cpu_host(2), compute_occupies_cores=False)
    mlp = load_workload("mlp")              # short sleeps, 12.9 MB of gradients
    sc = Scenario(cluster=host, workload=mlp, workers=8, batch_size=64, jitter="none")
    ddp = DDP()
    t = unit_times(host, mlp, 64)
    buckets, _, durations = ddp._wire(sc, t.backward_s)
    idle = float(t.forward_s.sum()) + t.optimizer_s + buckets[0].ready_backward_s
    own = ddp.host_passes(sc, buckets, unshared=True)     # a rank's CPU in its copies
    assert 0 < own.copy_back_s < idle
    floor = idle - own.copy_back_s + float(durations.sum()) + 8 * own.total_s() / 2
    assert _mean_step(ddp.simulate(sc)) >= floor * (1 - EXACT_TOL)
    # and it binds here: without it the event model's step (sleeps, the exposed chain, the
    # waits for a core) is shorter
    # crowded all-reduces that keep 0.85 of the cores busy leave the rest to the copies
    idle_share = dataclasses.replace(sc, cluster=dataclasses.replace(
        host, comm_cpu_busy_by_level=((4.0, 0.85),)))
    shared = idle - own.copy_back_s + 0.85 * float(durations.sum()) + 8 * own.total_s() / 2
    assert _mean_step(ddp.simulate(idle_share)) >= shared * (1 - EXACT_TOL)
    assert _mean_step(ddp.simulate(idle_share)) < _mean_step(ddp.simulate(sc))
    monkeypatch.setattr("perfmodel.sim.ddp.node_cpu_floor_s", lambda *a, **k: 0.0)
    assert _mean_step(ddp.simulate(sc)) < floor * (1 - 1e-3)


def test_crowded_timed_wait_fsdp_on_gloo_pays_the_sleeps_less_the_copies_plus_the_cpu_work(
        monkeypatch):
    # gloo FSDP's collectives block, so no sleep overlaps them; the Sleeper pays each rank's
    # copies back from its next sleep, so the cores idle through the sleeps less the copies:
    # floor = sleeps - own + all collectives + the ranks' copies over the cores (no copy
    # counted twice: the session-20 floor, sleeps + collectives + copies, is not kept)
    from perfmodel.sim.fsdp import copy_cpu_s

    host = dataclasses.replace(cpu_host(2), compute_occupies_cores=False)
    n, mlp = 8, load_workload("mlp")
    sc = Scenario(cluster=host, workload=mlp, workers=n, batch_size=64, jitter="none")
    t = unit_times(host, mlp, 64, optimizer_param_fraction=1 / n)
    comm = sum(2 * allgather_s(host, n, u.params * 4) + reduce_scatter_s(host, n, u.params * 4)
               for u in mlp.units)
    own = copy_cpu_s(sc, True, True)
    assert 0 < own < t.step_s
    floor = t.step_s - own + comm + n * own / 2
    step = _mean_step(FSDP().simulate(sc))
    assert step >= floor * (1 - EXACT_TOL)
    assert step < (t.step_s + comm + n * own / 2) * (1 - 1e-3)
    # blocked in its collectives, no rank copies beside them: the cores they leave idle
    # stay idle
    busy = dataclasses.replace(sc, cluster=dataclasses.replace(
        host, comm_cpu_busy_by_level=((4.0, 0.85),)))
    assert _mean_step(FSDP().simulate(busy)) == pytest.approx(step, rel=EXACT_TOL)
    # the floor is the event model's step here (the same sleeps, copies and collectives):
    # without it the step does not fall below it
    monkeypatch.setattr("perfmodel.sim.fsdp.node_cpu_floor_s", lambda *a, **k: 0.0)
    assert _mean_step(FSDP().simulate(sc)) >= floor * (1 - 0.02)
