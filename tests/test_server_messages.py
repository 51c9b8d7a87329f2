"""A serial CPU-host server's own messages, `[server.push]` and `[server.reply]`: fitted from
the 1-worker PS runs (calibration/fit_ps.py, calibration/from_store.py `_server_messages`),
written and read back (calibration/profile_writer.py, perfmodel/cluster.py), and carried by
the model in place of the link's fit (perfmodel/sim/ps.py `message_s` and `_route`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from calibration import from_store
from calibration.fit_ps import fit_server_messages
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.sim.ps import AsyncPS, message_s
from perfmodel.workload import load_workload
from tests.test_serial_server import WORKLOAD, scenario, serial_cluster

EXACT = 1e-9
CNN, MLP = load_workload("cnn-small"), load_workload("mlp")


def _bytes(wl) -> tuple[float, float]:
    return wl.params * wl.precision_spec.grad_bytes, wl.params * wl.precision_spec.param_bytes


def test_the_fit_recovers_each_directions_latency_and_rate():
    push = lambda n: 400e-6 + n / 2.5e9                                     # noqa: E731
    reply = lambda n: 50e-6 + n / 4.0e9                                     # noqa: E731
    sizes = [2.5e6, 12.9e6, 12.9e6]
    (p_lat, p_bw), (r_lat, r_bw) = fit_server_messages(
        sizes, [push(n) for n in sizes], sizes, [reply(n) for n in sizes])
    assert (p_lat.value, p_bw.value) == pytest.approx((400.0, 2.5), rel=1e-6)
    assert (r_lat.value, r_bw.value) == pytest.approx((50.0, 4.0), rel=1e-6)
    assert p_lat.parameter == "server.push.latency_us"
    assert r_bw.parameter == "server.reply.bandwidth_GBps"
    with pytest.raises(PerfmodelError, match="server.push: needs pushes of >= 2 sizes"):
        fit_server_messages([1e6, 1e6], [1e-3, 2e-3], [1e6, 2e6], [1e-3, 2e-3])


def _ps_run(wl, push_s: float, reply_s: float, apply_s: float = 0.004, pack_s: float = 0.001,
            workers: int = 1, run_id: int = 1):
    """A PS run as the store gives it: the server's phases per update and the worker's round
    trip per step (push + apply + pack + reply); step 0 a warm-up far off, left out."""
    updates = [{"step": s, "apply_s": apply_s, "pack_s": pack_s,
                "reply_s": reply_s if s else 9.0} for s in range(5)]
    steps = [{"step": s, "comm_wait_s": (push_s + apply_s + pack_s + reply_s) if s else 9.0}
             for s in range(5)]
    tables = {"updates": updates, "steps": steps}
    return SimpleNamespace(row=SimpleNamespace(id=run_id, workload=wl.name, workers=workers,
                                               config={"warmup_steps": 1}),
                           table=lambda name: tables.get(name, []))


def test_calibration_takes_the_push_from_the_round_trip_and_the_reply_from_the_server():
    base, notes = load_cluster("local"), []
    (c_push, c_grad), (m_push, m_grad) = _bytes(CNN), _bytes(MLP)
    runs = [_ps_run(CNN, 0.0012, 0.0007), _ps_run(MLP, 0.0049, 0.0032),
            # a crowded run (workers queue at the server): its phases are no message alone
            _ps_run(MLP, 0.0300, 0.0100, workers=5)]
    fit = from_store._server_messages(runs, base, notes)
    assert fit is not None and not notes
    (p_lat, p_bw), (r_lat, r_bw) = fit
    pushed = lambda n: p_lat.value * 1e-6 + n / (p_bw.value * 1e9)          # noqa: E731
    replied = lambda n: r_lat.value * 1e-6 + n / (r_bw.value * 1e9)         # noqa: E731
    assert (pushed(c_push), pushed(m_push)) == pytest.approx((0.0012, 0.0049), rel=1e-6)
    assert (replied(c_grad), replied(m_grad)) == pytest.approx((0.0007, 0.0032), rel=1e-6)


def test_calibration_says_when_it_cannot_fit_them():
    base, notes = load_cluster("local"), []
    assert from_store._server_messages([_ps_run(MLP, 0.0049, 0.0032)], base, notes) is None
    assert "not fitted" in notes[-1] and "found 1" in notes[-1]
    # a round trip no longer than the server's own phases leaves no push
    assert from_store._server_messages([_ps_run(CNN, 0.0012, 0.0007),
                                        _ps_run(MLP, -0.001, 0.0032, run_id=7)],
                                       base, notes) is None
    assert "run 7's round trip" in notes[-1]
    assert from_store._server_messages([_ps_run(CNN, 0.0012, 0.0007),
                                        _ps_run(MLP, 0.0049, 0.0032)],
                                       load_cluster("a100"), []) is None   # no serial server


def _with_messages(push=(400.0, 2.5), reply=(50.0, 4.0)):
    base = load_cluster("local")
    sizes = [2.5e6, 12.9e6]
    fit = fit_server_messages(
        sizes, [push[0] * 1e-6 + n / (push[1] * 1e9) for n in sizes],
        sizes, [reply[0] * 1e-6 + n / (reply[1] * 1e9) for n in sizes])
    data = build_profile("local", base, MeasuredFits(server_messages=fit),
                         RunInfo(host="h", device_names=(), versions="v", runs=2))
    return data, parse_profile(data, base.path)


def test_the_profile_carries_them_and_the_model_charges_them_on_a_serial_server_only():
    data, cluster = _with_messages()
    assert data["server"]["push"]["bandwidth_GBps"] == pytest.approx(2.5, rel=1e-6)
    assert {"server.push", "server.reply"} <= set(data["calibration"]["measured"])
    grad, params = _bytes(MLP)
    assert message_s(cluster, "push", grad) == pytest.approx(400e-6 + grad / 2.5e9, rel=1e-6)
    assert message_s(cluster, "pull", params) == pytest.approx(50e-6 + params / 4e9, rel=1e-6)
    base = load_cluster("local")          # not measured: the server's link decides
    assert cluster.server.message_s("push", grad) is not None
    assert base.server.message_s("push", grad) is None
    assert message_s(base, "push", grad) != message_s(cluster, "push", grad)
    gpu = load_cluster("a100")            # a GPU server is no serial server: ignored
    measured_gpu = dataclasses.replace(gpu, server=dataclasses.replace(
        gpu.server, push_latency_us=400.0, push_GBps=2.5))
    assert message_s(measured_gpu, "push", grad) == message_s(gpu, "push", grad)
    bad = {**data, "server": {**data["server"], "reply": {"latency_us": -1.0,
                                                          "bandwidth_GBps": 4.0}}}
    with pytest.raises(PerfmodelError, match="server.reply.latency_us"):
        parse_profile(bad, cluster.path)


def test_the_simulated_messages_take_the_measured_times():
    # one worker, cores enough that nothing shares: every push and every reply holds the
    # server for exactly its measured time, and slower messages lengthen the step by
    # exactly their difference (nothing queues)
    plain = serial_cluster()
    slow = dataclasses.replace(plain, server=dataclasses.replace(
        plain.server, push_latency_us=300.0, push_GBps=0.5, reply_latency_us=100.0,
        reply_GBps=1.0))
    grad = WORKLOAD.params * WORKLOAD.precision_spec.grad_bytes
    params = WORKLOAD.params * WORKLOAD.precision_spec.param_bytes
    result = AsyncPS().simulate(scenario(1, steps=6, cluster=slow))
    pushes = [c.end_s - c.start_s for c in result.comms if c.kind == "push"]
    pulls = [c.end_s - c.start_s for c in result.comms if c.kind == "pull"]
    assert pushes == pytest.approx([300e-6 + grad / 0.5e9] * len(pushes), rel=EXACT)
    assert pulls == pytest.approx([100e-6 + params / 1e9] * len(pulls), rel=EXACT)
    step = lambda c: AsyncPS().simulate(scenario(1, steps=6, cluster=c)).steps[-1]  # noqa: E731
    s_plain, s_slow = step(plain), step(slow)
    added = (message_s(slow, "push", grad) - message_s(plain, "push", grad)
             + message_s(slow, "pull", params) - message_s(plain, "pull", params))
    assert (s_slow.end_s - s_slow.start_s) - (s_plain.end_s - s_plain.start_s) \
        == pytest.approx(added, rel=1e-6)
