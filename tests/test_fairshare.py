"""The fair-share link against hand calculations of fluid processor sharing (Kleinrock 1967)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.errors import PerfmodelError
from perfmodel.sim.engine import CountingEnvironment
from perfmodel.sim.fairshare import FairShareLink
from tests.factories import flat_link

REL = 1e-9          # timings are exact up to floating-point rounding


def run_transfers(bandwidth_Bps: float, latency_s: float,
                  arrivals: list[tuple[float, float]]) -> tuple[FairShareLink, list[float]]:
    """Start transfer i of arrivals[i] = (time_s, bytes); return the link and end times."""
    env = CountingEnvironment()
    link = FairShareLink(env, "test", [], bandwidth_Bps, latency_s)
    ends = [0.0] * len(arrivals)

    def sender(i: int, at_s: float, nbytes: float):
        yield env.timeout(at_s)
        record = yield from link.transfer("push", i, nbytes)
        ends[i] = record.end_s

    for i, (at_s, nbytes) in enumerate(arrivals):
        env.process(sender(i, at_s, nbytes))
    env.run()
    return link, ends


def test_single_transfer_takes_latency_plus_bytes_over_bandwidth():
    _, ends = run_transfers(100.0, 0.25, [(0.0, 50.0)])
    assert ends[0] == pytest.approx(0.25 + 50.0 / 100.0, rel=REL)


def test_two_equal_simultaneous_transfers_each_take_twice_as_long():
    # Processor sharing: two transfers at once each get bandwidth / 2.
    _, ends = run_transfers(100.0, 0.0, [(0.0, 100.0), (0.0, 100.0)])
    assert ends == pytest.approx([2.0, 2.0], rel=REL)


def test_late_arrival_by_hand():
    # A (100 B) alone from 0 to 0.5 s gets 50 B at 100 B/s; B (100 B) joins, both get 50 B/s:
    # A's last 50 B end at 1.5 s; B then has 50 B left alone at 100 B/s and ends at 2.0 s.
    # With 0.1 s latency everything shifts by 0.1 s (B's latency overlaps A's transfer).
    _, ends = run_transfers(100.0, 0.0, [(0.0, 100.0), (0.5, 100.0)])
    assert ends == pytest.approx([1.5, 2.0], rel=REL)
    _, ends = run_transfers(100.0, 0.1, [(0.0, 100.0), (0.5, 100.0)])
    assert ends == pytest.approx([1.6, 2.1], rel=REL)


def test_short_transfer_overtakes_long_one():
    # A = 300 B at t=0, B = 50 B at t=1 on 100 B/s: A alone has 200 B left at t=1; sharing,
    # B finishes after 50 / 50 = 1 s (t=2), A then has 150 B left alone: t = 3.5.
    _, ends = run_transfers(100.0, 0.0, [(0.0, 300.0), (1.0, 50.0)])
    assert ends == pytest.approx([3.5, 2.0], rel=REL)


def test_link_efficiency_curve_charges_small_messages_more():
    # A cluster Link with efficiency 0.5 at every size carries bytes at half its bandwidth.
    env = CountingEnvironment()
    link = FairShareLink(env, "half", [], 1e9, 10e-6, efficiency=lambda nbytes: 0.5)
    env.process(link.transfer("pull", 0, 1e6))
    env.run()
    assert link.records[0].end_s == pytest.approx(10e-6 + 1e6 / 0.5e9, rel=REL)


def test_from_link_uses_bandwidth_and_latency():
    env = CountingEnvironment()
    records = []
    link = FairShareLink.from_link(env, "flat", records, flat_link(2.0, latency_us=5.0))
    env.process(link.transfer("pull", 3, 4e9))
    env.run()
    (rec,) = records
    assert (rec.kind, rec.worker, rec.link, rec.bytes) == ("pull", 3, "flat", 4e9)
    assert rec.end_s == pytest.approx(5e-6 + 2.0, rel=REL)


def test_bad_link_parameters_are_user_errors():
    env = CountingEnvironment()
    with pytest.raises(PerfmodelError, match="bandwidth"):
        FairShareLink(env, "x", [], 0.0)
    with pytest.raises(PerfmodelError, match="latency"):
        FairShareLink(env, "x", [], 1.0, latency_s=-1.0)


@settings(max_examples=60, deadline=None)
@given(bandwidth=st.floats(1.0, 1e10),
       arrivals=st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(1.0, 1e3)),
                         min_size=1, max_size=40))
def test_work_conservation(bandwidth, arrivals):
    # A work-conserving server delivers exactly its bandwidth while busy (fluid PS model):
    # total bytes / busy time = bandwidth; no transfer beats its solo time bytes / bandwidth.
    arrivals = [(t, b * bandwidth / 1e3) for t, b in arrivals]   # transfer times 1 ms .. 1 s
    link, ends = run_transfers(bandwidth, 0.0, arrivals)
    total = sum(b for _, b in arrivals)
    assert link.bytes_done == pytest.approx(total, rel=REL)
    assert total / link.busy_s == pytest.approx(bandwidth, rel=1e-6)
    assert link.active == 0
    for (at_s, nbytes), end in zip(arrivals, ends, strict=True):
        assert end - at_s >= nbytes / bandwidth * (1 - 1e-9)
