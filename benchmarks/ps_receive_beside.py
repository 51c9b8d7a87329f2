"""How much longer a CPU-host server's receive of one push takes with other work beside it:
an exploration for the crowded serial server (docs/model.md, "The CPU-host server's own
messages"), not a test. benchmarks/ps_receive.py ruled out how the push meets the server
(queued, from any source, several senders); this asks what the work beside it costs.

Four gloo processes on loopback: the server (rank 0) receives one 13.4 MB push (about the
mlp's 12.9 MB gradient, float32) from the sender (rank 1), `recv(src=1)`, posted 5 ms before
the push; ranks 2 and 3 are the neighbours. Each round times one receive beside each of
these, interleaved:

- none: the neighbours wait at the barrier (the alone time, as set A's 1-worker runs see it);
- spin: rank 2 runs Python arithmetic (CPU, no memory traffic) for `BUSY_S`;
- copy: rank 2 copies 13.4 MB tensor to tensor in a loop (a worker unflattening a reply, or
  flattening its push: memory traffic) for `BUSY_S`;
- sgd: rank 2 applies momentum SGD to 3.35 M float32 parameters in a loop (the server's own
  apply, as another process would do it) for `BUSY_S`;
- transfer: rank 3 sends rank 2 13.4 MB messages back to back, `PAIR_MESSAGES` of them (a
  second message in flight: the previous reply's tail, or another worker's push);
- hot: nothing beside it, but the sender has just written its push buffer (as a 1-worker
  run's worker has: its gradients concatenated into the push right before the send);
- cold: as hot, then the sender and the server each stream `EVICT_BYTES` through their own
  scratch memory before the push, so neither buffer is in the shared cache (a crowded run's
  push waits in the queue while the others' work runs through the cache).

With 2 cores, processor sharing says one more busy process beside the two that carry the push
stretches it x1.5 at most and two more (transfer) x2; more than that is contention in
memory or in the kernel's loopback path, which the model's core sharing does not count.

    GLOO_SOCKET_IFNAME=lo python benchmarks/ps_receive_beside.py [--repeats 30] [--port 29621]

Prints each kind's median and quartiles in ms and its median ratio to `none` in the same
rounds. Run it on an otherwise idle host.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NBYTES = 13_400_000                  # about the mlp's gradient (12.9 MB, float32)
LEAD_S = 0.005                       # the server posts its receive this long before the push
BUSY_S = 0.040                       # a busy neighbour's work covers the whole receive
PAIR_MESSAGES = 10
EVICT_BYTES = 96_000_000             # three times a 32 MiB last-level cache
KINDS = ("none", "spin", "copy", "sgd", "transfer", "hot", "cold")


def _evict(scratch: torch.Tensor) -> None:
    scratch.add_(1.0)


def _server(repeats: int, out) -> None:
    buf = torch.empty(NBYTES // 4)
    scratch = torch.zeros(EVICT_BYTES // 4)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(repeats):
        for kind in KINDS:
            if kind == "cold":
                _evict(scratch)
            dist.barrier()
            t0 = time.perf_counter()
            dist.recv(buf, src=1)
            times[kind].append(time.perf_counter() - t0 - LEAD_S)
            dist.barrier()              # the neighbours have finished: next round
    out.update(times)


def _sender(repeats: int) -> None:
    buf, fresh = torch.ones(NBYTES // 4), torch.full((NBYTES // 4,), 2.0)
    scratch = torch.zeros(EVICT_BYTES // 4)
    for _ in range(repeats):
        for kind in KINDS:
            if kind in ("hot", "cold"):
                buf.copy_(fresh)
            if kind == "cold":
                _evict(scratch)
            dist.barrier()
            time.sleep(LEAD_S)
            dist.isend(buf, dst=0).wait()
            dist.barrier()


def _busy(kind: str, a: torch.Tensor, b: torch.Tensor, momentum: torch.Tensor) -> None:
    """Rank 2's work for BUSY_S: spin, copy or sgd."""
    end = time.perf_counter() + BUSY_S
    x = 0
    while time.perf_counter() < end:
        if kind == "spin":
            for i in range(2000):
                x += i * i
        elif kind == "copy":
            a.copy_(b)
        else:                                   # sgd: momentum, then the step
            momentum.mul_(0.9).add_(b)
            a.add_(momentum, alpha=-0.01)


def _neighbour(rank: int, repeats: int) -> None:
    a, b = torch.zeros(NBYTES // 4), torch.ones(NBYTES // 4)
    momentum = torch.zeros(NBYTES // 4)
    for _ in range(repeats):
        for kind in KINDS:
            dist.barrier()
            if kind == "transfer":
                for _m in range(PAIR_MESSAGES):
                    if rank == 3:
                        dist.isend(b, dst=2).wait()
                    else:
                        dist.recv(a, src=3)
            elif kind in ("spin", "copy", "sgd") and rank == 2:
                _busy(kind, a, b, momentum)
            dist.barrier()


def _run(rank: int, repeats: int, port: int, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    try:
        if rank == 0:
            _server(repeats, out)
        elif rank == 1:
            _sender(repeats)
        else:
            _neighbour(rank, repeats)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--port", type=int, default=29621)
    args = ap.parse_args()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_run, args=(args.repeats, args.port, out), nprocs=4)
        ms = {k: np.asarray(out[k][2:]) * 1e3 for k in KINDS}     # the first two: warm-up
        for kind in KINDS:
            q1, med, q3 = np.percentile(ms[kind], [25, 50, 75])
            ratio = float(np.median(ms[kind] / ms["none"]))
            print(f"{kind:9s} median {med:6.2f} ms  quartiles {q1:6.2f}-{q3:6.2f}  "
                  f"x{ratio:.2f} of none in the same round  ({ms[kind].size} receives)")


if __name__ == "__main__":
    main()
