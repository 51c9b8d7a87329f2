"""Collectives when ranks outnumber the cores: the model (ClusterProfile.comm_cpu_share), the
fit of its one parameter u (calibration/fit_comm_sharing.py) and where calibration takes it.

Synthetic sweeps are the simulator's own closed forms times 3 % Gaussian noise, as in
tests/test_calibration_fit.py, whose TIME_TOL (the fitted link's time against the truth, every
point) bounds how far the unshared model a stretch is measured against can be off.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibration.fit_comm_sharing import (
    byte_term_s,
    fit_busy_by_level,
    fit_comm_cpu_bound_fraction,
    fit_comm_sharing,
    fit_stretch_by_level,
    unshared_s,
)
from calibration.fit_network import CollectiveSample
from calibration.from_store import _network
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import Link, load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import collective_s
from tests.test_calibration_fit import NOISE, SIZES, TIME_TOL

CORES = 2
OPS = ("all-reduce", "all-gather", "reduce-scatter")
TRUE_U = 0.3


def host(u: float = 1.0):
    """A CPU host: 2 cores drive gloo, every rank on one node, reduce-scatter no ring."""
    link = Link(bandwidth_GBps=1.2, latency_us=700.0,
                efficiency_by_bytes=((1e3, 0.2), (1e6, 0.7), (1.6e7, 1.0)),
                time_factor_by_op={"reduce-scatter": 2.0})
    return dataclasses.replace(load_cluster("local"), intra_node=link, inter_node=link,
                               devices_per_node=64, comm_cpu_cores_per_node=CORES,
                               comm_cpu_bound_fraction=u)


def sweep(cluster, ranks, rng, sizes=SIZES[:15]):
    return [CollectiveSample(op=op, ranks=p, bytes=float(n),
                             time_s=collective_s(op, cluster, p, n) * (1 + NOISE * rng.normal()))
            for p in ranks for op in OPS for n in sizes]


@given(u=st.floats(0.0, 1.0), ranks=st.integers(1, 64), more=st.integers(1, 8))
def test_sharing_is_p_over_c_at_u_1_none_at_u_0_and_grows_with_u_and_ranks(u, ranks, more):
    c = host(u)
    share = c.comm_cpu_share(ranks)
    assert share == pytest.approx(1 - u + u * max(1.0, ranks / CORES))
    assert host(1.0).comm_cpu_share(ranks) == pytest.approx(max(1.0, ranks / CORES))
    assert host(0.0).comm_cpu_share(ranks) == 1.0
    assert c.comm_cpu_share(ranks + more) >= share
    assert host(min(1.0, u + 0.1)).comm_cpu_share(ranks) >= share
    if ranks <= CORES:
        assert share == 1.0
    # links that move data themselves share nothing, whatever u says
    assert dataclasses.replace(c, comm_cpu_cores_per_node=0).comm_cpu_share(ranks) == 1.0


def test_the_fit_recovers_u_and_then_predicts_8_ranks():
    truth, rng = host(TRUE_U), np.random.default_rng(7)
    crowded = sweep(truth, (4,), rng)
    # against the true links the only error is the noise: per point σ = 3 % / (p/c − 1)
    fit = fit_comm_cpu_bound_fraction(crowded, truth, CORES)
    assert fit.parameter == "topology.comm_cpu_bound_fraction"
    assert abs(fit.value - TRUE_U) <= 3 * fit.stderr
    assert fit.points == len(crowded) and fit.rms_rel <= 2 * NOISE
    # 8 ranks were not fitted: the stretch 1 + 3u holds them within the noise
    fitted = dataclasses.replace(truth, comm_cpu_bound_fraction=fit.value)
    for s in sweep(truth, (8,), rng):
        model = collective_s(s.op, fitted, s.ranks, s.bytes)
        assert abs(model / s.time_s - 1) <= 4 * NOISE + 3 * abs(fit.value - TRUE_U)
    # p/c (u = 1) is what the 4-rank runs refute: where the byte term is at least half the
    # time, (1 + f)/(1 + 0.3 f) >= 1.3x the truth at byte share f >= 0.5, less 3 % noise
    big = [s for s in crowded if byte_term_s(truth, s) >= 0.5 * unshared_s(truth, s)]
    assert len(big) >= 6
    assert all(collective_s(s.op, host(1.0), 4, s.bytes) / s.time_s > 1.15 for s in big)


def test_u_is_held_to_0_1_and_needs_crowded_samples():
    rng = np.random.default_rng(3)
    slower = [dataclasses.replace(s, time_s=s.time_s * 3) for s in sweep(host(1.0), (4,), rng)]
    assert fit_comm_cpu_bound_fraction(slower, host(), CORES).value == 1.0
    faster = [dataclasses.replace(s, time_s=s.time_s * 0.5) for s in sweep(host(0.0), (4,), rng)]
    assert fit_comm_cpu_bound_fraction(faster, host(), CORES).value == 0.0
    with pytest.raises(PerfmodelError, match="more ranks on a node than its 2 core"):
        fit_comm_cpu_bound_fraction(sweep(host(), (2,), rng), host(), CORES)
    # the reference time has no sharing in it, whatever the profile's u
    s = sweep(host(), (4,), rng)[0]
    assert unshared_s(host(1.0), s) == unshared_s(host(0.0), s) \
        == pytest.approx(collective_s(s.op, host(0.0), 4, s.bytes))


def _run(samples):
    """A stored collectives run as calibration/from_store.py reads it."""
    rows = [{"op": s.op, "bytes": s.bytes, "time_s": s.time_s}
            | ({"cpu_busy_fraction": s.cpu_busy_fraction} if s.cpu_busy_fraction else {})
            for s in samples]
    return SimpleNamespace(row=SimpleNamespace(world_size=samples[0].ranks, config={}),
                           table=lambda name: rows)


def test_calibration_fits_the_links_on_2_ranks_and_u_on_4():
    truth, rng = host(TRUE_U), np.random.default_rng(11)
    two, four = sweep(truth, (2,), rng), sweep(truth, (4,), rng)
    notes: list[str] = []
    links, u = _network([_run(two), _run(four)], host(), host(), notes)
    u = u.fraction
    assert abs(u.value - TRUE_U) <= 3 * u.stderr + TIME_TOL        # links fitted, not true
    assert links["intra_node"].bandwidth_GBps.value == pytest.approx(1.2, rel=0.05)
    assert any("u = " in n for n in notes)
    # the links alone are the 2-rank sweep's: the 4-rank one moves only u
    alone, none = _network([_run(two)], host(), host(), [])
    assert none is None
    assert alone["intra_node"].bandwidth_GBps.value == links["intra_node"].bandwidth_GBps.value
    # a store with only 4-rank sweeps fits the links through p/c, as before u existed
    links4, u4 = _network([_run(four)], host(), host(), [])
    assert u4 is None and links4["intra_node"].bandwidth_GBps.value > 0


def test_u_is_written_to_the_profile_and_read_back(tmp_path):
    base = load_cluster("local")
    fit = fit_comm_cpu_bound_fraction(sweep(host(TRUE_U), (4,), np.random.default_rng(5)),
                                      host(TRUE_U), CORES)
    info = RunInfo(host="h", device_names=("CPU core",), versions="torch", runs=1,
                   date="2026-12-03T00:00:00+00:00")
    data = build_profile("local", base, MeasuredFits(comm_cpu_bound_fraction=fit), info)
    c = parse_profile(data, tmp_path / "p.toml")
    assert c.comm_cpu_bound_fraction == fit.value
    assert "topology.comm_cpu_bound_fraction" in data["calibration"]["measured"]
    # not measured: the base's value (1: p/c) stays, and says so
    data = build_profile("local", base, MeasuredFits(), info)
    assert parse_profile(data, tmp_path / "q.toml").comm_cpu_bound_fraction == 1.0
    assert "topology.comm_cpu_bound_fraction" in data["calibration"]["unmeasured"]
    raw = tomllib.loads(Path(base.path).read_text())
    raw["topology"]["comm_cpu_bound_fraction"] = 1.5
    with pytest.raises(PerfmodelError, match="comm_cpu_bound_fraction' = 1.5 is not <= 1"):
        parse_profile(raw, tmp_path / "bad.toml")


def test_one_crowded_timing_is_no_fit_and_no_failed_calibration():
    truth, rng = host(TRUE_U), np.random.default_rng(2)
    one = sweep(truth, (4,), rng)[:1]
    with pytest.raises(PerfmodelError, match=">= 2 collective timings"):
        fit_comm_cpu_bound_fraction(one, truth, CORES)
    notes: list[str] = []
    links, u = _network([_run(sweep(truth, (2,), rng)), _run(one)], host(), host(), notes)
    assert u is None and links["intra_node"] and any("stays" in n for n in notes)


def test_the_latency_steps_do_not_share_the_cores():
    """Only the byte term stretches: a 0-byte collective takes its latency at any u, and
    the stretch of the byte term alone is 1 − u + u·p/c."""
    for op in OPS:
        assert collective_s(op, host(1.0), 8, 0.0) == pytest.approx(collective_s(op, host(0.0),
                                                                                   8, 0.0))
        n = 8e6
        byte = {u: collective_s(op, host(u), 8, n) - collective_s(op, host(u), 8, 0.0)
                for u in (0.0, 0.5)}
        assert byte[0.5] / byte[0.0] == pytest.approx(1 - 0.5 + 0.5 * 8 / CORES)


def curved(points):
    return dataclasses.replace(host(0.5), comm_cpu_bound_by_bytes=points)


def test_u_by_size_is_interpolated_and_flat_beyond_its_ends():
    c = curved(((1e6, 0.1), (1.6e7, 0.7)))
    assert c.comm_cpu_bound(1e3) == 0.1 and c.comm_cpu_bound(1e9) == 0.7
    assert c.comm_cpu_bound(4e6) == pytest.approx(0.4)         # halfway in log size
    assert c.comm_cpu_bound(None) == 0.5                       # the one value
    assert c.comm_cpu_share(4, 1.6e7) == pytest.approx(1 - 0.7 + 0.7 * 2)
    assert host(0.5).comm_cpu_bound(1.6e7) == 0.5              # no curve: the one value


def test_the_fit_recovers_u_by_size_where_one_value_cannot():
    truth = curved(((1e6, 0.0), (1.6e7, 0.8)))
    rng = np.random.default_rng(13)
    crowded = sweep(truth, (4,), rng) + sweep(truth, (4,), rng) + sweep(truth, (4,), rng)
    fit = fit_comm_sharing(crowded, truth, CORES)
    points = dict(fit.by_bytes)
    assert max(points) == 2.0 ** 24 and min(points) >= 2.0 ** 16
    for n, u in points.items():
        # per point σ = 3 % / ((p/c − 1) · byte share >= 0.2): the median of 9 within 0.2
        assert abs(u - truth.comm_cpu_bound(n)) <= 0.2
    assert points[2.0 ** 24] > points[min(points)]
    # 8 ranks, 16 MiB, unfitted: the curve holds them, the one value does not
    with_curve = dataclasses.replace(truth, comm_cpu_bound_by_bytes=fit.by_bytes)
    one = dataclasses.replace(truth, comm_cpu_bound_by_bytes=(),
                              comm_cpu_bound_fraction=fit.fraction.value)
    for op in OPS:
        exact = collective_s(op, truth, 8, 2.0 ** 24)
        assert abs(collective_s(op, with_curve, 8, 2.0 ** 24) / exact - 1) <= 0.2
        assert abs(collective_s(op, one, 8, 2.0 ** 24) / exact - 1) > \
            abs(collective_s(op, with_curve, 8, 2.0 ** 24) / exact - 1)


def test_u_by_size_is_written_read_back_and_checked(tmp_path):
    base = load_cluster("local")
    fit = fit_comm_sharing(sweep(host(TRUE_U), (4,), np.random.default_rng(5)), host(TRUE_U),
                           CORES)
    info = RunInfo(host="h", device_names=("CPU core",), versions="torch", runs=1,
                   date="2026-12-03T00:00:00+00:00")
    data = build_profile("local", base, MeasuredFits(comm_cpu_bound_fraction=fit.fraction,
                                                     comm_cpu_bound_by_bytes=fit.by_bytes),
                         info)
    c = parse_profile(data, tmp_path / "p.toml")
    assert c.comm_cpu_bound_by_bytes == tuple((n, round(u, 4)) for n, u in fit.by_bytes)
    assert "topology.comm_cpu_bound_by_bytes" in data["calibration"]["measured"]
    data["topology"]["comm_cpu_bound_by_bytes"] = [[1e6, 0.0], [2e6, 1.2]]
    with pytest.raises(PerfmodelError, match=r"must lie in \[0, 1\]"):
        parse_profile(data, tmp_path / "bad.toml")


# ---------------------------------------------------------------- the stretch by level

ROWS = ((2.0, 1e6, 2.0), (2.0, 1.6e7, 2.2), (4.0, 1e6, 2.5), (4.0, 1.6e7, 1.75))
TABLE = (("all-reduce", ROWS), ("all-gather", ((2.0, 1e6, 1.2), (4.0, 1e6, 1.4))))


def leveled(table=TABLE):
    return dataclasses.replace(host(0.5), comm_cpu_stretch_by_level=table)


def test_the_measured_stretch_is_read_by_level_and_size_and_replaces_u():
    c = leveled()
    assert c.comm_cpu_stretch(2, 1e6) == 1.0 and c.comm_cpu_stretch(1, 1e6) == 1.0
    assert c.comm_cpu_stretch(4, 1e6) == pytest.approx(2.0)       # a measured point
    assert c.comm_cpu_stretch(8, 1.6e7) == pytest.approx(1.75)
    assert c.comm_cpu_stretch(8, 1e3) == pytest.approx(2.5)       # flat below the sizes
    assert c.comm_cpu_stretch(4, 4e6) == pytest.approx(2.1)       # halfway in log size
    assert c.comm_cpu_stretch(3, 1e6) == pytest.approx(1.5)       # 1 at p/c = 1 to 2.0 at 2
    assert c.comm_cpu_stretch(6, 1e6) == pytest.approx(2.25)      # between the levels
    assert c.comm_cpu_stretch(16, 1e6) == pytest.approx(2.5)      # flat beyond the last level
    assert c.comm_cpu_share(8, 1e6) == 1.0                        # u no longer applies
    assert host(0.5).comm_cpu_stretch(8, 1e6) == 1.0              # no table: u's model
    assert c.comm_cpu_stretch(8, 1e6, "all-gather") == pytest.approx(1.4)    # its own kind
    assert c.comm_cpu_stretch(6, 1e6, "all-gather") == pytest.approx(1.3)
    assert c.comm_cpu_stretch(8, 1e6, "reduce-scatter") == pytest.approx(2.5)   # all-reduce's
    for op in OPS:        # the whole collective, latency steps included, stretches
        for n in (0.0, 1e6, 1.6e7):
            plain = dataclasses.replace(c, comm_cpu_stretch_by_level=(),
                                        comm_cpu_bound_fraction=0.0, comm_cpu_bound_by_bytes=())
            assert collective_s(op, c, 8, n) == pytest.approx(
                collective_s(op, plain, 8, n) * c.comm_cpu_stretch(8, n, op))


def _stretched_sweep(table, ranks, rng):
    """Timings whose whole time is the unshared model's times the table's stretch."""
    truth = leveled(table)
    return [dataclasses.replace(s, time_s=unshared_s(truth, s) * truth.comm_cpu_stretch(
        s.ranks, s.bytes, s.op) * (1 + NOISE * rng.normal())) for s in sweep(truth, ranks, rng)]


def test_the_fit_recovers_the_stretch_at_each_level_and_needs_two_levels():
    rng = np.random.default_rng(17)
    crowded = [s for _ in range(3) for s in _stretched_sweep(TABLE, (4, 8), rng)]
    table = fit_stretch_by_level(crowded, leveled(()), CORES)
    assert [op for op, _ in table] == sorted(OPS)
    assert all({lv for lv, _, _ in rows} == {2.0, 4.0} for _, rows in table)
    fitted = leveled(table)
    for op in OPS:
        for ranks in (4, 6, 8):
            for n in (2.0 ** 20, 2.0 ** 22, 2.0 ** 24):
                # the median of 3 timings at 3 % noise: within 8 % (4.6 sigma of one) of
                # the truth, which the sweep's sizes (powers of 2) log-interpolate
                assert fitted.comm_cpu_stretch(ranks, n, op) == pytest.approx(
                    leveled().comm_cpu_stretch(ranks, n, op), rel=0.08)
    four_only = [s for s in crowded if s.ranks == 4]
    assert fit_stretch_by_level(four_only, leveled(()), CORES) == ()
    assert fit_comm_sharing(crowded, leveled(()), CORES).by_level == table


def test_the_stretch_table_is_written_read_back_and_checked(tmp_path):
    base = load_cluster("local")
    info = RunInfo(host="h", device_names=("CPU core",), versions="torch", runs=1,
                   date="2026-12-04T00:00:00+00:00")
    fit = fit_comm_cpu_bound_fraction(sweep(host(TRUE_U), (4,), np.random.default_rng(5)),
                                      host(TRUE_U), CORES)
    data = build_profile("local", base, MeasuredFits(comm_cpu_bound_fraction=fit,
                                                     comm_cpu_stretch_by_level=TABLE), info)
    assert parse_profile(data, tmp_path / "p.toml").comm_cpu_stretch_by_level == TABLE
    assert data["topology"]["comm_cpu_stretch_by_level"]["all-gather"] == [[2.0, 1e6, 1.2],
                                                                           [4.0, 1e6, 1.4]]
    assert "topology.comm_cpu_stretch_by_level" in data["calibration"]["measured"]
    plain = build_profile("local", base, MeasuredFits(comm_cpu_bound_fraction=fit), info)
    assert "comm_cpu_stretch_by_level" not in plain["topology"]
    assert parse_profile(plain, tmp_path / "q.toml").comm_cpu_stretch_by_level == ()
    for bad, says in (([[1.0, 1e6, 2.0]], "must exceed 1"), ([[2.0, 1e6]], "rows"),
                      ([[2.0, 2e6, 2.0], [2.0, 1e6, 2.0]], "sizes must increase")):
        data["topology"]["comm_cpu_stretch_by_level"] = {"all-reduce": bad}
        with pytest.raises(PerfmodelError, match=f"comm_cpu_stretch_by_level.all-reduce.*{says}"):
            parse_profile(data, tmp_path / "bad.toml")


# ---------------------------------------------------------------- the busy share of the cores

def busy_sweep(shares: dict[int, float], rng, sizes=SIZES[:15]):
    """Crowded timings whose ranks each used share·c/p of a core (3 % noise on it)."""
    return [dataclasses.replace(s, cpu_busy_fraction=shares[s.ranks] * CORES / s.ranks
                                * (1 + NOISE * rng.normal()))
            for s in sweep(host(TRUE_U), tuple(shares), rng, sizes)]


def test_the_busy_share_is_read_by_level_linear_between_flat_beyond_and_1_without():
    c = dataclasses.replace(host(0.5), comm_cpu_busy_by_level=((2.0, 0.8), (4.0, 0.9)))
    assert c.comm_cpu_busy(4) == pytest.approx(0.8) and c.comm_cpu_busy(8) == pytest.approx(0.9)
    assert c.comm_cpu_busy(6) == pytest.approx(0.85)               # halfway in p/c
    assert c.comm_cpu_busy(3) == pytest.approx(0.8)                # flat below the first level
    assert c.comm_cpu_busy(16) == pytest.approx(0.9)               # and beyond the last
    assert c.comm_cpu_busy(2) == 1.0 and c.comm_cpu_busy(1) == 1.0    # the ranks fit
    assert host(0.5).comm_cpu_busy(8) == 1.0                       # nothing measured
    assert dataclasses.replace(c, comm_cpu_cores_per_node=0).comm_cpu_busy(8) == 1.0   # GPUs


def test_the_fit_recovers_the_busy_share_per_level_from_1_MiB_and_ignores_the_rest():
    rng = np.random.default_rng(23)
    crowded = busy_sweep({4: 0.84, 8: 0.89}, rng)
    # a small message's share says nothing (wake-ups): set it wrong, the fit must not see it
    crowded = [dataclasses.replace(s, cpu_busy_fraction=0.01) if s.bytes < 2**20 else s
               for s in crowded]
    levels = fit_busy_by_level(crowded, CORES)
    assert [lv for lv, _ in levels] == [2.0, 4.0]
    # a median of >= 15 points at 3 % noise: within 3 % (> 4 sigma of the median)
    assert levels[0][1] == pytest.approx(0.84, rel=0.03)
    assert levels[1][1] == pytest.approx(0.89, rel=0.03)
    assert fit_comm_sharing(crowded, host(TRUE_U), CORES).busy_by_level == levels
    # held to (0, 1]: a rank cannot keep more than the cores busy
    assert fit_busy_by_level(busy_sweep({4: 1.3}, rng), CORES)[0][1] == 1.0
    # not recorded (stores from before), or only the ranks that fit the cores: none
    assert fit_busy_by_level(sweep(host(TRUE_U), (4, 8), rng), CORES) == ()
    assert fit_busy_by_level(busy_sweep({2: 0.7}, rng), CORES) == ()


def test_the_busy_share_is_written_read_back_and_checked(tmp_path):
    base = load_cluster("local")
    info = RunInfo(host="h", device_names=("CPU core",), versions="torch", runs=1,
                   date="2026-12-06T00:00:00+00:00")
    levels = ((2.0, 0.84), (4.0, 0.89))
    data = build_profile("local", base, MeasuredFits(comm_cpu_busy_by_level=levels), info)
    assert data["topology"]["comm_cpu_busy_by_level"] == [[2.0, 0.84], [4.0, 0.89]]
    assert "topology.comm_cpu_busy_by_level" in data["calibration"]["measured"]
    assert parse_profile(data, tmp_path / "p.toml").comm_cpu_busy_by_level == levels
    plain = build_profile("local", base, MeasuredFits(), info)
    assert "comm_cpu_busy_by_level" not in plain["topology"]
    for bad in ([[2.0, 1.2]], [[4.0, 0.9], [2.0, 0.8]], [[2.0]]):
        data["topology"]["comm_cpu_busy_by_level"] = bad
        with pytest.raises(PerfmodelError, match="comm_cpu_busy_by_level"):
            parse_profile(data, tmp_path / "bad.toml")


def test_calibration_reads_the_busy_share_from_the_stored_sweeps():
    rng = np.random.default_rng(29)
    two = sweep(host(TRUE_U), (2,), rng)
    four, eight = busy_sweep({4: 0.84}, rng), busy_sweep({8: 0.89}, rng)
    notes: list[str] = []
    _, fit = _network([_run(two), _run(four), _run(eight)], host(), host(), notes)
    assert [lv for lv, _ in fit.busy_by_level] == [2.0, 4.0]
    assert fit.busy_by_level[0][1] == pytest.approx(0.84, rel=0.03)
    assert any("comm_cpu_busy_by_level" in n for n in notes)
