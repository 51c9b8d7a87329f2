"""A pooled set A (calibration/pool.py): several stores' calibration runs fitted as one.

The recorded fixture (tests/fixtures/local_runs.json, runs 1-9 the `local` suite) is pooled
with itself and with a copy whose collectives took twice as long; no torch job runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibration.driver import pool_sources
from calibration.from_store import calibrate_runs
from calibration.pool import ID_STRIDE, PooledStore, PoolSource
from calibration.suite import build_suite
from measure.store import Store
from perfmodel.compare.comparison import pooled_sources
from perfmodel.errors import PerfmodelError
from tests.fixtures.runs_json import load_into_store

FIXTURE = Path(__file__).parent / "fixtures" / "local_runs.json"


@pytest.fixture(scope="module")
def suite_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    store = Store(root / "store.sqlite")
    load_into_store(FIXTURE, store, root / "runs")
    ids = tuple(r.id for r in store.list_runs() if r.config.get("calibration"))
    return store, ids


class _Scaled:
    """A store whose `table` records' `field` took `factor` times as long: another session's
    state (collectives) or another machine (compute)."""

    def __init__(self, store: Store, factor: float, table: str = "collectives",
                 field: str = "time_s", path: str = "slower.sqlite"):
        self.store, self.factor, self.path = store, factor, Path(path)
        self.table, self.field = table, field

    def get_run(self, run_id: int):
        run = self.store.get_run(run_id)
        rows = [dict(c, **{self.field: c[self.field] * self.factor})
                for c in run.table(self.table)]
        return dataclasses.replace(run, records={**run.records, self.table: rows})


def _other_machine(store: Store, factor: float) -> _Scaled:
    return _Scaled(store, factor, "compute", "median_s", "other-machine.sqlite")


def test_pooled_ids_say_which_store_each_run_came_from(suite_store):
    store, ids = suite_store
    pooled = PooledStore([PoolSource(store, ids), PoolSource(store, ids[:2])])
    assert pooled.ids == [*ids, ID_STRIDE + ids[0], ID_STRIDE + ids[1]]
    run = pooled.get_run(ID_STRIDE + ids[1])
    assert run.row.id == ID_STRIDE + ids[1]
    assert run.row.kind == store.get_run(ids[1]).row.kind
    first, second = pooled.describe()
    assert first.endswith(f"runs {ids[0]}-{ids[-1]}")
    assert second.endswith(f"as {ID_STRIDE + ids[0]}-{ID_STRIDE + ids[1]}")
    with pytest.raises(PerfmodelError, match="2 store"):
        pooled.get_run(2 * ID_STRIDE + 1)
    with pytest.raises(PerfmodelError, match="at least one store"):
        PooledStore([])


def test_one_store_pooled_with_itself_fits_what_it_fits_alone(suite_store):
    store, ids = suite_store
    alone = calibrate_runs(store, ids).profile("local")
    pooled = PooledStore([PoolSource(store, ids), PoolSource(store, ids)])
    twice = calibrate_runs(pooled, pooled.ids).profile("local")
    for section, key in (("intra_node", "bandwidth_GBps"), ("intra_node", "latency_us"),
                         ("compute", "overhead_us_per_unit"), ("compute", "optimizer_GBps"),
                         ("compute", "overlap_slowdown"), ("server", "apply_GBps")):
        assert math.isclose(twice[section][key], alone[section][key], rel_tol=1e-9), key
    assert any(n.startswith("pooled set A of 2 stores") for n in twice["calibration"]["notes"])
    assert not any("pooled" in n for n in alone["calibration"]["notes"])


def test_a_slower_session_pooled_in_gives_a_bandwidth_between_the_two(suite_store):
    store, ids = suite_store
    fast = calibrate_runs(store, ids).profile("local")["intra_node"]["bandwidth_GBps"]
    slow_store = _Scaled(store, 2.0)
    slow_pool = PooledStore([PoolSource(slow_store, ids)])
    slow = calibrate_runs(slow_pool, slow_pool.ids).profile("local")["intra_node"]
    assert math.isclose(slow["bandwidth_GBps"], fast / 2, rel_tol=1e-6)
    both = PooledStore([PoolSource(store, ids), PoolSource(slow_store, ids)])
    mixed = calibrate_runs(both, both.ids).profile("local")["intra_node"]["bandwidth_GBps"]
    assert fast / 2 * 1.05 < mixed < fast / 1.05


def test_a_pooled_store_without_the_suite_is_one_clear_error(tmp_path):
    empty = Store(tmp_path / "empty.sqlite")
    with pytest.raises(PerfmodelError, match=r"--pool .*empty\.sqlite.*no complete full"):
        pooled_sources((empty,), "local", "full", here="vm", allow=False)
    with pytest.raises(PerfmodelError, match=r"--pool .*empty\.sqlite: \d+ of this suite"):
        pool_sources(build_suite("cpu", suite="local"), [empty], host="vm")


def test_cli_pool_with_a_fitted_profile_is_refused_in_one_line(tmp_path):
    other = tmp_path / "other.sqlite"
    Store(other).list_runs()
    other.write_bytes(b"")
    profile = tmp_path / "p.toml"
    profile.write_text('name = "x"\n')
    done = subprocess.run(
        [sys.executable, "-m", "perfmodel", "compare", "--cluster", "local", "--predict-only",
         "--db", str(tmp_path / "s.sqlite"), "--profile", str(profile), "--pool", str(other),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert "--pool" in done.stderr and "--profile" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_store_of_another_machine_is_refused_and_one_of_this_machine_is_not(suite_store):
    store, ids = suite_store
    assert any(store.get_run(i).table("compute") for i in ids)     # the check has data
    other = PooledStore([PoolSource(store, ids), PoolSource(_other_machine(store, 1.8), ids)])
    with pytest.raises(PerfmodelError, match=r"other-machine\.sqlite: its compute took "
                                             r"1\.80x .* another machine"):
        calibrate_runs(other, other.ids)
    faster = PooledStore([PoolSource(store, ids), PoolSource(_other_machine(store, 0.55), ids)])
    with pytest.raises(PerfmodelError, match=r"0\.55x"):
        calibrate_runs(faster, faster.ids)
    same = PooledStore([PoolSource(store, ids), PoolSource(_other_machine(store, 1.1), ids)])
    notes = calibrate_runs(same, same.ids).notes
    assert any("median unit-timing ratio" in n and "1.10" in n for n in notes)
