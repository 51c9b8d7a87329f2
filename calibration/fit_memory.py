"""Fit the memory a run uses beyond the analytic model: a framework constant plus a fraction.

perfmodel/memory.py adds up model state, activations and communication buffers (ZeRO,
Rajbhandari et al. 2020; the FSDP and DDP sources it cites) and leaves out what an allocator
trace would show: the framework's own memory (CUDA context, library workspaces, torch's
process state) and a per-run extra that grows with the tensors (caching-allocator rounding
and fragmentation, temporaries inside kernels and collectives). Measured peaks fit

    measured = framework + (1 + fraction) x analytic,

with `analytic` the model's peak *without* its framework part (MemoryBreakdown.peak_bytes −
framework_bytes). `framework` feeds device.framework_overhead_GiB; `fraction` is the proposed
field device.memory_overhead_fraction. Least squares in relative error; a negative constant
within noise of zero is taken as zero (calibration/fit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibration.fit import FitResult, check_measurements, fit_result, relative_lstsq
from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown

MIN_SPREAD = 1.5      # largest / smallest analytic size that tells constant from fraction


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySample:
    """One run's measured peak bytes per device and the analytic peak for the same run."""

    measured_bytes: float
    analytic_bytes: float           # model peak without framework_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryFit:
    framework_overhead_GiB: FitResult
    overhead_fraction: FitResult    # proposed profile field device.memory_overhead_fraction

    @property
    def results(self) -> tuple[FitResult, ...]:
        return (self.framework_overhead_GiB, self.overhead_fraction)


def memory_sample(measured_bytes: float, model: MemoryBreakdown) -> MemorySample:
    """Pair a measured peak with the model's breakdown, leaving out its framework part."""
    return MemorySample(measured_bytes=measured_bytes,
                        analytic_bytes=model.peak_bytes - model.framework_bytes)


def fit_memory(samples: Sequence[MemorySample]) -> MemoryFit:
    """Fit framework constant and proportional extra from runs of different sizes."""
    meas = check_measurements([s.measured_bytes for s in samples], "measured peak bytes")
    model = check_measurements([s.analytic_bytes for s in samples], "analytic peak bytes")
    if meas.size < 2 or model.max() < MIN_SPREAD * model.min():
        raise PerfmodelError(
            f"device.memory_overhead_fraction: need measured peaks of >= 2 runs whose modelled "
            f"memory differs by >= {MIN_SPREAD}x (e.g. two batch sizes or models), found "
            f"{meas.size} run(s) spanning {model.max() / model.min():.2f}x")
    fit = relative_lstsq(np.column_stack([np.ones_like(model), model]), meas, zero_ok=(0,))
    const, scale = fit.coef
    what = f"{meas.size} measured memory peaks"
    if const < 0:
        raise PerfmodelError(
            f"device.framework_overhead_GiB: the fit gives {const / 2**30:.3g} GiB from {what}; "
            f"the analytic model overstates these runs (check the memory records)")
    if scale <= 0:
        raise PerfmodelError(
            f"device.memory_overhead_fraction: the fit gives a non-positive scale ({scale:.3g}) "
            f"from {what}; measured memory does not grow with the modelled memory")
    return MemoryFit(
        framework_overhead_GiB=fit_result("device.framework_overhead_GiB", const / 2**30,
                                          fit.stderr[0] / 2**30, fit.rel),
        overhead_fraction=fit_result("device.memory_overhead_fraction", scale - 1.0,
                                     fit.stderr[1], fit.rel),
    )
