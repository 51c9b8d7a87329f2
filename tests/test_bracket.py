"""Set A before and after set B, set B predicted from each (perfmodel/compare/bracket.py).

Two committed set As of one machine stand in for "before" and "after": report 52's (fitted
compute.ddp_cpu_work_factor 1.08) and report 53's (0.84), copied into one store as
tests/test_set_a_gate.py does. The end-to-end --quick comparison in tests/test_compare.py
runs bracketed, its closing set A the recorded fixture loaded a second time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from measure.store import Store
from perfmodel.cluster import parse_profile
from perfmodel.compare import bracket, comparison, run
from perfmodel.compare.protocol import (
    WAIT_FIELDS,
    compute_wait,
    held_out_set,
    with_waits_of,
)
from perfmodel.errors import PerfmodelError
from tests.test_set_a_gate import REPORTS, copy_runs

REPO = Path(__file__).resolve().parent.parent
SET_A = {n: next((REPORTS / f"local-2026-12-06-heldout-{n}" / "pooled").glob("*.sqlite"))
         for n in (52, 53)}
FIXTURE = REPO / "tests" / "fixtures" / "local_runs.json"


def _profile(n: int):
    path = REPORTS / f"local-2026-12-06-heldout-{n}" / "profile.toml"
    return parse_profile(tomllib.loads(path.read_text()), path)


@pytest.fixture(scope="module")
def two_set_as(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("bracket") / "store.sqlite")
    before = copy_runs(SET_A[52], store)
    after = copy_runs(SET_A[53], store)
    return store, before, after


# ---------------------------------------------------------------- the waits a run slept


def test_a_timed_wait_keeps_the_waits_it_slept_and_takes_the_rest_from_the_later_fit():
    first, later = _profile(52), _profile(53)
    mixed = with_waits_of(later, first)
    timed = [h for h in held_out_set() if h.timed_wait]
    assert len(timed) == 6
    for h in timed:
        assert compute_wait(h, mixed) == compute_wait(h, first)
        assert compute_wait(h, mixed) != compute_wait(h, later)    # the two fits differ
    for f in dataclasses.fields(later.compute):
        want = (first if f.name in WAIT_FIELDS else later).compute
        assert getattr(mixed.compute, f.name) == getattr(want, f.name), f.name
    assert dataclasses.replace(mixed, compute=later.compute) == later


def test_only_timed_wait_rows_take_the_first_fits_waits():
    first, later = _profile(52), _profile(53)
    rows = tuple(h for h in held_out_set() if h.key in ("ddp-mlp-b32", "ddp-mlp-tw4"))
    plain = run.predict_all(rows, later, None, steps=6, seed=0)
    waited = run.predict_all(rows, later, None, steps=6, seed=0, waits=first)
    assert plain[0] == waited[0]                                    # real compute: unchanged
    assert plain[1]["step_time_s"] != waited[1]["step_time_s"]
    # ... and is the later fit with the first's waits (protocol.with_waits_of)
    assert waited[1] == run.predict_all(rows[1:], with_waits_of(later, first), None, steps=6,
                                        seed=0)[0]


# ---------------------------------------------------------------- the pooled fit


def _record(key, step, thr, low, high, compute):
    return {"key": key, "step_time_s": step, "throughput_samples_per_s": thr,
            "step_time_interval_s": {"low": low, "high": high, "coverage": 0.9},
            "breakdown": {"compute_s": compute, "comm_exposed_s": 0.01, "wait_s": 0.0},
            "staleness_mean": 1.5, "peak_memory_bytes": 7}


def test_a_bracketed_prediction_is_the_geometric_mean_of_the_two_by_hand():
    first = _record("a", 0.040, 1600.0, 0.036, 0.044, 0.030)
    after = _record("a", 0.090, 711.1, 0.081, 0.099, 0.050)
    got = bracket.combine(first, after)
    assert got["step_time_s"] == pytest.approx(0.060)                # sqrt(0.04 * 0.09)
    assert got["throughput_samples_per_s"] == pytest.approx(math.sqrt(1600.0 * 711.1))
    assert got["step_time_interval_s"] == pytest.approx(
        {"low": 0.054, "high": 0.066, "coverage": 0.9})
    assert got["breakdown"]["compute_s"] == pytest.approx(0.040)
    assert got["staleness_mean"] == 1.5 and got["peak_memory_bytes"] == 7   # the first's
    assert got["bracket"] == {"step_time_s_before": 0.040, "step_time_s_after": 0.090}
    assert bracket.combine(first, first)["step_time_s"] == pytest.approx(0.040)
    with pytest.raises(ValueError):
        bracket.combine(first, _record("b", 0.09, 711.1, 0.08, 0.1, 0.05))


def test_the_closing_set_a_is_fitted_alone_and_shown_beside_the_first(two_set_as):
    store, before, after = two_set_as
    b = bracket.fit(store, before, after, "local")
    first = comparison._fit_set_a(store, before, [], "local")[1]
    assert first["compute"]["ddp_cpu_work_factor"] == pytest.approx(1.08, abs=0.01)  # 52
    assert b.data["compute"]["ddp_cpu_work_factor"] == pytest.approx(0.84, abs=0.01)  # 53
    m = bracket.meta(first, b, ["| a headline |"], ["step time: missed"])
    assert json.loads(json.dumps(m)) == m
    shown = {r["field"]: r for r in m["fitted"]}
    assert shown["compute.ddp_cpu_work_factor"] == pytest.approx(
        {"field": "compute.ddp_cpu_work_factor", "before": 1.08, "after": 0.84}, abs=0.01)
    crowded = shown["server.crowded_message_factor"]         # a server field beside them
    assert crowded == pytest.approx({"field": "server.crowded_message_factor",
                                     "before": 1.67, "after": 1.34}, abs=0.01)   # 52, 53
    assert crowded["before"] == pytest.approx(first["server"]["crowded_message_factor"])
    assert shown["server.crowded_update_factor"]["after"] == pytest.approx(
        b.data["server"]["crowded_update_factor"])
    text = "\n".join(bracket.markdown(m))
    assert f"runs {min(after)}-{max(after)}" in text
    assert "| a headline |" in text and "missed before: step time: missed" in text


def test_the_closing_set_a_is_measured_afresh_and_a_refused_pool_keeps_the_first(
        monkeypatch, two_set_as):
    store, before, after = two_set_as
    calls = []

    def fake_calibrate(cluster, store_, here, **kw):
        calls.append(kw.get("fresh"))
        return list(after)

    monkeypatch.setattr(comparison, "calibrate_set_a", fake_calibrate)
    closing, notes = comparison.close_bracket(
        store, "local", {"ids": list(before)}, here="h", max_time_s=None, quick=False,
        progress=None, run_protocol=None, notes=["kept"])
    assert calls == [True] and notes == ["kept"]
    assert closing.ids_after == tuple(after)

    def refuse(*a, **k):
        raise PerfmodelError("not one machine")

    monkeypatch.setattr(bracket, "fit", refuse)
    closing, notes = comparison.close_bracket(
        store, "local", {"ids": list(before)}, here="h", max_time_s=None, quick=False,
        progress=None, run_protocol=None, notes=[])
    assert closing is None
    assert len(notes) == 1 and "not one machine" in notes[0] and "first set A alone" in notes[0]


def test_bracket_with_a_fitted_profile_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "perfmodel", "compare", "--cluster", "local", "--bracket",
         "--profile", str(REPORTS / "local-2026-12-06-heldout-53" / "profile.toml"),
         "--db", str(tmp_path / "db.sqlite"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--bracket" in lines[0]
    assert not (tmp_path / "out").exists()
