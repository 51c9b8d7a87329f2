"""Straggler-aware variants (perfmodel/stragglers.py) against order-statistics theory.

With i.i.d. exponential compute times of mean 1 the k-th smallest of N has mean
Σ_{i=N−k+1}^{N} 1/i, the maximum H_N (David & Nagaraja, Order Statistics, 3rd ed., sec. 3.1;
DESIGN.md "Synchronous step = E[max_i T_i]").
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from perfmodel.cluster import load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.compute import unit_times
from perfmodel.sim.scenario import Scenario
from perfmodel.stragglers import backup_step, exclusions, fastest, order_statistic_mean
from perfmodel.workload import load_workload

MONTE_CARLO_TOLERANCE = 0.03     # 4000 draws: SE of the max's mean ≈ 1.3 % at N = 8


def scenario(workers=8, speed=(), jitter="lognormal"):
    w = load_workload("resnet50")
    return Scenario(cluster=load_cluster("a100"), workload=w, workers=workers,
                    batch_size=w.batch_size, speed=speed, jitter=jitter)


@pytest.mark.parametrize("n", [2, 8, 32])
def test_order_statistics_of_exponential_compute_times(n):
    sc = scenario(workers=n, jitter="exponential")
    harmonic = sum(1 / i for i in range(1, n + 1))
    assert order_statistic_mean(sc, n) == pytest.approx(harmonic, rel=MONTE_CARLO_TOLERANCE)
    k = n - 1
    expected = sum(1 / i for i in range(n - k + 1, n + 1))
    assert order_statistic_mean(sc, k) == pytest.approx(expected, rel=MONTE_CARLO_TOLERANCE)


def test_exclusions_and_fastest():
    sc = scenario(speed=(1.0, 0.1, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0))
    assert exclusions(sc) == [1, 2]
    kept = fastest(sc, 6)
    assert kept.workers == 6 and min(kept.speed) == 1.0
    assert exclusions(scenario()) == []
    with pytest.raises(PerfmodelError):
        fastest(sc, 0)


def test_backup_workers_drop_the_straggler():
    sc = scenario(speed=(1.0,) * 7 + (0.1,))
    kept = predict("sync-ps", fastest(sc, 7))
    step = backup_step(sc, 1, kept.summary.step_time_s.mean)
    plain = predict("sync-ps", sc)
    assert step.used_workers == 7
    # the slowest worker no longer holds the step: far faster than waiting for it
    assert step.throughput_samples_per_s > 2 * plain.summary.throughput_samples_per_s
    # and never faster than the 7 fast workers alone could go without any waiting
    nominal = unit_times(sc.cluster, sc.workload, sc.batch_size, 0).step_s
    assert step.step_time_s >= nominal
    # the correction is the gap between E[max of the 7 kept] and E[7th of all 8]: small
    assert 0 <= step.compute_saved_s < 0.1 * nominal


def test_backup_without_jitter_changes_nothing():
    sc = replace(scenario(speed=(1.0,) * 7 + (0.1,)), jitter="none")
    kept = predict("sync-ps", fastest(sc, 7))
    step = backup_step(sc, 1, kept.summary.step_time_s.mean)
    assert math.isclose(step.step_time_s, kept.summary.step_time_s.mean)
    with pytest.raises(PerfmodelError):
        backup_step(sc, 8, 1.0)
