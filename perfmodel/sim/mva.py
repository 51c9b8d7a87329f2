"""Exact mean-value analysis of a closed queueing network (Reiser & Lavenberg, JACM 1980).

N customers (PS workers) cycle between one delay station with mean think time Z (compute and
pure latencies: no queueing) and K queueing stations with service demands D_k (seconds of
service per cycle: a server's link, its apply step). By the arrival theorem a customer
arriving at station k finds the queue the network holds with one customer fewer, so for
n = 1..N:

    R_k(n) = D_k (1 + Q_k(n-1)),   X(n) = n / (Z + sum_k R_k(n)),   Q_k(n) = X(n) R_k(n).

Exact for product-form networks (BCMP: processor-sharing or infinite-server stations with any
service distribution, FCFS stations with exponential service); an approximation for FCFS
stations with deterministic service. The asymptotic bounds X(n) <= min(n / (Z + D), 1 / D_max)
meet at the saturation point N* = (Z + D) / D_max (Denning & Buzen 1978): below it workers
mostly compute, above it they mostly queue at the bottleneck station.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.errors import PerfmodelError


@dataclass(frozen=True, slots=True)
class MVAResult:
    """Mean values for every population n = 1..N (row n-1)."""

    think_s: float
    demands_s: np.ndarray            # (K,) service demand per cycle at each queueing station
    throughput_per_s: np.ndarray     # (N,) X(n): cycles per second, all customers together
    response_s: np.ndarray           # (N, K) R_k(n): residence time per cycle at station k
    queue_length: np.ndarray         # (N, K) Q_k(n): mean customers at station k

    @property
    def cycle_s(self) -> np.ndarray:
        """(N,) mean time of one customer's cycle: Z + sum_k R_k(n) = n / X(n)."""
        return self.think_s + self.response_s.sum(axis=1)

    @property
    def utilisation(self) -> np.ndarray:
        """(N, K) fraction of time each station is busy: X(n) D_k."""
        return self.throughput_per_s[:, None] * self.demands_s[None, :]


def _check(demands_s: Sequence[float] | np.ndarray, think_s: float) -> np.ndarray:
    demands = np.atleast_1d(np.asarray(demands_s, dtype=float))
    if demands.ndim != 1 or demands.size == 0:
        raise PerfmodelError("give at least one queueing station's service demand")
    if np.any(demands < 0) or not np.all(np.isfinite(demands)):
        raise PerfmodelError("service demands must be finite and >= 0 seconds")
    if not (think_s >= 0 and np.isfinite(think_s)):
        raise PerfmodelError(f"think time must be finite and >= 0 seconds, got {think_s}")
    if think_s == 0 and demands.sum() == 0:
        raise PerfmodelError("think time and every service demand are zero: throughput is "
                             "unbounded")
    return demands


def mva(demands_s: Sequence[float] | np.ndarray, think_s: float, customers: int) -> MVAResult:
    """Exact MVA of `customers` customers, think time `think_s`, queueing demands `demands_s`."""
    demands = _check(demands_s, think_s)
    if customers < 1:
        raise PerfmodelError(f"customers must be at least 1, got {customers}")
    throughput = np.empty(customers)
    response = np.empty((customers, demands.size))
    queue = np.empty((customers, demands.size))
    q = np.zeros(demands.size)
    for n in range(1, customers + 1):
        r = demands * (1.0 + q)
        x = n / (think_s + r.sum())
        q = x * r
        throughput[n - 1], response[n - 1], queue[n - 1] = x, r, q
    return MVAResult(think_s=float(think_s), demands_s=demands, throughput_per_s=throughput,
                     response_s=response, queue_length=queue)


def throughput_bounds(demands_s: Sequence[float] | np.ndarray, think_s: float,
                      customers: int) -> tuple[float, float]:
    """Asymptotic bounds on X(N): (N / (Z + N D), min(N / (Z + D), 1 / D_max)), D = sum D_k."""
    demands = _check(demands_s, think_s)
    total, peak = float(demands.sum()), float(demands.max())
    upper = customers / (think_s + total)
    if peak > 0:
        upper = min(upper, 1.0 / peak)
    return customers / (think_s + customers * total), upper


def saturation_customers(demands_s: Sequence[float] | np.ndarray, think_s: float) -> float:
    """N* = (Z + D) / D_max: the population where the two asymptotic bounds cross."""
    demands = _check(demands_s, think_s)
    peak = float(demands.max())
    return float("inf") if peak == 0 else (think_s + float(demands.sum())) / peak
