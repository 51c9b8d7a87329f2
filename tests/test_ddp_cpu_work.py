"""compute.ddp_cpu_work_factor: the CPU work a crowded DDP timed wait's node really does a step
over what the model's crowded-node floor counts for it (perfmodel/sim/cores.py
`node_cpu_work_s`), fitted from the calibration's 6-rank DDP timed waits
(calibration/suite.py ddp-crowded, calibration/fit_cores.py `fit_ddp_cpu_work_factor`).

tests/fixtures/ddp_crowded_runs.json: real DDP mlp timed waits at 4, 6 and 8 ranks on this
2-core host, two each, interleaved (tests/fixtures/README.md); ddp_crowded_profile.toml is
the profile they were timed against (report 51's set A), so the modelled side is a real
calibration's.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import numpy as np
import pytest

from calibration.fit_cores import fit_ddp_cpu_work_factor
from calibration.from_store import _ddp_cpu_work, calibrate_runs
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from calibration.suite import CROWDED_DDP_REPEATS, build_suite
from measure.store import Store
from perfmodel.cluster import parse_profile
from perfmodel.compare.protocol import check_disjoint, held_out_set
from perfmodel.errors import PerfmodelError
from perfmodel.sim import cores
from perfmodel.sim.ddp import DDP
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload
from tests.factories import make_cluster
from tests.fixtures.runs_json import load_into_store

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = FIXTURES / "ddp_crowded_runs.json"
PROFILE = FIXTURES / "ddp_crowded_profile.toml"
EXACT_TOL = 1e-9


def crowded_host(factor: float = 1.0, contention: float = 0.1):
    base = make_cluster("local")
    return make_cluster("local", compute_cpu_cores_per_node=2, compute_occupies_cores=False,
                        comm_cpu_busy_by_level=((2.0, 0.85), (4.0, 0.9)),
                        compute=dataclasses.replace(base.compute, core_contention=contention,
                                                    ddp_cpu_work_factor=factor))


# -- the model ------------------------------------------------------------------------------

def test_node_cpu_work_and_the_floor_it_scales_by_hand():
    host = crowded_host()
    # 8 ranks on 2 cores: collectives of 60 ms keep 0.9 of both cores busy, each rank's own
    # 7 ms slowed by contention 1 + 0.1 (2 - 1)
    work = 2 * 0.9 * 0.060 + 8 * 0.007 * 1.1
    assert cores.node_cpu_work_s(host, 8, 0.060, 0.007) == pytest.approx(work, rel=EXACT_TOL)
    for f in (1.0, 1.3, 0.8):
        assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, beside_collectives=True,
                                      work_factor=f) == \
            pytest.approx(0.010 + max(0.060, f * work / 2), rel=EXACT_TOL)
    # gloo FSDP's floor (its ranks block in each collective) takes no DDP factor
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, work_factor=2.0) == \
        pytest.approx(0.010 + 0.060 + 8 * 0.007 * 1.1 / 2, rel=EXACT_TOL)
    # never shorter than the collectives, however small the factor
    assert cores.node_cpu_floor_s(host, 8, 0.010, 0.060, 0.007, beside_collectives=True,
                                  work_factor=0.1) == pytest.approx(0.070, rel=EXACT_TOL)


def _mean_step(result) -> float:
    return float(np.mean([s.end_s - s.start_s for s in result.steps if s.step >= 2]))


def test_ddp_counts_its_floor_work_and_a_crowded_step_moves_with_the_factor():
    mlp = load_workload("mlp")
    sc = Scenario(cluster=crowded_host(), workload=mlp, workers=8, batch_size=64, jitter="none")
    ddp = DDP()
    assert ddp.node_cpu_work_s(sc) > 0
    steps = []
    for f in (1.0, 1.5, 2.0):
        cluster = crowded_host(f)
        steps.append(_mean_step(ddp.simulate(dataclasses.replace(sc, cluster=cluster))))
    assert steps[0] < steps[1] < steps[2]
    # the floor binds at 1.5 and 2: each half-step of the factor adds half the work on 2 cores
    assert steps[2] - steps[1] == pytest.approx(0.5 * ddp.node_cpu_work_s(sc) / 2, rel=1e-6)
    # ranks that fit the cores, or that really compute: the factor changes nothing
    computing = dataclasses.replace(crowded_host(), compute_occupies_cores=True)
    for cluster in (crowded_host(), computing):
        two = dataclasses.replace(sc, cluster=cluster, workers=2 if cluster.timed_wait else 8)
        moved = dataclasses.replace(two, cluster=dataclasses.replace(
            cluster, compute=dataclasses.replace(cluster.compute, ddp_cpu_work_factor=2.0)))
        assert _mean_step(ddp.simulate(moved)) == pytest.approx(_mean_step(ddp.simulate(two)),
                                                                rel=EXACT_TOL)


# -- the fit --------------------------------------------------------------------------------

def test_the_factor_is_the_median_ratio_of_measured_to_modelled_work():
    fit = fit_ddp_cpu_work_factor([0.150, 0.160, 0.090], [0.100, 0.100, 0.050])
    assert fit.parameter == "compute.ddp_cpu_work_factor"
    assert fit.value == pytest.approx(1.6, rel=EXACT_TOL)
    assert fit.points == 3 and fit.max_rel == pytest.approx(1.8 / 1.6 - 1, rel=1e-6)
    assert fit_ddp_cpu_work_factor([0.2], [0.1]).value == pytest.approx(2.0)
    for measured, modelled in (([0.1, 0.2], [0.1]), ([], []), ([0.0], [0.1]), ([0.1], [-1.0])):
        with pytest.raises(PerfmodelError, match="ddp_cpu_work_factor|CPU seconds"):
            fit_ddp_cpu_work_factor(measured, modelled)


def test_the_profile_writes_reads_and_checks_the_factor(tmp_path):
    base = make_cluster("local")
    info = RunInfo(host="vm", device_names=("CPU core",), versions="torch", runs=2, cpu_cores=2)
    fit = fit_ddp_cpu_work_factor([0.15, 0.17], [0.1, 0.1])
    data = build_profile("local", base, MeasuredFits(ddp_cpu_work_factor=fit), info)
    assert data["compute"]["ddp_cpu_work_factor"] == pytest.approx(1.6)
    assert "compute.ddp_cpu_work_factor" in data["calibration"]["measured"]
    assert parse_profile(data, tmp_path / "p.toml").compute.ddp_cpu_work_factor == \
        pytest.approx(1.6)
    plain = build_profile("local", base, MeasuredFits(), info)
    assert "ddp_cpu_work_factor" not in plain["compute"]
    assert parse_profile(plain, tmp_path / "p.toml").compute.ddp_cpu_work_factor == 1.0
    for bad in (0.0, -1.0):
        data["compute"]["ddp_cpu_work_factor"] = bad
        with pytest.raises(PerfmodelError, match="ddp_cpu_work_factor"):
            parse_profile(data, tmp_path / "bad.toml")


# -- the suite ------------------------------------------------------------------------------

def test_the_full_cpu_suite_times_ddp_crowded_at_three_ranks_per_core():
    full = build_suite("cpu", suite="local")
    crowded = [m for m in full if m.key.startswith("ddp-crowded-")]
    assert len(crowded) == CROWDED_DDP_REPEATS
    for m in crowded:
        assert m.config["kind"] == "ddp" and m.config["workers"] == 6 and m.nproc == 6
        assert m.config["workload"] == "mlp" and m.oversubscribe and m.optional
        assert m.config["compute_mode"] == "timed-wait"
        assert m.config["compute_wait_s"]["optimizer"] > 0        # a DDP rank steps itself
    for quick, kind in ((True, "cpu"), (False, "cuda")):
        assert not [m for m in build_suite(kind, suite="local", quick=quick)
                    if m.key.startswith("ddp-crowded-")]
    check_disjoint(held_out_set(False), [m.config for m in full])   # not a held-out run


def test_the_crowded_runs_are_spread_through_the_training_runs():
    # Four, none next to another: the node's CPU a step moves with the host's phase (report
    # 54's two back-to-back runs: factor 1.10 and 1.27), so the median takes runs minutes apart
    full = build_suite("cpu", suite="local")
    training = [m for m in full if m.config["kind"] in ("ddp", "fsdp", "ps")]
    at = [i for i, m in enumerate(training) if m.key.startswith("ddp-crowded-")]
    assert CROWDED_DDP_REPEATS == len(at) >= 4
    assert all(b - a >= 2 for a, b in zip(at, at[1:], strict=False))
    assert at[0] <= 2 and at[-1] < len(training) - 2      # from the first runs to the last
    assert [training[i].config["calibration"]["repeat"] for i in at] == \
        list(range(1, CROWDED_DDP_REPEATS + 1))


# -- real runs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("crowded")
    store = Store(root / "store.sqlite")
    load_into_store(RUNS, store, root / "runs")
    runs = [store.get_run(r.id) for r in store.list_runs()]
    profile = parse_profile(tomllib.loads(PROFILE.read_text()), PROFILE)
    return runs, profile


def test_six_ranks_factor_predicts_the_four_and_eight_rank_runs_work(recorded):
    # The suite times 6 ranks; the held-out runs have 4 and 8. On these real runs the factor
    # fitted at 6 ranks must give the 4- and 8-rank runs' CPU work within three standard
    # deviations of a run's own noise, estimated from the fixture's repeat pairs (the
    # difference of two pair means has the SD of one run).
    runs, profile = recorded
    by_ranks: dict[int, list] = {}
    for r in runs:
        by_ranks.setdefault(int(r.row.workers), []).append(r)
    assert sorted(by_ranks) == [4, 6, 8] and all(len(v) == 2 for v in by_ranks.values())
    notes: list[str] = []
    six = _ddp_cpu_work(by_ranks[6], profile, notes)
    assert six is not None and six.points == 2 and "ddp_cpu_work_factor" in notes[0]
    factors = {p: _ddp_cpu_work(v, profile, []).value for p, v in by_ranks.items()}
    pairs = [(_ddp_cpu_work([a], profile, []).value, _ddp_cpu_work([b], profile, []).value)
             for a, b in by_ranks.values()]
    rel = np.array([(a - b) / ((a + b) / 2) for a, b in pairs])
    sd_one_run = float(np.sqrt(np.mean(rel ** 2) / 2))
    for p in (4, 8):
        assert abs(factors[p] / six.value - 1) <= 3 * sd_one_run, (p, factors, sd_one_run)


def test_calibration_fits_the_factor_from_crowded_ddp_runs_only(tmp_path):
    # set A with the crowded runs beside the recorded 2-core calibration runs: the factor is
    # fitted and written, and a DDP timed wait never feeds the PS timed waits' spread
    store = Store(tmp_path / "store.sqlite")
    load_into_store(FIXTURES / "local_runs.json", store, tmp_path / "a")
    load_into_store(RUNS, store, tmp_path / "b")
    suite = [r.id for r in store.list_runs() if r.config.get("calibration")]
    crowded = [r.id for r in store.list_runs() if r.config.get("compute_mode") == "timed-wait"]
    cal = calibrate_runs(store, suite + crowded)
    assert cal.fits.ddp_cpu_work_factor is not None and cal.fits.ddp_cpu_work_factor.points == 6
    assert cal.fits.ddp_cpu_work_factor.value > 0
    assert cal.fits.timed_wait_spread is None
    assert any("ddp_cpu_work_factor" in n for n in cal.notes)
    assert calibrate_runs(store, suite).fits.ddp_cpu_work_factor is None
