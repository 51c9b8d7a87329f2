"""A timed wait's interval (perfmodel/uncertainty.py): its compute is the model's own, so its
width is the fitted runs' step residual with their measured compute in place of the model's
(`step_comm_rms_rel`), not the whole step residual. Its value from stored runs:
tests/test_intervals.py, beside r_step's."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfmodel.cluster import load_cluster
from perfmodel.compare.run import step_interval as compare_interval
from perfmodel.errors import PerfmodelError
from perfmodel.uncertainty import CalibrationErrors, calibration_errors, interval_for

FIXTURE = Path(__file__).parent / "fixtures" / "local_runs.json"
ERRORS = CalibrationErrors(network_rms_rel=0.5, compute_rms_rel=0.3, run_spread_cv=0.04,
                           step_rms_rel=0.14, step_comm_rms_rel=0.05)


def test_a_timed_wait_takes_the_communication_residual_and_a_real_run_the_whole_one():
    wait, how = interval_for(1.0, ERRORS, compute_share=0.6, compute_exact=True)
    assert wait.sigma_rel == pytest.approx(math.hypot(0.05, 0.04))
    assert "measured compute" in how
    real, how = interval_for(1.0, ERRORS, compute_share=0.6)
    assert real.sigma_rel == pytest.approx(0.14)       # holds one run's spread already
    assert "measured compute" not in how
    # a profile without it (written before 2026-12-05): the whole residual for both
    old = dataclasses.replace(ERRORS, step_comm_rms_rel=None)
    assert interval_for(1.0, old, compute_share=0.6, compute_exact=True)[0].sigma_rel == \
        pytest.approx(real.sigma_rel)
    # the median of five: the communication residual whole, the spread shrunk by π/10
    five, how = interval_for(1.0, ERRORS, compute_share=0.6, compute_exact=True, repeats=5)
    assert five.sigma_rel == pytest.approx(math.sqrt(0.05**2 + 0.04**2 * math.pi / 10))


def test_calibration_errors_read_it_and_refuse_a_bad_one():
    table = {"network_rms_rel": 0.5, "compute_rms_rel": 0.3, "run_spread_cv": 0.05,
             "step_rms_rel": 0.12}
    assert calibration_errors({"calibration": table}).step_comm_rms_rel is None
    assert calibration_errors({"calibration": {**table, "step_comm_rms_rel": 0.04}}
                              ).step_comm_rms_rel == 0.04
    with pytest.raises(PerfmodelError, match="calibration.step_comm_rms_rel"):
        calibration_errors({"calibration": {**table, "step_comm_rms_rel": float("nan")}})


def test_compare_picks_the_width_by_whether_the_prediction_is_a_timed_wait():
    local = load_cluster("local")
    summary = SimpleNamespace(step_time_s=SimpleNamespace(mean=0.05), compute_s=0.03)

    def prediction(cluster):
        return SimpleNamespace(summary=summary, scenario=SimpleNamespace(cluster=cluster))

    waiting = dataclasses.replace(local, compute_occupies_cores=False)
    assert waiting.timed_wait and not local.timed_wait
    assert compare_interval(prediction(waiting), ERRORS).sigma_rel == \
        pytest.approx(math.hypot(0.05, 0.04))
    assert compare_interval(prediction(local), ERRORS).sigma_rel == pytest.approx(0.14)
    assert compare_interval(prediction(local), ERRORS, repeats=5).sigma_rel == \
        pytest.approx(math.sqrt(0.14**2 - 0.04**2 * (1 - math.pi / 10)))
