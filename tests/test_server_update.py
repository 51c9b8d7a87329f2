"""The serial CPU-host server's own time per update, `[server.update]`: fitted from the
server's records (calibration/fit_ps.py, calibration/from_store.py), written and read back
(calibration/profile_writer.py, perfmodel/cluster.py), charged by the model
(perfmodel/sim/ps.py `server_apply_s`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from calibration import from_store
from calibration.fit_ps import fit_server_update
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.sim.ps import server_apply_s
from perfmodel.workload import load_workload

EXACT = 1e-9


def test_the_fit_recovers_latency_and_rate_from_two_sizes():
    latency_s, rate = 1.0e-3, 7.5e9
    sizes = [2.5e6, 2.5e6, 12.9e6]
    lat, bw = fit_server_update(sizes, [latency_s + n / rate for n in sizes])
    assert lat.value == pytest.approx(1000.0, rel=1e-6)
    assert bw.value == pytest.approx(7.5, rel=1e-6)
    assert lat.parameter == "server.update.latency_us"


def test_the_fit_refuses_one_size_and_a_rate_that_is_not_one():
    with pytest.raises(PerfmodelError, match=">= 2 sizes"):
        fit_server_update([1e6, 1e6], [1e-3, 2e-3])
    with pytest.raises(PerfmodelError, match="did not take longer"):
        fit_server_update([1e6, 1e7], [3e-3, 1e-3])


def _with_update(latency_us: float, bandwidth_GBps: float):
    base = load_cluster("local")
    lat, bw = fit_server_update([1e6, 2e6], [latency_us * 1e-6 + n / (bandwidth_GBps * 1e9)
                                              for n in (1e6, 2e6)])
    data = build_profile("local", base, MeasuredFits(server_update=(lat, bw)),
                         RunInfo(host="h", device_names=(), versions="v", runs=2))
    return data, parse_profile(data, base.path)


def test_the_profile_carries_it_and_lists_it_as_measured():
    data, cluster = _with_update(900.0, 6.0)
    assert data["server"]["update"]["latency_us"] == pytest.approx(900.0, rel=1e-6)
    assert cluster.server.update_GBps == pytest.approx(6.0, rel=1e-6)
    assert "server.update" in data["calibration"]["measured"]
    assert load_cluster("local").server.update_GBps is None      # the spec profile: none
    bad = {**data, "server": {**data["server"], "update": {"latency_us": 1.0,
                                                           "bandwidth_GBps": -1.0}}}
    with pytest.raises(PerfmodelError, match="server.update.bandwidth_GBps"):
        parse_profile(bad, cluster.path)


def test_a_serial_server_charges_its_measured_update_and_a_gpu_server_does_not():
    _, cluster = _with_update(900.0, 6.0)
    wl = load_workload("mlp")
    grad = wl.params * wl.precision_spec.grad_bytes
    assert server_apply_s(cluster, wl, wl.params) == pytest.approx(900e-6 + grad / 6e9,
                                                                   rel=EXACT)
    # half the parameters on this server: the latency stays, the bytes halve
    assert server_apply_s(cluster, wl, wl.params / 2) == pytest.approx(
        900e-6 + grad / 2 / 6e9, rel=EXACT)
    gpu = load_cluster("a100")
    measured_gpu = dataclasses.replace(gpu, server=dataclasses.replace(
        gpu.server, update_latency_us=900.0, update_GBps=6.0))
    assert server_apply_s(measured_gpu, wl, wl.params) == server_apply_s(gpu, wl, wl.params)


def _ps_run(workload: str, apply_s: float, pack_s: float | None = None):
    updates = [{"step": s, "apply_s": apply_s if s else 99.0, "pack_s": pack_s}
               for s in range(4)]                       # step 0: warm-up, left out
    return SimpleNamespace(row=SimpleNamespace(workload=workload,
                                               config={"warmup_steps": 1}),
                           table=lambda name, u=updates: u if name == "updates" else [])


def test_calibration_fits_it_from_two_workloads_servers_and_says_when_it_cannot():
    base = load_cluster("local")
    notes: list[str] = []
    fit = from_store._server_update([_ps_run("cnn-small", 0.0010, 0.0004),
                                     _ps_run("mlp", 0.0030, 0.0012)], base, notes)
    assert fit is not None and not notes
    cnn, mlp = (load_workload(w) for w in ("cnn-small", "mlp"))
    lat, bw = fit[0].value * 1e-6, fit[1].value * 1e9
    assert lat + cnn.params * 4 / bw == pytest.approx(0.0014, rel=1e-6)
    assert lat + mlp.params * 4 / bw == pytest.approx(0.0042, rel=1e-6)
    # runs from before the server recorded its phases, or one workload only: not fitted
    assert from_store._server_update([_ps_run("cnn-small", 0.001), _ps_run("mlp", 0.003)],
                                     base, notes) is None
    assert from_store._server_update([_ps_run("mlp", 0.003, 0.001)], base, notes) is None
    assert len(notes) == 2 and all("server.update not fitted" in n for n in notes)
    assert from_store._server_update([_ps_run("mlp", 0.003, 0.001)], load_cluster("a100"),
                                     []) is None           # GPUs: no serial server


def _ps_worker_run(workload: str, compute_s: list[float], mode: str = "real", workers=1):
    steps = [{"step": i, "compute_s": 99.0 if i == 0 else c} for i, c in enumerate(compute_s)]
    return SimpleNamespace(row=SimpleNamespace(workload=workload, batch_size=load_workload(
        workload).batch_size, workers=workers, config={"warmup_steps": 1,
                                                      "compute_mode": mode}),
                           table=lambda name, s=steps: s if name == "steps" else [])


def test_a_ps_workers_measured_extra_compute_is_fitted_written_and_charged():
    from calibration.from_store import _ps_worker_extra
    from perfmodel.sim.compute import ps_worker_seconds
    base = load_cluster("local")
    mlp, cnn = load_workload("mlp"), load_workload("cnn-small")
    model = ps_worker_seconds(base, mlp, mlp.batch_size)
    notes: list[str] = []
    runs = [_ps_worker_run("mlp", [0, model + 0.005, model + 0.005]),
            _ps_worker_run("mlp", [0, model + 0.006, model + 0.006]),
            _ps_worker_run("cnn-small", [0, 1e-6, 1e-6]),          # faster than the model: 0
            _ps_worker_run("mlp", [0, 9.0], mode="timed-wait"),    # not real compute: left out
            _ps_worker_run("mlp", [0, 9.0], workers=2)]            # not 1 worker: left out
    fits = _ps_worker_extra(runs, base, notes)
    by_name = {r.parameter: r.value for r in fits}
    assert by_name["compute.ps_worker_extra_ms.mlp"] == pytest.approx(5.5, rel=1e-6)
    assert by_name["compute.ps_worker_extra_ms.cnn-small"] == 0.0
    assert any("in-sample" in n for n in notes)
    assert _ps_worker_extra(runs, load_cluster("a100"), []) == ()     # GPUs: not fitted
    data = build_profile("local", base, MeasuredFits(ps_worker_extra=fits),
                         RunInfo(host="h", device_names=(), versions="v", runs=3))
    assert "compute.ps_worker_extra_ms" in data["calibration"]["measured"]
    cluster = parse_profile(data, base.path)
    # charged to real-compute PS workers of that workload only, and not in a timed wait
    assert ps_worker_seconds(cluster, mlp, 64) == pytest.approx(
        ps_worker_seconds(base, mlp, 64) + 0.0055, rel=1e-9)
    assert ps_worker_seconds(cluster, cnn, 32) == ps_worker_seconds(base, cnn, 32)
    timed = dataclasses.replace(cluster, compute_occupies_cores=False)
    assert ps_worker_seconds(timed, mlp, 64) == ps_worker_seconds(
        dataclasses.replace(base, compute_occupies_cores=False), mlp, 64)
    bad = {**data, "compute": {**data["compute"], "ps_worker_extra_ms": {"mlp": -1.0}}}
    with pytest.raises(PerfmodelError, match="ps_worker_extra_ms.mlp"):
        parse_profile(bad, base.path)
