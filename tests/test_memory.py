"""Tests of the memory model against ZeRO's formulas, torch's DDP/FSDP sources and the study.

The peak is the larger of two moments of a step (zero_grad(set_to_none=True), torch's
default): the start of backward (no gradients; everything the forward saved, autocast's weight
cache and the transient peaks) and the end of backward (every gradient; activations freed).
Parts are per-parameter byte counts of the precision's dtypes (perfmodel/workload.py
PRECISIONS): autocast keeps fp32 params and grads, pure bf16 keeps 2-byte ones and an fp32
master copy in the optimizer.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.errors import PerfmodelError
from perfmodel.memory import ddp_memory, fsdp_memory, ps_memory
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import Unit
from tests.factories import make_cluster, make_workload

REL_TOL = 1e-12          # the formulas are exact arithmetic; only float rounding may differ
A100 = make_cluster("a100")
DDP_DEFAULT_BUCKETS = {"bucket_cap_MiB": 25.0, "first_bucket_MiB": 1.0}   # torch's defaults

PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16")
OPTIMIZERS = ("sgd", "momentum", "adam")


def scenario(workload, workers: int = 8, batch_size: int = 8, cluster=A100) -> Scenario:
    return Scenario(cluster=cluster, workload=workload, workers=workers, batch_size=batch_size)


def state_only(**kwargs):
    """A workload with no activations: nothing is alive at the start of backward that is not
    also alive at its end, so the peak is the end of backward and every gradient is in it."""
    return make_workload(activation_bytes_per_sample=0.0, **kwargs)


def gpt2_like(batch_size: int = 16):
    """GPT-2 XL-sized: 48 blocks of 31M parameters (1.49B), bf16 mixed-precision Adam.

    Activations are modest: with full activation checkpointing each block keeps only its
    input, s·h bf16 values per sample (Korthikanti et al. 2022, sec. 4): 2·1024·1600 bytes.
    """
    return make_workload(units=48, params_per_unit=31_000_000,
                         activation_bytes_per_sample=2 * 1024 * 1600,
                         precision="bf16-mixed", optimizer="adam", batch_size=batch_size)


# ZeRO (Rajbhandari et al. 2020, sec. 3.1): model state = (param + grad + K) bytes per parameter,
# K = fp32 master (pure bf16 only) + optimizer state (momentum 4, Adam moments 8). Under
# autocast (bf16-mixed, fp16-mixed) the parameters and gradients stay fp32: 4 + 4 + K; pure
# bf16 (Megatron-style) keeps 2 + 2 and the fp32 master in K (ZeRO's 16Ψ for Adam).
@pytest.mark.parametrize(("precision", "optimizer", "param", "grad", "k"), [
    ("bf16-mixed", "adam", 4, 4, 8),
    ("fp16-mixed", "adam", 4, 4, 8),
    ("bf16", "adam", 2, 2, 4 + 8),
    ("fp32", "adam", 4, 4, 8),
    ("tf32", "adam", 4, 4, 8),
    ("bf16-mixed", "momentum", 4, 4, 4),
    ("bf16", "momentum", 2, 2, 4 + 4),
    ("fp32", "momentum", 4, 4, 4),
    ("bf16-mixed", "sgd", 4, 4, 0),
    ("bf16", "sgd", 2, 2, 4),
    ("fp32", "sgd", 4, 4, 0),
])
def test_ddp_model_state_matches_zero(precision, optimizer, param, grad, k):
    w = state_only(precision=precision, optimizer=optimizer)
    m = ddp_memory(scenario(w), **DDP_DEFAULT_BUCKETS)
    assert m.phase == "end of backward"
    assert m.params_bytes == pytest.approx(param * w.params, rel=REL_TOL)
    assert m.grads_bytes == pytest.approx(grad * w.params, rel=REL_TOL)
    assert m.optimizer_bytes == pytest.approx(k * w.params, rel=REL_TOL)
    assert m.model_state_bytes == pytest.approx((param + grad + k) * w.params, rel=REL_TOL)


def test_master_weights_are_counted_with_the_optimizer():
    # Convention of this model: pure bf16's fp32 master copy sits in optimizer_bytes.
    w = state_only(precision="bf16", optimizer="sgd")
    m = ddp_memory(scenario(w), **DDP_DEFAULT_BUCKETS)
    assert m.params_bytes == pytest.approx(2 * w.params, rel=REL_TOL)
    assert m.optimizer_bytes == pytest.approx(4 * w.params, rel=REL_TOL)


@pytest.mark.parametrize("bucket_cap_MiB", [1.0, 25.0, 1000.0])
def test_ddp_buckets_are_one_gradient_copy_whatever_the_cap(bucket_cap_MiB):
    # torch reducer.cpp (initialize_buckets) allocates a flat gradients tensor per bucket and
    # the buckets partition all parameters: their total is the gradient size, any cap.
    # Under autocast the gradients, so the buckets, are fp32 (4 bytes a parameter).
    w = state_only(precision="bf16-mixed", optimizer="adam")
    m = ddp_memory(scenario(w), bucket_cap_MiB=bucket_cap_MiB, first_bucket_MiB=1.0)
    assert m.comm_buffers_bytes == pytest.approx(m.grads_bytes, rel=REL_TOL)
    assert m.comm_buffers_bytes == pytest.approx(4 * w.params, rel=REL_TOL)


@pytest.mark.parametrize("workers", [1, 2, 8, 64, 512])
@pytest.mark.parametrize("variant", ["full-shard", "grad-op"])
def test_fsdp_model_state_is_zero3_share(workers, variant):
    # ZeRO stage 3 (Rajbhandari et al. 2020, fig. 1): 16Ψ/N per rank for mixed-precision Adam
    # (MixedPrecisionPolicy: fp32 sharded params 4 + grads 4 + moments 8).
    w = state_only(units=8, precision="bf16-mixed", optimizer="adam")
    m = fsdp_memory(scenario(w, workers=workers), variant, prefetch=1)
    assert m.phase == "end of backward"
    assert m.params_bytes == pytest.approx(4 * w.params / workers, rel=REL_TOL)
    assert m.model_state_bytes == pytest.approx(16 * w.params / workers, rel=REL_TOL)


def test_full_shard_buffers_are_largest_prefetch_window_and_largest_gradient():
    # Units [1, 5, 2, 4] M params with prefetch 1: the two consecutive units with most params
    # are 5 + 2 = 7 M; the largest unsharded gradient is 5 M (FSDP paper, sec. 3.2; fp32).
    # No activations: the peak is the end of backward, with that gradient alive.
    sizes = [1_000_000, 5_000_000, 2_000_000, 4_000_000]
    w = dataclasses.replace(make_workload(), units=tuple(
        Unit(name=f"u{i}", params=p, forward_flops_per_sample=1e9,
             activation_bytes_per_sample=0.0) for i, p in enumerate(sizes)))
    m = fsdp_memory(scenario(w, workers=4), "full-shard", prefetch=1)
    assert m.comm_buffers_bytes == pytest.approx(4 * 7_000_000 + 4 * 5_000_000, rel=REL_TOL)
    no_prefetch = fsdp_memory(scenario(w, workers=4), "full-shard", prefetch=0)
    assert no_prefetch.comm_buffers_bytes == pytest.approx(4 * 5_000_000 * 2, rel=REL_TOL)
    grad_op = fsdp_memory(scenario(w, workers=4), "grad-op", prefetch=1)
    assert grad_op.comm_buffers_bytes == pytest.approx(4 * 12_000_000 + 4 * 5_000_000,
                                                       rel=REL_TOL)
    # MixedPrecisionPolicy(bf16, fp32 reduce): gathered in 2 bytes; the largest unit's
    # gradient in bf16 (2) and again in fp32 for the reduce-scatter (4); pure bf16: 2 + 2.
    mixed = fsdp_memory(scenario(dataclasses.replace(w, precision="bf16-mixed"), workers=4),
                        "full-shard", prefetch=1)
    assert mixed.comm_buffers_bytes == pytest.approx(2 * 7_000_000 + (2 + 4) * 5_000_000,
                                                     rel=REL_TOL)
    pure = fsdp_memory(scenario(dataclasses.replace(w, precision="bf16"), workers=4),
                       "full-shard", prefetch=1)
    assert pure.comm_buffers_bytes == pytest.approx(2 * 7_000_000 + 2 * 5_000_000, rel=REL_TOL)


workloads = st.builds(
    lambda sizes, precision, optimizer: dataclasses.replace(
        make_workload(precision=precision, optimizer=optimizer),
        units=tuple(Unit(name=f"u{i}", params=p, forward_flops_per_sample=1e9,
                         activation_bytes_per_sample=1e5) for i, p in enumerate(sizes))),
    st.lists(st.integers(1, 10**9), min_size=1, max_size=60),
    st.sampled_from(PRECISIONS), st.sampled_from(OPTIMIZERS))


@settings(max_examples=200, deadline=None)
@given(workload=workloads, n=st.integers(1, 1024), extra=st.integers(1, 1024),
       variant=st.sampled_from(["full-shard", "grad-op"]), prefetch=st.integers(0, 4))
def test_fsdp_peak_never_grows_with_more_workers(workload, n, extra, variant, prefetch):
    # Sharded state falls as 1/N; unsharded buffers and activations do not depend on N
    # (FSDP paper, sec. 3.2), so the per-rank peak is non-increasing in N.
    fewer = fsdp_memory(scenario(workload, workers=n), variant, prefetch)
    more = fsdp_memory(scenario(workload, workers=n + extra), variant, prefetch)
    assert more.peak_bytes <= fewer.peak_bytes * (1 + REL_TOL)


@settings(max_examples=200, deadline=None)
@given(workload=workloads, n=st.integers(1, 1024), prefetch=st.integers(0, 4))
def test_grad_op_never_below_full_shard(workload, n, prefetch):
    # reshard_after_forward=False keeps every unit unsharded until backward (ZeRO-2-like),
    # a superset of the prefetch window that full sharding holds.
    s = scenario(workload, workers=n)
    full = fsdp_memory(s, "full-shard", prefetch)
    grad_op = fsdp_memory(s, "grad-op", prefetch)
    assert grad_op.peak_bytes >= full.peak_bytes * (1 - REL_TOL)


@pytest.mark.parametrize("variant", ["full-shard", "grad-op"])
def test_fsdp_at_one_worker_is_not_smaller_than_the_model(variant):
    # N = 1: nothing to shard, and FSDP2 still copies into unsharded tensors (torch 2.13
    # _fsdp_param_group.py, wait_for_unshard, world_size == 1), so at least DDP's model state.
    w = state_only(units=12, precision="bf16-mixed", optimizer="adam")
    s = scenario(w, workers=1)
    fsdp = fsdp_memory(s, variant, prefetch=1)
    ddp = ddp_memory(s, **DDP_DEFAULT_BUCKETS)
    assert fsdp.model_state_bytes == pytest.approx(ddp.model_state_bytes, rel=REL_TOL)
    assert fsdp.peak_bytes > ddp.peak_bytes - ddp.comm_buffers_bytes


@pytest.mark.parametrize("workers", [8, 16])
def test_fsdp_cuts_gpt2_peak_at_least_4x(workers):
    # The study's finding: FSDP cuts peak memory 4-6x against DDP on GPT-style models when
    # activations are modest (DESIGN.md, issue 12: at least 4x). Both peaks from the rules:
    # DDP under autocast, at the end of backward (A < 4Ψ): F + Ψ(4 param + 8 Adam + 4 bucket
    # + 4 grad); FSDP full-shard, prefetch 1, the larger of the start of backward
    # F + 12Ψ/N + A + 2·2U (two units gathered in bf16) and the end F + 16Ψ/N + 2·2U + (2+4)U
    # (the largest unit's gradient in bf16 and in fp32 for the reduce-scatter), U = 31 M.
    w = gpt2_like()
    s = scenario(w, workers=workers, batch_size=16)
    psi, u, n = w.params, 31_000_000, workers
    f_bytes, a = A100.device.framework_overhead_GiB * 2**30, 48 * 2 * 1024 * 1600 * 16
    assert a < 4 * psi
    ddp_expected = f_bytes + psi * (4 + 8 + 4 + 4)
    fsdp_expected = f_bytes + max(12 * psi / n + a + 2 * 2 * u,
                                  16 * psi / n + 2 * 2 * u + (2 + 4) * u)
    ddp = ddp_memory(s, **DDP_DEFAULT_BUCKETS)
    fsdp = fsdp_memory(s, "full-shard", prefetch=1)
    assert ddp.peak_bytes == pytest.approx(ddp_expected, rel=REL_TOL)
    assert fsdp.peak_bytes == pytest.approx(fsdp_expected, rel=REL_TOL)
    assert ddp.peak_bytes / fsdp.peak_bytes >= 4.0


def test_fsdp_gain_is_capped_by_what_is_not_sharded():
    # As N grows the FSDP peak tends to what is not sharded (activations, transients,
    # framework, unsharded buffers), so the DDP/FSDP ratio rises with N but never past DDP
    # peak / that floor.
    w = gpt2_like()
    ddp = ddp_memory(scenario(w, workers=8, batch_size=16), **DDP_DEFAULT_BUCKETS)
    ratios = []
    for n in (8, 64, 4096):
        f = fsdp_memory(scenario(w, workers=n, batch_size=16), "full-shard", prefetch=1)
        ratios.append(ddp.peak_bytes / f.peak_bytes)
        floor = f.peak_bytes - f.model_state_bytes
    assert ratios == sorted(ratios)
    assert ratios[-1] < ddp.peak_bytes / floor


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "ps"])
def test_oom_flips_when_capacity_is_exceeded(strategy):
    w = gpt2_like()

    def breakdown(memory_GiB):
        device = dataclasses.replace(A100.device, memory_GiB=memory_GiB)
        s = scenario(w, workers=8, batch_size=16,
                     cluster=dataclasses.replace(A100, device=device))
        if strategy == "ddp":
            return ddp_memory(s, **DDP_DEFAULT_BUCKETS)
        if strategy == "fsdp":
            return fsdp_memory(s, "full-shard", prefetch=1)
        return ps_memory(s, servers=1)["worker"]

    # the card must hold the peak plus the allocator's reserve (issue 12's usable memory)
    card_GiB = breakdown(80.0).peak_bytes / 2**30 / (1 - A100.device.allocator_reserve_fraction)
    assert not breakdown(card_GiB * 1.01).oom
    assert breakdown(card_GiB * 0.99).oom


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 4096), workers=st.integers(1, 256))
def test_activations_scale_linearly_with_batch_and_are_not_sharded(batch, workers):
    # Activations = Σ per-sample bytes x batch (DESIGN.md "Memory"); FSDP does not shard them.
    # Small units: the start of backward, where the activations are alive, is the peak.
    w = make_workload(units=5, params_per_unit=1000, activation_bytes_per_sample=3e6)
    one = fsdp_memory(scenario(w, workers=1, batch_size=1), "full-shard", prefetch=1)
    many = fsdp_memory(scenario(w, workers=workers, batch_size=batch), "full-shard", prefetch=1)
    ddp = ddp_memory(scenario(w, workers=workers, batch_size=batch), **DDP_DEFAULT_BUCKETS)
    assert one.phase == many.phase == ddp.phase == "start of backward"
    assert one.activations_bytes == pytest.approx(5 * 3e6, rel=REL_TOL)
    assert many.activations_bytes == pytest.approx(batch * one.activations_bytes, rel=REL_TOL)
    assert ddp.activations_bytes == pytest.approx(many.activations_bytes, rel=REL_TOL)


@pytest.mark.parametrize("servers", [1, 2, 4])
def test_ps_server_holds_optimizer_state_and_worker_does_not(servers):
    # DESIGN.md: PS workers hold params + grads; the server holds params + optimizer state.
    # Under autocast both are fp32 (4 + 4 on the worker); the servers hold fp32 params and
    # Adam's moments (4 + 8), with no separate master copy.
    w = state_only(precision="bf16-mixed", optimizer="adam")
    parts = ps_memory(scenario(w), servers=servers)
    worker, server = parts["worker"], parts["server"]
    assert worker.optimizer_bytes == 0
    assert worker.model_state_bytes == pytest.approx((4 + 4) * w.params, rel=REL_TOL)
    assert servers * server.optimizer_bytes == pytest.approx(8 * w.params, rel=REL_TOL)
    assert servers * server.params_bytes == pytest.approx(4 * w.params, rel=REL_TOL)
    # Pure bf16: 2 + 2 on the worker; the servers add the fp32 master to Adam's moments.
    pure = ps_memory(scenario(state_only(precision="bf16", optimizer="adam")), servers=servers)
    assert pure["worker"].model_state_bytes == pytest.approx((2 + 2) * w.params, rel=REL_TOL)
    assert servers * pure["server"].optimizer_bytes == pytest.approx(12 * w.params,
                                                                     rel=REL_TOL)
    assert servers * pure["server"].params_bytes == pytest.approx(2 * w.params, rel=REL_TOL)
    assert server.activations_bytes == 0
    assert server.capacity_bytes == worker.capacity_bytes == A100.device.allocatable_bytes


def test_framework_overhead_and_capacity_come_from_the_profile():
    m = ddp_memory(scenario(make_workload()), **DDP_DEFAULT_BUCKETS)
    assert m.framework_bytes == pytest.approx(A100.device.framework_overhead_GiB * 2**30,
                                              rel=REL_TOL)
    reserve = A100.device.allocator_reserve_fraction     # usable-memory convention (#12)
    assert m.capacity_bytes == pytest.approx(40 * 2**30 * (1 - reserve), rel=REL_TOL)


@pytest.mark.parametrize("call", [
    lambda s: fsdp_memory(s, "zero-9", prefetch=1),
    lambda s: fsdp_memory(s, "full-shard", prefetch=-1),
    lambda s: ps_memory(s, servers=0),
    lambda s: ddp_memory(s, bucket_cap_MiB=0.0, first_bucket_MiB=1.0),
    lambda s: ddp_memory(s, bucket_cap_MiB=25.0, first_bucket_MiB=-1.0),
])
def test_bad_options_raise_a_user_error(call):
    with pytest.raises(PerfmodelError):
        call(scenario(make_workload()))


def test_calibrated_overhead_fraction_adds_to_the_analytic_parts():
    # calibration/fit_memory.py: measured = framework + (1 + fraction) x analytic parts.
    import dataclasses

    from factories import make_cluster, make_workload

    from perfmodel.memory import ddp_memory
    from perfmodel.sim.scenario import Scenario

    base = make_cluster("a100")
    tuned = dataclasses.replace(base, device=dataclasses.replace(
        base.device, memory_overhead_fraction=0.1))
    w = make_workload()
    plain = ddp_memory(Scenario(cluster=base, workload=w, workers=2, batch_size=8), 25, 1)
    more = ddp_memory(Scenario(cluster=tuned, workload=w, workers=2, batch_size=8), 25, 1)
    analytic = plain.peak_bytes - plain.framework_bytes
    assert plain.overhead_bytes == 0
    assert more.peak_bytes == pytest.approx(plain.peak_bytes + 0.1 * analytic, rel=1e-12)
