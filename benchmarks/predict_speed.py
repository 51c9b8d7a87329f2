"""How fast is `perfmodel predict`? Whole-process time and simulated events per second.

    python benchmarks/predict_speed.py [--repeats 5]

Interleaves the cases in each round (timings on a shared machine drift between runs) and
prints medians and spreads. Figures go in the README; no unit test asserts a wall-clock time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from perfmodel.cluster import load_cluster
from perfmodel.predict import predict
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

CLI_CASE = ["perfmodel", "predict", "--strategy", "async-ps", "--workers", "16"]
SCALE_CASES = [("ddp", "gpt2-xl"), ("fsdp", "gpt2-xl"), ("sync-ps", "resnet50"),
               ("async-ps", "resnet50"), ("ssp-ps", "resnet50")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1024)
    args = ap.parse_args()
    cli: list[float] = []
    scale: dict[str, list[tuple[float, float, int]]] = {f"{s}/{w}": [] for s, w in SCALE_CASES}
    cluster = load_cluster("a100")
    for _ in range(args.repeats):
        t = time.perf_counter()
        subprocess.run(CLI_CASE, check=True, capture_output=True)
        cli.append(time.perf_counter() - t)
        for strategy, workload in SCALE_CASES:
            w = load_workload(workload)
            sc = Scenario(cluster=cluster, workload=w, workers=args.workers,
                          batch_size=w.batch_size)
            t = time.perf_counter()
            p = predict(strategy, sc)
            scale[f"{strategy}/{workload}"].append(
                (time.perf_counter() - t, p.wall_s, p.result.events))

    def spread(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"

    print(f"{' '.join(CLI_CASE)}: whole process {spread(cli)}")
    for case, runs in scale.items():
        secs, sim_secs, events = [r[0] for r in runs], [r[1] for r in runs], runs[0][2]
        print(f"{args.workers} workers {case}: {spread(secs)}, {events:,} events, "
              f"{events / statistics.median(sim_secs):,.0f} simulated events/s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
