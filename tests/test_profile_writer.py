"""The measured-profile writer: TOML that perfmodel loads back exactly, written atomically.

Checks: the written profile loads with perfmodel.cluster.load_cluster from $PERFMODEL_PROFILES
with every fitted value bit-for-bit (Python's float repr round-trips, and is valid TOML 1.0);
a crash before os.replace leaves the old profile intact (POSIX rename(2) atomicity); an existing
profile is backed up first; a profile that would not load is never written.
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibration.fit import FitResult
from calibration.fit_compute import fit_compute
from calibration.fit_network import fit_network
from calibration.profile_writer import (
    MeasuredFits,
    RunInfo,
    build_profile,
    write_profile,
)
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import to_toml
from perfmodel.uncertainty import calibration_errors
from tests.test_calibration_fit import UNITS, compute_cluster, sweep, truth_cluster, unit_timings

NOW = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
INFO = RunInfo(host="testhost", device_names=("CPU core", "CPU core"),
               versions="torch 2.13.0, gloo", runs=7, run_spread_cv=0.12,
               date="2025-03-01T12:00:00+00:00")


def fr(parameter: str, value: float) -> FitResult:
    return FitResult(parameter=parameter, value=value, stderr=0.01 * value, rms_rel=0.03,
                     max_rel=0.08, points=20)


@pytest.fixture(scope="module")
def fits() -> MeasuredFits:
    network = fit_network(sweep(truth_cluster(), np.random.default_rng(1), ranks=(2, 8)))
    compute = fit_compute(unit_timings(compute_cluster(((1.0, 0.45),)),
                                       np.random.default_rng(3)), UNITS, peak_TFLOPS=0.08)
    return MeasuredFits(intra_node=network["intra_node"], inter_node=network["inter_node"],
                        compute=compute, jitter_cv=fr("compute.jitter_cv", 0.04),
                        overlap_slowdown=fr("compute.overlap_slowdown", 1.17),
                        server_apply_GBps=fr("server.apply_GBps", 1.9))


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_PROFILES", str(tmp_path))
    return tmp_path


def test_written_profile_loads_with_every_fitted_value(fits, profiles):
    base = load_cluster("local")
    data = build_profile("local", base, fits, INFO)
    result = write_profile(data, now=NOW)
    assert result.path == profiles / "local.toml" and result.backup is None
    assert result.path.stat().st_mode & 0o777 == 0o644           # not mkstemp's private 0600
    c = load_cluster("local")                     # the user folder shadows the shipped one
    assert c.path == result.path
    assert c.provenance.source == "measured" and c.provenance.runs == 7
    assert c.provenance.host == "testhost" and "torch 2.13.0" in c.provenance.versions
    assert c.device.name == "CPU core"
    net, comp = fits.intra_node, fits.compute
    assert c.intra_node.latency_us == net.latency_us.value            # exact: repr round-trips
    assert c.intra_node.bandwidth_GBps == net.bandwidth_GBps.value
    assert c.intra_node.efficiency_by_bytes == net.efficiency_by_bytes
    assert net.time_factor_by_op and dict(c.intra_node.time_factor_by_op) == \
        net.time_factor_by_op                         # all-gather, broadcast vs all-reduce
    assert c.comm_cpu_cores_per_node == base.comm_cpu_cores_per_node   # INFO names no cores
    assert c.inter_node.bandwidth_GBps == fits.inter_node.bandwidth_GBps.value
    assert c.compute.efficiency_by_flops == comp.efficiency_by_flops
    assert c.compute.overhead_us_per_unit == comp.overhead_us_per_unit.value
    assert c.compute.jitter_cv == 0.04 and c.server.apply_GBps == 1.9
    # what was not measured comes from the base profile
    assert c.device.peak_TFLOPS == base.device.peak_TFLOPS
    assert c.compute.optimizer_GBps == base.compute.optimizer_GBps
    assert c.devices_per_node == base.devices_per_node
    raw = tomllib.loads(result.path.read_text())
    assert raw["compute"]["overlap_slowdown"] == 1.17                 # proposed field
    assert "compute.optimizer_GBps" in raw["calibration"]["unmeasured"]
    residual = raw["calibration"]["residuals"]["intra_node.latency_us"]
    assert residual["rms_rel"] == net.latency_us.rms_rel
    errors = calibration_errors(raw)
    assert errors.run_spread_cv == 0.12
    assert errors.network_rms_rel == max(net.latency_us.rms_rel,
                                         fits.inter_node.latency_us.rms_rel)
    assert errors.compute_rms_rel == comp.overhead_us_per_unit.rms_rel


def test_existing_profile_is_backed_up_first(fits, profiles):
    data = build_profile("local", load_cluster("local"), fits, INFO)
    write_profile(data, now=NOW)
    first = (profiles / "local.toml").read_bytes()
    second = write_profile({**data, "description": "second calibration"}, now=NOW)
    assert second.backup == profiles / "local.toml.bak-20250301T120000Z"
    assert second.backup.read_bytes() == first
    third = write_profile(data, now=NOW)                   # same second: a numbered backup
    assert third.backup.name == "local.toml.bak-20250301T120000Z-2"
    assert load_cluster("local").description == data["description"]
    assert sorted(p.name for p in profiles.glob("*.toml")) == ["local.toml"]


@pytest.mark.parametrize("crash", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_crash_before_replace_leaves_the_old_profile(fits, profiles, monkeypatch, crash):
    data = build_profile("local", load_cluster("local"), fits, INFO)
    write_profile(data, now=NOW)
    old = (profiles / "local.toml").read_bytes()

    def fail(*args, **kwargs):
        raise crash

    monkeypatch.setattr(os, "replace", fail)
    expected = PerfmodelError if isinstance(crash, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        write_profile({**data, "description": "never lands"}, now=NOW)
    assert (profiles / "local.toml").read_bytes() == old
    assert not list(profiles.glob(".*.tmp"))                      # no temporary left behind
    assert load_cluster("local").description == data["description"]


def test_profile_that_would_not_load_is_never_written(fits, profiles):
    data = build_profile("local", load_cluster("local"), fits, INFO)
    bad = {**data, "intra_node": {**data["intra_node"], "efficiency_by_bytes": [[1e3, 1.5]]}}
    with pytest.raises(PerfmodelError, match="fractions must lie in"):
        write_profile(bad, now=NOW)
    nan = {**data, "server": {**data["server"], "apply_GBps": float("nan")}}
    with pytest.raises(PerfmodelError, match="server.apply_GBps"):
        write_profile(nan, now=NOW)
    with pytest.raises(PerfmodelError, match="profile name"):
        write_profile({**data, "name": "../escape"}, now=NOW)
    assert list(profiles.iterdir()) == []


def test_new_name_builds_on_a_base_profile(fits, profiles):
    data = build_profile("mybox", load_cluster("local"), MeasuredFits(), INFO)
    write_profile(data, now=NOW)
    c = load_cluster("mybox")
    assert c.name == "mybox" and c.provenance.source == "measured"
    assert calibration_errors(tomllib.loads(c.path.read_text())) is None   # nothing fitted


def test_shipped_profiles_survive_a_round_trip(tmp_path):
    # every field of the hand-written profiles survives to_toml -> tomllib -> parse_profile
    for name in ("a100", "a10g", "local"):
        c = load_cluster(name)
        raw = tomllib.loads(c.path.read_text())
        again = tomllib.loads(to_toml(raw))
        assert again == raw
        assert parse_profile(again, tmp_path / f"{name}.toml").intra_node == c.intra_node


KEYS = st.text(min_size=1, max_size=12)
SCALARS = (st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2**63, 2**63 - 1)
           | st.booleans() | st.text(max_size=30))


@given(st.dictionaries(KEYS, SCALARS | st.lists(SCALARS, max_size=4)
                       | st.dictionaries(KEYS, SCALARS, max_size=4), max_size=6))
def test_toml_text_round_trips(data):
    # TOML 1.0: any string (quotes, backslashes, control characters) and any finite float
    assert tomllib.loads(to_toml(data)) == data


def test_a_ping_pong_fit_is_written_as_the_links_p2p_table(fits, profiles):
    import dataclasses

    from calibration.fit_network import CollectiveSample
    pings = [CollectiveSample(op="ping-pong", ranks=2, bytes=float(n), time_s=50e-6 + n / 3e9)
             for n in (1e3, 1e5, 1e7)]
    rings = sweep(truth_cluster(), np.random.default_rng(1), ranks=(2,))
    intra = fit_network(rings + pings)["intra_node"]
    data = build_profile("local", load_cluster("local"),
                         dataclasses.replace(fits, intra_node=intra), INFO)
    c = load_cluster(str(write_profile(data, now=NOW).path))
    assert c.intra_node.p2p.latency_us == intra.p2p.latency_us.value
    assert c.intra_node.p2p.bandwidth_GBps == intra.p2p.bandwidth_GBps.value
    assert c.intra_node.point_to_point() is c.intra_node.p2p
    assert c.inter_node.p2p is None and c.inter_node.point_to_point() is c.inter_node
    assert "intra_node.p2p" not in data["calibration"]["unmeasured"]
    assert "intra_node.p2p.latency_us" in data["calibration"]["residuals"]
    # one message is no collective: a p2p table with time factors is refused
    data["intra_node"]["p2p"]["time_factor_by_op"] = {"all-reduce": 2.0}
    with pytest.raises(PerfmodelError, match="intra_node.p2p.time_factor_by_op"):
        parse_profile(data, profiles / "bad.toml")


def test_a_time_factor_for_an_unknown_collective_is_refused(tmp_path):
    data = tomllib.loads((Path(load_cluster("local").path)).read_text())
    data["intra_node"]["time_factor_by_op"] = {"all-to-all": 2.0}
    with pytest.raises(PerfmodelError, match="all-to-all"):
        parse_profile(data, tmp_path / "bad.toml")
    data["intra_node"]["time_factor_by_op"] = {"reduce-scatter": 3.0}
    assert parse_profile(data, tmp_path / "ok.toml").intra_node.time_factor(
        "reduce-scatter") == 3.0
