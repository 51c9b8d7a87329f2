"""How fast are the parameter-server predictions? Whole-process times, interleaved repeats.

    python benchmarks/ps_speed.py [--repeats 3] [--tree DIR] [--out FILE] [--baseline FILE]

Cases (issue 13's targets on a 2-core machine): `perfmodel predict` of every PS strategy at
1024 workers (< 0.7 s) and 4096 workers (< 2 s), a 16-worker predict (< 0.3 s), and the full
sweep of 5 strategies x 11 worker counts to 1024 (< 4 s). Every case runs as its own process
(`python -m perfmodel ...` with the tree to time as the working directory, so an older
checkout can be timed with `--tree`), the cases interleaved round by round because the
machine is shared and its load drifts. For every timing the 1-minute load average
(os.getloadavg()) is recorded beside it: other engineers' processes share the 2 cores, so
compare medians taken at similar load. Prints medians, min-max spreads, the median load, and
ratios against `--baseline` (a JSON file this script wrote for the tree before the change:
benchmarks/ps_speed_baseline.json). No unit test asserts any of these times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PS = ("sync-ps", "async-ps", "ssp-ps")
SWEEP_WORKERS = ",".join(str(2**k) for k in range(11))       # 1..1024: 11 sizes


def cases(tmp: str) -> dict[str, list[str]]:
    out = {"predict async-ps 16": ["predict", "--strategy", "async-ps", "--workers", "16"]}
    for n in (1024, 4096):
        for s in PS:
            out[f"predict {s} {n}"] = ["predict", "--strategy", s, "--workers", str(n)]
    out["sweep 5 x 11 to 1024"] = ["sweep", "--strategies", "ddp,fsdp,sync-ps,async-ps,ssp-ps",
                                   "--workers", SWEEP_WORKERS, "--out", tmp, "--json"]
    return out


def time_once(tree: Path, args: list[str]) -> tuple[float, float]:
    """(whole-process seconds, 1-minute load average just before)."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "perfmodel", *args], cwd=tree, check=True,
                   capture_output=True)
    return time.perf_counter() - t, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(tmp)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in todo}
        for _ in range(args.repeats):
            for key, cli in todo.items():
                runs[key].append(time_once(args.tree, cli))
    base = json.loads(args.baseline.read_text())["cases"] if args.baseline else {}
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "host": platform.node(), "cpus": os.cpu_count(), "tree": str(args.tree),
              "repeats": args.repeats, "cases": {}}
    for key, rs in runs.items():
        secs, loads = [r[0] for r in rs], [r[1] for r in rs]
        med = statistics.median(secs)
        row = {"median_s": med, "min_s": min(secs), "max_s": max(secs), "times_s": secs,
               "load_avg_1min": loads, "median_load": statistics.median(loads)}
        ratio = ""
        if key in base:
            row["speedup_vs_baseline"] = base[key]["median_s"] / med
            ratio = (f"  {row['speedup_vs_baseline']:.1f}x faster than baseline "
                     f"{base[key]['median_s']:.2f} s (load {base[key]['median_load']:.1f})")
        result["cases"][key] = row
        print(f"{key:<24} median {med:6.2f} s (min {min(secs):.2f}, max {max(secs):.2f}) "
              f"load {row['median_load']:.1f}{ratio}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
