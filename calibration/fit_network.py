"""Fit each link class's latency, bandwidth and size-dependent efficiency from collective sweeps.

The model is the simulator's (perfmodel/sim/collectives.py; Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005): a ring
collective of n bytes over p ranks packed onto k nodes takes

    (steps − crossing)·α_intra + crossing·α_inter + busbw_factor(op, p)·n·β(n)

    op               steps      crossing (k > 1)   busbw_factor (nccl-tests PERFORMANCE.md)
    all-reduce       2(p−1)     2(k−1)             2(p−1)/p
    all-gather       p−1        k−1                (p−1)/p     n = the gathered output
    reduce-scatter   p−1        k−1                (p−1)/p     n = the input
    broadcast        p−1        k−1                1           pipelined ring (NCCL)
    send-recv        1          1                  1
    ping-pong        1          1                  1           one way, half a round trip

with β(n) = 1 / (bandwidth_GBps·1e9 · efficiency(n)) of the slowest link the ring uses, the
efficiency looked up at n (cluster.Link.seconds_per_byte). Single-node measurements fit
`intra_node`; measurements over several nodes then fit `inter_node` with α_intra known and
the node link taken as the bottleneck (β = β_inter), which holds when the NIC is slower per
rank than the links inside a node, as on every cluster the profiles describe.

The bandwidth is the best achieved one and the efficiency curve (kept only where the
residuals show it, see calibration/fit.py) is relative to it, so every fraction is in (0, 1].

Not every library runs every kind as a ring: gloo on CPU took about 1.5x the ring model's time
for all-gather and 3x for reduce-scatter against the all-reduce fit here. So where all-reduce
was measured at enough sizes beside other kinds, α, β and the curve are fitted on all-reduce
alone (the kind DDP uses) and each other kind gets a time factor, the geometric median of its
measured / modelled times (`Link.time_factor_by_op`); the residuals by kind are taken after
the factors.

One-way point-to-point messages (ping-pong, the push and pull of a parameter server) are no
ring step: gloo over loopback moved them at ~0.2 ms and ~1.8 GB/s where the all-reduce fit
said 0.7 ms and 1.2 GB/s (its α is a ring step's wake-up). Where a scope has ping-pong
timings at >= MIN_SIZES sizes they get an α–β fit of their own (`LinkFit.p2p`, the profile's
`[<scope>.p2p]`) and take no part in the collective fit; otherwise messages use the
collective fit, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from calibration.fit import FitResult, Residual, fit_latency_rate, fit_result
from perfmodel.cluster import Link
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import busbw_factor, ring_steps

SCOPES = ("intra_node", "inter_node")
REFERENCE_OP = "all-reduce"  # fitted for α, β and the curve when other kinds get factors
P2P_OP = "ping-pong"         # one-way messages: fitted apart (LinkFit.p2p)
MIN_SIZES = 3                # distinct message sizes needed per scope to separate α from β


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveSample:
    """One timed collective: the nccl-tests row (op, size, time) and where it ran."""

    op: str                 # all-reduce, all-gather, reduce-scatter, broadcast, send-recv
    ranks: int
    bytes: float            # nccl-tests size S (all-gather: output; reduce-scatter: input)
    time_s: float           # median time of one call
    nodes: int = 1
    # each rank's CPU seconds (all threads) over its wall seconds, averaged over the ranks
    # (measure/runs/collectives.py); None where not recorded
    cpu_busy_fraction: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkFit:
    """The fitted parameters of one link class, ready for a profile's [intra_node]/[inter_node]."""

    scope: str                                       # "intra_node" or "inter_node"
    latency_us: FitResult
    bandwidth_GBps: FitResult
    efficiency_by_bytes: tuple[tuple[float, float], ...]   # [message bytes, fraction]
    curve_fitted: bool                               # False: flat, the residuals showed none
    by_op: dict[str, Residual]                       # how well the one model fits each op
    time_factor_by_op: dict[str, float] = field(default_factory=dict)   # see the docstring
    p2p: LinkFit | None = None                       # ping-pong's own fit (see the docstring)

    @property
    def results(self) -> tuple[FitResult, ...]:
        own = (self.latency_us, self.bandwidth_GBps)
        return own if self.p2p is None else own + self.p2p.results


def fit_network(samples: Sequence[CollectiveSample]) -> dict[str, LinkFit]:
    """Fit `intra_node` from single-node samples, then `inter_node` if there are any over
    nodes; each with a p2p fit of its own where it has ping-pong timings at enough sizes."""
    rings = [s for s in samples if s.op != P2P_OP]
    fits = {"intra_node": _with_p2p(fit_link(rings, "intra_node"), samples)}
    if any(s.nodes > 1 and s.ranks > 1 for s in rings):
        fits["inter_node"] = _with_p2p(
            fit_link(rings, "inter_node", intra=fits["intra_node"]), samples)
    return fits


def _with_p2p(fit: LinkFit, samples: Sequence[CollectiveSample]) -> LinkFit:
    """`fit` with the p2p fit of its scope's ping-pong timings, if >= MIN_SIZES sizes."""
    inter = fit.scope == "inter_node"
    use = [s for s in samples if s.op == P2P_OP and s.ranks > 1 and (s.nodes > 1) == inter]
    if len({s.bytes for s in use}) < MIN_SIZES:
        return fit
    p2p = fit_link(use, fit.scope)
    name = f"{fit.scope}.p2p"
    return replace(fit, p2p=replace(
        p2p, scope=name,
        latency_us=replace(p2p.latency_us, parameter=f"{name}.latency_us"),
        bandwidth_GBps=replace(p2p.bandwidth_GBps, parameter=f"{name}.bandwidth_GBps")))


def fit_link(samples: Sequence[CollectiveSample], scope: str = "intra_node",
             intra: LinkFit | None = None) -> LinkFit:
    """Fit α, bandwidth and the efficiency curve of one scope from the samples that use it.

    Samples with one rank (no communication) and those of the other scope are left out.
    `inter_node` needs the `intra` fit for the ring steps that stay inside a node.
    """
    if scope not in SCOPES:
        raise PerfmodelError(f"unknown link scope '{scope}'; choose from: {', '.join(SCOPES)}")
    use = [s for s in samples if s.ranks > 1 and (s.nodes > 1) == (scope == "inter_node")]
    _check_samples(use, scope)
    what = _describe(use, scope)
    steps, crossing, volume = _design(use)
    size = np.array([s.bytes for s in use])
    times = np.array([s.time_s for s in use])
    if scope == "intra_node":
        alpha_steps, known = steps, np.zeros_like(times)
    else:
        inside = steps - crossing
        if intra is None and inside.any():
            raise PerfmodelError("inter_node: fitting it needs the intra_node fit first "
                                 "(measure the same collectives on one node)")
        alpha_intra = 0.0 if intra is None else intra.latency_us.value * 1e-6
        alpha_steps, known = crossing, inside * alpha_intra
    ops = np.array([s.op for s in use])
    ref = ops == REFERENCE_OP
    if not (len(set(size[ref])) >= MIN_SIZES and (~ref).any()):
        ref = np.ones(len(use), dtype=bool)           # one kind, or too few all-reduces
    fit = fit_latency_rate(alpha_steps[ref], volume[ref], size[ref], times[ref], known[ref],
                           names=(f"{scope}.latency_us", f"{scope}.bandwidth_GBps"), what=what,
                           bias_test=True)
    link = Link(bandwidth_GBps=fit.rate / 1e9, latency_us=fit.latency * 1e6,
                efficiency_by_bytes=fit.curve)
    model = known + alpha_steps * fit.latency + volume * np.array(
        [link.seconds_per_byte(n) for n in size])
    factors = {} if ref.all() else {
        str(op): float(np.exp(np.median(np.log(times[ops == op] / model[ops == op]))))
        for op in sorted(set(ops[~ref]))}
    scaled = model * np.array([factors.get(str(op), 1.0) for op in ops])
    rel = (scaled - times) / times
    return LinkFit(
        scope=scope,
        latency_us=fit_result(f"{scope}.latency_us", fit.latency * 1e6,
                              fit.latency_stderr * 1e6, rel),
        bandwidth_GBps=fit_result(f"{scope}.bandwidth_GBps", fit.rate / 1e9,
                                  fit.rate_stderr / 1e9, rel),
        efficiency_by_bytes=fit.curve,
        curve_fitted=fit.curve_kept,
        by_op={str(op): Residual.of(rel[ops == op]) for op in sorted(set(ops))},
        time_factor_by_op=factors,
    )


def _check_samples(use: list[CollectiveSample], scope: str) -> None:
    for s in use:
        ring_steps(s.op, s.ranks, s.nodes)          # refuses an unknown collective
        if s.nodes > s.ranks:
            raise PerfmodelError(f"a {s.op} measurement has {s.ranks} ranks on {s.nodes} "
                                 f"nodes; every node needs at least one rank")
        for name in ("bytes", "time_s"):
            value = getattr(s, name)
            if not math.isfinite(value) or value <= 0:
                raise PerfmodelError(
                    f"{scope}: a {s.op} timing at {s.ranks} ranks has {name} = {value!r}, "
                    f"not a finite number > 0; fix or remove that measurement")
    sizes = sorted({s.bytes for s in use})
    if len(sizes) < MIN_SIZES:
        where = "on one node" if scope == "intra_node" else "over 2 or more nodes"
        found = ", ".join(_human(b) for b in sizes) or "none"
        raise PerfmodelError(
            f"{scope}: need collective timings (e.g. all-reduce) at >= {MIN_SIZES} message "
            f"sizes with >= 2 ranks {where}, found {len(sizes)} ({found})")


def _design(use: list[CollectiveSample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: ring steps, steps that cross nodes, and bytes each rank sends."""
    steps, crossing, volume = [], [], []
    for s in use:
        total, cross = ring_steps(s.op, s.ranks, s.nodes)
        steps.append(total)
        crossing.append(cross)
        volume.append(busbw_factor(s.op, s.ranks) * s.bytes)
    return np.array(steps, float), np.array(crossing, float), np.array(volume)


def _describe(use: list[CollectiveSample], scope: str) -> str:
    ops = ", ".join(sorted({s.op for s in use}))
    lo, hi = min(s.bytes for s in use), max(s.bytes for s in use)
    return f"{len(use)} {scope} timings ({ops}; {_human(lo)}-{_human(hi)})"


def _human(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
