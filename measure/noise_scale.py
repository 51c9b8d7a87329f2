"""The gradient noise scale of synchronous training, measured: B_simple = tr(Σ)/|G|².

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training": with
per-sample gradient covariance Σ and true gradient G, a step of batch B makes
1/(1 + B_simple/B) of the progress of a noise-free step, so batches well above B_simple buy
little (perfmodel/accuracy/model.py batch_efficiency applies it to synchronous steps).

Estimator (their appendix A.1, with k small batches instead of two sizes): at a point of a
synchronous run, k gradients g_1..g_k of independent batches of b samples each, mean ḡ;
tr(Σ) ≈ b · Σ|g_i − ḡ|²/(k − 1) (unbiased: Var g_i = Σ/b), |G|² ≈ |ḡ|² − tr(Σ)/(k·b)
(unbiased for |G|²). Both are summed over the measured points before dividing (the ratio of
sums is stabler than a mean of ratios, whose denominators come near 0 late in training).
The run itself is measure/staleness_harness.py's plain SGD with every τ = 0, same model,
optimizer, batches and seed; the measuring batches come from their own stream, so the
training trajectory is exactly the harness's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from measure.staleness_harness import HarnessConfig, _build
from measure.training import DataSource, make_optimizer

MEASURE_STREAM = 2          # data stream of the measuring batches (training uses 0)
MICRO_BATCHES = 16          # k
MICRO_BATCH_SIZE = 16       # b


@dataclass(frozen=True, kw_only=True)
class NoisePoint:
    updates: int
    trace_sigma: float          # tr(Σ), per sample
    grad_sq: float              # |G|² estimate (may come out ≤ 0 near a minimum)


def _gradient(model, spec, x, y) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    spec.loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def measure_point(model, spec, data: DataSource, updates: int) -> NoisePoint:
    grads = torch.stack([_gradient(model, spec, *data.next_batch())
                         for _ in range(MICRO_BATCHES)])
    mean = grads.mean(dim=0)
    trace = MICRO_BATCH_SIZE * float(((grads - mean) ** 2).sum()) / (MICRO_BATCHES - 1)
    grad_sq = float((mean ** 2).sum()) - trace / (MICRO_BATCHES * MICRO_BATCH_SIZE)
    return NoisePoint(updates=updates, trace_sigma=trace, grad_sq=grad_sq)


def noise_scale_run(config: HarnessConfig, every: int) -> list[NoisePoint]:
    """Plain synchronous SGD for config.updates updates, measuring every `every` updates
    (from `every` on: the initial weights' gradient is not training's)."""
    spec = config.spec
    model = _build(spec, config.seed)
    optimizer = make_optimizer(spec, model.parameters())
    data = DataSource(spec, config.batch_size, config.seed, 0, "cpu")
    probe = DataSource(spec, MICRO_BATCH_SIZE, config.seed, MEASURE_STREAM, "cpu")
    points = []
    for done in range(1, config.updates + 1):
        x, y = data.next_batch()
        optimizer.zero_grad(set_to_none=True)
        spec.loss(model(x), y).backward()
        optimizer.step()
        if done % every == 0:
            points.append(measure_point(model, spec, probe, done))
            optimizer.zero_grad(set_to_none=True)
    return points


def noise_scale(points: list[NoisePoint]) -> float:
    """B_simple in samples: Σ tr(Σ) / Σ |G|² over the points."""
    g2 = sum(p.grad_sq for p in points)
    if g2 <= 0:
        return float("inf")
    return sum(p.trace_sigma for p in points) / g2
