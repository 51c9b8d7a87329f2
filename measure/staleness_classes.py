"""The workload classes of issue 16's held-out accuracy check, as the plan fixes them.

perfmodel/data/heldout/accuracy_plan.toml names four classes, each a model factory, data, an
optimizer and a schedule; this module builds them for measure/staleness_harness.py (no
download: scikit-learn's bundled sets and a generated task):

- mlp-digits: the `mlp` workload itself (measure/models.py, 4 x 1024 ReLU) on the digits,
  through the harness's own mlp path, so its runs are the ones mlp.toml is fitted on;
- cnn-digits: 2 conv (8, 16 channels, 3x3, padding 1, ReLU) + 2x2 max-pool + linear, on the
  digits as 1 x 8 x 8 images (measure/data.py's split);
- transformer-seq: a 2-layer pre-norm transformer (d 32, 2 heads, feed-forward 4d, learned
  positions, final LayerNorm, mean-pooled, linear head) on the sum mod 10 of 8 random digits
  (TRANSFORMER_TRAIN training and TRANSFORMER_TEST test sequences from a fixed generator);
- transformer-pointer (accuracy_plan_v2.toml's replacement for transformer-seq, which learned
  nothing within its budget): the same transformer and the same generated sequences, labelled
  by a pointer: the digit at position 1 + (first digit mod 7), so attention must find it;
- logreg-tabular: logistic regression (a linear layer to 2 logits, cross-entropy) on
  scikit-learn's breast-cancer set (569 x 30), a fixed 80/20 split, standardised with the
  training split's mean and SD.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from torch import nn

from measure.staleness_harness import HarnessConfig, Task
from perfmodel.errors import PerfmodelError

SPLIT_SEED = 0                  # the fixed train/test split (as measure/data.py's digits)
TEST_FRACTION = 0.2
SEQ_SEED = 16                   # the generated sequence task's fixed generator
SEQ_LENGTH, SEQ_DIGITS = 8, 10
TRANSFORMER_TRAIN, TRANSFORMER_TEST = 8192, 1024
BATCH_SIZE = 64                 # one worker's batch, as the mlp fit
# transformer-pointer's rate and budget, chosen from synchronous runs alone
# (accuracy_plan_v2.toml [[classes]] says how)
POINTER_LR, POINTER_BUDGET = 3e-3, 800


@dataclass(frozen=True, kw_only=True)
class WorkloadClass:
    """One class of the plan: model + data (a Task; None = the mlp workload's own path),
    optimizer, rate, schedule and the budget its runs are read at."""

    name: str
    description: str
    optimizer: str
    lr: float
    warmup_updates: int
    budget_updates: int
    eval_every: int
    workload: str               # the accuracy model's file name (<workload>.toml)
    data_set: str

    def task(self) -> Task | None:
        return TASKS[self.name]() if self.name in TASKS else None

    def config(self, *, mitigation: str = "none", seed: int = 0) -> HarnessConfig:
        return HarnessConfig(updates=self.budget_updates, lr=self.lr, optimizer=self.optimizer,
                             warmup_updates=self.warmup_updates, mitigation=mitigation,
                             batch_size=BATCH_SIZE, eval_every=self.eval_every, seed=seed)


def _split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(n))
    n_test = round(TEST_FRACTION * n)
    return order[n_test:], order[:n_test]


# ---------------------------------------------------------------- cnn-digits


def build_cnn_digits() -> nn.Sequential:
    return nn.Sequential(OrderedDict(
        image=nn.Unflatten(1, (1, 8, 8)),
        conv0=nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU()),
        conv1=nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        head=nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 10))))


@cache
def cnn_digits_task() -> Task:
    from measure.data import digits_split

    x_train, y_train, x_test, y_test = digits_split()
    return Task(name="cnn-digits", make_model=build_cnn_digits, x_train=x_train,
                y_train=y_train, x_test=x_test, y_test=y_test, classes=10)


# ---------------------------------------------------------------- transformer-seq


class PreNormLayer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class SeqTransformer(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2, layers: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(SEQ_DIGITS, d)
        self.positions = nn.Parameter(0.02 * torch.randn(SEQ_LENGTH, d))
        self.layers = nn.ModuleList(PreNormLayer(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, SEQ_DIGITS)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


@cache
def transformer_seq_task() -> Task:
    rng = np.random.default_rng(SEQ_SEED)
    ids = rng.integers(0, SEQ_DIGITS, (TRANSFORMER_TRAIN + TRANSFORMER_TEST, SEQ_LENGTH))
    x = torch.from_numpy(ids).long()
    y = x.sum(dim=1) % SEQ_DIGITS
    n = TRANSFORMER_TRAIN
    return Task(name="transformer-seq", make_model=SeqTransformer, x_train=x[:n],
                y_train=y[:n], x_test=x[n:], y_test=y[n:], classes=SEQ_DIGITS)


def pointer_labels(x: torch.Tensor) -> torch.Tensor:
    """The digit at position 1 + (first digit mod (length - 1)) of every sequence."""
    return x[torch.arange(len(x)), 1 + x[:, 0] % (SEQ_LENGTH - 1)]


@cache
def transformer_pointer_task() -> Task:
    seq = transformer_seq_task()
    x = torch.cat([seq.x_train, seq.x_test])
    y = pointer_labels(x)
    n = TRANSFORMER_TRAIN
    return Task(name="transformer-pointer", make_model=SeqTransformer, x_train=x[:n],
                y_train=y[:n], x_test=x[n:], y_test=y[n:], classes=SEQ_DIGITS)


# ---------------------------------------------------------------- logreg-tabular


def build_logreg() -> nn.Linear:
    return nn.Linear(30, 2)


@cache
def logreg_tabular_task() -> Task:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    train, test = _split(len(y))
    mean, sd = x[train].mean(dim=0), x[train].std(dim=0)
    x = (x - mean) / sd
    return Task(name="logreg-tabular", make_model=build_logreg, x_train=x[train],
                y_train=y[train], x_test=x[test], y_test=y[test], classes=2)


TASKS = {"cnn-digits": cnn_digits_task, "transformer-seq": transformer_seq_task,
         "logreg-tabular": logreg_tabular_task, "transformer-pointer": transformer_pointer_task}

# As perfmodel/data/heldout/accuracy_plan.toml and accuracy_plan_v2.toml [[classes]]
# (tests/test_staleness_classes.py checks that they agree).
CLASSES = {c.name: c for c in (
    WorkloadClass(name="mlp-digits", description="mlp (4 x 1024 ReLU) on scikit-learn digits",
                  optimizer="momentum", lr=0.05, warmup_updates=0, budget_updates=200,
                  eval_every=20, workload="mlp", data_set="digits"),
    WorkloadClass(name="cnn-digits", description="2 conv (8, 16) + max-pool + linear on the "
                  "8x8 digits", optimizer="momentum", lr=0.05, warmup_updates=20,
                  budget_updates=200, eval_every=20, workload="cnn-digits",
                  data_set="digits"),
    WorkloadClass(name="transformer-seq", description="2-layer pre-norm transformer, d 32, 2 "
                  "heads, on the sum mod 10 of 8 generated digits", optimizer="adam",
                  lr=3e-3, warmup_updates=20, budget_updates=300, eval_every=20,
                  workload="transformer-seq", data_set="sum-mod-10 of 8 digits (generated)"),
    WorkloadClass(name="logreg-tabular", description="logistic regression on scikit-learn's "
                  "breast-cancer set", optimizer="momentum", lr=0.1, warmup_updates=10,
                  budget_updates=150, eval_every=10, workload="logreg-tabular",
                  data_set="breast-cancer (scikit-learn)"),
    WorkloadClass(name="transformer-pointer", description="2-layer pre-norm transformer, d 32, "
                  "2 heads, on the digit at position 1 + (first mod 7) of 8 generated digits",
                  optimizer="adam", lr=POINTER_LR, warmup_updates=20,
                  budget_updates=POINTER_BUDGET, eval_every=50,
                  workload="transformer-pointer",
                  data_set="pointer into 8 digits (generated)"))}


def workload_class(name: str) -> WorkloadClass:
    if name not in CLASSES:
        raise PerfmodelError(f"unknown workload class '{name}'; known: {', '.join(CLASSES)}")
    return CLASSES[name]
