"""perfmodel/accuracy/penalty.py: the study's penalty at the same epochs and at the same
wall-clock time, against cases worked by hand on a plain exponential curve."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfmodel.accuracy.model import MITIGATIONS, AccuracyModel, LearningCurve, Setting
from perfmodel.accuracy.penalty import observed_penalties, study_penalty
from perfmodel.errors import PerfmodelError


def _model(threshold: float = 1.0, noise: float | None = 64.0) -> AccuracyModel:
    # acc(u) = 1 − exp(−u/100); a stale update of τ is worth 1/(1 + τ) (β = 1)
    setting = Setting(optimizer="momentum", lr=0.01, budget_updates=100,
                      curve=LearningCurve(a0=0.0, a_inf=1.0, scale_updates=100.0, shape=1.0),
                      beta={m: 1.0 for m in MITIGATIONS}, rate_exponent=1.0, seed_sd=0.0,
                      band=0.0, instability_threshold=threshold, noise_scale_samples=noise)
    return AccuracyModel(workload="toy", data_set="toy", caveat="", chance_accuracy=0.1,
                         batch_size=64, target_accuracy=0.9, default_optimizer="momentum",
                         default_lr=0.01, settings=(setting,), provenance={},
                         path=Path("toy.toml"))


def _penalty(model: AccuracyModel, ratio: float, **kw):
    # τ = 1 on every update: worth 1/2; instability 0.01·3/(1 − 0.9) = 0.3
    return study_penalty(model, model.settings[0], np.ones(10), throughput_ratio=ratio,
                         workers=4, **kw)


def test_same_epochs_and_same_time_by_hand():
    p = _penalty(_model(), 2.0)
    assert p.worth == pytest.approx(0.5) and not p.unstable
    assert p.async_accuracy == pytest.approx(1 - math.exp(-0.5))
    # same epochs: sync at U = 100 updates, 1 − e^−1 = 0.6321, against 0.3935
    assert p.same_epochs_points == pytest.approx(100 * (math.exp(-0.5) - math.exp(-1)))
    assert p.same_epochs_points == pytest.approx(23.865, abs=1e-3)
    # same time at r = 2: sync makes U/2 = 50 updates, exactly async's 100 x 1/2
    assert p.same_time_points == pytest.approx(0.0, abs=1e-12)
    # r = 1.25: sync at 80 updates, 1 − e^−0.8 = 0.5507: 15.72 points
    assert _penalty(_model(), 1.25).same_time_points == pytest.approx(15.720, abs=1e-3)
    # r = 4: async ahead at the same time (sync at 25 updates: 0.2212): −17.23 points
    assert _penalty(_model(), 4.0).same_time_points == pytest.approx(-17.227, abs=1e-3)


def test_noise_scaled_synchronous_steps():
    # B_noise = b = 64, N = 4: a batch of a synchronous step is worth (64 + 64)/(256 + 64)
    p = _penalty(_model(), 2.0, noise_scaled=True)
    assert p.sync_efficiency == pytest.approx(0.4)
    # sync at 100 x 0.4 = 40: 1 − e^−0.4 = 0.3297 against 0.3935: async ahead by 6.38 points
    assert p.same_epochs_points == pytest.approx(-6.379, abs=1e-3)
    assert _penalty(_model(noise=None), 2.0, noise_scaled=True).sync_efficiency == 1.0


def test_unstable_is_costed_to_chance():
    p = _penalty(_model(threshold=0.2), 2.0)          # 0.3 >= 0.2
    assert p.unstable and p.async_accuracy == 0.1
    assert p.same_epochs_points == pytest.approx(100 * (1 - math.exp(-1) - 0.1))


def test_bad_input_is_refused():
    with pytest.raises(PerfmodelError, match="throughput ratio"):
        _penalty(_model(), 0.0)
    with pytest.raises(PerfmodelError, match="mitigation"):
        _penalty(_model(), 2.0, mitigation="magic")


def test_observed_by_hand():
    # sync mean curve 0.1, 0.6, 0.8 at 0, 50, 100 updates; async seeds 0.7 and 0.5 at U = 100
    kw = dict(budget_updates=100)
    o = observed_penalties([0, 50, 100], [0.1, 0.6, 0.8], [0.7, 0.5], throughput_ratio=2.0,
                           **kw)
    assert o.seeds == 2
    assert o.same_epochs_points == pytest.approx(20.0)
    assert o.same_time_points == pytest.approx(0.0, abs=1e-12)
    # r = 1.6: sync at 62.5 updates, 0.6 + 0.2 x 12.5/50 = 0.65: 5 points
    o = observed_penalties([0, 50, 100], [0.1, 0.6, 0.8], [0.7, 0.5], throughput_ratio=1.6,
                           **kw)
    assert o.same_time_points == pytest.approx(5.0)
    with pytest.raises(PerfmodelError, match="r >= 1"):
        observed_penalties([0, 100], [0.1, 0.8], [0.5], throughput_ratio=0.5, **kw)
    with pytest.raises(PerfmodelError, match="reach the budget"):
        observed_penalties([0, 50], [0.1, 0.6], [0.5], throughput_ratio=2.0, **kw)
