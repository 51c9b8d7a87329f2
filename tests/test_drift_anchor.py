"""The drift anchor (perfmodel/compare/anchor.py): one set-A run measured again in every round
of set B, reported beside set A's, never fitted.

- its config is set A's own, but marked so that no calibration takes it for set A;
- the held-out file names a measurement the suite really has; a wrong one is one line;
- its ratio is the re-runs' step time over set A's, and the report says so;
- measure_all launches it once at the start of every round (a fake session, no torch).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from calibration.suite import build_suite, comparable, matching_runs
from perfmodel.compare import anchor, protocol, report
from perfmodel.compare.anchor import AnchorResult
from perfmodel.errors import PerfmodelError
from tests.test_compare import _write_run

EXACT = 1e-12


def _suite():
    return build_suite("cpu", suite="local")


def test_the_held_out_file_names_a_suite_measurement():
    drift = anchor.load_anchor(protocol.HELD_OUT_FILE)
    assert drift is not None and drift.why
    m = anchor.suite_measurement(drift, _suite())
    assert m.config["kind"] == "ddp" and m.config["workers"] == 2


def test_an_anchor_item_the_suite_lacks_is_one_line(tmp_path):
    path = tmp_path / "heldout.toml"
    path.write_text('[anchor]\nitem = "ddp-nosuch"\nwhy = "test"\n')
    with pytest.raises(PerfmodelError, match="not a measurement of the calibration suite"):
        anchor.suite_measurement(anchor.load_anchor(path), _suite())


def test_the_anchor_runs_set_as_config_but_is_never_taken_for_set_a():
    m = anchor.suite_measurement(anchor.load_anchor(protocol.HELD_OUT_FILE), _suite())
    config = anchor.anchor_config(m, 2)
    assert {k: v for k, v in config.items() if k != "compare"} == {
        k: v for k, v in m.config.items() if k != "calibration"}
    assert config["compare"] == {"item": "anchor:ddp-mlp", "repeat": 2}
    # a stored anchor run does not match the suite's measurement: set A never includes it
    row = SimpleNamespace(status="ok", kind="ddp", config=config, host="h", id=7)
    assert comparable(config) != comparable(m.config)
    assert matching_runs([row], m) == []
    assert not anchor.is_set_a_run(config, "ddp-mlp")
    assert anchor.is_set_a_run(m.config, "ddp-mlp")


def test_the_ratio_is_the_re_runs_over_set_as_median():
    r = AnchorResult(label="ddp mlp, 2 workers", set_a_run_ids=(3,), set_a_step_s=(0.030,),
                     run_ids=(41, 60, 79), step_s=(0.033, 0.030, 0.036))
    assert r.ratios == pytest.approx((1.1, 1.0, 1.2), rel=EXACT)
    assert r.ratio == pytest.approx(1.1, rel=EXACT)
    line = r.line()
    assert "x1.10 (x1.00-1.20;" in line and "30.0 ms" in line
    assert AnchorResult.from_dict(r.as_dict()) == r
    assert "no re-run finished" in AnchorResult(
        label="x", set_a_run_ids=(), set_a_step_s=(), run_ids=(), step_s=()).line()
    assert "no run of it" in AnchorResult(
        label="x", set_a_run_ids=(), set_a_step_s=(), run_ids=(1,), step_s=(0.1,)).line()


def test_the_line_gives_the_models_own_prediction_beside_the_re_runs():
    r = AnchorResult(label="ddp mlp, 2 workers", set_a_run_ids=(3,), set_a_step_s=(0.041,),
                     run_ids=(41, 60, 79), step_s=(0.0364, 0.0370, 0.0372),
                     predicted_step_s=0.0385)
    assert "the model, fitted on set A, 38.5 ms (re-runs x0.96 of it)" in r.line()
    assert AnchorResult.from_dict(r.as_dict()) == r


def test_a_drift_beyond_the_re_runs_spread_is_named_with_its_direction():
    def result(*steps, predicted=0.0314):
        return AnchorResult(label="ddp mlp, 2 workers", set_a_run_ids=(3,),
                            set_a_step_s=(0.031,), run_ids=(41, 60, 79), step_s=steps,
                            predicted_step_s=predicted)

    slow = result(0.0330, 0.0360, 0.0347).drift_line()      # report 32: x1.11, spread 9 %
    assert "x1.11 of the model's prediction" in slow and "ran slower" in slow
    assert "rows predicted too fast are partly that" in slow
    fast = result(0.0330, 0.0331, 0.0332, predicted=0.0370).drift_line()
    assert "ran faster" in fast and "rows predicted too slow" in fast
    # inside the re-runs' own spread, or within 5 %: nothing to say
    assert result(0.0300, 0.0350, 0.0340).drift_line() is None           # x1.08, spread 15 %
    assert result(0.0320, 0.0321, 0.0322).drift_line() is None           # x1.02
    # no prediction: set A's run is the reference
    assert "set A's run of it" in result(0.035, 0.035, 0.035, predicted=None).drift_line()
    assert result(predicted=None).drift_line() is None                   # no re-run
    # from a report's meta, as comparison.py and rerender.py read it
    assert anchor.drift_lines({"anchor": result(0.0330, 0.0360, 0.0347).as_dict()}) == [slow]
    assert anchor.drift_lines({}) == []


def test_the_anchor_is_predicted_as_the_set_b_item_it_would_be():
    m = anchor.suite_measurement(anchor.load_anchor(protocol.HELD_OUT_FILE), _suite())
    h = anchor.as_held_out(m)
    assert (h.strategy, h.workload, h.workers, h.batch, h.options, h.timed_wait) == (
        "ddp", "mlp", 2, 64, {}, False)
    # the run it stands for: the same config as the suite's (the markers aside)
    config = protocol.run_config(h, None, steps=m.config["steps"], seed=m.config["seed"],
                                 repeat=1)
    strip = {"calibration", "compare"}
    assert {k: v for k, v in config.items() if k not in strip} == {
        k: v for k, v in m.config.items() if k not in strip}
    ps = next(x for x in _suite() if x.config["kind"] == "ps")
    assert anchor.as_held_out(ps) is None


def test_the_report_gives_the_anchor_its_own_section(tmp_path):
    r = AnchorResult(label="ddp mlp, 2 workers", set_a_run_ids=(3,), set_a_step_s=(0.030,),
                     run_ids=(41,), step_s=(0.033,))
    meta = {"cluster": "local", "date": "d", "command": "perfmodel compare", "host": "h",
            "hardware": "cpu", "versions": "v", "wall_s": 60.0, "load_range": "1–2",
            "protocol": ["p"], "skipped": {}, "anchor": {**r.as_dict(), "why": "because"}}
    report.write_markdown(tmp_path / "report.md", meta=meta, rows=[], figures={},
                          torch_rows=[], why_missed=[])
    text = (tmp_path / "report.md").read_text()
    assert "## Drift anchor" in text and "x1.10" in text and "Why this run: because" in text
    json.dumps(meta)                                    # comparisons.json can hold it
    meta["by_round"] = anchor.round_errors({"k": 0.1}, {"k": "real"}, {"k": {1: 0.1}}, {1: 1.1})
    report.write_markdown(tmp_path / "report.md", meta=meta, rows=[], figures={},
                          torch_rows=[], why_missed=[])
    assert "- round 1: anchor x1.10; real rows +0.0 % median" in \
        (tmp_path / "report.md").read_text()


def test_measure_all_runs_the_anchor_first_in_every_round(monkeypatch, tmp_path):
    from perfmodel.compare import run

    launched: list[str] = []

    def fake_run(config, nproc, store, **kw):
        launched.append(config["compare"]["item"])
        return SimpleNamespace(run_id=len(launched), ok=True, interrupted=False,
                               outcome=lambda label: label, reason="")

    class Store:
        def get_run(self, run_id):
            return SimpleNamespace(row=SimpleNamespace(config={}))

    class Progress:
        def start(self, label, total):
            return lambda *a, **k: None

        def finish(self, line):
            pass

    monkeypatch.setattr(run.session, "run", fake_run)
    m = anchor.suite_measurement(anchor.load_anchor(protocol.HELD_OUT_FILE), _suite())
    held_out = protocol.held_out_set(quick=True)[:2]
    profile = SimpleNamespace()
    monkeypatch.setattr(run, "run_config", lambda h, p, **kw: {"compare": {"item": h.key}})
    found = run.measure_all(held_out, profile, Store(), repeats=2, steps=2, seed=0,
                            max_time_s=None, progress=Progress(), anchor=m)
    keys = [h.key for h in held_out]
    assert launched == ["anchor:ddp-mlp", *keys, "anchor:ddp-mlp", *keys]
    assert found.anchor == [1, 1 + len(keys) + 1]


def test_the_anchor_reads_set_as_step_time_from_the_store(tmp_path):
    from measure.store import Store

    m = anchor.suite_measurement(anchor.load_anchor(protocol.HELD_OUT_FILE), _suite())
    store = Store(tmp_path / "db.sqlite")
    a = store.ingest(_write_run(tmp_path, "a", config=m.config, throughput=1.0, wall=0.030),
                     "ok")
    other = store.ingest(_write_run(tmp_path, "o", config={**m.config, "calibration": {
        "suite": "local", "item": "ddp-cnn-small", "repeat": 1}}, throughput=1.0, wall=0.5), "ok")
    again = store.ingest(_write_run(tmp_path, "b", config=anchor.anchor_config(m, 1),
                                    throughput=1.0, wall=0.036), "ok")
    r = anchor.result(store, m, [a, other], [again])
    assert r.set_a_run_ids == (a,)
    assert r.set_a_step_s == pytest.approx((0.030,), rel=1e-9)
    assert r.ratio == pytest.approx(1.2, rel=1e-9)


def test_round_errors_by_hand():
    # a and b real, c timed-wait; round 1: a 0 %, b -20 % (median -10, |.| 10), c +50 %;
    # round 2: a -20 %, b 0 %; round 3: c alone, no anchor run
    by_round = anchor.round_errors(
        {"a": 0.1, "b": 0.2, "c": 0.3}, {"a": "real", "b": "real", "c": "timed-wait"},
        {"a": {1: 0.1, 2: 0.125}, "b": {1: 0.25, 2: 0.2}, "c": {1: 0.2, 3: 0.3}},
        {1: 1.0, 2: 1.25})
    assert [r["round"] for r in by_round] == [1, 2, 3]
    one, two, three = by_round
    assert one["real"] == pytest.approx({"rows": 2, "median": -0.1, "median_abs": 0.1})
    assert one["timed-wait"] == pytest.approx({"rows": 1, "median": 0.5, "median_abs": 0.5})
    assert two["real"]["median"] == pytest.approx(-0.1) and two["timed-wait"] is None
    assert three["real"] is None and three["anchor_ratio"] is None
    lines = anchor.round_lines(by_round)
    assert lines[0].startswith("round 1: anchor x1.00; real rows -10.0 % median, |error| 10.0 %")
    assert "timed-wait rows: none" in lines[1] and "anchor x1.25" in lines[1]
    assert "anchor: no run" in lines[2]
    json.dumps(by_round)                                # comparisons.json can hold it


def test_by_round_takes_each_runs_round_from_its_marker(tmp_path):
    from measure.store import Store
    from perfmodel.compare.comparison import by_round
    from perfmodel.compare.run import Measurements
    from tests.test_compare import _prediction

    store = Store(tmp_path / "db.sqlite")
    config = {"kind": "ddp", "workers": 2, "workload": "mlp", "batch_size": 32, "steps": 2,
              "warmup_steps": 2, "seed": 0, "speed": [], "options": {"ddp": {}}}
    # stored out of order: the round is the marker's, not the position
    late = store.ingest(_write_run(tmp_path, "r2", throughput=1.0, wall=0.125, config={
        **config, "compare": {"item": "k", "repeat": 2}}), "ok")
    early = store.ingest(_write_run(tmp_path, "r1", throughput=1.0, wall=0.1, config={
        **config, "compare": {"item": "k", "repeat": 1}}), "ok")
    found = Measurements(ok={"k": [late, early]})
    rows = by_round(store, [_prediction("k")], found, None)
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["real"]["median"] == pytest.approx(0.0, abs=1e-9)      # 0.1 predicted
    assert rows[1]["real"]["median"] == pytest.approx(0.1 / 0.125 - 1, rel=1e-9)
