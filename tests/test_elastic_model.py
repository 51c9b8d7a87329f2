"""The job-level membership model (perfmodel/sim/elastic.py, perfmodel/goodput.py).

What is checked, and where it comes from:
- No events: every result equals the plain prediction (the full membership's rate is the
  plain prediction's throughput; nothing is lost or stopped).
- Failures at rate Λ with checkpoint interval C and write time δ: a failure lands uniformly
  in a period of C + δ, so the training time lost per failure is (C²/2 + δC)/(C + δ) → C/2
  as δ/C → 0, and each failure also costs detection + restart (Young 1974, sec. 2; Daly 2006,
  sec. 3: the same renewal argument).
- The goodput-optimal C lies near Young's √(2δ/Λ) (Young 1974, CACM 17(9)) and Daly's
  higher-order estimate (Daly 2006, FGCS 22(3), eq. 37).
- An asynchronous PS that loses k of N workers keeps (N−k)/N of its throughput when the server
  is not the bottleneck (DESIGN.md: X(N) = N/(Z+S) below saturation, the machine-repairman
  model).
- torchrun elastic semantics (torch/distributed/elastic/agent/server/api.py `_invoke_run`):
  a failure or a membership change restarts the whole worker group from the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.cluster import load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.goodput import (
    check_events,
    daly_interval_s,
    elastic_config,
    goodput_by_interval,
    parse_events,
    predict_elasticity,
    render_elasticity,
    sample_failures,
    summarise_elastic,
    young_interval_s,
)
from perfmodel.predict import predict
from perfmodel.sim.elastic import ElasticConfig, Job, MembershipEvent, Rate, simulate
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload
from tests.factories import flat_link, make_cluster

EXACT = 1e-9                    # arithmetic identities
LOST_WORK_TOL = 0.05            # mean lost work per failure vs the renewal formula, ~500 failures
DOWNTIME_TOL = 0.02             # detection + restart per failure (a few fall inside a restart)
KEEP_FRACTION_TOL = 0.01        # async PS throughput after losing k of N workers
STRATEGIES = ("ddp", "fsdp", "sync-ps", "async-ps", "ssp-ps")
PER_SAMPLE = 100.0              # synthetic rate: samples/s per member


def linear_rate(members: tuple[int, ...]) -> Rate:
    """Perfect scaling: every member adds PER_SAMPLE samples/s, steps of 1 s, batch 100."""
    return Rate(PER_SAMPLE * len(members), 1.0)


def gang(workers: int = 4) -> Job:
    return Job(scheduling="gang", workers=workers, batch_size=100)


def run(job: Job, config: ElasticConfig, events=None):
    events = check_events(config.events, job.workers) if events is None else events
    result = simulate(job, config, events, linear_rate)
    return result, summarise_elastic(result, linear_rate(tuple(range(job.workers))))


def small_scenario(workers: int = 4, **changes) -> Scenario:
    return Scenario(cluster=load_cluster("a100"), workload=load_workload("resnet50"),
                    workers=workers, batch_size=32, **changes)


# ---------------------------------------------------------------- no events


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_events_reproduces_the_plain_prediction(strategy):
    p = predict(strategy, small_scenario())
    config = ElasticConfig(run_s=3600.0, checkpoint_write_s=0.0)
    e = predict_elasticity(p, config)
    s = e.summary
    plain = p.summary.throughput_samples_per_s
    assert s.goodput_samples_per_s == pytest.approx(plain, rel=EXACT)
    assert s.throughput_samples_per_s == plain
    assert np.allclose(s.series_samples_per_s, plain, rtol=EXACT)
    assert (s.lost_samples, s.time_lost_to_restarts_s, s.restarts) == (0.0, 0.0, 0)
    assert e.memberships_simulated == 0       # no extra simulation when nobody changes


def test_checkpoint_writes_alone_cost_their_share_of_time():
    # With no failures a gang job trains C of every C + δ seconds.
    c, d = 100.0, 10.0
    _, s = run(gang(), ElasticConfig(run_s=50 * (c + d), checkpoint_interval_s=c,
                                     checkpoint_write_s=d))
    assert s.goodput_samples_per_s == pytest.approx(4 * PER_SAMPLE * c / (c + d), rel=EXACT)


# ---------------------------------------------------------------- gang semantics, exactly


def test_one_failure_costs_detection_restart_and_the_work_since_the_checkpoint():
    cfg = ElasticConfig(run_s=1000.0, events=parse_events("fail:2@250"),
                        checkpoint_interval_s=100.0, checkpoint_write_s=0.0,
                        detection_s=10.0, restart_s=20.0)
    result, s = run(gang(), cfg)
    assert s.lost_work_s == pytest.approx(50.0, rel=EXACT)         # checkpoint at 200
    assert s.time_lost_to_restarts_s == pytest.approx(30.0, rel=EXACT)
    # 250 s at 4 workers, of which 50 s are lost, then 720 s at 3 workers
    useful = PER_SAMPLE * (4 * 200 + 3 * (1000 - 280))
    assert s.useful_samples == pytest.approx(useful, rel=EXACT)
    assert result.restarts == 1


@pytest.mark.parametrize("kind, down_s", [("leave", 20.0), ("join", 20.0)])
def test_announced_changes_restart_without_detection(kind, down_s):
    # torchrun restarts the worker group for a departure and for a newcomer alike.
    schedule = f"{kind}:3@250"          # a first event "join" makes worker 3 a late arrival
    cfg = ElasticConfig(run_s=1000.0, events=parse_events(schedule),
                        checkpoint_interval_s=100.0, checkpoint_write_s=0.0,
                        detection_s=10.0, restart_s=20.0)
    result, s = run(gang(), cfg)
    assert s.time_by_state_s.get("detecting", 0.0) == 0.0
    assert s.time_by_state_s["restarting"] == pytest.approx(down_s * result.restarts)
    assert s.lost_work_s == pytest.approx(50.0 * result.restarts, rel=EXACT)


def test_below_min_workers_the_job_waits_for_a_joiner():
    cfg = ElasticConfig(run_s=1000.0, events=parse_events("fail:0@100,join:0@400"),
                        checkpoint_interval_s=1e6, checkpoint_write_s=0.0, detection_s=10.0,
                        restart_s=20.0, min_workers=2)
    _, s = run(gang(2), cfg)
    assert s.time_by_state_s["waiting"] == pytest.approx(400.0 - 110.0, rel=EXACT)
    assert s.time_by_state_s["restarting"] == pytest.approx(20.0, rel=EXACT)


# ---------------------------------------------------------------- failures at a rate


def test_lost_work_per_failure_approaches_half_the_interval_plus_restart():
    workers, lam_per_h = 4, 0.02        # Λ = 0.08/h: ΛC = 0.013, failures rarely overlap
    c, d, det, rst = 600.0, 10.0, 15.0, 45.0
    cfg = ElasticConfig(run_s=2.5e7, failure_rate_per_hour=lam_per_h, seed=1,
                        checkpoint_interval_s=c, checkpoint_write_s=d, detection_s=det,
                        restart_s=rst)
    events = sample_failures(cfg, workers, np.random.default_rng(cfg.seed))
    result, s = run(gang(workers), cfg, events)
    assert s.failures > 400
    expected = (c * c / 2 + d * c) / (c + d)            # → C/2 as δ/C → 0
    assert s.lost_work_per_failure_s == pytest.approx(expected, rel=LOST_WORK_TOL)
    assert s.time_lost_to_restarts_s / s.failures == pytest.approx(det + rst, rel=DOWNTIME_TOL)


def test_goodput_optimal_interval_is_near_young_and_daly():
    workers, lam_per_h, d = 4, 0.05, 60.0
    job_rate = workers * lam_per_h / 3600.0
    young, daly = young_interval_s(d, job_rate), daly_interval_s(d, job_rate)
    assert young == pytest.approx(math.sqrt(2 * d / job_rate))
    assert daly < young                 # Daly subtracts the write time, adds higher orders
    p = predict("ddp", small_scenario(workers))
    cfg = ElasticConfig(run_s=1.5e7, failure_rate_per_hour=lam_per_h, seed=2,
                        checkpoint_write_s=d, detection_s=15.0, restart_s=60.0)
    factors = (0.25, 0.5, 2**-0.5, 1.0, 2**0.5, 2.0, 4.0)
    curve = goodput_by_interval(p, cfg, [young * f for f in factors])
    goodputs = np.array([g for _, g in curve])
    best = int(goodputs.argmax())
    assert factors[best] in (2**-0.5, 1.0, 2**0.5)      # within one grid step of Young
    assert goodputs[factors.index(1.0)] >= 0.995 * goodputs.max()
    assert goodputs[0] < goodputs[best] and goodputs[-1] < goodputs[best]


def test_sampled_failures_are_reproducible_from_the_seed():
    cfg = ElasticConfig(run_s=1e6, failure_rate_per_hour=0.5, seed=7, replace_after_s=30.0)
    a = sample_failures(cfg, 8, np.random.default_rng(7))
    b = sample_failures(cfg, 8, np.random.default_rng(7))
    assert a == b and len(a) > 0
    check_events(a, 8)              # a consistent fail/join order for every worker


# ---------------------------------------------------------------- parameter servers


def fast_server_scenario(workers: int) -> Scenario:
    """Servers and links so fast that workers never queue: X(n) = n / Z."""
    c = load_cluster("a100")
    cluster = make_cluster("a100", intra_node=flat_link(1e9), inter_node=flat_link(1e9),
                           server=dataclasses.replace(c.server, apply_GBps=1e9))
    return Scenario(cluster=cluster, workload=load_workload("resnet50"), workers=workers,
                    batch_size=32, jitter="none")


@pytest.mark.parametrize("k", [1, 3])
def test_async_ps_losing_k_of_n_workers_keeps_n_minus_k_over_n(k):
    n, run_s = 8, 3600.0
    p = predict("async-ps", fast_server_scenario(n))
    schedule = ",".join(f"fail:{w}@0" for w in range(k))
    e = predict_elasticity(p, ElasticConfig(run_s=run_s, events=parse_events(schedule)))
    keep = e.summary.goodput_samples_per_s / e.summary.throughput_samples_per_s
    assert keep == pytest.approx((n - k) / n, rel=KEEP_FRACTION_TOL)
    assert e.summary.time_lost_to_restarts_s == 0.0     # nobody restarts


def test_async_ps_throughput_series_drops_at_the_failure_and_recovers_after_the_join():
    n = 4
    p = predict("async-ps", fast_server_scenario(n))
    cfg = ElasticConfig(run_s=400.0, events=parse_events("fail:0@100,join:0@300"), join_s=0.0)
    s = predict_elasticity(p, cfg).summary
    t, x = np.array(s.series_t_s), np.array(s.series_samples_per_s)
    full = s.throughput_samples_per_s
    assert np.allclose(x[t < 99], full, rtol=KEEP_FRACTION_TOL)
    assert np.allclose(x[(t > 101) & (t < 299)], full * (n - 1) / n, rtol=KEEP_FRACTION_TOL)
    assert np.allclose(x[t > 301], full, rtol=KEEP_FRACTION_TOL)


def test_sync_ps_drops_after_detection_or_waits_for_the_replacement():
    job = Job(scheduling="sync", workers=4, batch_size=100, join_s=5.0)
    events = parse_events("fail:3@100,join:3@300")
    drop = ElasticConfig(run_s=1000.0, events=events, detection_s=10.0)
    wait = dataclasses.replace(drop, sync_on_departure="wait")
    _, s_drop = run(job, drop)
    _, s_wait = run(job, wait)
    assert s_drop.time_by_state_s["stalled"] == pytest.approx(10.0, rel=EXACT)
    assert s_wait.time_by_state_s["stalled"] == pytest.approx(300.0 + 5.0 - 100.0, rel=EXACT)


def test_ssp_runs_ahead_by_its_bound_then_stalls_until_detection():
    job = Job(scheduling="ssp", workers=4, batch_size=100, staleness_bound=3)
    cfg = ElasticConfig(run_s=1000.0, events=parse_events("fail:3@100"), detection_s=10.0)
    _, s = run(job, cfg)
    assert s.time_by_state_s["stalled"] == pytest.approx(10.0 - 3 * 1.0, rel=EXACT)


# ---------------------------------------------------------------- invariants


@settings(max_examples=40, deadline=None)
@given(scheduling=st.sampled_from(["gang", "async", "ssp", "sync"]),
       rate_per_h=st.floats(0.1, 20.0), seed=st.integers(0, 2**16),
       replace_s=st.one_of(st.none(), st.floats(0.0, 500.0)))
def test_time_is_accounted_for_and_goodput_never_exceeds_throughput(scheduling, rate_per_h,
                                                                   seed, replace_s):
    job = Job(scheduling=scheduling, workers=4, batch_size=100, join_s=2.0,
              staleness_bound=2)
    cfg = ElasticConfig(run_s=3600.0, failure_rate_per_hour=rate_per_h, seed=seed,
                        replace_after_s=replace_s, checkpoint_interval_s=300.0)
    events = sample_failures(cfg, job.workers, np.random.default_rng(seed))
    result, s = run(job, cfg, events)
    seg = result.segments
    assert seg[0].start_s == 0.0 and seg[-1].end_s == pytest.approx(cfg.run_s)
    assert all(a.end_s == b.start_s for a, b in zip(seg, seg[1:], strict=False))
    slack = EXACT * s.throughput_samples_per_s      # rounding when all work was lost
    assert -slack <= s.goodput_samples_per_s <= s.throughput_samples_per_s + slack


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("make, words", [
    (lambda: check_events(parse_events("fail:9@10"), 4), "worker 9"),
    (lambda: ElasticConfig(run_s=100.0, events=parse_events("fail:1@150")), "outside the run"),
    (lambda: ElasticConfig(run_s=100.0, events=(MembershipEvent("fail", 1, -1.0),)),
     "outside the run"),
    (lambda: ElasticConfig(run_s=100.0, checkpoint_interval_s=0.0), "checkpoint interval"),
    (lambda: ElasticConfig(run_s=0.0), "run length"),
    (lambda: check_events(parse_events("fail:1@5,join:1@10,join:1@20"), 4),
     "already in the job"),
    (lambda: check_events(parse_events("fail:1@10,leave:1@20"), 4), "not in the job"),
    (lambda: parse_events("explode:1@10"), "KIND:WORKER@TIME"),
    (lambda: parse_events("fail:1"), "KIND:WORKER@TIME"),
    (lambda: ElasticConfig(run_s=100.0, events=parse_events("fail:1@10"),
                           failure_rate_per_hour=1.0), "not both"),
    (lambda: ElasticConfig(run_s=100.0, sync_on_departure="maybe"), "drop"),
    (lambda: ElasticConfig(run_s=100.0, detection_s=-1.0), "detection_s"),
])
def test_bad_input_is_one_clear_sentence(make, words):
    with pytest.raises(PerfmodelError) as err:
        make()
    message = str(err.value)
    assert words in message and "\n" not in message


def test_min_workers_above_the_pool_is_refused():
    p = predict("ddp", small_scenario(2))
    with pytest.raises(PerfmodelError, match="min_workers 3 exceeds"):
        predict_elasticity(p, ElasticConfig(run_s=100.0, min_workers=3))


# ---------------------------------------------------------------- the command line's view


def test_no_elasticity_option_means_no_elasticity_work():
    assert elastic_config(seed=3) is None


def test_command_line_options_become_a_config_and_a_table():
    cfg = elastic_config(events="fail:1@2m,join:1@10m", checkpoint_interval_s=300.0,
                         restart_s=30.0)
    assert cfg.events[0] == MembershipEvent("fail", 1, 120.0)
    assert cfg.run_s == 3600.0          # at least an hour, and twice the last event
    assert (cfg.checkpoint_interval_s, cfg.restart_s) == (300.0, 30.0)
    rate = elastic_config(failure_rate_per_hour=0.1, seed=5)
    assert (rate.run_s, rate.seed, rate.events) == (24 * 3600.0, 5, ())
    e = predict_elasticity(predict("ddp", small_scenario()), cfg)
    text = render_elasticity(e)
    assert "goodput" in text and "2 restarts" in text     # the failure and the rejoin
    doc = e.to_json()
    assert doc["restarts"] == 2 and len(doc["throughput_series"]["t_s"]) == 200


def test_predict_command_adds_an_elasticity_section():
    import json

    from click.testing import CliRunner

    from perfmodel.commands.predict import command

    args = ["--strategy", "ddp", "--workers", "4", "--events", "fail:1@120",
            "--checkpoint-interval-s", "100", "--checkpoint-write-s", "0", "--json"]
    out = CliRunner().invoke(command, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)["elasticity"]
    assert doc["restarts"] == 1 and doc["lost_work_s"] == pytest.approx(20.0)
    plain = CliRunner().invoke(command, ["--strategy", "ddp", "--workers", "4", "--json"])
    assert "elasticity" not in json.loads(plain.output)
