"""Parameter-server strategies against queueing theory, staleness theory and hand calculations.

Sources: DESIGN.md "Parameter server"; Reiser & Lavenberg 1980 (exact MVA); Baskett, Chandy,
Muntz & Palacios 1975 (BCMP product form for processor-sharing stations); Zhang et al. 2016
(asynchronous staleness); Ho et al. 2013 (SSP); Zheng et al. 2017 (DC-ASGD).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.cluster import Server
from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import ps_worker_seconds, unit_times
from perfmodel.sim.mva import mva, saturation_customers, throughput_bounds
from perfmodel.sim.ps import DC_ASGD_EXTRA_PASSES, SSPPS, AsyncPS, SyncPS
from perfmodel.sim.records import SimResult
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from tests.factories import flat_link, make_cluster, make_workload

THEORY_TOL = 0.05       # the project's acceptance tolerance against theory (5 %)
EXACT_TOL = 1e-9        # deterministic hand calculations: float rounding only
MVA_TOL = 0.02          # issue 13: simulation vs exact MVA under exponential service
WORKLOAD = make_workload()                      # 4M fp32 params: 16 MB each way
PAYLOAD_BYTES = WORKLOAD.param_bytes           # pull bytes = push bytes (fp32)


STATE_BYTES = WORKLOAD.model_state_bytes_per_param     # sgd fp32: 8 bytes a parameter


def cluster(link_GBps: float = 1e6, latency_us: float = 0.0, apply_GBps: float = 1e12,
            per_node: int = 8):
    """a100 compute; the links, the servers' optimizer rate (compute.optimizer_GBps, as
    DDP's step is charged) and elementwise rate (server.apply_GBps) chosen (default: all
    negligible); `per_node` workers share one NIC."""
    base = make_cluster("a100")
    return make_cluster("a100", inter_node=flat_link(link_GBps, latency_us),
                        compute=dataclasses.replace(base.compute, optimizer_GBps=apply_GBps),
                        server=Server(apply_GBps=apply_GBps, link="inter_node"),
                        devices_per_node=per_node)


NOMINAL_S = ps_worker_seconds(cluster(), WORKLOAD, 32)   # forward + backward + its copies


def scenario(workers: int, steps: int, **kw) -> Scenario:
    kw.setdefault("cluster", cluster())
    return Scenario(workload=WORKLOAD, workers=workers, batch_size=32, steps=steps, **kw)


def counted(result: SimResult, warmup: int):
    return [u for u in result.updates if u.step >= warmup]


def steady_cycles_per_s(result: SimResult, warmup: int) -> float:
    """Steps completed per second between every worker's warm-up and the first worker's end."""
    warm = [r for r in result.steps if r.step >= warmup]
    workers = {r.worker for r in warm}
    t0 = max(min(r.start_s for r in warm if r.worker == w) for w in workers)
    t1 = min(max(r.end_s for r in warm if r.worker == w) for w in workers)
    return sum(t0 < r.end_s <= t1 for r in warm) / (t1 - t0)


# -- exact mean-value analysis (Reiser & Lavenberg 1980) ------------------------------------

def test_mva_one_customer_never_queues():
    res = mva([0.2, 0.3], think_s=1.5, customers=1)
    assert res.throughput_per_s[0] == pytest.approx(1 / 2.0, rel=EXACT_TOL)


def test_mva_matches_machine_repairman_birth_death_solution():
    # One exponential server, N sources with exponential think time Z: the M/M/1//N queue
    # (Kleinrock 1975, sec. 3.9) has p_k ∝ N!/(N-k)! (D/Z)^k and X = (1 - p_0) / D.
    think, demand = 1.0, 0.25
    for n in (1, 3, 5, 12):
        weights = np.array([math.factorial(n) / math.factorial(n - k) * (demand / think) ** k
                            for k in range(n + 1)])
        p0 = weights[0] / weights.sum()
        assert mva([demand], think, n).throughput_per_s[-1] == pytest.approx(
            (1 - p0) / demand, rel=EXACT_TOL)


def test_mva_respects_asymptotic_bounds_and_littles_law():
    res = mva([0.1, 0.05, 0.2], think_s=1.0, customers=30)
    for n in range(1, 31):
        low, high = throughput_bounds([0.1, 0.05, 0.2], 1.0, n)
        assert low * (1 - EXACT_TOL) <= res.throughput_per_s[n - 1] <= high * (1 + EXACT_TOL)
    # Little's law: customers = X x cycle time.
    assert res.throughput_per_s * res.cycle_s == pytest.approx(np.arange(1, 31), rel=EXACT_TOL)
    assert saturation_customers([0.1, 0.05, 0.2], 1.0) == pytest.approx(1.35 / 0.2)


def test_mva_rejects_bad_input():
    with pytest.raises(PerfmodelError):
        mva([-1.0], 1.0, 3)
    with pytest.raises(PerfmodelError):
        mva([1.0], 1.0, 0)


# -- hand calculations of one step ----------------------------------------------------------

@pytest.mark.parametrize("servers", [1, 2, 4])
def test_one_worker_step_by_hand(servers):
    # One worker, no jitter: step = pull + compute + push + apply. The worker's NIC carries
    # its shards one after another (FCFS), each server's NIC one shard, so the last shard
    # arrives after the whole model's bytes at the worker's NIC bandwidth plus one latency;
    # the earlier shards' applies end before it arrives, the last one's (its optimizer over
    # 1/servers of the parameters) is waited for (DESIGN.md "Parameter server").
    bw, lat, apply_bw = 2.0, 50.0, 8.0
    sc = scenario(1, 5, jitter="none", cluster=cluster(bw, lat, apply_bw))
    result = AsyncPS(AsyncPS.Options(servers=servers)).simulate(sc)
    transfer = lat * 1e-6 + PAYLOAD_BYTES / (bw * 1e9)
    apply_s = STATE_BYTES * WORKLOAD.params / servers / (apply_bw * 1e9)
    for r in result.steps:
        compute_s = ps_worker_seconds(sc.cluster, WORKLOAD, 32)   # its copies at 8 GB/s
        assert r.end_s - r.start_s == pytest.approx(2 * transfer + compute_s + apply_s,
                                                    rel=EXACT_TOL)
        assert r.comm_exposed_s == pytest.approx(2 * transfer, rel=EXACT_TOL)
        assert r.wait_s == pytest.approx(apply_s, rel=EXACT_TOL)
    assert len(result.comms) == 2 * servers * 5


def test_a_ps_worker_copies_the_model_in_and_its_gradients_out_each_step():
    # measure/runs/ps.py `work`: unflatten (the pulled parameters into the model) and torch.cat
    # (the gradients into the push buffer), one read and write of their bytes each at the
    # memory-bound rate; a timed wait pays that CPU work back from its sleeps
    c = cluster(apply_GBps=8.0)
    p = WORKLOAD.precision_spec
    passes = unit_times(c, WORKLOAD, 32, optimizer_param_fraction=0).step_s
    copies = WORKLOAD.params * (p.param_bytes + p.grad_bytes) / 8e9
    assert ps_worker_seconds(c, WORKLOAD, 32) == pytest.approx(passes + copies, rel=EXACT_TOL)
    waited = dataclasses.replace(c, compute_occupies_cores=False)
    assert ps_worker_seconds(waited, WORKLOAD, 32) == pytest.approx(passes, rel=EXACT_TOL)


def test_delay_compensation_charges_extra_apply_work():
    # The apply is the optimizer over the shard (model-state bytes at compute.optimizer_GBps,
    # like DDP's step); DC-ASGD (Zheng et al. 2017) adds DC_ASGD_EXTRA_PASSES elementwise
    # passes over the gradient at server.apply_GBps (ps.py).
    sc = scenario(1, 4, jitter="none", cluster=cluster(apply_GBps=1.0))
    plain = AsyncPS().simulate(sc).steps[-1]
    dc = AsyncPS(AsyncPS.Options(delay_compensation=True)).simulate(sc).steps[-1]
    apply_s = STATE_BYTES * WORKLOAD.params / 1e9
    assert plain.wait_s == pytest.approx(apply_s, rel=1e-6)
    assert dc.wait_s == pytest.approx(apply_s + DC_ASGD_EXTRA_PASSES * PAYLOAD_BYTES / 1e9,
                                      rel=1e-6)


def test_staleness_aware_rate_costs_no_time_and_is_noted():
    sc = scenario(3, 6)
    plain = AsyncPS().simulate(sc)
    aware = AsyncPS(AsyncPS.Options(staleness_aware_lr=True)).simulate(sc)
    assert aware.steps == plain.steps
    assert any("alpha0/tau" in note for note in aware.notes)


# -- staleness of asynchronous PS (DESIGN.md; Zhang et al. 2016) ----------------------------

@pytest.mark.parametrize("jitter", ["lognormal", "exponential"])
@pytest.mark.parametrize("workers", [2, 4, 8, 16])
def test_async_homogeneous_mean_staleness_is_n_minus_1(workers, jitter):
    # Between a worker's pull and its apply every other worker applies once on average,
    # whatever the compute-time distribution (DESIGN.md "Parameter server").
    sc = scenario(workers, 3200 // workers, jitter=jitter, seed=11)
    stale = [u.staleness for u in counted(AsyncPS().simulate(sc), sc.warmup_steps)]
    assert np.mean(stale) == pytest.approx(workers - 1, rel=THEORY_TOL)


def test_async_heterogeneous_staleness_per_worker():
    # E[τ_i] ≈ Σ_{j≠i} r_j / r_i for cycle rates r = [1, 1, 1, 0.25]: 2.25, 2.25, 2.25, 12;
    # the update-weighted mean stays N - 1 = 3 (DESIGN.md "Parameter server").
    sc = scenario(4, 600, speed=(1.0, 1.0, 1.0, 0.25))
    updates = counted(AsyncPS().simulate(sc), sc.warmup_steps)
    rates = np.array(sc.speed)
    expected = (rates.sum() - rates) / rates
    for w in range(4):
        mine = [u.staleness for u in updates if u.worker == w]
        assert np.mean(mine) == pytest.approx(expected[w], rel=THEORY_TOL)
    assert np.mean([u.staleness for u in updates]) == pytest.approx(3.0, rel=THEORY_TOL)


# -- throughput against the closed queueing network (Reiser & Lavenberg 1980) ---------------

@pytest.mark.parametrize("workers,steps", [(2, 2000), (5, 800), (12, 400)])
def test_async_throughput_matches_exact_mva(workers, steps):
    # Exponential compute (delay station Z, with the two pure latencies) and, with
    # exponential service, three FCFS stations: the server's NIC in (pushes), its apply and
    # its NIC out (pulls): BCMP product form, so MVA is exact. A worker NIC carries a subset
    # of the server NIC's messages in the same order, so it never decides. D_push = D_pull =
    # Z/8 and D_apply = Z/8 put the knee at N* = (Z + D) / D_max = 11: cases below and above.
    latency_us, demand = NOMINAL_S * 1e6 / 400, NOMINAL_S / 8   # latency << compute
    bw_GBps = PAYLOAD_BYTES / demand / 1e9
    apply_GBps = STATE_BYTES * WORKLOAD.params / demand / 1e9
    sc = scenario(workers, steps, jitter="exponential", seed=7,
                  cluster=cluster(bw_GBps, latency_us, apply_GBps, per_node=4))
    # the worker's copies run at this cluster's optimizer rate (apply_GBps): part of Z
    think = ps_worker_seconds(sc.cluster, WORKLOAD, 32) + 2 * latency_us * 1e-6
    strategy = AsyncPS()
    rng = np.random.default_rng(3)
    strategy.service = rng.exponential
    expected = mva([demand] * 3, think, workers).throughput_per_s[-1]
    measured = steady_cycles_per_s(strategy.simulate(sc), sc.warmup_steps)
    assert measured == pytest.approx(expected, rel=MVA_TOL)


# -- synchronous PS: the slowest worker sets the pace -----------------------------------------

@pytest.mark.parametrize("workers,steps", [(1, 4000), (4, 2000), (16, 800)])
def test_sync_step_is_expected_max_of_exponentials(workers, steps):
    # E[max of N exponentials of mean 1/μ] = H_N / μ (DESIGN.md); communication negligible.
    sc = scenario(workers, steps, jitter="exponential", seed=3)
    result = SyncPS().simulate(sc)
    durations = [r.end_s - r.start_s for r in result.steps
                 if r.worker == 0 and r.step >= sc.warmup_steps]
    harmonic = sum(1.0 / k for k in range(1, workers + 1))
    assert np.mean(durations) == pytest.approx(harmonic * NOMINAL_S, rel=THEORY_TOL)


# -- stale synchronous parallel (Ho et al. 2013) --------------------------------------------

SSP_SPEEDS = (1.0, 0.9, 0.5, 0.2)


def completed_by(result: SimResult, worker: int, t: float) -> int:
    return sum(r.end_s <= t for r in result.steps if r.worker == worker)


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_clock_never_exceeds_slowest_plus_bound(bound):
    sc = scenario(4, 40, speed=SSP_SPEEDS, cluster=cluster(link_GBps=20.0))
    result = SSPPS(SSPPS.Options(staleness_bound=bound)).simulate(sc)
    for w in range(sc.workers):
        pulls = sorted(c.start_s for c in result.comms if c.kind == "pull" and c.worker == w)
        for step, t in enumerate(pulls):
            slowest = min(completed_by(result, j, t) for j in range(sc.workers))
            assert step <= slowest + bound
    # While a step runs, each other worker applies at most 2s + 1 gradients (its clock lies
    # within s of this one's at both ends), so τ <= (N - 1)(2s + 1).
    assert max(u.staleness for u in result.updates) <= (sc.workers - 1) * (2 * bound + 1)
    if bound == 0:
        assert {r.step for r in result.steps if r.worker == 3} == set(range(sc.steps))


def test_ssp_bound_zero_progresses_like_sync_ps():
    # s = 0: nobody starts step k before everyone has finished k - 1: the synchronous pace,
    # set by the slowest worker each step (same compute draws in both runs).
    sc = scenario(4, 30, speed=SSP_SPEEDS)
    ssp = SSPPS(SSPPS.Options(staleness_bound=0)).simulate(sc)
    sync = SyncPS().simulate(sc)
    makespan = [max(r.end_s for r in res.steps) for res in (ssp, sync)]
    assert makespan[0] == pytest.approx(makespan[1], rel=1e-3)
    free = AsyncPS().simulate(sc)
    assert max(r.end_s for r in free.steps) < makespan[0] * (1 - THEORY_TOL)


# -- options --------------------------------------------------------------------------------

@pytest.mark.parametrize("cls,bad", [
    (SyncPS, {"servers": 0}), (AsyncPS, {"servers": 1.5}), (AsyncPS, {"servers": True}),
    (AsyncPS, {"delay_compensation": "yes"}), (SSPPS, {"staleness_bound": -1}),
])
def test_bad_options_are_user_errors(cls, bad):
    with pytest.raises(PerfmodelError):
        cls.Options(**bad)


def test_make_strategy_builds_ps_strategies_with_their_options():
    ssp = make_strategy("ssp-ps", staleness_bound=2, servers=3)
    assert isinstance(ssp, SSPPS) and ssp.options == SSPPS.Options(staleness_bound=2, servers=3)
    with pytest.raises(PerfmodelError, match="ssp-ps"):
        make_strategy("sync-ps", staleness_bound=2)


def test_names_and_memory_keys():
    assert (SyncPS.name, AsyncPS.name, SSPPS.name) == ("sync-ps", "async-ps", "ssp-ps")
    mem = SSPPS(SSPPS.Options(servers=2)).memory(scenario(4, 5))
    assert set(mem) == {"worker", "server"}


# -- properties (STYLE.md practice 9) -------------------------------------------------------

STRATEGIES = {"sync-ps": SyncPS, "async-ps": AsyncPS, "ssp-ps": SSPPS}


@st.composite
def ps_cases(draw):
    workers = draw(st.integers(1, 6))
    name = draw(st.sampled_from(sorted(STRATEGIES)))
    opts = {"servers": draw(st.integers(1, 3))}
    if name == "ssp-ps":
        opts["staleness_bound"] = draw(st.integers(0, 3))
    if name == "async-ps":
        opts["delay_compensation"] = draw(st.booleans())
    sc = scenario(
        workers, draw(st.integers(3, 8)),
        speed=tuple(draw(st.lists(st.floats(0.2, 1.0), min_size=workers, max_size=workers))),
        jitter=draw(st.sampled_from(["none", "lognormal", "exponential"])),
        seed=draw(st.integers(0, 2**16)),
        cluster=cluster(draw(st.floats(0.05, 50.0)), draw(st.floats(0.0, 1e4)),
                        draw(st.floats(0.5, 500.0))))
    return STRATEGIES[name](STRATEGIES[name].Options(**opts)), sc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ps_cases())
def test_records_are_consistent(case):
    strategy, sc = case
    result = strategy.simulate(sc)
    # Every gradient applied exactly once: one update per worker step, the same pairs.
    steps = {(r.worker, r.step) for r in result.steps}
    assert len(steps) == len(result.steps) == len(result.updates) == sc.workers * sc.steps
    assert {(u.worker, u.step) for u in result.updates} == steps
    for r in result.steps:
        assert 0 <= r.start_s <= r.end_s
        assert min(r.compute_s, r.comm_exposed_s, r.wait_s) >= 0
        assert r.compute_s + r.comm_exposed_s + r.wait_s == pytest.approx(
            r.end_s - r.start_s, rel=EXACT_TOL, abs=1e-12)
    assert all(0 <= c.start_s <= c.end_s for c in result.comms)
    assert all(u.staleness >= 0 for u in result.updates)
    if strategy.name == "sync-ps":
        assert all(u.staleness == 0 for u in result.updates)
    assert result.events > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ps_cases(), st.floats(1.0, 10.0))
def test_more_bandwidth_never_lowers_throughput(case, factor):
    strategy, sc = case
    if strategy.name != "sync-ps":
        # Run by run, asynchronous PS has list-scheduling anomalies (Graham 1969): with
        # unequal workers a faster link can reorder who takes the last mini-batches and end
        # the run later (hypothesis found 4 workers, speeds 1, 1, 1, 0.25, exponential
        # jitter). Run by run it holds for identical workers; for unequal ones see the
        # long-run test below. sync-ps's barrier makes it hold for every run.
        sc = dataclasses.replace(sc, speed=(), jitter="none")
    faster_link = dataclasses.replace(sc.cluster.inter_node, bandwidth_GBps=(
        sc.cluster.inter_node.bandwidth_GBps * factor))
    faster = dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster,
                                                                 inter_node=faster_link))
    makespans = [max(r.end_s for r in strategy.simulate(s).steps) for s in (sc, faster)]
    # Same work (workers x steps mini-batches) in no more time.
    assert makespans[1] <= makespans[0] * (1 + EXACT_TOL)


FINITE_RUN_TOL = 0.01   # long-run throughput of one seeded run: allow 1 % of sampling noise


@pytest.mark.parametrize("strategy", [AsyncPS(), SSPPS(SSPPS.Options(staleness_bound=1))])
def test_long_run_throughput_grows_with_bandwidth_for_unequal_workers(strategy):
    # A single-class closed product-form network's throughput never falls when a station gets
    # faster (Suri, Operations Research 1985); unequal workers make the network multi-class,
    # so this checks the same expectation on long seeded runs.
    demand = NOMINAL_S / 4
    measured = []
    for factor in (0.5, 1.0, 2.0, 4.0):
        link_GBps = 2 * PAYLOAD_BYTES / demand / 1e9 * factor
        sc = scenario(4, 400, speed=(1.0, 0.8, 0.5, 0.3), jitter="exponential", seed=5,
                      cluster=cluster(link_GBps, 100.0))
        measured.append(steady_cycles_per_s(strategy.simulate(sc), sc.warmup_steps))
    for slower, faster in zip(measured, measured[1:], strict=False):
        assert faster >= slower * (1 - FINITE_RUN_TOL)


def test_record_maker_builds_the_same_frozen_records():
    import dataclasses

    from perfmodel.sim.records import CommRecord, StepRecord, UpdateRecord, maker

    for cls, values in ((StepRecord, (3, 4, 0.5, 0.75, 0.125, 0.0625, 0.0)),
                        (UpdateRecord, (3, 4, 7, 9, 1.5)),
                        (CommRecord, ("push", 3, 0.5, 0.75, 1e6, "server0"))):
        made = maker(cls)(*values)
        assert type(made) is cls and made == cls(*values) and hash(made) == hash(cls(*values))
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.worker = 0


def test_sync_ps_reads_the_version_applied_the_instant_it_wakes():
    # found by test_records_are_consistent: the barrier's wake-up time is computed as
    # now + (end - now), one ulp before the apply's end, so step 1 read version 0
    sc = scenario(1, 3, speed=(0.859375,), jitter="none", cluster=cluster(0.5, 0.6875, 0.5))
    result = SyncPS(SyncPS.Options(servers=1)).simulate(sc)
    assert [(u.version_read, u.version_applied) for u in result.updates] == \
        [(0, 0), (1, 1), (2, 2)]
