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
and real parameter-server runs are comparable.

Other models: a `Task` (a model factory, train and test tensors, a loss) replaces the mlp and
its digits; `HarnessConfig` keeps the optimizer (sgd, momentum 0.9, adam), the rate and the
schedule (a linear warm-up over the first `warmup_updates`, then constant). Batches then come
from the task's training tensors exactly as measure/data.py draws the digits (a fresh random
order every epoch from numpy's generator (seed, stream 0)). measure/staleness_classes.py holds
the workload classes of issue 16; `perfmodel staleness fit` builds a Task from a user's module.

Seeds: initial weights from `seed` (torch's generator, forked so the global state is left
alone), batches from (seed, stream 0), τ draws from an explicit torch.Generator seeded with
`seed`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from measure.data import DIGITS_WORKLOAD, DataSource, evaluate, held_out_set
from measure.models import MODELS, ModelSpec
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

OPTIMIZERS = ("sgd", "momentum", "adam")
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
    optimizer: str = "momentum"         # sgd, SGD with momentum 0.9 (the workload's), adam
    warmup_updates: int = 0             # linear warm-up: update v at lr·min(1, (v+1)/warm-up)
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
        if self.warmup_updates < 0:
            raise PerfmodelError(f"warm-up must be >= 0 updates, got {self.warmup_updates}")

    def scheduled_lr(self, update: int) -> float:
        """The rate of update `update` (0-based) before any staleness mitigation."""
        if self.warmup_updates and update < self.warmup_updates:
            return self.lr * (update + 1) / self.warmup_updates
        return self.lr

    @property
    def spec(self) -> ModelSpec:
        """The mlp workload with this run's optimizer and learning rate."""
        return dataclasses.replace(MODELS[DIGITS_WORKLOAD], optimizer=self.optimizer,
                                   learning_rate=self.lr)


@dataclass(frozen=True, kw_only=True)
class Task:
    """A model and its data for the harness: what a workload class or a user's module gives."""

    name: str
    make_model: Callable[[], torch.nn.Module]     # built under torch.manual_seed(seed)
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int                                  # chance = 1/classes (a diverged run's score)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.nn.functional.cross_entropy

    def __post_init__(self):
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise PerfmodelError(f"{self.name}: inputs and targets differ in length")
        if len(self.y_train) < 1 or len(self.y_test) < 1:
            raise PerfmodelError(f"{self.name}: needs training and test samples")
        if self.classes < 2:
            raise PerfmodelError(f"{self.name}: needs at least 2 classes, got {self.classes}")

    @property
    def chance_accuracy(self) -> float:
        return 1.0 / self.classes


class TensorSource:
    """Batches of a Task's training tensors, drawn as measure/data.py draws the digits."""

    def __init__(self, task: Task, batch_size: int, seed: int, stream: int):
        self.task, self.batch_size = task, batch_size
        self._rng = np.random.default_rng([seed, stream])
        self._rng.integers(2**62)            # as DataSource: its synthetic generator's seed
        self._order: np.ndarray = np.empty(0, dtype=np.int64)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.task.y_train)
        if len(self._order) < min(self.batch_size, n):
            self._order = self._rng.permutation(n)
        take, self._order = self._order[:self.batch_size], self._order[self.batch_size:]
        index = torch.from_numpy(take)
        return self.task.x_train[index], self.task.y_train[index]


@torch.no_grad()
def evaluate_task(model: torch.nn.Module, task: Task, chunk: int = 256) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on the task's test tensors."""
    hits, loss_sum, x, y = 0, 0.0, task.x_test, task.y_test
    for start in range(0, len(x), chunk):
        out = model(x[start:start + chunk])
        target = y[start:start + chunk]
        loss_sum += float(task.loss(out.float(), target)) * len(target)
        hits += int((out.argmax(dim=-1) == target).sum())
    return hits / len(y), loss_sum / len(y)


class _Pieces:
    """Model, optimizer, batches and scoring of one run: the mlp workload's or a Task's."""

    def __init__(self, config: HarnessConfig, task: Task | None):
        self.config, self.task = config, task
        if task is None:
            self.spec = config.spec

    def build(self) -> torch.nn.Module:
        if self.task is None:
            return _build(self.spec, self.config.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            return self.task.make_model()

    def optimizer(self, params) -> torch.optim.Optimizer:
        if self.task is None:
            return make_optimizer(self.spec, params)
        return _optimizer(self.config.optimizer, self.config.lr, params)

    def data(self, stream: int = 0, batch_size: int | None = None):
        b = self.config.batch_size if batch_size is None else batch_size
        if self.task is None:
            return DataSource(self.spec, b, self.config.seed, stream, "cpu")
        return TensorSource(self.task, b, self.config.seed, stream)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.spec.loss(out, y) if self.task is None else self.task.loss(out, y)

    def scorer(self) -> Callable[[torch.nn.Module], tuple[float, float]]:
        if self.task is None:
            x_test, y_test, _ = held_out_set(self.spec, self.config.seed, "cpu")
            return lambda model: evaluate(model, self.spec, x_test, y_test)
        return lambda model: evaluate_task(model, self.task)

    @property
    def chance_accuracy(self) -> float:
        return CHANCE_ACCURACY if self.task is None else self.task.chance_accuracy


def _optimizer(name: str, lr: float, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)


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
                "warmup_updates": self.config.warmup_updates,
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


def run_harness(staleness: Sequence[int] | np.ndarray, config: HarnessConfig,
                task: Task | None = None) -> HarnessResult:
    """Train for `config.updates` updates with gradients delayed by the profile: the mlp
    workload on digits, or `task`'s model on its data."""
    taus = staleness_sequence(check_profile(staleness), config)
    pieces = _Pieces(config, task)
    server, worker = _Flat(pieces.build()), _Flat(pieces.build())
    optimizer = pieces.optimizer(server.params)
    capacity = int(taus.max()) + 1
    ring = torch.empty((capacity, server.vector.numel()))
    ring[0].copy_(server.vector)
    data = pieces.data()
    score = pieces.scorer()
    evals, accs, losses, applied = [0], [], [], []
    acc, loss = score(server.model)
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
        batch_loss = pieces.loss(worker.model(x), y)
        batch_loss.backward()
        grad = worker.gradient()
        if config.mitigation == "dc":
            grad = grad + config.dc_lambda * grad * grad * (server.vector - worker.vector)
        lr = config.scheduled_lr(v)
        lr = lr / max(tau, 1) if config.mitigation == "staleness-aware" else lr
        for group in optimizer.param_groups:
            group["lr"] = lr
        server.set_gradient(grad)
        optimizer.step()
        ring[(v + 1) % capacity].copy_(server.vector)
        done = v + 1
        if not (math.isfinite(batch_loss.item()) and torch.isfinite(server.vector).all()):
            diverged = True
        if diverged or done % config.eval_every == 0 or done == config.updates:
            acc, loss = ((pieces.chance_accuracy, math.nan) if diverged
                         else score(server.model))
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


def plain_sgd(config: HarnessConfig, task: Task | None = None) -> torch.Tensor:
    """Ordinary SGD on the same model, batches, optimizer and schedule: the flat final
    parameters. The reference that the harness with zero delay must equal exactly.
    """
    pieces = _Pieces(config, task)
    model = pieces.build()
    optimizer = pieces.optimizer(model.parameters())
    data = pieces.data()
    for v in range(config.updates):
        x, y = data.next_batch()
        for group in optimizer.param_groups:
            group["lr"] = config.scheduled_lr(v)
        optimizer.zero_grad(set_to_none=True)
        pieces.loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
