"""DDP simulation against the ring all-reduce formula, overlap, stragglers and invariants.

Sources: torch 2.13 DDP (reducer.cpp: buckets in reverse parameter order, 1 MiB first bucket,
25 MiB cap; all-reduce overlaps backward); Thakur, Rabenseifner & Gropp 2005 (ring all-reduce
2(p-1)α + 2(p-1)/p·nβ and the bandwidth bound 2(p-1)/p·n/B).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from factories import flat_link, make_cluster, make_workload
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel.memory
from perfmodel.cluster import load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import allreduce_s
from perfmodel.sim.compute import unit_times
from perfmodel.sim.ddp import DDP, gradient_buckets
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

MiB = 2**20
REL = 1e-9          # the event model against a closed form: float rounding only
BOUND_REL = 0.01    # the bandwidth bound is reached within 1 % (latency terms are left)


def scenario(cluster, workload, workers, **kw) -> Scenario:
    kw.setdefault("steps", 4)
    kw.setdefault("warmup_steps", 1)
    kw.setdefault("jitter", "none")
    return Scenario(cluster=cluster, workload=workload, workers=workers,
                    batch_size=kw.pop("batch_size", 8), **kw)


def step_times(result, step=None) -> np.ndarray:
    return np.array([r.end_s - r.start_s for r in result.steps if step in (None, r.step)])


def zero_compute_cluster(latency_us=2.0):
    return make_cluster(zero_compute=True, intra_node=flat_link(100.0, latency_us),
                        inter_node=flat_link(10.0, 4 * latency_us))


def test_buckets_follow_torch_sizes():
    # 4 units x 10M fp32 params = 160 MB in reverse order: 1 MiB, then 25 MiB buckets
    wl = make_workload(units=4, params_per_unit=10_000_000)
    buckets = gradient_buckets(wl, np.ones(4), 25.0, 1.0)
    total = 160e6
    expected = [MiB] + [25 * MiB] * int((total - MiB) // (25 * MiB))
    expected.append(total - sum(expected))
    assert [b.nbytes for b in buckets] == pytest.approx(expected, rel=REL)
    # pro-rata readiness: the 1 MiB bucket is ready 1 MiB / 40 MB into the last unit's backward
    assert buckets[0].ready_backward_s == pytest.approx(MiB / 40e6, rel=REL)
    assert buckets[-1].ready_backward_s == pytest.approx(4.0, rel=REL)


@pytest.mark.parametrize("workers", [4, 16])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_zero_compute_step_is_the_sum_of_allreduces(workers, algorithm):
    # with no compute every bucket is ready at once: the all-reduces run back to back
    cluster = zero_compute_cluster()
    wl = make_workload(units=4, params_per_unit=10_000_000)
    sc = scenario(cluster, wl, workers)
    result = DDP(DDP.Options(allreduce=algorithm)).simulate(sc)
    buckets = gradient_buckets(wl, np.zeros(4), 25.0, 1.0)
    expected = sum(allreduce_s(cluster, workers, b.nbytes, algorithm) for b in buckets)
    assert step_times(result) == pytest.approx(expected, rel=REL)
    assert len(result.comms) == len(buckets) * sc.steps


@pytest.mark.parametrize("workers", [2, 8, 64])
def test_single_bucket_reaches_the_bandwidth_bound(workers):
    # one bucket holding the whole model: 2(p-1)/p · n/B (Thakur et al. 2005 lower bound)
    cluster = zero_compute_cluster(latency_us=1.0)
    wl = make_workload(units=4, params_per_unit=25_000_000)
    n = wl.params * 4
    options = DDP.Options(bucket_cap_MiB=n / MiB, first_bucket_MiB=n / MiB)
    result = DDP(options).simulate(scenario(cluster, wl, workers))
    bandwidth = 100e9 if workers <= 8 else 10e9
    bound = 2 * (workers - 1) / workers * n / bandwidth
    assert len(result.comms) == 4          # one all-reduce per step
    assert step_times(result) == pytest.approx(bound, rel=BOUND_REL)
    assert step_times(result).min() >= bound


def test_compute_hides_all_but_the_last_bucket():
    # overlap (DDP design): with compute >> communication, step = compute + the last bucket's
    # all-reduce, which can only start when backward ends
    cluster = make_cluster(intra_node=flat_link(100.0, 2.0))
    wl = make_workload(units=8, params_per_unit=5_000_000, flops_per_sample=2e11)
    sc = scenario(cluster, wl, 8)
    # backward as the simulator runs it: stretched by the overlap slowdown while in flight
    times = unit_times(cluster, wl, sc.batch_size, overlapped=("backward",),
                       in_flight=DDP().in_flight(sc))
    buckets = gradient_buckets(wl, times.backward_s, 25.0, 1.0)
    durations = [allreduce_s(cluster, 8, b.nbytes) for b in buckets]
    host = DDP().host_passes(sc, buckets)        # copies in during backward, back after it
    result = DDP().simulate(sc)
    assert step_times(result) == pytest.approx(
        times.step_s + host.copy_in_s.sum() + durations[-1] + host.copy_back_s, rel=REL)
    assert sum(durations) > 10 * durations[-1]        # most communication was hidden


def test_the_reducer_copies_every_gradient_in_and_back_at_the_streaming_rate():
    # reducer.cpp: copy_grad_to_bucket (one pass, divided on the way without a hook) and
    # finalize_bucket_dense's copy back; each pass reads and writes the gradient bytes once,
    # the unit of compute.optimizer_GBps
    cluster = make_cluster()
    wl = make_workload(units=6, params_per_unit=3_000_000)
    sc = scenario(cluster, wl, 8)
    buckets = gradient_buckets(wl, np.ones(6), 25.0, 1.0)
    grad_bytes = 6 * 3_000_000 * wl.precision_spec.grad_bytes
    rate = cluster.compute.optimizer_GBps * 1e9
    plain = DDP().host_passes(sc, buckets)
    assert plain.copy_in_s.sum() == pytest.approx(grad_bytes / rate, rel=REL)
    assert plain.copy_back_s == pytest.approx(grad_bytes / rate, rel=REL)
    assert not plain.before_s.any() and not plain.after_s.any()
    hooked = DDP(DDP.Options(comm_hook="allreduce")).host_passes(sc, buckets)
    assert hooked.before_s.sum() == pytest.approx(grad_bytes / rate, rel=REL)
    alone = DDP().host_passes(scenario(cluster, wl, 1), buckets)    # one rank: no reducer
    assert alone.copy_in_s.sum() == alone.copy_back_s == 0.0


def test_a_measured_copy_rate_prices_the_copies_and_leaves_the_divides_at_the_streaming_rate():
    # compute.copy_GBps (a CPU host's FSDP runs): the copies into the buckets and back move at
    # it, the hook's in-place divide at compute.optimizer_GBps as FSDP's divides do
    base = make_cluster()
    slow = base.compute.optimizer_GBps / 3.0
    cluster = dataclasses.replace(base, compute=dataclasses.replace(base.compute, copy_GBps=slow))
    wl = make_workload(units=6, params_per_unit=3_000_000)
    buckets = gradient_buckets(wl, np.ones(6), 25.0, 1.0)
    grad_bytes = 6 * 3_000_000 * wl.precision_spec.grad_bytes
    hooked = DDP(DDP.Options(comm_hook="allreduce"))
    passes = hooked.host_passes(scenario(cluster, wl, 8), buckets)
    before = hooked.host_passes(scenario(base, wl, 8), buckets)
    assert passes.copy_in_s.sum() == pytest.approx(grad_bytes / (slow * 1e9), rel=REL)
    assert passes.copy_back_s == pytest.approx(3.0 * before.copy_back_s, rel=REL)
    assert passes.before_s.sum() == pytest.approx(before.before_s.sum(), rel=REL)


def test_a_hook_that_divides_costs_one_pass_over_the_gradients_when_compute_hides_the_rest():
    # with compute >> communication every bucket's divide but the last delays backward and
    # the last delays its own all-reduce: the step grows by exactly one pass
    cluster = make_cluster(intra_node=flat_link(100.0, 2.0))
    wl = make_workload(units=8, params_per_unit=5_000_000, flops_per_sample=2e11)
    sc = scenario(cluster, wl, 8)
    grad_bytes = 8 * 5_000_000 * wl.precision_spec.grad_bytes
    plain = step_times(DDP().simulate(sc))
    hooked = step_times(DDP(DDP.Options(comm_hook="allreduce")).simulate(sc))
    assert hooked - plain == pytest.approx(
        np.full_like(plain, grad_bytes / (cluster.compute.optimizer_GBps * 1e9)), rel=1e-6)


def test_the_reducer_passes_share_a_cpu_hosts_cores_and_a_timed_wait_keeps_only_the_sharing():
    # every rank of a node copies at once; in a timed wait measure/timed_wait.py's Sleeper
    # pays the copies' CPU time back from the next sleeps, so only the wait for a core is left
    local = load_cluster("local")
    wl = make_workload(units=4, params_per_unit=1_000_000)
    buckets = gradient_buckets(wl, np.ones(4), 25.0, 1.0)
    alone = 4_000_000 * wl.precision_spec.grad_bytes / (local.compute.optimizer_GBps * 1e9)
    waited = dataclasses.replace(local, compute_occupies_cores=False)
    for ranks in (2, 8):
        share = local.compute_share(ranks, wl.name)
        real = DDP().host_passes(scenario(local, wl, ranks), buckets).copy_back_s
        timed = DDP().host_passes(scenario(waited, wl, ranks), buckets).copy_back_s
        assert real == pytest.approx(alone * share, rel=REL)
        assert timed == pytest.approx(alone * (share - 1.0), rel=REL)
        # the harness writes each zero gradient before the reducer copies it in
        copied = DDP().host_passes(scenario(local, wl, ranks), buckets).copy_in_s.sum()
        written = DDP().host_passes(scenario(waited, wl, ranks), buckets).copy_in_s.sum()
        assert written == pytest.approx(2.0 * copied * (share - 1.0) / share, rel=REL)
    assert local.compute_share(8, wl.name) > 3.0       # 8 ranks on 2 cores


def test_comm_hook_is_checked():
    with pytest.raises(PerfmodelError, match="unknown comm hook"):
        DDP.Options(comm_hook="fp8")
    with pytest.raises(PerfmodelError, match="not both"):
        DDP.Options(comm_hook="allreduce", grad_compression="bf16")


def test_staleness_zero_and_records_complete():
    cluster = make_cluster()
    wl = make_workload(units=6)
    sc = scenario(cluster, wl, 12, jitter="lognormal", jitter_cv=0.1, steps=5)
    result = DDP().simulate(sc)
    assert all(u.staleness == 0 for u in result.updates)
    for w in range(12):
        assert [r.step for r in result.steps if r.worker == w] == list(range(5))
    for r in result.steps:
        assert min(r.compute_s, r.comm_exposed_s, r.wait_s) >= 0.0
        assert r.compute_s + r.comm_exposed_s + r.wait_s == pytest.approx(
            r.end_s - r.start_s, rel=REL)
    assert all(c.worker == -1 and c.end_s >= c.start_s >= 0 for c in result.comms)
    assert result.events > 0


def test_events_do_not_grow_with_workers():
    # the vectorised design: SimPy events per step are O(buckets), not O(workers x units)
    cluster, wl = make_cluster(), make_workload(units=6)
    small = DDP().simulate(scenario(cluster, wl, 4)).events
    large = DDP().simulate(scenario(cluster, wl, 256)).events
    assert large <= 1.5 * small


def test_one_worker_has_no_communication():
    cluster, wl = make_cluster(), make_workload()
    result = DDP().simulate(scenario(cluster, wl, 1))
    assert result.comms == ()
    times = unit_times(cluster, wl, 8)
    assert step_times(result) == pytest.approx(times.step_s, rel=REL)


def test_straggler_slows_everyone_and_shows_as_wait():
    # synchronous training runs at the pace of its slowest worker (DESIGN.md)
    cluster = make_cluster(intra_node=flat_link(100.0, 2.0))
    wl = make_workload(units=6, flops_per_sample=2e10)
    compute = unit_times(cluster, wl, 8).step_s
    base = DDP().simulate(scenario(cluster, wl, 4))
    slow = DDP().simulate(scenario(cluster, wl, 4, speed=(0.5, 1.0, 1.0, 1.0)))
    for w in range(4):
        before = [r.end_s - r.start_s for r in base.steps if r.worker == w and r.step >= 1]
        after = [r.end_s - r.start_s for r in slow.steps if r.worker == w and r.step >= 1]
        assert min(after) > max(before) + 0.5 * compute
    waits = {w: np.mean([r.wait_s for r in slow.steps if r.worker == w and r.step >= 1])
             for w in range(4)}
    assert waits[0] == pytest.approx(0.0, abs=1e-12)
    assert all(waits[w] > 0.5 * compute for w in (1, 2, 3))


@settings(max_examples=25, deadline=None)
@given(bw=st.floats(0.5, 500.0), more=st.floats(1.0, 50.0), workers=st.integers(1, 24),
       algorithm=st.sampled_from(["ring", "tree"]))
def test_more_bandwidth_is_never_slower(bw, more, workers, algorithm):
    # property (STYLE.md); the same seed gives the same jitter draws in both runs
    wl = make_workload(units=5, params_per_unit=3_000_000)

    def makespan(b):
        c = make_cluster(intra_node=flat_link(b, 3.0), inter_node=flat_link(b / 6, 15.0))
        sc = scenario(c, wl, workers, jitter="lognormal", jitter_cv=0.1, steps=3)
        result = DDP(DDP.Options(allreduce=algorithm)).simulate(sc)
        assert all(r.start_s >= 0 and r.end_s >= r.start_s for r in result.steps)
        return max(r.end_s for r in result.steps)

    assert makespan(bw * more) <= makespan(bw) * (1 + REL)


@pytest.mark.parametrize("bad", [{"bucket_cap_MiB": 0}, {"first_bucket_MiB": -1},
                                 {"allreduce": "butterfly"}])
def test_bad_options_are_a_perfmodel_error(bad):
    with pytest.raises(PerfmodelError):
        DDP.Options(**bad)


@pytest.mark.skipif(not hasattr(perfmodel.memory, "ddp_memory"),
                    reason="perfmodel.memory.ddp_memory not written yet")
def test_memory_has_a_worker_entry():
    sc = scenario(make_cluster(), make_workload(), 4)
    assert DDP().memory(sc)["worker"].peak_bytes > 0


def test_absurdly_small_bucket_cap_is_a_perfmodel_error():
    wl = make_workload(units=4, params_per_unit=10_000_000)
    with pytest.raises(PerfmodelError):
        gradient_buckets(wl, np.ones(4), 1e-4, 1.0)


def test_overlap_slowdown_stretches_backward_only_while_communicating():
    # compute.overlap_slowdown: backward shares the device with all-reduce kernels in DDP for
    # the share of its time the all-reduces are in flight (perfmodel/sim/compute.py
    # in_flight_fraction); with one worker nothing overlaps.
    import dataclasses

    from perfmodel.sim.compute import unit_times

    a100 = make_cluster("a100")
    base, slowed = (dataclasses.replace(a100, compute=dataclasses.replace(
        a100.compute, overlap_slowdown=s)) for s in (1.0, 1.5))
    w = make_workload(units=4, flops_per_sample=1e10)

    def scenario(cluster, workers):
        return Scenario(cluster=cluster, workload=w, workers=workers, batch_size=8,
                        jitter="none", steps=4)

    def compute_s(cluster, workers):
        return DDP().simulate(scenario(cluster, workers)).steps[-1].compute_s

    assert compute_s(slowed, 1) == pytest.approx(compute_s(base, 1))
    share = DDP().in_flight(scenario(base, 4))
    assert 0 < share <= 1
    backward = float(unit_times(base, w, 8).backward_s.sum())
    assert compute_s(slowed, 4) - compute_s(base, 4) == pytest.approx(0.5 * share * backward)


def _cpu_link_overlap(bandwidth_GBps: float, batch: int, *, cap_MiB: float = 25.0,
                      first_MiB: float = 1.0, capped: bool = False):
    """(the compute seconds overlap_slowdown 1.5 adds to a 2-rank DDP step on a CPU-driven
    link, the buckets, their all-reduce seconds on the host's own link, backward seconds)."""
    host = make_cluster(intra_node=flat_link(bandwidth_GBps, 50.0), comm_cpu_cores_per_node=2)
    base, slowed = (dataclasses.replace(host, compute=dataclasses.replace(
        host.compute, overlap_slowdown=s)) for s in (1.0, 1.5))
    w = make_workload(units=4, params_per_unit=1_000_000, flops_per_sample=1e10)
    backward = unit_times(base, w, batch).backward_s
    buckets = gradient_buckets(w, backward, cap_MiB, first_MiB)
    seconds = [allreduce_s(base, 2, b.nbytes) for b in buckets]
    ddp = DDP(DDP.Options(bucket_cap_MiB=cap_MiB, first_bucket_MiB=first_MiB))

    def compute_s(cluster):
        if capped:      # ranks on two emulated nodes behind a slow link: waits, not CPU work
            cluster = dataclasses.replace(cluster, devices_per_node=1,
                                          inter_node=flat_link(0.01, 50.0))
        sc = Scenario(cluster=cluster, workload=w, workers=2, batch_size=batch,
                      jitter="none", steps=4)
        return ddp.simulate(sc).steps[-1].compute_s

    return compute_s(slowed) - compute_s(base), buckets, seconds, float(backward.sum())


def test_on_a_cpu_driven_link_the_overlap_costs_the_all_reduce_seconds_beside_backward():
    # gloo on a CPU host (DDP.overlap_share): its threads take the rank's core from backward
    # for as long as they reduce beside it, so s costs (s - 1) x the all-reduce seconds that
    # run before backward ends: the first bucket's whole all-reduce where it fits in the rest
    # of backward, the same seconds at any batch where it does
    extras = []
    for batch in (8, 16):
        extra, buckets, seconds, backward = _cpu_link_overlap(20.0, batch)
        assert len(buckets) == 2 and buckets[1].ready_backward_s == pytest.approx(backward)
        assert seconds[0] < backward - buckets[0].ready_backward_s      # it fits
        assert extra == pytest.approx(0.5 * seconds[0])
        extras.append(extra)
    assert extras[0] == pytest.approx(extras[1])
    # ... and only up to backward's end where it outlasts it
    extra, buckets, seconds, backward = _cpu_link_overlap(0.01, 8)
    assert seconds[0] > backward - buckets[0].ready_backward_s
    assert extra == pytest.approx(0.5 * (backward - buckets[0].ready_backward_s))
    # a capped link between emulated nodes adds waits, not CPU work: the host's own link
    assert _cpu_link_overlap(20.0, 8, capped=True)[0] == pytest.approx(extras[0])


def test_on_a_cpu_driven_link_a_bucket_ready_at_backwards_end_costs_no_overlap():
    # one bucket (first and cap above the 16 MB of gradients): its all-reduce starts once
    # backward has ended, takes the core from nothing, and s adds no compute; smaller
    # buckets start before backward ends and add more than torch's default two
    one, buckets, _, _ = _cpu_link_overlap(20.0, 8, cap_MiB=100.0, first_MiB=100.0)
    assert len(buckets) == 1 and one == pytest.approx(0.0, abs=1e-12)
    default = _cpu_link_overlap(20.0, 8)[0]
    small, buckets, _, _ = _cpu_link_overlap(20.0, 8, cap_MiB=2.0)
    assert len(buckets) > 2 and small > default > 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_overlap_slowdown_lasts_as_long_as_the_collectives_not_the_straggler(strategy):
    # compute.overlap_slowdown stretches compute only while collectives are in flight; a
    # worker at half speed computes twice as long, but the collectives it overlaps take no
    # longer, so its extra seconds from the slowdown are the same as a fast worker's
    import dataclasses

    from perfmodel.sim.fsdp import FSDP
    base = make_cluster(intra_node=flat_link(100.0, 2.0))
    wl = make_workload(units=6, flops_per_sample=2e10)

    def compute(slowdown, speed):
        cluster = dataclasses.replace(base, compute=dataclasses.replace(
            base.compute, overlap_slowdown=slowdown))
        sim = DDP() if strategy == "ddp" else FSDP()
        res = sim.simulate(scenario(cluster, wl, 2, speed=speed))
        return {w: np.mean([r.compute_s for r in res.steps if r.worker == w]) for w in (0, 1)}

    fast, slow = compute(1.0, (1.0, 0.5)), compute(1.5, (1.0, 0.5))
    extra = {w: slow[w] - fast[w] for w in (0, 1)}
    assert extra[0] > 0
    assert extra[1] == pytest.approx(extra[0], rel=1e-9)


@pytest.mark.parametrize("name", ["mlp", "cnn-small", "transformer-small"])
@pytest.mark.parametrize("cap_first", [(25.0, 1.0), (1.0, 1.0), (2.0, 0.5)])
def test_whole_tensor_buckets_are_torchs(name, cap_first):
    """A workload that lists its tensors is bucketed as torch's own assignment does it
    (`dist._compute_bucket_assignment_by_size` over the parameters in reverse order): whole
    tensors, a bucket closing once it reaches its limit."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from measure.models import MODELS

    cap, first = cap_first
    params = list(MODELS[name].build().parameters())[::-1]
    indices, _ = dist._compute_bucket_assignment_by_size(
        params, [int(first * MiB), int(cap * MiB)], [False] * len(params))
    expected = [sum(params[i].numel() * 4 for i in bucket) for bucket in indices]
    wl = load_workload(name)
    buckets = gradient_buckets(wl, np.ones(len(wl.units)), cap, first)
    assert [b.nbytes for b in buckets] == expected


def test_measured_mlp_buckets_match():
    # measure/runs/ddp.py's record of report 24's set A DDP mlp run (run 32,
    # reports/local-2026-12-05-heldout-24/pooled/report-24-set-a.sqlite): bucket_count 2,
    # first_bucket_bytes 4239400, largest_bucket_bytes 8663040
    wl = load_workload("mlp")
    buckets = gradient_buckets(wl, np.ones(len(wl.units)), 25.0, 1.0)
    assert [b.nbytes for b in buckets] == [4_239_400, 8_663_040]


def test_a_whole_tensor_bucket_is_ready_with_its_last_tensor():
    # mlp with 1 MiB buckets: head + hidden3 (ready at the end of hidden3's backward), then
    # each 1024x1024 layer alone; backward 1 s per unit, head first
    wl = load_workload("mlp")
    buckets = gradient_buckets(wl, np.ones(len(wl.units)), 1.0, 1.0)
    assert len(buckets) == 4
    assert [b.ready_backward_s for b in buckets[:3]] == pytest.approx([2.0, 3.0, 4.0], rel=REL)
    assert buckets[3].ready_backward_s == pytest.approx(5.0, rel=REL)


def test_a_workload_without_tensor_counts_is_split_pro_rata():
    wl = load_workload("mlp")
    bare = dataclasses.replace(wl, units=tuple(dataclasses.replace(u, tensor_params=())
                                               for u in wl.units))
    buckets = gradient_buckets(bare, np.ones(len(wl.units)), 1.0, 1.0)
    assert len(buckets) == 13 and buckets[0].nbytes == pytest.approx(MiB, rel=REL)
