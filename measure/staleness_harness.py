"""What staleness costs, measured for real in one process: SGD with delayed gradients.

Asynchronous training applies at model version v a gradient computed on version v − τ
(τ = staleness, Zhang et al. 2016). This harness reproduces exactly that on the `mlp` workload
and scikit-learn's digits, one process, for any staleness profile — the simulator's
UpdateRecords for 1 to 1024 workers, or a measured run's — without the workers:

- a ring buffer keeps the last τ_max + 1 parameter versions (one flat fp32 vector each);
- update v draws τ from the profile (or replays it in order), computes the gradient of a fresh
  batch on version v − min(τ, v), and applies it to the current parameters with the workload's
  optimizer, as the real parameter server does (measure/runs/ps.py `Server.apply`);
- mitigations, as on the real server: the staleness-aware rate α₀/max(τ, 1) (Zhang et al.
  2016) and DC-ASGD's compensated gradient g + λ g⊙g⊙(w_now − w_old) (Zheng et al. 2017);
- test accuracy on the fixed digits test split (measure/data.py) every `eval_every`
  updates; a run whose loss or parameters stop being finite is marked diverged.

With every τ = 0 the harness is ordinary SGD, bit for bit (tests/test_staleness_harness.py).
Data, split, model and optimizer are measure/data.py's and training.py's, so harness numbers
and real parameter-server runs are comparable. Seeds: initial weights from `seed` (torch's
generator, forked so the global state is left alone), batches from (seed, stream 0), τ draws
from an explicit torch.Generator seeded with `seed`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from measure.data import DIGITS_WORKLOAD, DataSource, evaluate, held_out_set
from measure.models import MODELS, ModelSpec
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

OPTIMIZERS = ("sgd", "momentum")
MITIGATIONS = ("none", "staleness-aware", "dc")
SAMPLING = ("draw", "replay")
DC_LAMBDA = 0.04            # DC-ASGD's λ, as measure/runs/ps.py's default
MAX_RING_VERSIONS = 1024    # parameter versions kept at most (13 MB each for mlp)
CHANCE_ACCURACY = 0.1       # ten digit classes


@dataclass(frozen=True, kw_only=True)
class HarnessConfig:
    """One harness run: how long, how fast and with which protocol."""

    updates: int = 300                  # gradients applied
    lr: float = 0.05                    # α₀; the mlp workload's own rate
    optimizer: str = "momentum"         # sgd, or SGD with momentum 0.9 (the workload's)
    mitigation: str = "none"            # none, staleness-aware (α₀/max(τ,1)), dc (DC-ASGD)
    dc_lambda: float = DC_LAMBDA
    batch_size: int = 64                # samples per gradient (one worker's batch)
    eval_every: int = 20                # updates between test evaluations
    sampling: str = "draw"              # draw τ i.i.d. from the profile, or replay it in order
    seed: int = 0

    def __post_init__(self):
        if self.updates < 1:
            raise PerfmodelError(f"updates must be at least 1, got {self.updates}")
        if not self.lr > 0:
            raise PerfmodelError(f"learning rate must be positive, got {self.lr}")
        for name, value, known in (("optimizer", self.optimizer, OPTIMIZERS),
                                   ("mitigation", self.mitigation, MITIGATIONS),
                                   ("sampling", self.sampling, SAMPLING)):
            if value not in known:
                raise PerfmodelError(f"{name} '{value}' is not one of {', '.join(known)}")
        if self.batch_size < 1 or self.eval_every < 1:
            raise PerfmodelError("batch size and eval_every must be at least 1")

    @property
    def spec(self) -> ModelSpec:
        """The mlp workload with this run's optimizer and learning rate."""
        return dataclasses.replace(MODELS[DIGITS_WORKLOAD], optimizer=self.optimizer,
                                   learning_rate=self.lr)


@dataclass(frozen=True, kw_only=True)
class HarnessResult:
    config: HarnessConfig
    staleness: tuple[int, ...]          # τ applied to each update (after the min(τ, v) clamp)
    eval_updates: tuple[int, ...]       # updates done at each evaluation (0 = initial weights)
    accuracy: tuple[float, ...]         # test accuracy at each evaluation
    loss: tuple[float, ...]             # test loss at each evaluation (nan once diverged)
    diverged: bool
    final_params: torch.Tensor = field(repr=False)   # flat, for exactness checks

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[-1]

    def to_json(self) -> dict:
        return {"updates": self.config.updates, "lr": self.config.lr,
                "optimizer": self.config.optimizer, "mitigation": self.config.mitigation,
                "batch_size": self.config.batch_size, "seed": self.config.seed,
                "mean_staleness": float(np.mean(self.staleness)),
                "eval_updates": list(self.eval_updates), "accuracy": list(self.accuracy),
                "diverged": self.diverged}


def check_profile(staleness: Sequence[int] | np.ndarray) -> np.ndarray:
    """The profile as an int64 array, refused when empty, negative or fractional."""
    values = np.asarray(staleness, dtype=float).reshape(-1)
    if values.size == 0:
        raise PerfmodelError("the staleness profile is empty; give at least one τ value")
    if (values < 0).any() or (values != np.round(values)).any():
        raise PerfmodelError("staleness values must be whole numbers >= 0")
    if values.max() >= MAX_RING_VERSIONS:
        raise PerfmodelError(f"staleness {int(values.max())} exceeds the harness's ring of "
                             f"{MAX_RING_VERSIONS} parameter versions")
    return values.astype(np.int64)


def staleness_sequence(profile: np.ndarray, config: HarnessConfig) -> np.ndarray:
    """τ for every update: i.i.d. draws from the profile, or the profile replayed cyclically."""
    if config.sampling == "replay":
        return np.resize(profile, config.updates)
    generator = torch.Generator().manual_seed(config.seed)
    index = torch.randint(len(profile), (config.updates,), generator=generator).numpy()
    return profile[index]


class _Flat:
    """A model whose parameters are views into one flat vector (one copy moves them all)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.params = list(model.parameters())
        self.vector = torch.cat([p.detach().reshape(-1) for p in self.params])
        offset = 0
        for p in self.params:
            p.data = self.vector[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def gradient(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def set_gradient(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()


def _build(spec: ModelSpec, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):     # build_model seeds torch's global generator
        return build_model(spec, seed, "cpu")


def run_harness(staleness: Sequence[int] | np.ndarray, config: HarnessConfig) -> HarnessResult:
    """Train mlp on digits for `config.updates` updates with gradients delayed by the profile."""
    taus = staleness_sequence(check_profile(staleness), config)
    spec = config.spec
    server, worker = _Flat(_build(spec, config.seed)), _Flat(_build(spec, config.seed))
    optimizer = make_optimizer(spec, server.params)
    capacity = int(taus.max()) + 1
    ring = torch.empty((capacity, server.vector.numel()))
    ring[0].copy_(server.vector)
    data = DataSource(spec, config.batch_size, config.seed, 0, "cpu")
    x_test, y_test, _ = held_out_set(spec, config.seed, "cpu")
    evals, accs, losses, applied = [0], [], [], []
    acc, loss = evaluate(server.model, spec, x_test, y_test)
    accs.append(acc)
    losses.append(loss)
    diverged = False
    for v in range(config.updates):
        tau = int(min(taus[v], v))
        applied.append(tau)
        worker.vector.copy_(ring[(v - tau) % capacity])
        x, y = data.next_batch()
        for p in worker.params:
            p.grad = None
        batch_loss = spec.loss(worker.model(x), y)
        batch_loss.backward()
        grad = worker.gradient()
        if config.mitigation == "dc":
            grad = grad + config.dc_lambda * grad * grad * (server.vector - worker.vector)
        lr = config.lr / max(tau, 1) if config.mitigation == "staleness-aware" else config.lr
        for group in optimizer.param_groups:
            group["lr"] = lr
        server.set_gradient(grad)
        optimizer.step()
        ring[(v + 1) % capacity].copy_(server.vector)
        done = v + 1
        if not (math.isfinite(batch_loss.item()) and torch.isfinite(server.vector).all()):
            diverged = True
        if diverged or done % config.eval_every == 0 or done == config.updates:
            acc, loss = ((CHANCE_ACCURACY, math.nan) if diverged
                         else evaluate(server.model, spec, x_test, y_test))
            evals.append(done)
            accs.append(acc)
            losses.append(loss)
        if diverged:
            break
    applied.extend(int(t) for t in taus[len(applied):])
    return HarnessResult(config=config, staleness=tuple(applied), eval_updates=tuple(evals),
                         accuracy=tuple(accs), loss=tuple(losses), diverged=diverged,
                         final_params=server.vector.clone())


def accuracy_at(result: HarnessResult, updates: int) -> float:
    """Test accuracy after `updates` updates (a diverged run stays at chance)."""
    ev = np.asarray(result.eval_updates)
    if updates > ev[-1] and not result.diverged:
        raise PerfmodelError(f"the run stopped at {ev[-1]} updates, before {updates}")
    i = int(np.searchsorted(ev, updates, side="right")) - 1
    return result.accuracy[max(i, 0)]


def plain_sgd(config: HarnessConfig) -> torch.Tensor:
    """Ordinary SGD on the same model, batches and optimizer: the flat final parameters.

    The reference that the harness with zero delay must equal exactly.
    """
    spec = config.spec
    model = _build(spec, config.seed)
    optimizer = make_optimizer(spec, model.parameters())
    data = DataSource(spec, config.batch_size, config.seed, 0, "cpu")
    for _ in range(config.updates):
        x, y = data.next_batch()
        optimizer.zero_grad(set_to_none=True)
        spec.loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
