"""A CPU host's whole step moves every unit's weights through memory (compute.weight_stream_GBps,
perfmodel/sim/compute.py weights_streamed_s): the term against its arithmetic, where it is and
is not added, and the whole-step factor fitted beside it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from calibration.from_store import _whole_step
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.sim.compute import unit_times, weights_streamed_s
from perfmodel.workload import load_workload

INFO = RunInfo(host="box", device_names=("CPU core",), versions="torch", runs=6, cpu_cores=2)


def _streaming(cluster, gbps: float):
    return dataclasses.replace(cluster, compute=dataclasses.replace(
        cluster.compute, weight_stream_GBps=gbps))


def test_forward_reads_the_weights_and_backward_reads_them_and_writes_the_gradients():
    mlp = load_workload("mlp")                  # fp32: 4-byte parameters and gradients
    fwd, bwd = weights_streamed_s(_streaming(load_cluster("local"), 10.0), mlp)
    params = np.array([u.params for u in mlp.units], dtype=float)
    assert np.allclose(fwd, params * 4 / 10e9)
    assert np.allclose(bwd, params * 8 / 10e9)
    # the mlp's 3.2 M parameters: 38.5 MB a step, 3.85 ms at 10 GB/s, whatever the batch
    assert fwd.sum() + bwd.sum() == pytest.approx(12 * mlp.params / 10e9)


def test_nothing_is_added_without_the_field_so_gpus_and_old_profiles_predict_as_before():
    for name in ("local", "a100", "a10g"):
        cluster = load_cluster(name)
        assert cluster.compute.weight_stream_GBps == 0.0
        fwd, bwd = weights_streamed_s(cluster, load_workload("mlp"))
        assert not fwd.any() and not bwd.any()


def test_the_term_is_a_cost_a_step_beside_the_passes_not_scaled_by_the_whole_step_factor():
    local, mlp = load_cluster("local"), load_workload("mlp")
    whole = dataclasses.replace(local, compute=dataclasses.replace(
        local.compute, whole_step_factor=1.5))
    streamed = _streaming(whole, 10.0)
    fwd, bwd = weights_streamed_s(streamed, mlp)
    for batch in (16, 64, 256):
        a, b = unit_times(whole, mlp, batch), unit_times(streamed, mlp, batch)
        assert np.allclose(b.forward_s - a.forward_s, fwd)
        assert np.allclose(b.backward_s - a.backward_s, bwd)
        assert b.optimizer_s == a.optimizer_s
    # two busy ranks on the 2 cores stretch it with the passes (core sharing)
    a2, b2 = unit_times(whole, mlp, 64, busy=2), unit_times(streamed, mlp, 64, busy=2)
    share = local.compute_share(2, "mlp")
    assert np.allclose(b2.forward_s - a2.forward_s, share * fwd)


def test_calibration_writes_it_on_a_cpu_host_with_a_compute_fit_only():
    from calibration.fit import fit_result
    from calibration.fit_compute import ComputeFit

    fit = ComputeFit(overhead_us_per_unit=fit_result("compute.overhead_us_per_unit", 10.0, 1.0,
                                                     np.zeros(3)),
                     achieved_TFLOPS=fit_result("compute.achieved_TFLOPS", 0.05, 0.001,
                                                np.zeros(3)),
                     efficiency_by_flops=((1e6, 0.5), (1e9, 0.5)), curve_fitted=False,
                     backward_time_ratio=None, by_phase={})
    optimizer = fit_result("compute.optimizer_GBps", 13.1, 0.1, np.zeros(3))
    local = build_profile("mine", load_cluster("local"),
                          MeasuredFits(compute=fit, optimizer_GBps=optimizer), INFO)
    assert local["compute"]["weight_stream_GBps"] == local["compute"]["optimizer_GBps"] == 13.1
    assert parse_profile(local, Path("mine.toml")).compute.weight_stream_GBps == 13.1
    # no unit timings fitted (a profiler trace, or the network alone): nothing streamed
    assert "weight_stream_GBps" not in build_profile("n", load_cluster("local"),
                                                     MeasuredFits(), INFO)["compute"]
    gpu = build_profile("g", load_cluster("a100"),
                        MeasuredFits(compute=fit, optimizer_GBps=optimizer), INFO)
    assert "weight_stream_GBps" not in gpu["compute"]


class _Alone:
    """A stored 1-process concurrent compute run of the mlp at `batch` (its summaries)."""

    def __init__(self, batch: int, step_s: float):
        class Row:
            pass
        self.row = Row()
        self.row.id, self.row.workload, self.row.world_size = 1, "mlp", 1
        self.row.batch_size = batch
        self._rows = [{"rank": 0, "key": k, "value": v}
                      for k, v in (("busy_processes", 1), ("concurrent_step_s", step_s),
                                   ("concurrent_cpu_s", step_s), ("load1_before", 0.5))]

    def table(self, name: str):
        return self._rows if name == "summaries" else []


def test_the_whole_step_factor_is_fitted_on_what_is_left_after_the_streamed_weights():
    """Whole steps made as f x passes + streamed weights give f back; the factor fitted
    without the term would be the ratio at that batch, wrong at any other."""
    streamed = _streaming(load_cluster("local"), 13.1)
    mlp = load_workload("mlp")
    weights = float(sum(a.sum() for a in weights_streamed_s(streamed, mlp)))
    plain = unit_times(load_cluster("local"), mlp, 64, optimizer_param_fraction=0).step_s
    runs = [_Alone(64, 1.13 * plain + weights) for _ in range(3)]
    assert _whole_step(runs, streamed).value == pytest.approx(1.13, rel=1e-9)
    # and the profile predicts those whole steps back, with the term beside the factor
    fitted = dataclasses.replace(streamed, compute=dataclasses.replace(
        streamed.compute, whole_step_factor=1.13))
    half = unit_times(fitted, mlp, 32, optimizer_param_fraction=0).step_s
    plain32 = unit_times(load_cluster("local"), mlp, 32, optimizer_param_fraction=0).step_s
    assert half == pytest.approx(1.13 * plain32 + weights, rel=1e-9)
