"""calibration/fit_cores.py: compute under core sharing fitted from 1, 2 and 3 busy processes,
against timings made from the model itself (the fit must recover what made them) and
against the loud checks."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit_cores import (
    SHARING_CHECK_TOL,
    ConcurrentTiming,
    fit_core_contention,
    sharing_checks,
)
from calibration.from_store import CHECK_FAILED, failed_checks
from perfmodel.errors import PerfmodelError

CPU_S = 0.025           # one process's CPU seconds per step


def timings(kappa: float, cores: int = 2, load_wait: float = 0.0, busy=(1, 2, 3)):
    """Ranks of runs with b busy processes: CPU time 1 + κ(min(b,c)−1), wall time that
    times max(1, b/c), plus `load_wait` seconds of waiting for other people's work."""
    out = []
    for b in busy:
        cpu = CPU_S * (1 + kappa * (min(b, cores) - 1))
        wall = cpu * max(1.0, b / cores) + load_wait
        out += [ConcurrentTiming(busy=b, step_s=wall, cpu_s=cpu, load1=1.0)] * b
    return out


@pytest.mark.parametrize("kappa", [0.0, 0.1, 0.3])
def test_recovers_the_contention_that_made_the_timings(kappa):
    fit = fit_core_contention(timings(kappa), cores=2)
    assert fit.value == pytest.approx(kappa, abs=1e-12)
    assert fit.parameter == "compute.core_contention"


def test_contention_comes_from_cpu_time_so_waiting_for_a_busy_host_does_not_count():
    assert fit_core_contention(timings(0.1, load_wait=0.05), cores=2).value == \
        pytest.approx(0.1, abs=1e-12)


def test_checks_pass_on_model_made_timings_and_fail_loudly_when_wall_time_disagrees():
    quiet = sharing_checks(timings(0.2), 2, 0.2)
    assert set(quiet) == {"compute_share.busy2", "compute_share.busy3"}
    assert all(abs(c["rel"]) < 1e-12 for c in quiet.values())
    assert failed_checks(quiet) == []
    # a host whose other work doubles the wall time of the 1-process run only
    skewed = [t if t.busy > 1 else ConcurrentTiming(busy=1, step_s=2 * t.step_s, cpu_s=t.cpu_s,
                                                    load1=6.0) for t in timings(0.2)]
    loud = failed_checks(sharing_checks(skewed, 2, 0.2))
    assert loud and all(n.startswith(CHECK_FAILED) for n in loud)
    assert f"±{SHARING_CHECK_TOL:.0%}" in loud[0]


def test_refuses_timings_without_a_lone_process_or_with_one_core():
    with pytest.raises(PerfmodelError, match="1 busy process"):
        fit_core_contention(timings(0.1, busy=(2, 3)), cores=2)
    with pytest.raises(PerfmodelError, match="contention cannot be measured"):
        fit_core_contention(timings(0.1, cores=1), cores=1)


# -- the PS round-trip check (issue 13/14): the apply as the simulation charges it, loud --

class _Row:
    def __init__(self, workload: str, waits: list[float]):
        self.id, self.workload, self.workers, self.batch_size = 7, workload, 1, 64
        self._waits = waits

class _Run:
    def __init__(self, workload: str, waits: list[float]):
        self.row = _Row(workload, waits)

    def table(self, name: str):
        return [{"comm_wait_s": w} for w in self.row._waits] if name == "steps" else []


def _round_trip_model(cluster, workload) -> float:
    from perfmodel.sim.collectives import link_transfer_s
    from perfmodel.sim.compute import optimizer_seconds

    link = getattr(cluster, cluster.server.link)
    return (link_transfer_s(link, workload.param_bytes)
            + link_transfer_s(link, workload.params * workload.precision_spec.grad_bytes)
            + optimizer_seconds(cluster, workload, 1.0)
            # a CPU host's server also packs its parameters into the reply (ps.server_apply_s)
            + (workload.param_bytes / (cluster.compute.optimizer_GBps * 1e9)
               if cluster.compute_cpu_cores_per_node else 0.0))


def test_ps_round_trip_check_charges_the_optimizer_and_flags_a_miss_loudly():
    from calibration.from_store import PS_ROUND_TRIP_TOL, _ps_checks
    from perfmodel.cluster import load_cluster
    from perfmodel.workload import load_workload

    local, mlp = load_cluster("local"), load_workload("mlp")
    model = _round_trip_model(local, mlp)
    # the apply term is the workload's optimizer (model-state bytes at optimizer_GBps), as
    # perfmodel/sim/ps.py charges it, not gradient bytes at server.apply_GBps
    from perfmodel.sim.compute import optimizer_seconds

    old_apply = mlp.params * mlp.precision_spec.grad_bytes / (local.server.apply_GBps * 1e9)
    assert optimizer_seconds(local, mlp, 1.0) != pytest.approx(old_apply, rel=0.05)
    checks = _ps_checks([_Run("mlp", [model] * 5)], local, local)
    [(name, check)] = [(k, v) for k, v in checks.items() if k.startswith("ps_round_trip_unshared")]
    assert check["model"] == pytest.approx(model, rel=1e-12)
    assert check["tolerance"] == PS_ROUND_TRIP_TOL
    assert failed_checks(checks) == []
    far = _ps_checks([_Run("mlp", [model * 20] * 5)], local, local)      # -95 %, issue 14
    [note] = failed_checks(far)
    assert note.startswith(f"{CHECK_FAILED}: ps_round_trip_unshared_s.run7") and "-95%" in note


def test_measured_profile_carries_the_host_cores_and_contention_only_on_a_cpu_base():
    from pathlib import Path

    from calibration.fit_cores import fit_whole_step_factor
    from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
    from perfmodel.cluster import load_cluster, parse_profile

    fit = fit_core_contention(timings(0.25), cores=2)
    whole = fit_whole_step_factor([0.02, 0.021], [0.015, 0.015])
    info = RunInfo(host="box", device_names=("CPU core",), versions="torch", runs=6, cpu_cores=4)
    data = build_profile("mine", load_cluster("local"),
                         MeasuredFits(core_contention=fit, whole_step_factor=whole), info)
    assert data["topology"]["compute_cpu_cores_per_node"] == 4
    cluster = parse_profile(data, Path("mine.toml"))
    assert cluster.compute.core_contention == pytest.approx(0.25)
    assert cluster.compute.whole_step_factor == whole.value == pytest.approx(1.3667, rel=1e-3)
    assert {"compute.core_contention", "compute.whole_step_factor"} <= set(
        data["calibration"]["measured"])
    gpu = build_profile("g", load_cluster("a100"), MeasuredFits(), info)
    assert "compute_cpu_cores_per_node" not in gpu["topology"]
    assert "core_contention" not in gpu["compute"] and "whole_step_factor" not in gpu["compute"]


def test_concurrent_compute_config_runs_p_processes_of_whole_steps():
    from measure.configs import compute_config, processes, progress_total

    config = compute_config(workload="cnn-small", batch_sizes=[32], repeats=5, warmup=2,
                            seed=0, timeout_s=60, threads_per_worker=1, concurrent=3)
    assert processes(config) == 3 and config["batch_size"] == 32
    assert config["options"]["compute"]["concurrent"] is True
    assert progress_total(config) == 1


def test_whole_step_factor_is_the_median_ratio_and_scales_the_passes_only():
    import dataclasses

    from calibration.fit_cores import fit_whole_step_factor
    from perfmodel.cluster import load_cluster
    from perfmodel.errors import PerfmodelError
    from perfmodel.sim.compute import unit_times
    from perfmodel.workload import load_workload

    rng = np.random.default_rng(4)
    passes = np.full(9, 0.0147)
    steps = 1.33 * passes * (1 + 0.03 * rng.normal(size=9))        # 3 % timing noise
    fit = fit_whole_step_factor(steps, passes)
    assert fit.parameter == "compute.whole_step_factor"
    assert abs(fit.value - 1.33) <= 3 * fit.stderr and fit.points == 9
    with pytest.raises(PerfmodelError, match="whole-step"):
        fit_whole_step_factor([], [])
    with pytest.raises(PerfmodelError, match=">= 2 whole-step timings"):   # no NaN stderr
        fit_whole_step_factor([0.02], [0.015])
    # the factor stretches forward and backward, not the optimizer (timed on its own)
    local, mlp = load_cluster("local"), load_workload("mlp")
    slow = dataclasses.replace(local, compute=dataclasses.replace(local.compute,
                                                                  whole_step_factor=1.5))
    a, b = unit_times(local, mlp, 64), unit_times(slow, mlp, 64)
    assert np.allclose(b.forward_s, 1.5 * a.forward_s)
    assert np.allclose(b.backward_s, 1.5 * a.backward_s)
    assert b.optimizer_s == a.optimizer_s
    assert local.compute.whole_step_factor == 1.0          # not measured: no stretch


# -- per workload (compute.by_workload): working sets differ, so contention and whole steps do --

class _ConcurrentRun:
    """A stored concurrent compute run: `busy` ranks of `workload`, each with its summary."""

    def __init__(self, workload: str, busy: int, step_s: float, cpu_s: float):
        class Row:
            pass
        self.row = Row()
        self.row.id, self.row.workload, self.row.world_size = 1, workload, busy
        self.row.batch_size = 64 if workload == "mlp" else 32
        self._rows = [{"rank": r, "key": k, "value": v} for r in range(busy)
                      for k, v in (("busy_processes", busy), ("concurrent_step_s", step_s),
                                   ("concurrent_cpu_s", cpu_s), ("load1_before", 0.5))]

    def table(self, name: str):
        return self._rows if name == "summaries" else []


def _concurrent_runs(workload: str, kappa: float, whole: float, cluster) -> list:
    """Model-made runs: 1, 2, 3 busy processes, twice, of a workload with these factors."""
    from perfmodel.sim.compute import unit_times
    from perfmodel.workload import load_workload

    w = load_workload(workload)
    alone = whole * unit_times(cluster, w, 64 if workload == "mlp" else 32,
                               optimizer_param_fraction=0).step_s
    out = []
    for _ in range(2):
        for busy in (1, 2, 3):
            cpu = alone * (1 + kappa * (min(busy, 2) - 1))
            out.append(_ConcurrentRun(workload, busy, cpu * max(1.0, busy / 2), cpu))
    return out


def test_each_workload_gets_its_own_whole_step_factor_and_contention(monkeypatch):
    from pathlib import Path

    from calibration.from_store import _by_workload
    from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
    from perfmodel.cluster import load_cluster, parse_profile
    from perfmodel.sim.compute import unit_times
    from perfmodel.workload import load_workload

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    local = load_cluster("local")
    # as seen on this host (cluster.WorkloadCompute): the mlp contends, cnn-small hardly
    runs = (_concurrent_runs("mlp", 0.25, 1.13, local)
            + _concurrent_runs("cnn-small", 0.04, 1.40, local))
    notes: list[str] = []
    fits = _by_workload(runs, local, notes)
    got = {f.workload: f for f in fits}
    assert set(got) == {"mlp", "cnn-small"}
    assert got["mlp"].core_contention.value == pytest.approx(0.25, rel=1e-6)
    assert got["mlp"].whole_step_factor.value == pytest.approx(1.13, rel=1e-6)
    assert got["cnn-small"].core_contention.value == pytest.approx(0.04, rel=1e-6)
    assert got["cnn-small"].whole_step_factor.value == pytest.approx(1.40, rel=1e-6)
    assert got["mlp"].core_contention.parameter == "compute.by_workload.mlp.core_contention"
    # one workload alone: its fits are the defaults, nothing by workload
    assert _by_workload(_concurrent_runs("mlp", 0.25, 1.13, local), local, []) == ()

    # through the profile: each workload's own where fitted, the defaults elsewhere
    info = RunInfo(host="box", device_names=("CPU core",), versions="torch", runs=12,
                   cpu_cores=2)
    default = fit_core_contention(timings(0.1), cores=2)
    data = build_profile("mine", local, MeasuredFits(core_contention=default,
                                                     by_workload=fits), info)
    assert "compute.by_workload" in data["calibration"]["measured"]
    cluster = parse_profile(data, Path("mine.toml"))
    assert cluster.compute.contention("mlp") == pytest.approx(0.25, rel=1e-6)
    assert cluster.compute.contention("transformer-small") == pytest.approx(0.1, rel=1e-6)
    assert cluster.compute.whole_step("cnn-small") == pytest.approx(1.40, rel=1e-6)
    assert cluster.compute.whole_step("transformer-small") == cluster.compute.whole_step_factor
    assert cluster.compute_share(2, "mlp") == pytest.approx(1.25, rel=1e-6)
    assert cluster.compute_share(2) == pytest.approx(1.1, rel=1e-6)
    mlp, tiny = load_workload("mlp"), load_workload("transformer-small")
    assert np.allclose(unit_times(cluster, mlp, 64, busy=2).forward_s,
                       1.13 * 1.25 * unit_times(local, mlp, 64).forward_s)
    assert np.allclose(unit_times(cluster, tiny, 16, busy=2).forward_s,
                       cluster.compute.whole_step_factor * 1.1
                       * unit_times(local, tiny, 16).forward_s)
