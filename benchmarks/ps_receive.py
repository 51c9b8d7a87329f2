"""How long a CPU-host server's receive of one push takes, by how the push met it: an
exploration for the crowded serial server (docs/model.md, "The CPU-host server's own
messages"), not a test.

Two gloo processes on loopback, one message of 13.4 MB (about the mlp's 12.9 MB gradient) at
a time, the worker sending with isend + wait as measure/runs/ps.py does. The server times its
receive in four ways, interleaved, `REPEATS` rounds:

- ready, any: the server posts `recv(src=None)` first; the push comes 5 ms later (so the time
  is from the push's start: the receive less those 5 ms), streamed;
- ready, src: the same with `recv(src=1)`;
- queued, any: the worker pushes first and the server posts `recv(src=None)` 20 ms later: the
  message waits in the socket buffers;
- queued, src: the same with `recv(src=1)`;
- with `--senders K` (K > 1): K workers push at once and the server receives them one after
  another with `recv(src=None)`: "crowd, first" is the first receive (from when they pushed),
  "crowd, later" each later one (from the end of the one before).

    GLOO_SOCKET_IFNAME=lo python benchmarks/ps_receive.py [--repeats 30] [--port 29611]

Prints the median and quartiles of each, in ms. Run it on an otherwise idle host.
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
LEAD_S, LATE_S = 0.005, 0.020
KINDS = ("ready, any", "ready, src", "queued, any", "queued, src")


def _server(repeats: int, senders: int, out) -> None:
    buf = torch.empty(NBYTES // 4)
    times = {k: [] for k in (*KINDS, "crowd, first", "crowd, later")}
    for _ in range(repeats):
        if senders > 1:
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(senders):
                dist.recv(buf, src=None)
                t1 = time.perf_counter()
                times["crowd, first" if i == 0 else "crowd, later"].append(t1 - t0)
                t0 = t1
            continue
        for kind in KINDS:
            src = None if kind.endswith("any") else 1
            dist.barrier()
            if kind.startswith("queued"):
                time.sleep(LATE_S)
            t0 = time.perf_counter()
            dist.recv(buf, src=src)
            took = time.perf_counter() - t0
            times[kind].append(took - (LEAD_S if kind.startswith("ready") else 0.0))
    out.update({k: v for k, v in times.items()})


def _worker(repeats: int, senders: int) -> None:
    buf = torch.ones(NBYTES // 4)
    for _ in range(repeats):
        if senders > 1:
            dist.barrier()
            dist.isend(buf, dst=0).wait()
            continue
        for kind in KINDS:
            dist.barrier()
            if kind.startswith("ready"):
                time.sleep(LEAD_S)
            dist.isend(buf, dst=0).wait()


def _run(rank: int, repeats: int, port: int, senders: int, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1 + senders)
    try:
        _server(repeats, senders, out) if rank == 0 else _worker(repeats, senders)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--senders", type=int, default=1)
    args = ap.parse_args()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_run, args=(args.repeats, args.port, args.senders, out),
                 nprocs=1 + args.senders)
        for kind in (KINDS if args.senders == 1 else ("crowd, first", "crowd, later")):
            ms = np.asarray(out[kind][2:]) * 1e3          # the first two: warm-up
            q1, med, q3 = np.percentile(ms, [25, 50, 75])
            print(f"{kind:12s} median {med:6.2f} ms  quartiles {q1:6.2f}-{q3:6.2f}  "
                  f"({ms.size} receives of {NBYTES / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
