"""How far a crowded timed wait strays (compute.timed_wait_spread_ms): its fit against
samples of known spread, where calibration takes it from, and how `perfmodel compare` uses
it - as the timed-wait PS workers' jitter, with each PS row predicted over MODEL_SEEDS seeds
and the medians compared (perfmodel/compare/run.py `over_seeds`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from calibration.fit_cores import fit_timed_wait_spread
from calibration.from_store import _timed_wait_spread
from calibration.selfcheck import is_timed_wait
from perfmodel.cluster import load_cluster
from perfmodel.compare import protocol, run
from perfmodel.compare.matching import compare, steady_staleness_by_worker
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.compute import ps_worker_seconds

SSP = "ssp-ps-mlp-tw4-straggler"


@pytest.mark.parametrize("sd_ms", [0.5, 3.0, 8.0])
def test_the_fit_recovers_a_known_spread_whatever_each_worker_waits(sd_ms):
    rng = np.random.default_rng(7)
    # three workers waiting 40, 60 and 90 ms: only how far each strays is wanted
    series = [median + sd_ms * 1e-3 * rng.standard_normal(4000) for median in (0.040, 0.060,
                                                                                0.090)]
    fit = fit_timed_wait_spread(series)
    # 12,000 draws: the IQR's relative standard error is ~1.5 %; 6 % is four of them
    assert fit.value == pytest.approx(sd_ms, rel=0.06)
    assert fit.points == 3 and fit.parameter == "compute.timed_wait_spread_ms"


def test_the_fit_shrugs_off_a_few_steps_that_wait_a_whole_slice():
    rng = np.random.default_rng(3)
    series = [0.038 + 0.003 * rng.standard_normal(400) for _ in range(3)]
    spiked = [np.concatenate([x, [0.2, 0.3]]) for x in series]     # 2 of 402 steps, 5-8x
    assert fit_timed_wait_spread(spiked).value == pytest.approx(
        fit_timed_wait_spread(series).value, rel=0.05)


def test_too_few_workers_or_steps_say_what_is_missing():
    with pytest.raises(PerfmodelError, match="ps-crowded"):
        fit_timed_wait_spread([[0.01, 0.02, 0.015, 0.012]])
    with pytest.raises(PerfmodelError, match=">= 2 workers with >= 4"):
        fit_timed_wait_spread([[0.01, 0.02], [0.01, 0.02]])
    with pytest.raises(PerfmodelError, match="not a finite number"):
        fit_timed_wait_spread([[0.01, 0.02, 0.015, -1.0], [0.01, 0.02, 0.015, 0.012]])


def _run(steps: dict[int, list[float]], *, workers: int = 5, mode: str = "timed-wait"):
    rows = [{"rank": r, "step": i, "compute_s": s} for r, xs in steps.items()
            for i, s in enumerate(xs)]
    config = {"kind": "ps", "workers": workers, "warmup_steps": 2, "compute_mode": mode}
    return SimpleNamespace(row=SimpleNamespace(config=config, id=1),
                           table=lambda name: rows if name == "steps" else [])


def test_calibration_reads_each_workers_steps_after_the_warm_up(monkeypatch):
    monkeypatch.setattr("calibration.from_store.os.cpu_count", lambda: 2)
    rng = np.random.default_rng(11)
    # rank 0 is the server (no steps); ranks 1-5 the workers; the warm-up steps are huge
    steps = {r: [5.0, 5.0, *(0.038 + 0.004 * rng.standard_normal(300))] for r in range(1, 6)}
    notes: list[str] = []
    fit = _timed_wait_spread([_run(steps)], notes)
    assert fit is not None and fit.value == pytest.approx(4.0, rel=0.1)
    assert "strays from its length" in notes[0]
    # a run that does not crowd the cores (1 worker and the server on 2) says nothing
    notes = []
    assert _timed_wait_spread([_run({1: steps[1]}, workers=1)], notes) is None
    assert "not fitted" in notes[0]
    assert is_timed_wait(_run(steps)) and not is_timed_wait(_run(steps, mode="real"))


# ------------------------------------------------------------------ what compare does with it


def _profile(spread_ms: float):
    p = load_cluster("local")
    return dataclasses.replace(p, compute=dataclasses.replace(
        p.compute, timed_wait_spread_ms=spread_ms))


def _held_out(key: str):
    return next(h for h in protocol.held_out_set() if h.key == key)


def test_only_timed_wait_ps_workers_stray_by_the_spread_at_their_own_wait():
    profile, h = _profile(3.0), _held_out(SSP)
    ssp = protocol.scenario_for(h, profile, steps=6, seed=0)
    nominal = ps_worker_seconds(ssp.cluster, ssp.workload, h.batch)
    assert ssp.jitter == "lognormal" and ssp.cv == pytest.approx(3e-3 / nominal)
    ddp = protocol.scenario_for(_held_out("ddp-mlp-tw4"), profile, steps=6, seed=0)
    assert ddp.jitter == "none" and ddp.cv == 0.0       # its steps spread by its collectives
    real = protocol.scenario_for(_held_out("async-ps-mlp-straggler"), profile, steps=6, seed=0)
    assert (real.jitter, real.cv) == ("lognormal", profile.compute.jitter_cv)
    unmeasured = protocol.scenario_for(h, _profile(0.0), steps=6, seed=0)
    assert unmeasured.jitter == "none"                  # a profile without it: exact waits


def test_a_ps_row_is_the_median_over_its_seeds():
    profile, h, steps = _profile(4.0), _held_out(SSP), 10
    [record] = run.predict_all((h,), profile, None, steps=steps, seed=4)
    assert record["seeds"] == list(range(4, 4 + protocol.MODEL_SEEDS))
    each = [predict(h.strategy, protocol.scenario_for(h, profile, steps=steps, seed=s),
                    **protocol.model_options(h, cpu=True)) for s in record["seeds"]]
    assert record["step_time_s"] == pytest.approx(
        float(np.median([p.summary.step_time_s.mean for p in each])), rel=1e-12)
    per_worker = [steady_staleness_by_worker(p.result.updates, protocol.WARMUP_STEPS)
                  for p in each]
    for w, value in record["staleness_worker_means"].items():
        assert value == pytest.approx(float(np.median([x[int(w)] for x in per_worker])))
    low, high = record["seed_range"]["staleness_mean"]
    assert low <= record["staleness_mean"] <= high
    # the comparison counts the median of the seeds' means, as it does the runs'
    row = compare(h.key, record, [], [], warmup_steps=protocol.WARMUP_STEPS)
    assert row.quantities["staleness_mean"].predicted == record["staleness_mean"]
    assert row.staleness_seed_range == (low, high)


def test_exact_waits_give_every_seed_the_same_answer():
    [record] = run.predict_all((_held_out(SSP),), _profile(0.0), None, steps=10, seed=0)
    low, high = record["seed_range"]["step_time_s"]
    assert low == high
    assert record["seed_range"]["staleness_mean"][0] == record["seed_range"]["staleness_mean"][1]


def test_ddp_rows_are_predicted_at_one_seed():
    [record] = run.predict_all((_held_out("ddp-mlp-tw4"),), _profile(4.0), None, steps=6,
                               seed=0)
    assert "seeds" not in record and record["seed"] == 0
