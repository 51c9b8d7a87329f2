"""The elastic part of `perfmodel compare` (perfmodel/compare/elastic*.py), checked against
hand-worked timelines and synthetic records; the real elastic runs themselves are exercised
in tests/test_elastic_runs.py.

Theory for a gang job at a steady step time s, a checkpoint every E steps written in w,
detection d and restart r: without kills, S steps take S·s plus one write per E steps done
before the end; a kill when progress is p steps loses p − E·floor(p/E) steps and delays the
finish by its recovery d + r + (lost steps)·s.
"""

from __future__ import annotations

import math

import pytest

from perfmodel.cluster import load_cluster
from perfmodel.compare import elastic, elastic_report
from perfmodel.compare.elastic import POLL_S, ElasticItem
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

COSTS = {"detection_s": 0.3, "restart_s": 9.0, "checkpoint_write_s": 0.02}
STEP_S = 0.05


def small_scenario(workers: int, workload: str = "mlp") -> Scenario:
    return Scenario(cluster=load_cluster("a100"), workload=load_workload(workload),
                    workers=workers, batch_size=32)


def item(kills=(), steps=40, every=8) -> ElasticItem:
    return ElasticItem(key="t", what="test", kind="elastic_ddp", steps=steps,
                       checkpoint_every=every, kills=kills)


def test_without_kills_the_run_takes_its_steps_and_checkpoint_writes():
    p = elastic.predict_gang(item(), step_s=STEP_S, costs=COSTS)
    assert p["total_s"] == pytest.approx(40 * STEP_S + 4 * COSTS["checkpoint_write_s"])
    assert p["recoveries"] == [] and p["restart_time_s"] == 0
    samples = 40 * 2 * item().batch
    assert p["goodput_samples_per_s"] == pytest.approx(samples / p["total_s"])


def test_one_kill_costs_detection_restart_and_the_steps_since_the_checkpoint():
    free = elastic.predict_gang(item(), step_s=STEP_S, costs=COSTS)
    p = elastic.predict_gang(item(kills=((1, 9),)), step_s=STEP_S, costs=COSTS)
    at_kill = 10 + (POLL_S / 2) / STEP_S           # steps done when the kill lands
    lost = at_kill - 8                              # the checkpoint after step 8
    (rec,) = p["recoveries"]
    assert rec["lost_steps"] == pytest.approx(lost)
    expected = COSTS["detection_s"] + COSTS["restart_s"] + lost * STEP_S
    assert rec["recovery_s"] == pytest.approx(expected)
    assert rec["low_s"] < rec["recovery_s"] < rec["high_s"]
    assert p["total_s"] == pytest.approx(free["total_s"] + expected)


def test_the_second_kill_is_timed_on_the_progress_after_the_first_restart():
    p = elastic.predict_gang(item(kills=((1, 9), (0, 25))), step_s=STEP_S, costs=COSTS)
    first, second = p["kills"]
    # between the kills: the lost steps again, then steps 10.. up to 26 done, writes at 16, 24
    redo = first["time_s"] + COSTS["detection_s"] + COSTS["restart_s"]
    expected = redo + (26 - 8) * STEP_S + 2 * COSTS["checkpoint_write_s"] + POLL_S / 2
    assert second["time_s"] == pytest.approx(expected)
    assert len(p["recoveries"]) == 2


def test_goodput_interval_brackets_the_point():
    it = item(kills=((1, 9),))
    p = elastic.predict_gang(it, step_s=STEP_S, costs=COSTS)
    low, high = elastic.goodput_interval(p, it, 0.8 * STEP_S, 1.3 * STEP_S)
    assert low < p["goodput_samples_per_s"] < high


def synthetic_records(steps=40, step_s=0.05, t0=1000.0, restart_at=10, gap_s=10.0):
    """Two ranks; a restart after step `restart_at` resuming from step 8."""
    recs = [{"type": "elastic", "event": "ready", "attempt": 0, "rank": r, "time": t0}
            for r in (0, 1)]
    t = t0
    for step in range(restart_at + 1):
        t += step_s
        recs += [{"type": "step", "rank": r, "attempt": 0, "step": step, "end_time": t,
                  "wall_s": step_s} for r in (0, 1)]
    t += gap_s
    for step in range(8, steps):
        t += step_s
        recs += [{"type": "step", "rank": r, "attempt": 1, "step": step, "end_time": t,
                  "wall_s": step_s} for r in (0, 1)]
    return recs, t - t0


def test_measured_gang_counts_from_first_ready_to_the_last_step():
    recs, total = synthetic_records()
    it = item()
    m = elastic.measured_gang(it, recs, [{"recovery_s": 10.2, "lost_steps": 3}])
    assert m["total_s"] == pytest.approx(total)
    assert m["goodput_samples_per_s"] == pytest.approx(40 * 2 * it.batch / total)
    assert m["progress"]["steps"][0] == 1 and m["progress"]["steps"][-1] == 40
    assert min(m["progress"]["steps"][11:]) == 9        # dropped back to the checkpoint


def test_measured_gang_refuses_a_run_without_its_last_step():
    recs, _ = synthetic_records(steps=40)
    recs = [r for r in recs if r.get("step") != 39]
    with pytest.raises(Exception, match="last-step"):
        elastic.measured_gang(item(), recs, [])


def test_rows_give_error_against_the_median_and_whether_it_is_inside():
    it = item(kills=((1, 9),))
    p = elastic.predict_gang(it, step_s=STEP_S, costs=COSTS)
    p["goodput_interval"] = [1.0, 1e9]
    rec = p["recoveries"][0]["recovery_s"]
    measured = [{"recoveries": [{"recovery_s": rec * 2, "lost_steps": 4}], "total_s": 20.0,
                 "goodput_samples_per_s": 100.0},
                {"recoveries": [{"recovery_s": rec * 2, "lost_steps": 6}], "total_s": 22.0,
                 "goodput_samples_per_s": 110.0}]
    rows = {r["quantity"].split(" (")[0]: r for r in elastic.rows_for(it, p, measured)}
    assert rows["recovery 1"]["error_rel"] == pytest.approx(-0.5)
    assert rows["recovery 1"]["inside"] is (p["recoveries"][0]["high_s"] >= rec * 2)
    assert rows["lost steps 1"]["median"] == 5
    assert rows["goodput"]["inside"] is True
    assert rows["time to finish"]["median"] == 21.0


def test_an_async_ps_keeps_at_least_half_its_rate_when_one_of_two_workers_leaves():
    # half exactly when the server is idle (tests/test_elastic_model.py); more when the
    # leaver had been sharing the server's link with the one that stays
    it = ElasticItem(key="p", what="t", kind="elastic_ps", workers=3)
    p = elastic.predict_ps(it, small_scenario(workers=2))
    assert 0.5 - 1e-9 <= p["gone_over_before"] <= 1.0
    assert p["join_s"] > 0 and p["update_rate_before_per_s"] > 0


def test_report_section_and_figure_agree_with_the_rows(tmp_path):
    ddp, ps = elastic.HELD_OUT
    pd = elastic.predict_gang(ddp, step_s=STEP_S, costs=COSTS)
    recs, _ = synthetic_records()
    md = elastic.measured_gang(ddp, recs, [{"recovery_s": 10.0, "lost_steps": 4},
                                           {"recovery_s": 9.0, "lost_steps": 2}])
    pp = elastic.predict_ps(ps, small_scenario(workers=2))
    mp = {"update_rate_before_per_s": 20.0, "update_rate_gone_per_s": 11.0,
          "update_rate_after_per_s": 19.0, "join_s": 0.3, "gone_over_before": 0.55}
    doc = {"calibration": {"key": "c", "label": "cal", "run_id": 7, "costs": COSTS},
           "predictions": {ddp.key: pd, ps.key: pp},
           "measured": {ddp.key: [md], ps.key: [mp]}, "failed": [],
           "rows": elastic.rows_for(ddp, pd, [md]) + elastic.rows_for(ps, pp, [mp])}
    fig = elastic_report.figure(doc, tmp_path)
    assert (tmp_path / fig["file"]).stat().st_size > 0
    model = fig["plotted"]["model"]["samples_per_s"]
    assert max(model) == pytest.approx(2 * ddp.batch / STEP_S, rel=0.1)   # steady rate
    lines = elastic_report.markdown(doc, fig["file"])
    table = [line for line in lines if line.startswith("| `")]
    assert len(table) == len(doc["rows"])
    assert any("![elastic](elastic.png)" in line for line in lines)
    head = elastic_report.headline(doc)[0]
    assert "recoveries inside their interval" in head and "0.55" in head


def test_throughput_series_is_the_slope_of_progress():
    t, v = elastic_report.throughput_series([0.0, 10.0], [0.0, 100.0], samples_per_step=4,
                                              bin_s=1.0)
    assert all(math.isclose(x, 40.0) for x in v)
    assert len(t) == 10
