"""Real runs whose membership changes (measure/elastic_launch.py, measure/runs/elastic_*.py).

What is checked, and where it comes from:
- torchrun elastic mode (torch/distributed/elastic/agent/server/api.py `_invoke_run`): when a
  worker dies the agent stops the others, rendezvouses again and starts a new worker group
  with TORCHELASTIC_RESTART_COUNT one higher; a script that checkpoints resumes from its last
  checkpoint and finishes.
- The recovery time (kill -> the lost progress regained) lies in the membership model's 90 %
  interval, predicted from what the first attempt measured BEFORE the kill: its step time,
  checkpoint write time and start-up time, plus torchrun's monitor interval and rendezvous
  last call (perfmodel.goodput.predict_recovery; the interval is log-normal with relative
  spread RECOVERY_SPREAD_CV = 0.6, i.e. x/÷ 2.7 around the point, from restarts seen on
  this loaded 2-core host).
- A parameter server keeps applying updates while a worker is gone, and a joiner that pulls
  the parameters trains on (Li et al., OSDI 2014, sec. 4.3).

The slow tests start real torchrun jobs of 2-4 gloo processes (one of them idle in the PS run).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from measure.elastic_launch import (
    Kill,
    Killer,
    elastic_command,
    first_start,
    measured_costs,
    parse_kills,
    recoveries,
)
from measure.recorder import read_records
from perfmodel.errors import PerfmodelError
from perfmodel.goodput import RECOVERY_SPREAD_CV, predict_recovery

JOB_TIMEOUT_S = 240
CHECKPOINT_EVERY = 10


def ddp_config(steps: int) -> dict:
    return {"kind": "elastic_ddp", "workers": 2, "workload": "mlp", "batch_size": 32,
            "steps": steps, "warmup_steps": 0, "seed": 0, "speed": [],
            "options": {"elastic_ddp": {"checkpoint_every": CHECKPOINT_EVERY}},
            "timeout_s": 60, "threads_per_worker": 1}


# ---------------------------------------------------------------- without torch


def test_kill_schedules_parse_and_refuse_nonsense():
    assert parse_kills("1@30, 0@70") == (Kill(1, 30), Kill(0, 70))
    for bad in ("1", "a@3", "1@x", ""):
        with pytest.raises(PerfmodelError, match="RANK@STEP"):
            parse_kills(bad)


def test_elastic_command_uses_elastic_mode_not_standalone(tmp_path):
    cmd = elastic_command(tmp_path, 2, min_nodes=1, max_nodes=2, max_restarts=3)
    assert "--standalone" not in cmd
    assert cmd[cmd.index("--nnodes") + 1] == "1:2"
    assert cmd[cmd.index("--max-restarts") + 1] == "3"
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"


def synthetic_records() -> list[dict]:
    """Two ranks; rank 1 killed at t=10 after step 14; checkpoint at step 10; attempt 1
    ready at t=16 and back at step 14 at t=16.6."""
    recs = [{"type": "elastic", "rank": r, "event": "attempt", "attempt": a, "pid": 100 + r,
             "spawned_at": 0.0 if a == 0 else 12.0, "entered_at": 2.0 if a == 0 else 14.0}
            for a in (0, 1) for r in (0, 1)]
    recs += [{"type": "elastic", "rank": r, "event": "ready", "attempt": a, "step": 10 * a,
              "reload_s": 0.05 * a, "time": 3.0 if a == 0 else 16.0}
             for a in (0, 1) for r in (0, 1)]
    recs += [{"type": "step", "rank": r, "step": s, "wall_s": 0.1, "attempt": 0,
              "end_time": 3.0 + 0.1 * (s + 1)} for s in range(15) for r in (0, 1)]
    recs += [{"type": "step", "rank": r, "step": s, "wall_s": 0.1, "attempt": 1,
              "end_time": 16.0 + 0.1 * (s - 9)} for s in range(10, 20) for r in (0, 1)]
    recs.append({"type": "elastic", "rank": 0, "event": "stopped", "attempt": 0,
                 "time": 10.2, "how": "peer lost"})
    recs.append({"type": "elastic", "rank": 0, "event": "checkpoint", "attempt": 0,
                 "step": 10, "write_s": 0.05, "time": 4.1})
    return recs


def test_recovery_is_derived_from_the_records():
    rec = recoveries(synthetic_records(), [{"attempt": 0, "rank": 1, "time": 10.0}])[0]
    assert (rec.steps_done, rec.resumed_step, rec.lost_steps) == (15, 10, 5)
    assert rec.lost_work_s == pytest.approx(0.5)
    assert rec.detection_s == pytest.approx(0.2)
    assert rec.rendezvous_s == pytest.approx(1.8)
    assert rec.restart_s == pytest.approx(5.8)
    assert rec.recovery_s == pytest.approx(16.5 - 10.0)     # step 14 of attempt 1 ends


def test_a_kill_right_after_a_checkpoint_loses_nothing_and_recovers_when_ready():
    # the kill lands after step 9, whose checkpoint (10 steps) was written: attempt 1
    # resumes at step 10 and never redoes step 9; recovery ends when every rank is ready
    records = [r for r in synthetic_records() if not (r["type"] == "step"
                                                       and r["attempt"] == 0 and r["step"] > 9)]
    rec = recoveries(records, [{"attempt": 0, "rank": 1, "time": 10.0}])[0]
    assert (rec.steps_done, rec.resumed_step, rec.lost_steps) == (10, 10, 0)
    assert rec.recovery_s == pytest.approx(16.0 - 10.0)


def test_recovery_records_give_the_model_its_parameters():
    records = synthetic_records()
    found = recoveries(records, [{"attempt": 0, "rank": 1, "time": 10.0}])
    records += [{"type": "elastic", "event": "recovery", **dataclasses.asdict(r)}
                for r in found]
    costs = measured_costs(records)
    assert costs == pytest.approx({"detection_s": 0.2, "restart_s": 5.8,
                                   "checkpoint_write_s": 0.05, "lost_steps": 5})


def test_killer_kills_the_scheduled_rank_once_it_reaches_the_step(tmp_path, monkeypatch):
    killed = []
    monkeypatch.setattr("os.kill", lambda pid, sig: killed.append((pid, sig)))
    killer = Killer(tmp_path, [Kill(1, 12)], progress=None)
    lines = [r for r in synthetic_records() if r["rank"] == 1 and r.get("attempt") == 0
             and (r["type"] != "step" or r["step"] <= 11)]
    (tmp_path / "rank1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    killer(0)
    assert killed == []                                     # step 12 not reached yet
    with open(tmp_path / "rank1.jsonl", "a") as f:
        f.write(json.dumps({"type": "step", "rank": 1, "step": 12, "wall_s": 0.1,
                            "attempt": 0, "end_time": 4.3}) + "\n")
    killer(0)
    killer(0)
    assert [pid for pid, _ in killed] == [101]
    assert json.loads((tmp_path / "kills.json").read_text())[0]["step_seen"] == 12


# ---------------------------------------------------------------- real jobs


@pytest.mark.slow
def test_ddp_job_whose_rank_is_killed_recovers_within_the_predicted_interval(tmp_path):
    pytest.importorskip("torch")
    from measure.elastic_launch import launch_elastic
    from measure.store import Store

    steps, kill_at = 30, 13
    result, found = launch_elastic(ddp_config(steps), 2, [Kill(1, kill_at)],
                                   run_root=tmp_path, timeout_s=JOB_TIMEOUT_S)
    assert result.ok, result.reason
    records = read_records(result.run_dir)
    last = {(r["rank"], r["attempt"]): r["step"] for r in records if r["type"] == "step"}
    assert last[(0, 1)] == last[(1, 1)] == steps - 1         # attempt 1 finished the run
    (rec,) = found
    assert rec.resumed_step % CHECKPOINT_EVERY == 0 and rec.resumed_step <= rec.steps_done
    assert 0 <= rec.lost_steps <= CHECKPOINT_EVERY + 5       # + steps past the kill poll
    assert rec.detection_s is not None and rec.restart_s is not None

    before = first_start(records)
    forecast = predict_recovery(
        step_s=before.step_s, checkpoint_every_steps=CHECKPOINT_EVERY,
        checkpoint_write_s=before.checkpoint_write_s, detection_s=before.detection_s,
        restart_s=before.restart_s, failure_at_step=rec.steps_done)
    band = forecast.interval
    assert band.sigma_rel == RECOVERY_SPREAD_CV
    assert band.low_s <= rec.recovery_s <= band.high_s, (
        f"measured recovery {rec.recovery_s:.2f} s outside the predicted "
        f"[{band.low_s:.2f}, {band.high_s:.2f}] s (point {band.point_s:.2f} s)")

    store = Store(tmp_path / "store.sqlite")
    run = store.get_run(store.ingest(result.run_dir, result.status, result.reason))
    stored = [json.loads(r["json"]) for r in run.table("other_records")
              if r["type"] == "elastic"]
    assert any(r["event"] == "recovery" and r["source"] == "launcher" for r in stored)


@pytest.mark.slow
def test_ps_keeps_updating_while_a_worker_is_gone_and_a_joiner_trains(tmp_path):
    pytest.importorskip("torch")
    from measure.elastic_launch import launch_membership_ps

    steps = 15
    config = {"kind": "elastic_ps", "workers": 3, "workload": "mlp", "batch_size": 32,
              "steps": steps, "warmup_steps": 0, "seed": 0, "speed": [],
              "options": {"ps": {"mode": "async"},
                          "elastic_ps": {"leave_worker": 0, "leave_after_steps": 4,
                                         "standby": 1, "join_after_updates": 6}},
              "timeout_s": 60, "threads_per_worker": 1}
    result = launch_membership_ps(config, 3, run_root=tmp_path, timeout_s=JOB_TIMEOUT_S)
    assert result.ok, result.reason
    records = read_records(result.run_dir)
    events = {r["event"]: r for r in records if r["type"] == "elastic"}
    updates = [r for r in records if r["type"] == "update"]
    left, sent = events["left"]["time_s"], events["join_sent"]["time_s"]
    gone = [u for u in updates if left < u["time_s"] <= sent]
    assert len(gone) >= 6 and {u["worker"] for u in gone} == {1}    # worker 1 carried on
    assert not [u for u in updates if u["worker"] == 0 and u["time_s"] > left]
    assert [u for u in updates if u["worker"] == 2 and u["time_s"] > sent]   # the joiner
    assert len(updates) >= 2 * steps                        # the budget was spent
    assert events["joined"]["needed"] and events["membership"]["join_s"] > 0
