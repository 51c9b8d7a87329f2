"""A serial CPU-host server's messages on a host with more processes than cores:
server.crowded_message_factor, fitted from the calibration's crowded PS runs
(calibration/from_store.py `_crowded_messages`, fit_ps.py `fit_crowded_messages`) and
carried by perfmodel/sim/ps.py `send`. Seen in reports 49-56: the crowded server's receive
and reply took 1.3-1.9x the 1-worker fits while the host kept ~1.5 of its 2 cores busy, and
the held-out crowded PS runs' server phases matched the calibration's crowded run's within
its session (docs/model.md)."""

from __future__ import annotations

import dataclasses
import glob
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from calibration.fit_ps import fit_crowded_factor
from calibration.from_store import CROWDED_IN_SAMPLE, _crowded_server, calibrate_runs
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from calibration.suite import CROWDED_PS_REPEATS, build_suite
from measure.store import Store
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.sim.ps import SHARING_TOLERANCE, AsyncPS
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

REPO = Path(__file__).resolve().parent.parent
MESSAGES = "server.crowded_message_factor"
# report 56's set A (committed): three 1-worker-fitted messages and one crowded run
SET_A = REPO / "reports/local-2026-12-07-heldout-56/pooled/report-56-set-a.sqlite"


def served(cluster, workers: int, factor: float | None, steps: int = 12,
           update: float | None = None):
    """A timed-wait async PS run of the mlp on `cluster` with the crowded factors set."""
    c = dataclasses.replace(cluster, server=dataclasses.replace(
        cluster.server, crowded_message_factor=factor,
        crowded_update_factor=update)).as_timed_wait()
    sc = Scenario(cluster=c, workload=load_workload("mlp"), workers=workers, batch_size=64,
                  steps=steps, jitter="none")
    return AsyncPS()._run(sc, "async")


def local_with_messages():
    """The shipped local profile with a serial server's messages as a calibration fits them
    (report 56's set A: push 0.55 ms + 4.0 GB/s, reply 0.1 ms + 4.9 GB/s, update 0.35 ms +
    2.5 GB/s, about)."""
    local = load_cluster("local")
    return dataclasses.replace(local, server=dataclasses.replace(
        local.server, push_latency_us=550.0, push_GBps=4.0, reply_latency_us=100.0,
        reply_GBps=4.9, update_latency_us=350.0, update_GBps=2.5))


# -- the fit --------------------------------------------------------------------------------

def test_the_factor_is_the_median_ratio_of_crowded_to_alone():
    fit = fit_crowded_factor(MESSAGES, [0.012, 0.016, 0.013], [0.008, 0.008, 0.008])
    assert fit.parameter == "server.crowded_message_factor"
    assert fit.value == pytest.approx(1.625)
    assert fit.points == 3 and fit.stderr > 0
    one = fit_crowded_factor(MESSAGES, [0.012], [0.008])
    assert one.value == pytest.approx(1.5) and one.stderr == 0


@pytest.mark.parametrize("crowded, alone", [([], []), ([0.01, 0.02], [0.01]),
                                            ([0.01], [0.0]), ([-0.01], [0.01])])
def test_the_fit_refuses_what_cannot_give_a_factor(crowded, alone):
    with pytest.raises(PerfmodelError):
        fit_crowded_factor(MESSAGES, crowded, alone)


def test_set_a_crowded_run_gives_its_own_receive_and_reply_over_the_fitted_messages():
    # Independent arithmetic on the stored rows: the server's medians over its steady
    # updates, over the 1-worker push + reply the profile carries at the mlp's sizes
    store = Store(SET_A)
    runs = [store.get_run(r.id) for r in store.list_runs(kind="ps")]
    crowded = [r for r in runs if int(r.row.workers) == 5]
    assert len(crowded) == 1                     # before CROWDED_PS_REPEATS was 3
    cluster = local_with_messages()
    notes: list[str] = []
    fit, update = _crowded_server(runs, cluster, notes)    # the 1-worker runs are not crowded
    assert fit is not None and fit.points == 1
    run = crowded[0]
    warm = int(run.row.config["warmup_steps"])
    ups = [u for u in run.table("updates") if int(u["step"]) >= warm]
    measured = np.median([u["recv_s"] for u in ups]) + np.median([u["reply_s"] for u in ups])
    mlp = load_workload("mlp")
    alone = (cluster.server.message_s("push", mlp.params * 4)
             + cluster.server.message_s("pull", mlp.params * 4))
    assert fit.value == pytest.approx(measured / alone, rel=1e-9)
    assert 1.0 < fit.value < 3.0 and "server.crowded_message_factor" in notes[0]
    applied = np.median([u["apply_s"] + u["pack_s"] for u in ups])
    fitted = 350e-6 + mlp.params * 4 / 2.5e9
    assert update.value == pytest.approx(applied / fitted, rel=1e-9)
    assert 0.3 < update.value < 3.0 and "server.crowded_update_factor" in notes[1]


def test_no_factor_without_fitted_messages_or_a_crowded_run():
    store = Store(SET_A)
    runs = [store.get_run(r.id) for r in store.list_runs(kind="ps")]
    notes: list[str] = []
    assert _crowded_server(runs, load_cluster("local"), notes) == (None, None)  # no fits
    assert "not fitted" in notes[-1]
    alone = [r for r in runs if int(r.row.workers) == 1]
    assert _crowded_server(alone, local_with_messages(), notes) == (None, None)
    assert "not fitted" in notes[-1]


def test_the_profile_carries_the_factor_and_refuses_a_bad_one(tmp_path):
    base = local_with_messages()
    fitted = fit_crowded_factor(MESSAGES, [0.013], [0.008])
    update = fit_crowded_factor("server.crowded_update_factor", [0.006], [0.008])
    data = build_profile("x", base, MeasuredFits(crowded_message_factor=fitted,
                                                 crowded_update_factor=update),
                         RunInfo(host="h", device_names=("cpu",), versions="v", runs=1))
    assert data["server"]["crowded_message_factor"] == pytest.approx(1.625)
    assert data["server"]["crowded_update_factor"] == pytest.approx(0.75)
    assert {"server.crowded_message_factor", "server.crowded_update_factor"} <= \
        set(data["calibration"]["measured"])
    parsed = parse_profile(data, tmp_path / "x.toml")
    assert parsed.server.crowded_message_factor == pytest.approx(1.625)
    assert parsed.server.crowded_update_factor == pytest.approx(0.75)
    unfitted = build_profile("x", base, MeasuredFits(),
                             RunInfo(host="h", device_names=("cpu",), versions="v", runs=1))
    assert "crowded_message_factor" not in unfitted["server"]
    assert parse_profile(unfitted, tmp_path / "x.toml").server.crowded_message_factor is None
    for name in ("crowded_message_factor", "crowded_update_factor"):
        bad = {**data, "server": {**data["server"], name: 0.0}}
        with pytest.raises(PerfmodelError, match=name):
            parse_profile(bad, tmp_path / "x.toml")


def test_calibrating_set_a_fits_the_factor_and_calls_the_crowded_check_in_sample():
    store = Store(SET_A)
    ids = [r.id for r in store.list_runs()]
    cal = calibrate_runs(store, ids)
    assert cal.fits.crowded_message_factor is not None
    crowded = [c for c in cal.self_checks if "5 workers" in c.label]
    assert len(crowded) == 1 and crowded[0].fitted_from_it == CROWDED_IN_SAMPLE
    one_worker = [c for c in cal.self_checks if c.label.endswith(", 1 worker")]
    assert one_worker and not any(c.fitted_from_it for c in one_worker)
    assert any(n.startswith("a crowded serial server's receive + reply") for n in cal.notes)
    assert all("not used in the fit" not in w for w in crowded[0].warnings())


# -- the model ------------------------------------------------------------------------------

def test_an_uncrowded_host_ignores_the_factor():
    # one worker and its server on 2 cores: the 1-worker runs the messages were fitted on
    cluster = local_with_messages()
    plain, crowded = served(cluster, 1, None), served(cluster, 1, 3.0)
    assert plain.env.now == pytest.approx(crowded.env.now, rel=1e-12)
    assert [r[2:4] for r in plain.comm_rows] == [r[2:4] for r in crowded.comm_rows]


def test_a_crowded_host_holds_each_message_for_the_factor_without_holding_a_core():
    # 5 workers and the server on 2 cores: every message holds its server at least the
    # factor times its 1-worker time; the copies' busy spans stay the shared copies' length
    cluster = local_with_messages()
    factor = 3.0
    plain, crowded = served(cluster, 5, None), served(cluster, 5, factor)
    assert crowded.crowded == [True]
    mlp = load_workload("mlp")
    push = cluster.server.message_s("push", mlp.params * 4)
    for kind, _worker, start, end, *_ in crowded.comm_rows:
        if kind == "push":
            assert end - start >= factor * push * (1 - 1e-9)
    stretch = plain.stretch[2][0]           # the shared copies' own stretch (the fixed point)
    assert stretch < factor
    busy = sorted(b - a for a, b in crowded.copy_spans[0])
    assert busy[-1] < factor * push      # the longest copy is the shared one, not the message
    assert crowded.env.now > plain.env.now * 1.3


def test_a_crowded_server_applies_at_the_crowded_runs_rate_and_an_uncrowded_one_does_not():
    cluster = local_with_messages()
    fitted = 350e-6 + load_workload("mlp").params * 4 / 2.5e9
    for workers, crowded in ((1, False), (5, True)):
        run = served(cluster, workers, None, update=0.7)
        plain = served(cluster, workers, None)
        assert run.crowded == [crowded]
        # the apply before the fixed point's stretch of it (the servers' own, same in both)
        own = [s.apply_s / x for s, x in zip(run.servers, run.stretch[1], strict=True)]
        base = [s.apply_s / x for s, x in zip(plain.servers, plain.stretch[1], strict=True)]
        assert base == pytest.approx([fitted], rel=1e-9)
        assert own == pytest.approx([0.7 * fitted if crowded else fitted], rel=1e-9)


@pytest.mark.parametrize("factor", [1.2, 1.6, 2.0])
def test_a_larger_factor_never_speeds_a_crowded_run(factor):
    # within the core-sharing fixed point's own tolerance (it stops when no stretch moves by
    # more than SHARING_TOLERANCE): at 1.2 the factor is about the copies' own stretch
    cluster = local_with_messages()
    times = [served(cluster, 5, f).env.now for f in (None, factor, factor + 0.3)]
    slack = 1 + SHARING_TOLERANCE
    assert times[0] <= times[1] * slack and times[1] <= times[2] * slack


# -- the suite ------------------------------------------------------------------------------

def test_the_crowded_ps_runs_are_spread_through_the_training_runs():
    full = build_suite("cpu", suite="local")
    training = [m for m in full if m.config["kind"] in ("ddp", "fsdp", "ps")]
    at = [i for i, m in enumerate(training) if m.key.startswith("ps-crowded-")]
    assert CROWDED_PS_REPEATS == len(at) == 3
    assert all(b - a >= 2 for a, b in zip(at, at[1:], strict=False))
    assert [training[i].config["calibration"]["repeat"] for i in at] == [1, 2, 3]
    assert all(training[i].config["workers"] == 5 for i in at)


def test_reports_crowded_run_matches_the_held_out_eight_worker_servers_messages():
    # Where a report timed the held-out async-ps-mlp-tw8's server, its median receive +
    # reply per update against set A's crowded run's (the factor's numerator), same session.
    # Bound: a factor 1.35 either way, the self-check's tolerance for a PS round trip
    # (calibration/data/self_check.toml), independent of these numbers. Every report that
    # has both, none left out.
    tolerance = tomllib.loads((REPO / "calibration/data/self_check.toml").read_text())
    factor = 1 + float(tolerance["tolerance_rel"]["ps_round_trip"])
    seen = 0
    for report in sorted(glob.glob(str(REPO / "reports/local-*-heldout-*"))):
        stores = [p for p in Path(report, "pooled").glob("*set-a.sqlite")]
        if len(stores) != 1:
            continue
        rows = json.loads(Path(report, "comparisons.json").read_text())["comparisons"]
        tw8 = [r for r in rows if r["key"] == "async-ps-mlp-tw8"
               and r.get("server_recv_s_measured") and r.get("server_reply_s_measured")]
        store = Store(stores[0])
        crowded = [store.get_run(r.id) for r in store.list_runs(kind="ps")
                   if int(r.workers) == 5]
        if not tw8 or not crowded:
            continue
        run = crowded[-1]
        warm = int(run.row.config["warmup_steps"])
        ups = [u for u in run.table("updates") if int(u["step"]) >= warm and "recv_s" in u]
        if not ups:
            continue
        set_a = np.median([u["recv_s"] for u in ups]) + np.median([u["reply_s"] for u in ups])
        held_out = tw8[0]["server_recv_s_measured"] + tw8[0]["server_reply_s_measured"]
        assert 1 / factor <= held_out / set_a <= factor, (report, held_out, set_a)
        seen += 1
    assert seen >= 8
