"""Calibration fits recover known parameters from measurements the model itself generates.

Synthetic measurements: the simulator's own closed forms (perfmodel/sim/collectives.py for
collectives, perfmodel/sim/compute.py `pass_seconds` for unit passes) times 3 % multiplicative
Gaussian noise from a seeded Generator. The fit must return the parameters used (issue 4:
"α, β, compute rate within 5 %").
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import calibration.fit as fit_module
from calibration.fit_compute import (
    UnitTiming,
    fit_compute,
    fit_jitter_cv,
    fit_optimizer_rate,
)
from calibration.fit_memory import MemorySample, fit_memory
from calibration.fit_network import CollectiveSample, fit_link, fit_network
from calibration.fit_ps import fit_push_link, fit_push_rate, fit_server_apply
from perfmodel.cluster import Link, interpolate_log
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import collective_s, sendrecv_s
from perfmodel.sim.compute import pass_seconds
from perfmodel.uncertainty import prediction_interval
from tests.factories import flat_link, make_cluster

NOISE = 0.03                 # multiplicative noise on every synthetic time (3 %)
PARAM_TOL = 0.05             # issue 4: α, β and the compute rate within 5 %
CURVE_TOL = 0.05             # efficiency where the bandwidth term dominates, absolute
TIME_TOL = 0.08              # fitted model's time vs the noise-free truth, every point
OPS = ("all-reduce", "all-gather", "broadcast")
SIZES = 2.0 ** np.arange(10, 29)            # 1 KiB .. 256 MiB, as an nccl-tests sweep
CURVE = ((1e4, 0.2), (1e6, 0.6), (1.6e7, 1.0))


def truth_cluster(curve=CURVE):
    intra = Link(bandwidth_GBps=1.5, latency_us=200.0, efficiency_by_bytes=curve)
    inter = Link(bandwidth_GBps=0.5, latency_us=800.0, efficiency_by_bytes=curve)
    # links that move data themselves (comm_cpu_cores_per_node 0): sweeps at up to 16 ranks
    # fit the α–β form directly (CPU hosts divide core sharing out first, from_store.py)
    return make_cluster("local", devices_per_node=4, intra_node=intra, inter_node=inter,
                        comm_cpu_cores_per_node=0)


def sweep(cluster, rng, ranks=(2, 4, 8, 16), repeats=2):
    return [CollectiveSample(op=op, ranks=p, bytes=float(n), nodes=cluster.nodes_for(p),
                             time_s=collective_s(op, cluster, p, n) * (1 + NOISE * rng.normal()))
            for p in ranks for op in OPS for n in SIZES for _ in range(repeats)]


def fitted_cluster(cluster, fits):
    links = {scope: Link(bandwidth_GBps=f.bandwidth_GBps.value, latency_us=f.latency_us.value,
                         efficiency_by_bytes=f.efficiency_by_bytes) for scope, f in fits.items()}
    return dataclasses.replace(cluster, **links)


def test_network_fit_recovers_alpha_beta_and_efficiency_curve():
    # Thakur et al. 2005 α–β ring costs with a size-dependent efficiency (collectives.py)
    truth = truth_cluster()
    fits = fit_network(sweep(truth, np.random.default_rng(1)))
    for scope, link in (("intra_node", truth.intra_node), ("inter_node", truth.inter_node)):
        f = fits[scope]
        assert f.curve_fitted
        assert f.latency_us.value == pytest.approx(link.latency_us, rel=PARAM_TOL)
        assert f.bandwidth_GBps.value == pytest.approx(link.bandwidth_GBps, rel=PARAM_TOL)
        assert f.latency_us.rms_rel == pytest.approx(NOISE, rel=0.25)   # residual = the noise
        for n in (1e6, 4e6, 1.6e7, 1e8):   # sizes where the bandwidth term dominates
            assert interpolate_log(f.efficiency_by_bytes, n) == pytest.approx(
                interpolate_log(CURVE, n), abs=CURVE_TOL)
        assert all(0 < e <= 1 for _, e in f.efficiency_by_bytes)
    model = fitted_cluster(truth, fits)
    for op in OPS:
        for p in (2, 8):
            for n in SIZES:
                assert collective_s(op, model, p, n) == pytest.approx(
                    collective_s(op, truth, p, n), rel=TIME_TOL)


def test_network_fit_keeps_a_flat_link_flat():
    # no efficiency loss in the data: the F-test must not invent a curve
    truth = truth_cluster(curve=((1.0, 1.0),))
    f = fit_network(sweep(truth, np.random.default_rng(2)))["intra_node"]
    assert not f.curve_fitted and f.efficiency_by_bytes[0][1] == 1.0
    assert f.latency_us.value == pytest.approx(200.0, rel=PARAM_TOL)
    assert f.bandwidth_GBps.value == pytest.approx(1.5, rel=PARAM_TOL)
    assert set(f.by_op) == set(OPS)


def loopback_like_pings(seed, repeats=3):
    # one-way messages as gloo over loopback moved them in five calibrations (fit.py's
    # docstring): slow and noisy mid sizes, fast large ones, and sub-256 KiB times whose
    # bimodal wake-ups spread them x0.5-x2 (log SD 0.7); the calibrate sweep's sizes
    truth = Link(bandwidth_GBps=2.5, latency_us=100.0,
                 efficiency_by_bytes=((2.6e5, 0.5), (1e6, 0.35), (4e6, 0.6), (8e6, 1.0)))
    rng = np.random.default_rng(seed)
    sizes = 2.0 ** np.arange(10, 25)                  # 1 KiB .. 16 MiB
    return truth, [CollectiveSample(op="ping-pong", ranks=2, bytes=float(n),
                                    time_s=sendrecv_s_on(truth, n)
                                    * np.exp(rng.normal(0, 0.7 if n < 2.6e5 else 0.15)))
                   for n in sizes for _ in range(repeats)]


def sendrecv_s_on(link, n):
    return link.latency_s + n * link.seconds_per_byte(n)


def test_a_curve_hidden_by_noisy_small_sizes_is_kept_by_the_bias_test(monkeypatch):
    # the F-test over every point drops the curve (noise at small sizes); the plain line
    # then misses 12.9 MB (a PS push of the mlp) by 20-45 %. The t-test of the plain fit's
    # bias where bandwidth dominates keeps it in most sweeps, and the kept curve predicts
    # 12.9 MB far closer. Ten seeds, fixed before looking: a property of the rule, not of one.
    def err(fit, truth, n=12.9e6):
        link = Link(bandwidth_GBps=fit.bandwidth_GBps.value, latency_us=fit.latency_us.value,
                    efficiency_by_bytes=fit.efficiency_by_bytes)
        return abs(sendrecv_s_on(link, n) / sendrecv_s_on(truth, n) - 1)

    runs = [loopback_like_pings(seed) for seed in range(10)]
    now = [fit_link(pings) for _, pings in runs]
    monkeypatch.setattr(fit_module, "_biased", lambda rel: False)
    monkeypatch.setattr(fit_module, "_trending", lambda rel, size: False)
    f_only = [fit_link(pings) for _, pings in runs]
    assert not any(f.curve_fitted for f in f_only)
    assert sum(f.curve_fitted for f in now) >= 7
    errors_now = [err(f, truth) for f, (truth, _) in zip(now, runs, strict=True)]
    errors_f_only = [err(f, truth) for f, (truth, _) in zip(f_only, runs, strict=True)]
    assert min(errors_f_only) > 0.15
    assert np.median(errors_now) < 0.5 * np.median(errors_f_only)


def test_a_wrongly_kept_curve_costs_about_the_noise(monkeypatch):
    # A flat link with the same noise: relative least squares under this heavy, one-sided
    # noise leaves the plain line biased too, so the t-test keeps a curve in some sweeps.
    # What that costs is bounded by the noise: the curve's points are medians of 3 timings
    # of log SD 0.15 (SE ~0.09), so 1-13 MB stay within 0.3 (~3.5 SE) and the median error
    # is the F-test-only rule's, within 0.02.
    flat = Link(bandwidth_GBps=2.5, latency_us=100.0, efficiency_by_bytes=((1.0, 1.0),))

    def errors(fit):
        link = Link(bandwidth_GBps=fit.bandwidth_GBps.value, latency_us=fit.latency_us.value,
                    efficiency_by_bytes=fit.efficiency_by_bytes)
        return [abs(sendrecv_s_on(link, n) / sendrecv_s_on(flat, n) - 1)
                for n in (1e6, 4e6, 12.9e6)]

    sweeps = []
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        sweeps.append([CollectiveSample(op="ping-pong", ranks=2, bytes=float(n),
                                        time_s=sendrecv_s_on(flat, n)
                                        * np.exp(rng.normal(0, 0.7 if n < 2.6e5 else 0.15)))
                       for n in 2.0 ** np.arange(10, 25) for _ in range(3)])
    now = [e for pings in sweeps for e in errors(fit_link(pings))]
    monkeypatch.setattr(fit_module, "_biased", lambda rel: False)
    f_only = [e for pings in sweeps for e in errors(fit_link(pings))]
    assert max(now) < 0.3
    assert np.median(now) <= np.median(f_only) + 0.02


def test_ping_pong_gets_a_fit_of_its_own_and_leaves_the_collective_fit_alone():
    # one-way messages with their own alpha and bandwidth (gloo loopback: ~0.2 ms, ~1.8 GB/s
    # against the all-reduce fit's ~0.7 ms, ~1.2 GB/s): a p2p fit recovers them within the
    # fit tolerance, and the collective parameters are what they are without ping-pong
    truth = truth_cluster(curve=((1.0, 1.0),))
    p2p = Link(bandwidth_GBps=3.0, latency_us=50.0, efficiency_by_bytes=((1.0, 1.0),))
    rng = np.random.default_rng(3)
    rings = sweep(truth, rng, ranks=(2,))
    pings = [CollectiveSample(op="ping-pong", ranks=2, bytes=float(n),
                              time_s=(50e-6 + n / 3e9) * (1 + NOISE * rng.normal()))
             for n in SIZES for _ in range(2)]
    alone = fit_network(rings)["intra_node"]
    both = fit_network(rings + pings)["intra_node"]
    assert alone.p2p is None and both.p2p is not None
    assert both.latency_us == alone.latency_us and both.bandwidth_GBps == alone.bandwidth_GBps
    assert "ping-pong" not in both.by_op and "ping-pong" not in both.time_factor_by_op
    assert both.p2p.latency_us.value == pytest.approx(p2p.latency_us, rel=PARAM_TOL)
    assert both.p2p.bandwidth_GBps.value == pytest.approx(p2p.bandwidth_GBps, rel=PARAM_TOL)
    assert both.p2p.latency_us.parameter == "intra_node.p2p.latency_us"
    assert both.p2p.results[0] in both.results                  # its residuals are reported
    # fewer than 3 sizes of ping-pong: no p2p fit, messages keep the collective fit
    few = [s for s in pings if s.bytes in SIZES[:2]]
    assert fit_network(rings + few)["intra_node"].p2p is None


def test_too_few_sizes_names_the_scope_and_what_was_found():
    samples = [CollectiveSample(op="all-reduce", ranks=2, bytes=1024.0, time_s=t)
               for t in (1e-3, 1.1e-3)]
    with pytest.raises(PerfmodelError, match=r"intra_node: need .*>= 3 message sizes.*found 1"):
        fit_network(samples)


def test_times_falling_with_size_give_non_physical_bandwidth():
    samples = [CollectiveSample(op="all-reduce", ranks=2, bytes=n, time_s=1.0 / n)
               for n in (1e3, 1e4, 1e5, 1e6)]
    with pytest.raises(PerfmodelError, match="intra_node.bandwidth_GBps"):
        fit_network(samples)


def test_negative_latency_is_refused():
    # t = n/B − 0.5 ms: an exact fit needs α < 0, far outside its (zero) standard error
    samples = [CollectiveSample(op="send-recv", ranks=2, bytes=n, time_s=n / 1e9 - 5e-4)
               for n in (1e6, 1e7, 1e8)]
    with pytest.raises(PerfmodelError, match="intra_node.latency_us.*negative"):
        fit_link(samples, "intra_node")


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1e-3, float("inf")])
def test_bad_times_are_refused(bad):
    samples = [CollectiveSample(op="all-reduce", ranks=2, bytes=n, time_s=1e-3)
               for n in (1e3, 1e4, 1e5)]
    samples[1] = dataclasses.replace(samples[1], time_s=bad)
    with pytest.raises(PerfmodelError, match="all-reduce timing at 2 ranks has time_s ="):
        fit_network(samples)


def test_inter_node_needs_the_intra_node_fit():
    samples = [CollectiveSample(op="all-reduce", ranks=8, nodes=2, bytes=n, time_s=n / 1e9)
               for n in (1e3, 1e5, 1e7)]
    with pytest.raises(PerfmodelError, match="needs the intra_node fit"):
        fit_link(samples, "inter_node")


def test_fit_that_does_not_converge_is_an_error(monkeypatch):
    monkeypatch.setattr(fit_module, "MAX_ITERATIONS", 1)
    with pytest.raises(PerfmodelError, match="did not converge"):
        fit_network(sweep(truth_cluster(), np.random.default_rng(1), ranks=(2,)))


UNITS = {"conv1": 2e6, "conv2": 8e6, "fc": 5e5}      # forward FLOPs per sample
BATCHES = (1, 4, 16, 64, 256)


def unit_timings(cluster, rng):
    ratio = cluster.compute.backward_flops_ratio
    return [UnitTiming(unit=u, phase=phase, batch_size=b,
                       median_s=pass_seconds(cluster, f * b * r, "fp32")
                       * (1 + NOISE * rng.normal()))
            for u, f in UNITS.items() for b in BATCHES
            for phase, r in (("forward", 1.0), ("backward", ratio))]


def compute_cluster(curve, overhead_us=50.0):
    c = make_cluster("local")
    return dataclasses.replace(c, compute=dataclasses.replace(
        c.compute, efficiency_by_flops=curve, overhead_us_per_unit=overhead_us))


def test_compute_fit_recovers_overhead_and_rate():
    # pass_seconds = overhead + FLOPs / (peak x efficiency): 0.45 x 0.08 TFLOPS = 36 GFLOP/s
    truth = compute_cluster(((1.0, 0.45),))
    f = fit_compute(unit_timings(truth, np.random.default_rng(3)), UNITS, peak_TFLOPS=0.08)
    assert not f.curve_fitted
    assert f.overhead_us_per_unit.value == pytest.approx(50.0, rel=PARAM_TOL)
    assert f.achieved_TFLOPS.value == pytest.approx(0.036, rel=PARAM_TOL)
    assert f.efficiency_by_flops[0][1] == pytest.approx(0.45, rel=PARAM_TOL)
    # dense layers: backward does 2x the forward FLOPs, so 2x the time at constant efficiency
    assert f.backward_time_ratio.value == pytest.approx(2.0, rel=0.1)


def test_compute_fit_follows_an_efficiency_curve():
    # overhead and a rising efficiency trade off at small FLOPs (both add time there), so
    # the check is the predicted pass time, and the efficiency where FLOPs dominate
    curve = ((1e6, 0.1), (1e8, 0.4), (1e10, 0.6))
    truth = compute_cluster(curve)
    f = fit_compute(unit_timings(truth, np.random.default_rng(3)), UNITS, peak_TFLOPS=0.08)
    assert f.curve_fitted
    model = dataclasses.replace(truth, compute=dataclasses.replace(
        truth.compute, efficiency_by_flops=f.efficiency_by_flops,
        overhead_us_per_unit=f.overhead_us_per_unit.value))
    for flops in np.geomspace(5e5, 4e9, 30):
        assert pass_seconds(model, flops, "fp32") == pytest.approx(
            pass_seconds(truth, flops, "fp32"), rel=TIME_TOL)
    assert interpolate_log(f.efficiency_by_flops, 2e9) == pytest.approx(
        interpolate_log(curve, 2e9), rel=PARAM_TOL)


def test_compute_above_the_device_peak_names_the_peak():
    truth = compute_cluster(((1.0, 0.45),))
    timings = unit_timings(truth, np.random.default_rng(3))
    with pytest.raises(PerfmodelError, match="device.peak_TFLOPS"):
        fit_compute(timings, UNITS, peak_TFLOPS=0.02)
    # a CPU core's peak is an estimate: raised to the best rate reached, the times unchanged
    raised = fit_compute(timings, UNITS, peak_TFLOPS=0.02, raise_peak="fp32")
    exact = fit_compute(timings, UNITS, peak_TFLOPS=1.0)
    assert raised.raised_peak == ("fp32", pytest.approx(exact.achieved_TFLOPS.value))
    assert max(e for _, e in raised.efficiency_by_flops) == pytest.approx(1.0, abs=1e-3)
    assert exact.raised_peak is None
    for (_, e), (_, e1) in zip(raised.efficiency_by_flops, exact.efficiency_by_flops,
                               strict=True):
        assert e * raised.raised_peak[1] == pytest.approx(e1 * 1.0, rel=1e-3)


def test_compute_needs_three_flop_counts_and_known_units():
    one = [UnitTiming(unit="fc", phase="forward", batch_size=8, median_s=1e-3)] * 3
    with pytest.raises(PerfmodelError, match=r">= 3 distinct FLOP counts.*found 1"):
        fit_compute(one, UNITS, peak_TFLOPS=0.08)
    with pytest.raises(PerfmodelError, match="unit 'attn' is not in the workload"):
        fit_compute([UnitTiming(unit="attn", phase="forward", batch_size=8, median_s=1e-3)],
                    UNITS, peak_TFLOPS=0.08)


def test_jitter_and_optimizer_rate():
    rng = np.random.default_rng(4)
    # lognormal with CV 0.05 (the StepNoise draw of perfmodel/sim/compute.py)
    sigma2 = math.log1p(0.05**2)
    steps = rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), 2000)
    assert fit_jitter_cv(steps).value == pytest.approx(0.05, rel=0.1)
    nbytes = rng.uniform(1e6, 1e8, 20)
    opt = fit_optimizer_rate(nbytes, nbytes / 5e9 * (1 + NOISE * rng.normal(size=20)))
    assert opt.value == pytest.approx(5.0, rel=PARAM_TOL)


def test_memory_fit_recovers_constant_and_fraction():
    # measured = framework + (1 + fraction) x analytic (calibration/fit_memory.py)
    rng = np.random.default_rng(5)
    analytic = np.geomspace(2e8, 8e9, 12)
    measured = (0.3 * 2**30 + 1.1 * analytic) * (1 + 0.01 * rng.normal(size=12))
    f = fit_memory([MemorySample(measured_bytes=m, analytic_bytes=a)
                    for m, a in zip(measured, analytic, strict=True)])
    assert f.framework_overhead_GiB.value == pytest.approx(0.3, rel=0.1)
    assert f.overhead_fraction.value == pytest.approx(0.1, abs=0.02)
    with pytest.raises(PerfmodelError, match="found 1 run"):
        fit_memory([MemorySample(measured_bytes=2e9, analytic_bytes=1e9)])


def test_ps_apply_rate_and_push_link():
    rng = np.random.default_rng(6)
    nbytes = np.geomspace(1e5, 4e8, 15)
    apply = fit_server_apply(nbytes, nbytes / 2e9 * (1 + NOISE * rng.normal(size=15)))
    assert apply.parameter == "server.apply_GBps"
    assert apply.value == pytest.approx(2.0, rel=PARAM_TOL)
    # pushes of a size sweep: α + n·β (collectives.py link_transfer_s)
    cluster = make_cluster("local", intra_node=flat_link(1.2, latency_us=350.0))
    sizes = np.repeat(np.geomspace(1e3, 4e8, 18), 2)
    push = [sendrecv_s(cluster, n) * (1 + NOISE * rng.normal()) for n in sizes]
    link = fit_push_link(sizes, push, "intra_node")
    assert link.latency_us.value == pytest.approx(350.0, rel=PARAM_TOL)
    assert link.bandwidth_GBps.value == pytest.approx(1.2, rel=PARAM_TOL)
    one_size = [sendrecv_s(cluster, 1e8) * (1 + NOISE * rng.normal()) for _ in range(5)]
    rate = fit_push_rate([1e8] * 5, one_size, scope="intra_node", latency_us=350.0)
    assert rate.value == pytest.approx(1.2, rel=PARAM_TOL)


# --- prediction interval (perfmodel/uncertainty.py) ----------------------------------------

COVERAGE_TOL = 0.01          # Monte Carlo: 20,000 draws give a standard error of ~0.2 %


def test_interval_is_z_sigma_wide_and_covers_what_it_says():
    # log T ~ Normal(log T̂, σ), σ² = r_c² + r_n² + s²; z(0.9) = 1.6449 (normal table)
    iv = prediction_interval(2.0, network_rms_rel=0.03, compute_rms_rel=0.04,
                             run_spread_cv=0.12, coverage=0.9)
    sigma = math.sqrt(0.03**2 + 0.04**2 + 0.12**2)
    assert iv.sigma_rel == pytest.approx(sigma)
    assert iv.low_s == pytest.approx(2.0 * math.exp(-1.6449 * sigma), rel=1e-4)
    assert iv.high_s == pytest.approx(2.0 * math.exp(1.6449 * sigma), rel=1e-4)
    draws = 2.0 * np.exp(np.random.default_rng(7).normal(0.0, sigma, 20_000))
    inside = np.mean((draws >= iv.low_s) & (draws <= iv.high_s))
    assert inside == pytest.approx(0.9, abs=COVERAGE_TOL)


@given(base=st.floats(0.0, 0.5), extra=st.floats(1e-3, 0.5),
       which=st.sampled_from(["network_rms_rel", "compute_rms_rel", "run_spread_cv"]))
def test_interval_widens_with_every_error(base, extra, which):
    errors = {"network_rms_rel": base, "compute_rms_rel": base, "run_spread_cv": base}
    narrow = prediction_interval(1.0, **errors)
    wide = prediction_interval(1.0, **{**errors, which: base + extra})
    assert wide.low_s < narrow.low_s <= 1.0 <= narrow.high_s < wide.high_s


def test_interval_refuses_bad_input():
    with pytest.raises(PerfmodelError, match="coverage"):
        prediction_interval(1.0, network_rms_rel=0.1, compute_rms_rel=0.1, run_spread_cv=0.1,
                            coverage=1.0)
    with pytest.raises(PerfmodelError, match="network_rms_rel"):
        prediction_interval(1.0, network_rms_rel=-0.1, compute_rms_rel=0.1, run_spread_cv=0.1)


def test_kinds_that_are_no_ring_get_a_time_factor_against_the_all_reduce_fit():
    # gloo on CPU: all-gather ~1.5x and reduce-scatter ~3x the ring model fitted on all-reduce
    truth = truth_cluster()
    factors = (("all-gather", 1.5), ("reduce-scatter", 3.0))
    truth = dataclasses.replace(truth, intra_node=dataclasses.replace(
        truth.intra_node, time_factor_by_op=factors))
    rng = np.random.default_rng(4)
    samples = [CollectiveSample(op=op, ranks=2, bytes=float(n),
                                time_s=collective_s(op, truth, 2, n) * (1 + NOISE * rng.normal()))
               for op in ("all-reduce", "all-gather", "reduce-scatter") for n in SIZES
               for _ in range(2)]
    f = fit_network(samples)["intra_node"]
    assert f.latency_us.value == pytest.approx(truth.intra_node.latency_us, rel=PARAM_TOL)
    assert f.bandwidth_GBps.value == pytest.approx(truth.intra_node.bandwidth_GBps,
                                                   rel=PARAM_TOL)
    for op, factor in factors:
        assert f.time_factor_by_op[op] == pytest.approx(factor, rel=PARAM_TOL)
        assert f.by_op[op].rms_rel < 2 * NOISE          # the factor took the misfit away
    assert "all-reduce" not in f.time_factor_by_op
    only = fit_network([s for s in samples if s.op == "all-reduce"])["intra_node"]
    assert only.time_factor_by_op == {}


def test_the_trend_test_sees_a_slope_not_noise():
    rng = np.random.default_rng(0)
    size = np.repeat(2.0 ** np.arange(18, 25), 3)
    assert fit_module._trending(0.2 * (np.log10(size) - 6.0) + rng.normal(0, 0.05, size.size),
                                size)
    flat = [fit_module._trending(rng.normal(0, 0.15, size.size), size) for _ in range(200)]
    assert sum(flat) <= 0.1 * len(flat)          # ~5 % by construction (BIAS_SIGNIFICANCE)
    assert not fit_module._trending(np.zeros(size.size), size)
