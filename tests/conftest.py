"""Shared test setup: `gpu` tests skip with a reason where no CUDA device is present."""

from __future__ import annotations

import importlib.util

import pytest


def _cuda_devices() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and _cuda_devices() == 0:
        skip = pytest.mark.skip(reason="needs CUDA GPUs; none on this machine")
        for item in gpu_items:
            item.add_marker(skip)
