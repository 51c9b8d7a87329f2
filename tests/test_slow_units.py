"""A CPU straggler as a slower device (measure/timing.py `SlowUnits`), on a fake clock: each
unit's forward advances it by a known time, its backward by another, and every sleep is
recorded, so the sleeps and where they fall are exact."""

from __future__ import annotations

import pytest
import torch

from measure import timing

FORWARD_S = (0.010, 0.020, 0.030)
BACKWARD_S = (0.050, 0.070, 0.090)
SPEED = 0.5                                 # 1/s - 1 = 1: every sleep equals its pass


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        self.now += seconds


class _Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clock, seconds, log, i):
        ctx.clock, ctx.seconds, ctx.log, ctx.i = clock, seconds, log, i
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(("backward", ctx.i, len(ctx.clock.sleeps)))
        ctx.clock.now += ctx.seconds
        return grad, None, None, None, None


class Unit(torch.nn.Module):
    def __init__(self, clock, i, log):
        super().__init__()
        self.clock, self.i, self.log = clock, i, log
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        self.clock.now += FORWARD_S[self.i]
        return _Backward.apply(x * self.weight, self.clock, BACKWARD_S[self.i], self.log, self.i)


@pytest.fixture
def fake(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(timing.time, "sleep", clock.sleep)
    return clock


def test_a_slow_worker_sleeps_each_pass_where_a_slower_device_would_take_it(fake):
    log: list = []
    units = [Unit(fake, i, log) for i in range(3)]
    model = torch.nn.Sequential(*units)
    slow = timing.SlowUnits(list(model.children()), SPEED)
    for step in range(2):
        slow.start_step()
        fake.sleeps.clear()
        log.clear()
        model(torch.ones(1)).sum().backward()
        forward = [round(f, 9) for f in FORWARD_S]
        # step 1 knows no backward yet: twice each forward; step 2 the units measured
        # (unit 0's backward is never marked: twice its forward)
        backward = [2 * f for f in forward][::-1] if step == 0 else \
            [BACKWARD_S[2], BACKWARD_S[1], 2 * FORWARD_S[0]]
        assert fake.sleeps == pytest.approx(forward + backward, abs=1e-9)
        assert slow.slept_s == pytest.approx(sum(forward) + sum(backward), abs=1e-9)
        # every unit's backward sleep comes before that unit computes its backward
        assert [(i, n) for _, i, n in log] == [(2, 4), (1, 5), (0, 6)]


def test_a_full_speed_worker_is_not_slowed(fake):
    model = torch.nn.Sequential(*[Unit(fake, i, []) for i in range(3)])
    slow = timing.SlowUnits(list(model.children()), 1.0)
    slow.start_step()
    model(torch.ones(1)).sum().backward()
    assert fake.sleeps == [] and slow.slept_s == 0.0
