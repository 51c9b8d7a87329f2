"""A CPU host's DDP rank's own work a step beyond its passes and copies
(compute.ddp_rank_extra_ms, perfmodel/sim/ddp.py `rank_extra_s`), and its fit beside the
overlap slowdown (calibration/from_store.py `_overlap`): where it is and is not added, and
the fit recovering both from compute the simulator itself produced."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calibration.from_store import _overlap
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.sim.ddp import DDP, HARNESS_COMM_HOOK
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

WORKLOADS = (("cnn-small", 32), ("mlp", 64))


def _host(extra_ms: float = 0.0, slowdown: float = 1.0, **changes):
    local = load_cluster("local")
    return dataclasses.replace(local, compute=dataclasses.replace(
        local.compute, ddp_rank_extra_ms=extra_ms, overlap_slowdown=slowdown,
        jitter_cv=0.0), **changes)


def _compute_s(cluster, workload: str, batch: int, workers: int = 2) -> np.ndarray:
    """Each rank's compute a steady step, as the harness's DDP runs (their timer is a comm
    hook: HARNESS_COMM_HOOK) would measure it if the model were exact."""
    sc = Scenario(cluster=cluster, workload=load_workload(workload), workers=workers,
                  batch_size=batch, steps=6, jitter="none")
    ddp = DDP(DDP.Options(comm_hook=HARNESS_COMM_HOOK))
    return np.array([s.compute_s for s in ddp.simulate(sc).steps if s.step >= 2])


def test_each_rank_pays_it_once_a_step_shared_like_its_passes():
    for workload, batch in WORKLOADS:
        with_extra = _compute_s(_host(3.0), workload, batch)
        without = _compute_s(_host(0.0), workload, batch)
        share = load_cluster("local").compute_share(2, workload)
        assert with_extra - without == pytest.approx(np.full_like(without, 3e-3 * share),
                                                     rel=1e-9)


def test_nothing_is_added_on_a_gpu_in_a_timed_wait_with_one_worker_or_an_older_profile():
    for name in ("local", "a100", "a10g"):
        assert load_cluster(name).compute.ddp_rank_extra_ms == 0.0
    mlp = load_workload("mlp")
    waiting = _host(3.0, compute_occupies_cores=False)
    gpu = dataclasses.replace(load_cluster("a100"), compute=dataclasses.replace(
        load_cluster("a100").compute, ddp_rank_extra_ms=3.0))
    for cluster, workers in ((waiting, 2), (gpu, 2), (_host(3.0), 1)):
        sc = Scenario(cluster=cluster, workload=mlp, workers=workers, batch_size=64)
        assert DDP.rank_extra_s(sc) == 0.0
    assert DDP.rank_extra_s(Scenario(cluster=_host(3.0), workload=mlp, workers=2,
                                     batch_size=64)) == \
        pytest.approx(3e-3 * load_cluster("local").compute_share(2, "mlp"))


def _runs(cluster) -> list[SimpleNamespace]:
    """DDP runs of both workloads whose compute is the simulator's own under `cluster`."""
    out = []
    for workload, batch in WORKLOADS:
        steps = [{"compute_s": float(c)} for c in _compute_s(cluster, workload, batch)]
        row = SimpleNamespace(kind="ddp", workers=2, workload=workload, batch_size=batch)
        out.append(SimpleNamespace(row=row, table=lambda _, s=steps: s))
    return out


def test_the_fit_recovers_the_slowdown_and_the_per_step_cost_the_simulator_used():
    s, extra = _overlap(_runs(_host(3.0, 1.4)), _host())
    assert s.value == pytest.approx(1.4, rel=0.02)
    assert extra is not None and extra.value == pytest.approx(3.0, rel=0.02)


def test_a_slowdown_below_one_is_held_at_one_and_the_cost_fitted_alone():
    # compute running faster while collectives are in flight is not physical
    s, extra = _overlap(_runs(_host(5.0, 0.6)), _host())
    assert s.value == 1.0
    assert extra is not None and 0.0 < extra.value < 5.0


def test_one_workload_fits_the_slowdown_alone():
    s, extra = _overlap(_runs(_host(0.0, 1.4))[1:], _host())
    assert extra is None and s.value == pytest.approx(1.4, rel=0.02)


def test_the_profile_carries_it_and_reads_it_back(tmp_path: Path):
    cnn = _runs(_host(2.5, 1.2))
    s, extra = _overlap(cnn, _host())
    info = RunInfo(host="box", device_names=("CPU core",), versions="torch", runs=2,
                   cpu_cores=2)
    data = build_profile("x", load_cluster("local"),
                         MeasuredFits(overlap_slowdown=s, ddp_rank_extra=extra), info)
    assert data["compute"]["ddp_rank_extra_ms"] == pytest.approx(extra.value)
    assert "compute.ddp_rank_extra_ms" in data["calibration"]["measured"]
    back = parse_profile(data, tmp_path / "x.toml")
    assert back.compute.ddp_rank_extra_ms == pytest.approx(2.5, rel=0.02)


def test_a_last_coefficient_fixed_at_zero_is_refitted_not_left_negative():
    # relative_lstsq fixes a negative coefficient within noise of 0 at 0 and refits; with
    # every listed coefficient fixed the refit used to be skipped, leaving it negative
    from calibration.fit import relative_lstsq

    fit = relative_lstsq(np.ones((4, 1)), np.array([1.0, 1.01, 0.99, 1.0]),
                         np.array([1.0, 1.02, 1.0, 1.0]), zero_ok=(0,))
    assert fit.coef[0] == 0.0 and fit.stderr[0] == 0.0
    assert fit.rel == pytest.approx([0.0, 0.01 / 1.01, 0.01 / 0.99, 0.0])
