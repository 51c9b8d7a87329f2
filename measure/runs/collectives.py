"""Collective sweeps in the style of nccl-tests: time each collective over a range of sizes.

For every op and size: `warmup_iters` untimed calls, a barrier, `iters` back-to-back timed
calls (the device synchronised at the end), the mean time per call on each rank, and the
slowest rank's mean (an all-reduce MAX) as the time t. As nccl-tests (doc/PERFORMANCE.md): S
is the total size (all-reduce: the buffer; all-gather: the gathered output; reduce-scatter:
the input; broadcast and send/recv: the buffer), algbw = S / t and busbw = algbw x factor,
the factor from `perfmodel.sim.collectives.busbw_factor` (2(n-1)/n for all-reduce, (n-1)/n
for all-gather and reduce-scatter, 1 for broadcast, send/recv and ping-pong). send/recv
pairs ranks 2k and 2k+1, each sending S bytes to and receiving S bytes from its partner at
once. ping-pong pairs them the same way: 2k sends S bytes to 2k+1, which sends them back;
its t is one way, half the round trip (OSU's osu_latency): the point-to-point message a
parameter server's push or pull is. Ping-pong times at least PER_CALL_MIN_ITERS calls, each
on its own and each after the sender has idled PING_PONG_GAP_S (untimed), as a PS worker
computes before its push and a server applies before its reply; t is the mean of the
sender's call times, and their median is kept beside it (`time_median_s`), with the gap
(`gap_s`). Why the gap: gloo over loopback, 2 pinned ranks on an idle host (2026-12-04,
12.3 MiB): back to back 3.8 ms one way, after a 2 ms gap 3.1 ms (1 MiB: 1.43 vs 0.45 ms,
4 MiB: 1.90 vs 0.98 ms), and a PS-shaped exchange (worker computes 25 ms, pushes, the server
applies 4 ms and replies) 3.5-3.7 ms: the back-to-back sweep made the calibration's
1-worker PS round trip 36-71 % too long in every report of 2026-12-04. Over gloo
on a CPU host a quarter or so of the calls at 64 KB-4 MB take 1-4 ms more (a blocked
receiver's wake-up; 40 calls a size timed on an idle host: 256 KB median 0.25-0.28 ms, mean
0.54-0.90), so a mean of ten rose and fell with one or two of them. Fitting the median
instead was tried (2026-12-03): the calibration's 1-worker PS round trip went from +92 % to
+12 %, but every held-out PS run of 2-8 workers came out 15-34 % too fast
(reports/local-2026-12-03-heldout-median): runs of several processes do see the wake-ups, so
the fit keeps the mean. An unpaired last rank sits out of both. Rank 0 writes one
"collective" record per op and size, with `cpu_busy_fraction`: each rank's CPU seconds (all
its threads, user and system) over its wall seconds in the timed loop, averaged over the
ranks; how much of a collective keeps a core busy (calibration/fit_comm_sharing.py).

config keys (None or absent = the default for the device): ops, min_bytes, max_bytes,
factor, iters, warmup_iters, dtype.
"""

from __future__ import annotations

import statistics
import time

from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import busbw_factor

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "send-recv", "ping-pong")
PAIRED = ("send-recv", "ping-pong")
LEGS = {"ping-pong": 2}                              # messages one timed call sends in turn
PER_CALL = ("ping-pong",)                            # timed call by call: median kept
PER_CALL_MIN_ITERS = 40     # 10 calls hold one or two 1-4 ms wake-ups, or none
PING_PONG_GAP_S = 0.002     # the sender idles this long, untimed, before each ping-pong
REDUCING = ("all-reduce", "reduce-scatter")          # nccl-tests' redop column: sum
SHARDED = ("all-gather", "reduce-scatter")           # S must split evenly across ranks
# Defaults: nccl-tests' usual 8 B .. 256 MiB x2 on GPUs; on CPU (gloo over loopback at about
# 1 GB/s) up to 64 MiB with fewer iterations, so a 2-rank sweep takes seconds.
DEFAULTS = {
    "cuda": {"min_bytes": 8, "max_bytes": 256 * 2**20, "factor": 2, "iters": 20,
             "warmup_iters": 5},
    "cpu": {"min_bytes": 8, "max_bytes": 64 * 2**20, "factor": 2, "iters": 10,
            "warmup_iters": 2},
}
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")


def settings(config: dict, device: str) -> dict:
    """The sweep's parameters: config values where given, else the device's defaults."""
    base = DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
    out = {k: int(config[k]) if config.get(k) is not None else v for k, v in base.items()}
    out["ops"] = list(config.get("ops") or OPS)
    out["dtype"] = config.get("dtype") or "float32"
    check_settings(out)
    return out


def check_settings(s: dict) -> None:
    unknown = [op for op in s["ops"] if op not in OPS]
    if unknown:
        raise PerfmodelError(f"unknown collective '{unknown[0]}'; choose from: {', '.join(OPS)}")
    if s["dtype"] not in DTYPES:
        raise PerfmodelError(f"unknown dtype '{s['dtype']}'; choose from: {', '.join(DTYPES)}")
    if not 1 <= s["min_bytes"] <= s["max_bytes"]:
        raise PerfmodelError(f"need 1 <= min bytes ({s['min_bytes']}) <= max bytes "
                             f"({s['max_bytes']})")
    if s["factor"] < 2:
        raise PerfmodelError(f"the size factor must be an integer >= 2, got {s['factor']}")
    if s["iters"] < 1 or s["warmup_iters"] < 0:
        raise PerfmodelError("need at least 1 timed iteration and >= 0 warm-up iterations")


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes, as nccl-tests' -b -e -f."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def op_sizes(op: str, sizes: list[int], elem_bytes: int, ranks: int) -> list[int]:
    """The sizes an op can run: whole elements, and for sharded ops a multiple of
    elements x ranks (nccl-tests rounds the same way); sizes that round alike run once."""
    unit = elem_bytes * (ranks if op in SHARDED else 1)
    out: list[int] = []
    for s in sizes:
        s = max(unit, s // unit * unit)
        if s not in out:
            out.append(s)
    return out


def run(ctx) -> None:
    import torch
    import torch.distributed as dist

    s = settings(ctx.config, ctx.device)
    dtype = getattr(torch, s["dtype"])
    elem = torch.empty((), dtype=dtype).element_size()
    n, rank = ctx.world_size, ctx.rank
    sync = torch.cuda.synchronize if ctx.device.startswith("cuda") else (lambda: None)
    sizes = message_sizes(s["min_bytes"], s["max_bytes"], s["factor"])
    for op in s["ops"]:
        if op in PAIRED and n < 2:
            continue
        for size in op_sizes(op, sizes, elem, n):
            call = _make_call(op, size // elem, dtype, ctx.device, rank, n, torch, dist)
            for _ in range(s["warmup_iters"]):
                call()
            sync()
            dist.barrier()
            t0, cpu0 = time.perf_counter(), time.process_time()
            iters = max(s["iters"], PER_CALL_MIN_ITERS) if op in PER_CALL else s["iters"]
            calls = _timed_calls(call, sync, iters, op in PER_CALL)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            mine = torch.tensor(call_times_s(calls, wall, iters, LEGS.get(op, 1)),
                                dtype=torch.float64, device=ctx.device)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)     # the slowest rank's times
            busy = torch.tensor([cpu / wall], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(busy)                           # summed; the mean below
            if rank == 0:
                time_s, median_s = mine.tolist()
                factor = busbw_factor(op, n)
                algbw = size / time_s / 1e9
                ctx.recorder.write("collective", op=op, bytes=size, count=size // elem,
                                   dtype=s["dtype"], time_s=time_s, algbw_GBps=algbw,
                                   busbw_GBps=algbw * factor, busbw_factor=factor,
                                   cpu_busy_fraction=busy.item() / n,
                                   **({"time_median_s": median_s, "gap_s": call.gap_s}
                                      if calls else {}))
            del call


def call_times_s(calls: list[float], wall_s: float, iters: int, legs: int
                 ) -> tuple[float, float]:
    """(mean, median) of one leg, each divided by the legs a call sends in turn: of the
    per-call times where there are any (the wall time then holds untimed gaps too), else
    the wall time over the calls, nccl-tests' mean"""
    if not calls:
        return wall_s / iters / legs, wall_s / iters / legs
    return statistics.fmean(calls) / legs, statistics.median(calls) / legs


def _timed_calls(call, sync, iters: int, per_call: bool) -> list[float]:
    """Run `call` iters times back to back, the device synchronised at the end; with
    per_call, synchronise after each call and return each call's seconds (else []). A call
    with `gap_s` is preceded by that much idling (untimed); one marked `timed = False` (a
    ping-pong's responder, whose calls wait out the sender's gaps) returns zeros, which the
    ranks' MAX then drops."""
    if not per_call:
        for _ in range(iters):
            call()
        sync()
        return []
    times = []
    timed = getattr(call, "timed", True)
    gap_s = getattr(call, "gap_s", 0.0) if timed else 0.0
    for _ in range(iters):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return times if timed else [0.0] * len(times)


def _make_call(op: str, count: int, dtype, device: str, rank: int, n: int, torch, dist):
    """A no-argument function doing one `op` on `count` elements in total (S)."""
    def buf(k: int):
        return torch.zeros(k, dtype=dtype, device=device)

    if op == "all-reduce":
        x = buf(count)
        return lambda: dist.all_reduce(x)
    if op == "all-gather":
        out, x = buf(count), buf(count // n)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, x)
    if op == "reduce-scatter":
        out, x = buf(count // n), buf(count)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, x)
    if op == "broadcast":
        x = buf(count)
        return lambda: dist.broadcast(x, src=0)
    partner = rank ^ 1
    if partner >= n:
        return lambda: None
    send, recv = buf(count), buf(count)
    if op == "ping-pong":
        first = rank % 2 == 0

        def ping_pong():
            if first:
                dist.send(send, partner)
                dist.recv(recv, partner)
            else:
                dist.recv(recv, partner)
                dist.send(send, partner)
        ping_pong.timed = first             # the sender's call times are the ones kept
        ping_pong.gap_s = PING_PONG_GAP_S   # it idles this long before each (untimed)
        return ping_pong

    def exchange():
        reqs = [dist.isend(send, partner), dist.irecv(recv, partner)]
        for r in reqs:
            r.wait()
    return exchange
