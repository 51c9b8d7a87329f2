"""Shared test setup: `gpu` tests skip with a reason where no CUDA device is present; the
commands' wait for a quiet machine (measure/protocol.py, --settle-max-s) is off in tests, so
a busy test machine does not add half a minute to every run a test launches."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("PERFMODEL_SETTLE_MAX_S", "0")


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
