"""The gradient noise scale estimator (measure/noise_scale.py) and its use for synchronous
steps (perfmodel/accuracy/model.py batch_efficiency), against McCandlish et al. 2018."""

from __future__ import annotations

import pytest

from perfmodel.accuracy.model import batch_efficiency

# 60 points of k = 16 batches of 16: the ratio of sums has a relative SE of a few percent
ESTIMATOR_TOLERANCE = 0.15


def test_batch_efficiency_limits():
    assert batch_efficiency(None, 64, 16) == 1.0            # not measured: linear scaling
    assert batch_efficiency(100.0, 64, 1) == 1.0
    # B_noise >> N·b: every batch counts fully; B_noise << b: a step counts as one batch
    assert batch_efficiency(1e9, 64, 16) == pytest.approx(1.0, rel=1e-6)
    assert 16 * batch_efficiency(1e-9, 64, 16) == pytest.approx(1.0, rel=1e-6)
    # the step of N batches is worth (1 + B/b)/(1 + B/(N b)) batches (S = S_min(1 + B/batch))
    b, n, noise = 64, 8, 24.0
    assert n * batch_efficiency(noise, b, n) == pytest.approx((1 + noise / b)
                                                              / (1 + noise / (n * b)))


def test_estimator_recovers_a_known_noise_scale():
    torch = pytest.importorskip("torch")
    from measure.noise_scale import MICRO_BATCH_SIZE, measure_point, noise_scale

    d, sigma, offset = 50, 2.0, 0.5      # per-sample gradient w − x, x ~ N(0, σ² I)

    class Shift(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((d,), offset))

        def forward(self, x):
            return self.w - x

    class Spec:
        @staticmethod
        def loss(out, _):
            return 0.5 * (out ** 2).sum(dim=1).mean()

    class Data:
        def __init__(self):
            self.g = torch.Generator().manual_seed(0)

        def next_batch(self):
            return sigma * torch.randn(MICRO_BATCH_SIZE, d, generator=self.g), None

    model, data = Shift(), Data()
    points = [measure_point(model, Spec, data, i) for i in range(60)]
    expected = d * sigma**2 / (d * offset**2)        # tr(Σ)/|G|²
    assert noise_scale(points) == pytest.approx(expected, rel=ESTIMATOR_TOLERANCE)
