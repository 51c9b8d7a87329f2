"""A user's own model module for `perfmodel workloads add --module tests.user_model:...`."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn


def make_net() -> nn.Sequential:
    """Two hidden layers on 3x8x8 inputs, 10 classes: 3 units."""
    return nn.Sequential(OrderedDict(
        flat=nn.Flatten(),
        hidden=nn.Sequential(nn.Linear(192, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()),
        head=nn.Linear(256, 10)))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.out = nn.Linear(32, 100)

    def forward(self, ids):
        return self.out(self.emb(ids))


def make_lm() -> nn.Module:
    """Not an nn.Sequential: one unit."""
    return TinyLM()
