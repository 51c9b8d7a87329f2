"""Fit a parameter server's apply rate and the rate of the link its pushes cross.

The simulator's server (DESIGN.md, closed queueing network) serves a push of Ψ bytes in
S = t_apply + Ψ/B: t_apply = gradient bytes / server.apply_GBps (the SGD apply is
memory-bound: it reads w and g and writes w), and the transfer is one point-to-point message
on the server's link, α + n·β(n) (perfmodel/sim/collectives.py `link_transfer_s`).

- `fit_server_apply`: apply_GBps through the origin from timed updates (bytes, seconds).
- `fit_server_update`: a serial CPU-host server's own time per update (apply + pack, as
  measure/runs/ps.py records them at the server) as latency + bytes / rate, from runs of
  >= 2 message sizes: `[server.update]` (perfmodel/cluster.py `Server`). The workers'
  optimizer-step timings (`fit_server_apply`) do not stand for it: the server applies a
  gradient it has just received and copies its parameters out for the reply, and on this
  machine that took 4.1 ms an update for the mlp where the compute suite's optimizer step
  took 1.9 ms (and 1.35 against 0.35 ms for cnn-small: a fixed part per update, not a rate).
- `fit_server_messages`: the same server's one push received and one reply sent, each
  latency + bytes / rate, from the 1-worker runs of >= 2 workloads: `[server.push]`,
  `[server.reply]`. The ping-pong fit does not stand for them: on this host a push took
  about 1.5x a ping-pong message of its size, a reply 1.0-1.5x (set A's of reports 31-46).
- `fit_crowded_factor`: the same server's messages, and its apply + pack, on a host running
  more processes than cores, over the 1-worker fits: `server.crowded_message_factor` and
  `server.crowded_update_factor`, from the calibration's crowded PS runs (the server's own
  phases per update).
- `fit_push_link`: a full α–β fit of the server's link from pushes of >= 3 sizes, the same
  fit as a ping-pong sweep (calibration/fit_network.py, `LinkFit.p2p`).
- `fit_push_rate`: with pushes of one size (one model), the rate left once α (from the
  collective fit of the same link) is taken off: a check of the link's bandwidth x efficiency
  at that size, which is all one size can tell.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibration.fit import FitResult, check_measurements, fit_rate, fit_result, relative_lstsq
from calibration.fit_cores import fit_run_ratio
from calibration.fit_network import SCOPES, CollectiveSample, LinkFit, fit_link
from perfmodel.errors import PerfmodelError


def fit_server_apply(update_bytes: Sequence[float], apply_s: Sequence[float]) -> FitResult:
    """server.apply_GBps: gradient bytes applied per second by one server."""
    return fit_rate(update_bytes, apply_s, parameter="server.apply_GBps",
                    what="server update timings", unit_scale=1e9)


def fit_server_update(update_bytes: Sequence[float], update_s: Sequence[float]
                      ) -> tuple[FitResult, FitResult]:
    """(server.update.latency_us, server.update.bandwidth_GBps): update_s ≈ latency +
    bytes / bandwidth, least squares in relative error (calibration/fit.py), from updates
    of at least 2 gradient sizes. A latency that cannot be told from 0 is fixed at 0."""
    return fit_latency_rate("server.update", update_bytes, update_s, "updates",
                            "two workloads' PS runs")


def fit_server_messages(push_bytes: Sequence[float], push_s: Sequence[float],
                        reply_bytes: Sequence[float], reply_s: Sequence[float]
                        ) -> tuple[tuple[FitResult, FitResult], tuple[FitResult, FitResult]]:
    """((server.push latency_us, bandwidth_GBps), (server.reply ...)): a serial server's
    one message each way as latency + bytes / rate, as `fit_server_update`, from the
    1-worker PS runs of >= 2 workloads (calibration/from_store.py `_server_messages`)."""
    return (fit_latency_rate("server.push", push_bytes, push_s, "pushes",
                             "two workloads' 1-worker PS runs"),
            fit_latency_rate("server.reply", reply_bytes, reply_s, "replies",
                             "two workloads' 1-worker PS runs"))


def fit_crowded_factor(parameter: str, crowded_s: Sequence[float], alone_s: Sequence[float]
                       ) -> FitResult:
    """A serial server's time on a crowded host over its 1-worker fit, one pair per crowded
    run (`crowded_s`: the run's medians per update as its server timed them; `alone_s`: the
    fitted 1-worker time at that run's sizes): the median ratio (fit_cores.py
    `fit_run_ratio`). server.crowded_message_factor: receive + reply over the fitted push +
    reply; server.crowded_update_factor: apply + pack over the fitted update."""
    return fit_run_ratio(parameter, crowded_s, alone_s,
                         measured="a crowded server's seconds an update",
                         reference="the 1-worker fit's seconds",
                         hint="`perfmodel calibrate` runs ps-crowded on CPU hosts")


def fit_latency_rate(name: str, nbytes_: Sequence[float], seconds_: Sequence[float],
                     what: str, source: str) -> tuple[FitResult, FitResult]:
    """(<name>.latency_us, <name>.bandwidth_GBps): seconds ≈ latency + bytes / bandwidth,
    least squares in relative error, from >= 2 sizes; a latency that cannot be told from 0
    is fixed at 0."""
    nbytes = check_measurements(nbytes_, f"{what} bytes")
    seconds = check_measurements(seconds_, f"{what} seconds")
    _same_length(nbytes, seconds)
    if np.unique(nbytes).size < 2:
        raise PerfmodelError(f"{name}: needs {what} of >= 2 sizes ({source}), found "
                             f"{np.unique(nbytes).size}")
    fit = relative_lstsq(np.column_stack([np.ones_like(nbytes), nbytes]), seconds, zero_ok=(0,))
    latency, per_byte = fit.coef
    if per_byte <= 0:
        raise PerfmodelError(f"{name}: the fit gives {per_byte:.3g} s/byte from "
                             f"{nbytes.size} runs: larger {what} did not take longer; "
                             f"measure again")
    return (fit_result(f"{name}.latency_us", latency * 1e6, fit.stderr[0] * 1e6, fit.rel),
            fit_result(f"{name}.bandwidth_GBps", 1.0 / per_byte / 1e9,
                       fit.stderr[1] / per_byte**2 / 1e9, fit.rel))


def fit_push_link(push_bytes: Sequence[float], push_s: Sequence[float],
                  scope: str = "intra_node") -> LinkFit:
    """α, bandwidth and efficiency of the server's link from pushes of several sizes."""
    _check_scope(scope)
    nbytes = check_measurements(push_bytes, "push bytes")
    seconds = check_measurements(push_s, "push seconds")
    _same_length(nbytes, seconds)
    nodes = 2 if scope == "inter_node" else 1
    samples = [CollectiveSample(op="ping-pong", ranks=2, bytes=float(b), time_s=float(t),
                                nodes=nodes) for b, t in zip(nbytes, seconds, strict=True)]
    return fit_link(samples, scope)


def fit_push_rate(push_bytes: Sequence[float], push_s: Sequence[float], *,
                  scope: str = "intra_node", latency_us: float = 0.0) -> FitResult:
    """<scope>.push_GBps: bytes per second of pushes once the link latency is taken off."""
    _check_scope(scope)
    if latency_us < 0:
        raise PerfmodelError(f"{scope}.latency_us must be >= 0, got {latency_us}")
    nbytes = check_measurements(push_bytes, "push bytes")
    seconds = check_measurements(push_s, "push seconds")
    _same_length(nbytes, seconds)
    left = seconds - latency_us * 1e-6
    if (left <= 0).any():
        i = int(np.flatnonzero(left <= 0)[0])
        raise PerfmodelError(f"{scope}.latency_us = {latency_us:g} us exceeds push {i}'s "
                             f"time of {seconds[i] * 1e6:.3g} us; the latency fit and the "
                             f"push timings disagree")
    return fit_rate(nbytes, left, parameter=f"{scope}.push_GBps", what="push timings",
                    unit_scale=1e9)


def _check_scope(scope: str) -> None:
    if scope not in SCOPES:
        raise PerfmodelError(f"unknown link scope '{scope}'; choose from: {', '.join(SCOPES)}")


def _same_length(a: np.ndarray, b: np.ndarray) -> None:
    if a.size != b.size:
        raise PerfmodelError(f"{a.size} push sizes but {b.size} push times; give one of each "
                             f"per push")
