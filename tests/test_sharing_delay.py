"""The time a step loses to core sharing, as a spread and not only a mean
(compute.sharing_delay_cv): its fit from concurrent compute runs (calibration/fit_cores.py),
the delay distribution's closed forms, and what the PS model draws with it
(perfmodel/sim/ps.py `_ComputeTimes`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from calibration.fit_cores import (
    IQR_PER_SD,
    ConcurrentTiming,
    delay_cv_for_robust_sd,
    fit_sharing_delay_cv,
)
from calibration.from_store import _cores
from perfmodel.cluster import MAX_SHARING_DELAY_CV, load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.compute import StepNoise
from perfmodel.sim.ps import _ComputeTimes
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload


def test_the_delay_family_matches_its_closed_forms():
    # 2·Beta(1, 1) is uniform on [0, 2]: IQR 1, CV 1/√3
    assert delay_cv_for_robust_sd(1.0 / IQR_PER_SD) == pytest.approx(1 / math.sqrt(3), abs=1e-6)
    # 2·Beta(½, ½) is the arcsine law: quartiles 2 sin²(π/8), 2 sin²(3π/8); CV 1/√2
    iqr = 2 * (math.sin(3 * math.pi / 8) ** 2 - math.sin(math.pi / 8) ** 2)
    assert delay_cv_for_robust_sd(iqr / IQR_PER_SD) == pytest.approx(1 / math.sqrt(2), abs=1e-6)
    # more spread than the family holds (a step waits 2x its mean or nothing) is clamped
    assert delay_cv_for_robust_sd(5.0) == pytest.approx(MAX_SHARING_DELAY_CV, abs=1e-6)
    assert delay_cv_for_robust_sd(0.01) < 0.02


def _crowded_timings(cv: float, *, solo_s=(0.012, 0.030), runs: int = 4, steps: int = 2000,
                     seed: int = 3) -> list[ConcurrentTiming]:
    """Ranks of concurrent runs made from the model: alone a step takes its workload's
    time; 3 busy processes on 2 cores add t1·(1.5 − 1)·d with d = 2·Beta(α, α)."""
    rng = np.random.default_rng(seed)
    alpha = (1 / cv**2 - 1) / 2
    out = []
    for i, t1 in enumerate(solo_s):
        name = f"w{i}"
        out.append(ConcurrentTiming(busy=1, step_s=t1, cpu_s=t1, workload=name))
        for _ in range(runs):
            for _rank in range(3):
                x = t1 * (1 + 0.5 * 2 * rng.beta(alpha, alpha, steps))
                q1, med, q3 = np.percentile(x, [25, 50, 75])
                out.append(ConcurrentTiming(busy=3, step_s=float(med), cpu_s=t1,
                                            step_iqr_s=float(q3 - q1), workload=name))
    return out


@pytest.mark.parametrize("cv", [0.3, 0.6, 0.8])
def test_the_fit_recovers_the_spread_that_made_the_timings(cv):
    # 24 ranks of 2000 steps: a quartile's sampling error is ~1 % of the IQR, far inside 5 %
    fit = fit_sharing_delay_cv(_crowded_timings(cv), cores=2, contention=0.0)
    assert fit.parameter == "compute.sharing_delay_cv"
    assert fit.value == pytest.approx(cv, rel=0.05)
    assert fit.points == 24


def test_ranks_without_their_workload_alone_or_without_crowding_are_left_out():
    timings = _crowded_timings(0.6)
    orphan = ConcurrentTiming(busy=3, step_s=1.0, cpu_s=1.0, step_iqr_s=5.0, workload="x")
    pair = ConcurrentTiming(busy=2, step_s=1.0, cpu_s=1.0, step_iqr_s=5.0, workload="w0")
    assert fit_sharing_delay_cv([*timings, orphan, pair], 2, 0.0).value == \
        fit_sharing_delay_cv(timings, 2, 0.0).value
    with pytest.raises(PerfmodelError, match="more busy processes than the 2 cores"):
        fit_sharing_delay_cv([t for t in timings if t.busy == 1] + [pair], 2, 0.0)


def test_calibration_fits_it_beside_the_contention_and_notes_it(monkeypatch):
    monkeypatch.setattr("calibration.from_store.os.cpu_count", lambda: 2)
    monkeypatch.setattr("calibration.from_store.concurrent_timings",
                        lambda runs: _crowded_timings(0.6))
    notes: list[str] = []
    contention, delay = _cores(["a run"], load_cluster("local"), notes, {})
    assert contention is not None and delay.value == pytest.approx(0.6, rel=0.05)
    assert any("compute.sharing_delay_cv" in n for n in notes)


# ------------------------------------------------------------------ what the model draws


def _scenario(cluster, workers=2, speed=(1.0, 0.5), seed=0, steps=40) -> Scenario:
    return Scenario(cluster=cluster, workload=load_workload("mlp"), workers=workers,
                    batch_size=64, steps=steps, warmup_steps=2, speed=speed, seed=seed)


def _cpu_host(delay_cv: float):
    p = load_cluster("local")
    return dataclasses.replace(p, compute=dataclasses.replace(p.compute,
                                                              sharing_delay_cv=delay_cv))


def test_each_step_waits_between_none_and_twice_the_mean_which_it_keeps():
    sc = _scenario(_cpu_host(0.0), speed=(1.0, 1.0))
    stretch = [1.4, 1.2]
    exact = _ComputeTimes(StepNoise(dataclasses.replace(sc, jitter="none"), sc.rng()), 0.02,
                          stretch)
    noisy = _ComputeTimes(StepNoise(dataclasses.replace(sc, jitter="none"), sc.rng()), 0.02,
                          stretch, delay=(0.6, np.random.default_rng(5)))
    n = 20000
    for w, x in enumerate(stretch):
        assert exact.seconds(w, 0) == pytest.approx(0.02 * x)
        got = np.array([noisy.seconds(w, i) for i in range(n)])
        delay = got - 0.02
        mean = 0.02 * (x - 1)
        assert got.mean() == pytest.approx(0.02 * x, abs=4 * delay.std() / math.sqrt(n))
        assert delay.std() / mean == pytest.approx(0.6, rel=0.03)
        assert delay.min() >= 0 and delay.max() <= 2 * mean + 1e-15


def test_a_timed_wait_spreads_only_the_wait_for_a_core_of_its_own_cpu_work():
    sc = dataclasses.replace(_scenario(_cpu_host(0.0), speed=(1.0,), workers=1), jitter="none")
    t = _ComputeTimes(StepNoise(sc, sc.rng()), 0.05, [1.5], paid_s=0.004,
                      delay=(0.5, np.random.default_rng(1)))
    got = np.array([t.seconds(0, i) for i in range(5000)]) - 0.05
    assert got.min() >= 0 and got.max() <= 2 * 0.002 + 1e-15
    assert got.mean() == pytest.approx(0.002, rel=0.03)


def test_the_spread_reaches_the_simulation_and_a_zero_spread_draws_nothing():
    # the shipped local profile shares 2 cores: each worker's compute is stretched
    exact = predict("async-ps", _scenario(_cpu_host(0.0)))
    noisy = predict("async-ps", _scenario(_cpu_host(0.6)))
    assert "compute shared" in exact.result.notes[-1]
    order = [[u.worker for u in p.result.updates] for p in (exact, noisy)]
    assert order[0] != order[1]          # steps of other lengths meet the server otherwise
    # a zero spread leaves the delay stream untouched: the same run, update by update
    again = predict("async-ps", _scenario(_cpu_host(0.0)))
    assert [u.time_s for u in again.result.updates] == [u.time_s for u in exact.result.updates]


def test_the_spread_moves_no_mean_throughput_beyond_its_own_noise():
    # the delay has mean 1: a PS with a straggler on shared cores keeps its throughput
    # within the seed-to-seed spread (3 SE of the mean over 12 seeds of each)
    def rates(cv):
        return np.array([predict("async-ps", _scenario(_cpu_host(cv), seed=s, steps=60)
                                 ).summary.throughput_samples_per_s for s in range(12)])
    exact, noisy = rates(0.0), rates(0.7)
    se = math.hypot(exact.std(ddof=1), noisy.std(ddof=1)) / math.sqrt(12)
    assert abs(noisy.mean() - exact.mean()) <= max(3 * se, 0.02 * exact.mean())


def test_a_profile_holds_the_spread_below_one():
    base = {"name": "x", "compute": {"sharing_delay_cv": 1.5}}
    with pytest.raises(PerfmodelError, match="sharing_delay_cv"):
        parse_profile(_with(base), None)


def _with(override: dict) -> dict:
    """The shipped local profile's data with `override`'s tables merged in."""
    import tomllib

    from perfmodel.cluster import profile_paths

    data = tomllib.loads(profile_paths()["local"].read_text())
    for k, v in override.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return data
