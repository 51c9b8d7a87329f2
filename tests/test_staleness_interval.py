"""A PS row's staleness interval for the median of the runs, from the model's own spread over
seeds (perfmodel/uncertainty.py `median_of_runs_interval`, perfmodel/compare/run.py
`staleness_intervals`), and how a headline counts it (matching.py `staleness_counted`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from perfmodel.cluster import load_cluster
from perfmodel.compare import protocol
from perfmodel.compare.matching import Quantity, headline
from perfmodel.compare.run import _point, staleness_intervals
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.uncertainty import median_of_runs_interval
from tests.test_compare import _ssp_row


def test_a_two_regime_row_can_land_in_either_regime():
    # half the seeds in each regime: a median of 5 runs is either, with P = 1/2 each
    per_seed = [[1.5]] * 50 + [[2.5]] * 50
    assert median_of_runs_interval(per_seed, 5) == (1.5, 2.5)
    # one regime in 20: a median of 5 almost never lands there
    rare = [[1.5]] * 95 + [[2.5]] * 5
    assert median_of_runs_interval(rare, 5) == (1.5, 1.5)


def test_normal_seeds_give_the_median_of_n_its_theoretical_width():
    # the median of n = 25 normal draws has SD ≈ σ √(π / 2n) (within 2 % at n = 25)
    rng = np.random.default_rng(2)
    per_seed = 2.0 + 0.2 * rng.standard_normal((4000, 1))
    low, high = median_of_runs_interval(per_seed, 25)
    half = 1.6449 * 0.2 * math.sqrt(math.pi / 50)
    assert (high - low) / 2 == pytest.approx(half, rel=0.08)
    assert (low + high) / 2 == pytest.approx(2.0, abs=0.02)


def test_the_interval_covers_the_median_of_runs_nine_times_in_ten_when_the_model_is_right():
    # runs drawn from the same two-worker class distribution as 400 seeds: the measured
    # statistic (each worker's median over 5 runs, then their mean) falls inside ~90 %
    rng = np.random.default_rng(7)

    def draw(n):
        regime = rng.random(n) < 0.4
        return np.column_stack([np.where(regime, 1.2, 1.9), np.where(regime, 2.1, 2.4)]) \
            + 0.1 * rng.standard_normal((n, 2))

    low, high = median_of_runs_interval(draw(400), 5)
    trials = 2000
    hits = sum(low <= np.median(draw(5), axis=0).mean() <= high for _ in range(trials))
    se = math.sqrt(0.9 * 0.1 / trials)
    assert abs(hits / trials - 0.9) < 4 * se + 0.02     # + the 400 seeds' own sampling


def test_refuses_too_few_seeds():
    with pytest.raises(PerfmodelError, match=">= 2 seeds"):
        median_of_runs_interval([[1.0]], 5)


def test_compare_states_pooled_and_per_speed_intervals_for_a_ps_row_only():
    profile = load_cluster("local")
    h = next(x for x in protocol.held_out_set() if x.key == "async-ps-mlp-straggler")
    points = [_point(h, predict(h.strategy, protocol.scenario_for(h, profile, steps=12,
                                                                  seed=s),
                                **protocol.model_options(h))) for s in range(6)]
    out = staleness_intervals(points, h, 5)
    assert set(out) == {"pooled", "speed 0.5", "speed 1"}
    slow = [x[3][1] for x in points]
    assert min(slow) <= out["speed 0.5"][0] <= out["speed 0.5"][1] <= max(slow)
    ddp = next(x for x in protocol.held_out_set() if x.key == "ddp-mlp-b32")
    assert staleness_intervals(points, ddp, 5) == {}


def test_a_headline_counts_the_counted_quantitys_own_interval():
    per_worker = {0: (1.1, 1.2), 1: (1.9, 1.8), 2: (2.7, 2.4), 3: (3.1, 3.1)}
    row = _ssp_row(per_worker)
    # the fast class: predicted 1.9, measured 1.8; the pooled mean 2.2 / 2.125
    inside = dataclasses.replace(row, staleness_speed_intervals={1.0: (1.7, 2.1),
                                                                 0.5: (3.0, 3.2)})
    outside = dataclasses.replace(row, staleness_speed_intervals={1.0: (1.85, 2.1),
                                                                  0.5: (3.0, 3.2)})
    assert inside.staleness_counted[3] == (1.7, 2.1)
    assert inside.staleness_inside is True and outside.staleness_inside is False
    h = headline([inside, dataclasses.replace(outside, key="b")], "staleness_mean")
    assert (h.inside, h.with_interval) == (1, 2)
    assert h.half_width_median == pytest.approx(np.median([0.2 / 1.9, 0.125 / 1.9]))
    # the pooled mean counts where it misses more (SSP): then its own interval decides
    q = row.quantities["staleness_mean"]
    pooled_miss = dataclasses.replace(inside, quantities=dict(
        row.quantities, staleness_mean=Quantity.of(3.0, [2.0], (2.5, 3.5))))
    assert q.predicted != 3.0
    assert pooled_miss.staleness_counted[3] == (2.5, 3.5)
    assert pooled_miss.staleness_inside is False
