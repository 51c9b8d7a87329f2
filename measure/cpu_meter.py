"""CPU use over a run's timed steps: this process's own CPU seconds and the host's busy cores.

The 1-minute load average cannot tell a run's own processes from other work on the machine
(it counts both, and a run starts 2-9 busy processes). Two counters over the same window can:

- `cpu_s`: this process's CPU time, every thread (`time.process_time`: user + system, the
  gloo threads included); summed over a run's ranks as rates, the cores the run kept busy;
- `thread_cpu_s`: the training loop's own thread (`time.thread_time`, the thread that calls
  `mark`): its host work (autograd, hooks, copies, the optimizer) without the collectives,
  which gloo runs on threads of its own; `cpu_s - thread_cpu_s` is their CPU;
- `host_busy_cores`: the host's busy share over the window from /proc/stat (user, nice,
  system, irq, softirq and steal jiffies over all of them, idle and iowait included) times
  its CPUs; absent where /proc/stat is not readable (not Linux).

So other work = host busy cores − the run's own (both over the timed steps), and a run whose
own processes keep every core busy is CPU-bound: its timing is set by CPU work, not by waits.
Each rank writes the three fields into its summary record (`usage`); `cpu_use` and
`thread_cores` below turn a run's records into its numbers (perfmodel/compare/matching.py
reports them; calibration/fit_cores.py fits compute.ddp_cpu_work_factor with them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROC_STAT = Path("/proc/stat")
_BUSY = (0, 1, 2, 5, 6, 7)      # user nice system irq softirq steal (guest is inside user)
_IDLE = (3, 4)                  # idle iowait


@dataclass(frozen=True, slots=True)
class CpuMark:
    """The counters at one moment."""

    wall_s: float                       # time.perf_counter()
    process_s: float                    # time.process_time()
    thread_s: float                     # time.thread_time() of the calling thread
    host: tuple[int, int, int] | None   # (busy jiffies, all jiffies, CPUs) or None


def host_jiffies(path: Path = PROC_STAT) -> tuple[int, int, int] | None:
    """(busy, all, CPUs) from the aggregate `cpu` line of /proc/stat; None if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    head = next((ln.split() for ln in lines if ln.startswith("cpu ")), None)
    cpus = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    if head is None or len(head) < 8 or cpus == 0:
        return None
    try:
        v = [int(x) for x in head[1:9]]
    except ValueError:
        return None
    busy = sum(v[i] for i in _BUSY)
    return busy, busy + sum(v[i] for i in _IDLE), cpus


def mark(path: Path = PROC_STAT) -> CpuMark:
    return CpuMark(wall_s=time.perf_counter(), process_s=time.process_time(),
                   thread_s=time.thread_time(), host=host_jiffies(path))


def usage(start: CpuMark, end: CpuMark | None = None) -> dict[str, float]:
    """Summary fields for the window from `start` to `end` (now, on the thread that marked
    `start`): cpu_s, thread_cpu_s, cpu_window_s and, where /proc/stat was readable at both
    ends and jiffies passed, host_busy_cores."""
    end = end or mark()
    out = {"cpu_s": max(end.process_s - start.process_s, 0.0),
           "thread_cpu_s": max(end.thread_s - start.thread_s, 0.0),
           "cpu_window_s": max(end.wall_s - start.wall_s, 0.0)}
    if start.host and end.host:
        busy = end.host[0] - start.host[0]
        total = end.host[1] - start.host[1]
        if total > 0:
            out["host_busy_cores"] = busy / total * end.host[2]
    return out


def cpu_use(summaries: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(cores the run's own processes kept busy, cores busy on the host) over the timed
    steps, from each rank's summary fields of measure/cpu_meter.py: the sum over ranks of
    cpu_s / cpu_window_s, and the median of the ranks' host_busy_cores. None where the run
    did not record them (runs before the meter)."""
    by_rank: dict[int, dict[str, float]] = {}
    for s in summaries:
        if s["key"] in ("cpu_s", "cpu_window_s", "host_busy_cores") and s["value"] is not None:
            by_rank.setdefault(int(s["rank"]), {})[s["key"]] = float(s["value"])
    rates = [r["cpu_s"] / r["cpu_window_s"] for r in by_rank.values()
             if r.get("cpu_window_s", 0) > 0 and "cpu_s" in r]
    hosts = [r["host_busy_cores"] for r in by_rank.values() if "host_busy_cores" in r]
    return (float(sum(rates)) if rates else None,
            float(np.median(hosts)) if hosts else None)


def thread_cores(summaries: Sequence[dict[str, Any]]) -> float | None:
    """Of the cores the run kept busy (`cpu_use`), the part its training threads did: the
    sum over ranks of thread_cpu_s / cpu_window_s (measure/cpu_meter.py: the thread that runs
    the loop - autograd, hooks, copies, the optimizer, a PS server's applies), the rest being
    the communication threads' (gloo's). None where not recorded."""
    by_rank: dict[int, dict[str, float]] = {}
    for s in summaries:
        if s["key"] in ("thread_cpu_s", "cpu_window_s") and s["value"] is not None:
            by_rank.setdefault(int(s["rank"]), {})[s["key"]] = float(s["value"])
    rates = [r["thread_cpu_s"] / r["cpu_window_s"] for r in by_rank.values()
             if r.get("cpu_window_s", 0) > 0 and "thread_cpu_s" in r]
    return float(sum(rates)) if rates else None
