"""The data every training run draws: real digits for `mlp`, synthetic batches otherwise.

the `mlp` workload trains on scikit-learn's bundled digits (1,797 8x8 images,
Alpaydin & Kaynak 1998; `sklearn.datasets.load_digits`, no download) with one fixed 80/20
train/test split; the other workloads use synthetic batches from the model's
`example_batch`. Every rank draws its own batches from its own seeded generator.

`held_out_set` is the fixed test set a run is scored on, `evaluate` its loss and accuracy.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from measure.models import ModelSpec
from measure.timed_wait import is_timed_wait

DIGITS_WORKLOAD = "mlp"             # the workload that trains on the real digits data
DIGITS_TEST_FRACTION = 0.2          # held-out share of the 1,797 digits images
DIGITS_SPLIT_SEED = 0               # fixed: every run is scored on the same test images
SYNTHETIC_TEST_SAMPLES = 256        # size of the synthetic held-out set
HELD_OUT_STREAM = 1_000_000         # generator stream of the held-out set (ranks use 0..)


@cache
def digits_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): the digits scaled to [0, 1], one fixed split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.from_numpy(np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y)))
    n_test = round(DIGITS_TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def uses_digits(spec: ModelSpec) -> bool:
    return spec.name == DIGITS_WORKLOAD


class DataSource:
    """Training batches for one stream (a rank or worker), reproducible from (seed, stream).

    Digits: the training images in a fresh random order every epoch. Synthetic: the model's
    `example_batch` from a torch generator seeded by (seed, stream).
    """

    def __init__(self, spec: ModelSpec, batch_size: int, seed: int, stream: int, device: str):
        self.spec, self.batch_size, self.device = spec, batch_size, device
        self._rng = np.random.default_rng([seed, stream])
        self._generator = torch.Generator().manual_seed(int(self._rng.integers(2**62)))
        self._order: np.ndarray = np.empty(0, dtype=np.int64)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not uses_digits(self.spec):
            x, y = self.spec.example_batch(self.batch_size, self._generator)
            return x.to(self.device), y.to(self.device)
        x_train, y_train, _, _ = digits_split()
        if len(self._order) < self.batch_size:
            self._order = self._rng.permutation(len(y_train))
        take, self._order = self._order[:self.batch_size], self._order[self.batch_size:]
        index = torch.from_numpy(take)
        return x_train[index].to(self.device), y_train[index].to(self.device)


def held_out_set(spec: ModelSpec, seed: int, device: str
                 ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(inputs, targets, what they are): the digits test images, or a synthetic set."""
    if uses_digits(spec):
        _, _, x, y = digits_split()
        return x.to(device), y.to(device), f"digits-test-{len(y)}"
    source = DataSource(spec, SYNTHETIC_TEST_SAMPLES, seed, HELD_OUT_STREAM, device)
    x, y = source.next_batch()
    return x, y, f"synthetic-held-out-{SYNTHETIC_TEST_SAMPLES}"


@torch.no_grad()
def evaluate(model: torch.nn.Module, spec: ModelSpec, x: torch.Tensor, y: torch.Tensor,
             chunk: int = 256) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on (x, y); accuracy = share of argmax hits (per token
    for language models). NaN for a timed-wait model, which computes nothing."""
    if is_timed_wait(spec):
        return float("nan"), float("nan")
    hits, total, loss_sum = 0, 0, 0.0
    for start in range(0, len(x), chunk):
        out = model(x[start:start + chunk])
        target = y[start:start + chunk]
        loss_sum += float(spec.loss(out, target)) * len(target)
        hits += int((out.argmax(dim=-1) == target).sum())
        total += target.numel()
    return hits / total, loss_sum / len(x)
