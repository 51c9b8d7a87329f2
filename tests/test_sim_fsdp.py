"""FSDP simulation against ZeRO's communication volume, the collective formulas and invariants.

Sources: Zhao et al., "PyTorch FSDP", VLDB 2023 (all-gather before forward and backward,
reduce-scatter after backward, prefetch); Rajbhandari et al., ZeRO 2020, sec. 7 (3Ψ per rank
for full sharding against DDP's 2Ψ: 1.5x; ZeRO-2 / grad-op: 1x); nccl-tests PERFORMANCE.md
(busbw factors turn a collective's size into the bytes each rank moves).
"""

from __future__ import annotations

import numpy as np
import pytest
from factories import flat_link, make_cluster, make_workload
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel.memory
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import allgather_s, busbw_factor, reduce_scatter_s
from perfmodel.sim.compute import unit_times
from perfmodel.sim.ddp import DDP
from perfmodel.sim.fsdp import FSDP
from perfmodel.sim.scenario import Scenario

REL = 1e-9              # the event model against a closed form: float rounding only


def scenario(cluster, workload, workers, **kw) -> Scenario:
    kw.setdefault("steps", 4)
    kw.setdefault("warmup_steps", 1)
    kw.setdefault("jitter", "none")
    return Scenario(cluster=cluster, workload=workload, workers=workers,
                    batch_size=kw.pop("batch_size", 8), **kw)


def step_times(result) -> np.ndarray:
    return np.array([r.end_s - r.start_s for r in result.steps])


def per_rank_bytes(result, workers) -> float:
    """Bytes each rank sends per step: collective size x nccl-tests busbw factor."""
    return sum(c.bytes * busbw_factor(c.kind, workers) for c in result.comms)


def fsdp(variant="full-shard", prefetch=1) -> FSDP:
    return FSDP(FSDP.Options(variant=variant, prefetch=prefetch))


@pytest.mark.parametrize("workers", [4, 16])
def test_full_shard_moves_one_and_a_half_times_ddp(workers):
    # ZeRO: full sharding 3Ψ(N-1)/N per rank, DDP 2Ψ(N-1)/N; grad-op (ZeRO-2) 2Ψ(N-1)/N
    cluster, wl = make_cluster(), make_workload(units=6, params_per_unit=3_000_000)
    sc = scenario(cluster, wl, workers)
    ddp = per_rank_bytes(DDP().simulate(sc), workers)
    assert per_rank_bytes(fsdp().simulate(sc), workers) == pytest.approx(1.5 * ddp, rel=REL)
    assert per_rank_bytes(fsdp("grad-op").simulate(sc), workers) == pytest.approx(ddp, rel=REL)


def test_full_shard_takes_one_and_a_half_times_ddp_on_a_flat_link():
    # no latency, no compute: time is bytes over bandwidth, so the ZeRO ratio holds for time
    cluster = make_cluster(zero_compute=True, intra_node=flat_link(100.0))
    wl = make_workload(units=6, params_per_unit=3_000_000)
    sc = scenario(cluster, wl, 8)
    ddp = step_times(DDP().simulate(sc)).mean()
    assert step_times(fsdp().simulate(sc)).mean() == pytest.approx(1.5 * ddp, rel=REL)


@pytest.mark.parametrize("variant", ["full-shard", "grad-op"])
@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("workers", [4, 16])
def test_zero_compute_step_is_the_sum_of_collectives(variant, prefetch, workers):
    # with no compute the link never idles: a step is the sum of its collectives' times
    cluster = make_cluster(zero_compute=True, intra_node=flat_link(100.0, 2.0),
                           inter_node=flat_link(10.0, 8.0))
    wl = make_workload(units=5, params_per_unit=2_000_000)
    result = fsdp(variant, prefetch).simulate(scenario(cluster, wl, workers))
    unit_bytes = 2_000_000 * 4
    gathers = 2 if variant == "full-shard" else 1
    expected = 5 * (gathers * allgather_s(cluster, workers, unit_bytes)
                    + reduce_scatter_s(cluster, workers, unit_bytes))
    assert step_times(result) == pytest.approx(expected, rel=REL)


def test_prefetch_overlaps_all_gathers_with_compute():
    # FSDP paper sec. 3.3: issuing the next all-gather early hides it behind compute
    cluster = make_cluster(intra_node=flat_link(20.0, 5.0))
    wl = make_workload(units=8, params_per_unit=5_000_000, flops_per_sample=5e10)
    sc = scenario(cluster, wl, 8)
    none, one = fsdp(prefetch=0).simulate(sc), fsdp(prefetch=1).simulate(sc)
    gather = allgather_s(cluster, 8, 5_000_000 * 4)
    # without prefetch each of the 16 all-gathers is exposed; with it most are hidden
    assert step_times(none).mean() - step_times(one).mean() > 10 * gather


@pytest.mark.parametrize("variant,gathers", [("full-shard", 2), ("grad-op", 1)])
def test_optimizer_updates_one_nth_of_the_parameters_and_fsdp2_copies_every_buffer(
        variant, gathers):
    cluster, wl = make_cluster(), make_workload(optimizer="adam")
    sc = scenario(cluster, wl, 4)
    result = fsdp(variant).simulate(sc)
    # both passes as the simulator runs them: stretched while collectives are in flight
    expected = unit_times(cluster, wl, 8, optimizer_param_fraction=0.25,
                          overlapped=("forward", "backward"),
                          in_flight=fsdp(variant).in_flight(sc)).step_s
    # FSDP2 (_fsdp_collectives.py): per all-gather the shard copied in and the whole
    # output copied out, per reduce-scatter the whole gradient copied in and the reduced
    # shard divided; each at the optimizer's streaming rate (bytes counted once)
    whole = wl.params * 4                                      # fp32 params and gradients
    copies = (gathers + 1) * (whole + whole / 4) / (cluster.compute.optimizer_GBps * 1e9)
    assert [r.compute_s for r in result.steps] == pytest.approx([expected + copies] * 16,
                                                                rel=REL)


def test_staleness_zero_and_records_complete():
    cluster, wl = make_cluster(), make_workload(units=6)
    sc = scenario(cluster, wl, 12, jitter="lognormal", jitter_cv=0.1, steps=5)
    result = fsdp().simulate(sc)
    assert all(u.staleness == 0 for u in result.updates)
    for w in range(12):
        assert [r.step for r in result.steps if r.worker == w] == list(range(5))
    for r in result.steps:
        assert min(r.compute_s, r.comm_exposed_s, r.wait_s) >= 0.0
        assert r.compute_s + r.comm_exposed_s + r.wait_s == pytest.approx(
            r.end_s - r.start_s, rel=REL)
    assert len(result.comms) == 3 * 6 * 5


def test_one_worker_has_no_communication():
    cluster, wl = make_cluster(), make_workload()
    result = fsdp().simulate(scenario(cluster, wl, 1))
    assert result.comms == ()
    assert step_times(result) == pytest.approx(unit_times(cluster, wl, 8).step_s, rel=REL)


def test_straggler_slows_everyone_and_shows_as_wait():
    # every unit's all-gather joins the ranks, so all run at the straggler's pace
    cluster = make_cluster(intra_node=flat_link(100.0, 2.0))
    wl = make_workload(units=6, flops_per_sample=2e10)
    compute = unit_times(cluster, wl, 8, optimizer_param_fraction=0.25).step_s
    base = fsdp().simulate(scenario(cluster, wl, 4))
    slow = fsdp().simulate(scenario(cluster, wl, 4, speed=(1.0, 1.0, 0.5, 1.0)))
    assert step_times(slow).min() > step_times(base).max() + 0.5 * compute
    waits = [np.mean([r.wait_s for r in slow.steps if r.worker == w]) for w in range(4)]
    assert waits[2] == pytest.approx(0.0, abs=1e-12)
    assert all(waits[w] > 0.5 * compute for w in (0, 1, 3))


@settings(max_examples=25, deadline=None)
@given(bw=st.floats(0.5, 500.0), more=st.floats(1.0, 50.0), workers=st.integers(1, 24),
       variant=st.sampled_from(["full-shard", "grad-op"]), prefetch=st.integers(0, 2))
def test_more_bandwidth_is_never_slower(bw, more, workers, variant, prefetch):
    # property (STYLE.md); the same seed gives the same jitter draws in both runs
    wl = make_workload(units=5, params_per_unit=3_000_000)

    def makespan(b):
        c = make_cluster(intra_node=flat_link(b, 3.0), inter_node=flat_link(b / 6, 15.0))
        sc = scenario(c, wl, workers, jitter="lognormal", jitter_cv=0.1, steps=3)
        result = fsdp(variant, prefetch).simulate(sc)
        assert all(r.start_s >= 0 and r.end_s >= r.start_s for r in result.steps)
        return max(r.end_s for r in result.steps)

    assert makespan(bw * more) <= makespan(bw) * (1 + REL)


@pytest.mark.parametrize("bad", [{"variant": "zero3"}, {"prefetch": -1}, {"prefetch": 1.5}])
def test_bad_options_are_a_perfmodel_error(bad):
    with pytest.raises(PerfmodelError):
        FSDP.Options(**bad)


@pytest.mark.skipif(not hasattr(perfmodel.memory, "fsdp_memory"),
                    reason="perfmodel.memory.fsdp_memory not written yet")
def test_memory_has_a_worker_entry():
    sc = scenario(make_cluster(), make_workload(), 4)
    assert fsdp().memory(sc)["worker"].peak_bytes > 0
