"""How fast are the parameter-server predictions? Whole-process times, interleaved repeats.

    python benchmarks/ps_speed.py [--repeats 3] [--tree DIR] [--against DIR] [--cases K,...]
                                  [--bytecode as-found|compiled] [--out FILE] [--baseline FILE]

Cases (issue 13's targets on a 2-core machine): `perfmodel predict` of every PS strategy at
1024 workers (< 0.7 s) and 4096 workers (< 2 s), a 16-worker predict (< 0.3 s), and the full
sweep of 5 strategies x 11 worker counts to 1024 (< 4 s). Every case runs as its own process
(`python -m perfmodel ...` with the tree to time as the working directory, so an older
checkout can be timed with `--tree` or `--against`), the cases interleaved round by round
because the machine is shared and its load drifts.

For every run it records the wall time, the process's CPU time (user + system of the child
and its children: less sensitive to other processes than the wall time, though not immune:
they share caches and cores) and the 1-minute load average (os.getloadavg()) just before;
other engineers' processes share the 2 cores, so compare medians taken at similar load.
`--against DIR` times a second tree (say, a checkout of the commit before a change) in the
same rounds, each case alternating between the two, and prints the ratio of the medians of
the same run: the fairest comparison on a shared machine. `--baseline FILE` compares with a
JSON file this script wrote earlier (benchmarks/ps_speed_baseline.json), which is only fair at
similar load. No unit test asserts any of these times.

Bytecode: where PYTHONDONTWRITEBYTECODE is set (this machine sets it) and a tree has no
__pycache__, every run compiles perfmodel's ~30 modules from source, ~60 ms of CPU, which an
installed package (pip compiles at install) never pays. `--bytecode compiled` runs
`python -m compileall` on each tree's perfmodel/ first; the default, as-found, times the trees
as they are. The output records which, and the variable.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PS = ("sync-ps", "async-ps", "ssp-ps")
SWEEP_WORKERS = ",".join(str(2**k) for k in range(11))       # 1..1024: 11 sizes
TARGET_S = {"predict async-ps 16": 0.3, "predict sync-ps 1024": 0.7,
            "predict async-ps 1024": 0.7, "predict ssp-ps 1024": 0.7,
            "predict sync-ps 4096": 2.0, "predict async-ps 4096": 2.0,
            "predict ssp-ps 4096": 2.0, "sweep 5 x 11 to 1024": 4.0}    # issue 13


def cases(tmp: str) -> dict[str, list[str]]:
    out = {"predict async-ps 16": ["predict", "--strategy", "async-ps", "--workers", "16"]}
    for n in (1024, 4096):
        for s in PS:
            out[f"predict {s} {n}"] = ["predict", "--strategy", s, "--workers", str(n)]
    out["sweep 5 x 11 to 1024"] = ["sweep", "--strategies", "ddp,fsdp,sync-ps,async-ps,ssp-ps",
                                   "--workers", SWEEP_WORKERS, "--out", tmp, "--json"]
    return out


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_once(tree: Path, args: list[str]) -> dict[str, float]:
    """Whole-process wall seconds, CPU seconds, and the 1-minute load average just before."""
    load = os.getloadavg()[0]
    cpu = _children_cpu_s()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "perfmodel", *args], cwd=tree, check=True,
                   capture_output=True)
    return {"wall_s": time.perf_counter() - t, "cpu_s": _children_cpu_s() - cpu, "load": load}


def summary(rs: list[dict[str, float]]) -> dict:
    wall, cpu, loads = ([r[k] for r in rs] for k in ("wall_s", "cpu_s", "load"))
    return {"median_s": statistics.median(wall), "min_s": min(wall), "max_s": max(wall),
            "times_s": wall, "median_cpu_s": statistics.median(cpu), "cpu_s": cpu,
            "load_avg_1min": loads, "median_load": statistics.median(loads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--against", type=Path, default=None,
                    help="a second tree timed in the same rounds (e.g. the code before)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case names to run (default: all)")
    ap.add_argument("--bytecode", choices=("as-found", "compiled"), default="as-found",
                    help="compiled: byte-compile each tree's perfmodel/ first, as an install does")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args()
    trees = {"tree": args.tree} | ({"against": args.against} if args.against else {})
    if args.bytecode == "compiled":
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "perfmodel")],
                           check=True)
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(tmp)
        if args.cases:
            todo = {k: v for k, v in todo.items() if k in args.cases.split(",")}
        runs = {(t, k): [] for t in trees for k in todo}
        for r in range(args.repeats):
            for key, cli in todo.items():
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for t in order:
                    runs[(t, key)].append(time_once(trees[t], cli))
    base = json.loads(args.baseline.read_text())["cases"] if args.baseline else {}
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "tree": str(args.tree), "repeats": args.repeats, "bytecode": args.bytecode,
              "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
              "cases": {}}
    if args.against:
        result["against"] = str(args.against)
    for key in todo:
        row = summary(runs[("tree", key)])
        row["target_s"] = TARGET_S[key]
        line = (f"{key:<24} median {row['median_s']:5.2f} s (min {row['min_s']:.2f}, max "
                f"{row['max_s']:.2f}) cpu {row['median_cpu_s']:5.2f} s  load "
                f"{row['median_load']:.1f}  target {TARGET_S[key]:.1f} s "
                f"{'met' if row['median_s'] < TARGET_S[key] else 'MISSED'}")
        if args.against:
            other = summary(runs[("against", key)])
            row["against"] = other
            row["speedup_vs_against"] = other["median_s"] / row["median_s"]
            row["cpu_speedup_vs_against"] = other["median_cpu_s"] / row["median_cpu_s"]
            line += (f"\n{'':<24} against {other['median_s']:5.2f} s, cpu "
                     f"{other['median_cpu_s']:5.2f} s: {row['speedup_vs_against']:.2f}x wall, "
                     f"{row['cpu_speedup_vs_against']:.2f}x cpu")
        if key in base:
            row["speedup_vs_baseline"] = base[key]["median_s"] / row["median_s"]
            line += (f"\n{'':<24} {row['speedup_vs_baseline']:.1f}x faster than baseline "
                     f"{base[key]['median_s']:.2f} s (load {base[key]['median_load']:.1f})")
        result["cases"][key] = row
        print(line)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
