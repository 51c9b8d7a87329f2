"""Small builders for tests: synthetic workloads and clusters with chosen parameters."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from perfmodel.cluster import ClusterProfile, Link, load_cluster
from perfmodel.workload import Unit, Workload


def make_workload(*, units: int = 4, params_per_unit: int = 1_000_000,
                  flops_per_sample: float = 1e9, activation_bytes_per_sample: float = 1e6,
                  precision: str = "fp32", optimizer: str = "sgd",
                  batch_size: int = 32) -> Workload:
    return Workload(
        name="synthetic", description="synthetic test workload", generated_by="tests",
        precision=precision, optimizer=optimizer, batch_size=batch_size,
        units=tuple(Unit(name=f"u{i}", params=params_per_unit,
                         forward_flops_per_sample=flops_per_sample,
                         activation_bytes_per_sample=activation_bytes_per_sample)
                    for i in range(units)),
        path=Path("synthetic.toml"),
        # the bytes above are at the workload's precision, as a workload file's default
        activation_element_bytes=4 if precision in ("fp32", "tf32") else 2,
    )


def flat_link(bandwidth_GBps: float, latency_us: float = 0.0) -> Link:
    """A link with no size-dependent efficiency loss: β = 1 / bandwidth exactly."""
    return Link(bandwidth_GBps=bandwidth_GBps, latency_us=latency_us,
                efficiency_by_bytes=((1.0, 1.0),))


def make_cluster(base: str = "a100", *, zero_compute: bool = False, **changes) -> ClusterProfile:
    """A shipped profile with fields replaced. zero_compute=True makes every compute phase
    (unit passes and the optimizer step) take no time, leaving communication alone."""
    c = load_cluster(base)
    if zero_compute:
        changes["compute"] = dataclasses.replace(
            c.compute, overhead_us_per_unit=0.0, optimizer_GBps=1e30, jitter_cv=0.0,
            launch_us_per_kernel=0.0, memory_efficiency=0.0)
        changes["device"] = dataclasses.replace(
            c.device, peak_TFLOPS={k: 1e30 for k in c.device.peak_TFLOPS})
    return dataclasses.replace(c, **changes)


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the folder is scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
