"""A 2-rank DDP mlp step's compute at batch 32 and 64, beside the same passes without DDP.

An exploration tool, not evidence (docs/model.md, "The DDP real rows on this EPYC host run
slower than set A predicts"). Round by round, interleaved, on an otherwise idle host: the
mlp's units timed apart (`perfmodel measure compute`), its whole forward + backward in one
process and in two at once (`--concurrent`), and a 2-rank DDP run (`perfmodel measure
ddp`), at batch 32 and 64. `read` prints each kind's median, its ratio b32/b64 and its
batch-independent part read as compute = fixed + per-sample (2 x b32 - b64): where the
fixed part grows from one kind to the next says which step adds it.

    python benchmarks/ddp_batch_probe.py run --db /tmp/probe.sqlite --rounds 6
    python benchmarks/ddp_batch_probe.py read --db /tmp/probe.sqlite

Session 39's probe (2026-12-07 14:43-14:50) is kept in
reports/local-2026-12-07-heldout-60/probe/.
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BATCHES = (32, 64)


def run(db: Path, rounds: int) -> None:
    cli = [sys.executable, "-m", "perfmodel", "measure"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    common = ["--workload", "mlp", "--db", str(db)]
    for r in range(1, rounds + 1):
        steps = [["compute", *common, "--batch-sizes", ",".join(map(str, BATCHES))]]
        for b in BATCHES:
            steps += [["compute", *common, "--batch-sizes", str(b), "--concurrent", str(p)]
                      for p in (1, 2)]
            steps.append(["ddp", *common, "--workers", "2", "--batch-size", str(b),
                          "--steps", "40"])
        for args in steps:
            subprocess.run([*cli, *args], cwd=REPO, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        print(f"round {r} of {rounds}, 1-min load {os.getloadavg()[0]:.2f}", flush=True)


def timings(db: Path) -> dict[str, dict[int, list[float]]]:
    """Seconds a step by kind and batch: units apart (summed), whole step in 1 and 2
    processes, a DDP run's compute and step (medians over ranks)."""
    from calibration.from_store import concurrent_timings
    from measure.store import Store

    store, out = Store(db), {}

    def add(kind: str, batch: int, seconds: float) -> None:
        out.setdefault(kind, {}).setdefault(batch, []).append(seconds)

    for row in store.list_runs(status="ok"):
        run_ = store.get_run(row.id)
        if row.kind == "ddp":
            values: dict[str, list[float]] = {}
            for s in run_.table("summaries"):
                values.setdefault(s["key"], []).append(s["value"])
            add("DDP compute", row.batch_size, st.median(values["mean_compute_s"]))
            add("DDP step", row.batch_size, st.median(values["mean_step_s"]))
        elif row.config["options"]["compute"].get("concurrent"):
            add(f"whole step, {row.workers} at once", row.batch_size,
                st.median(t.step_s for t in concurrent_timings([run_])))
        else:
            total: dict[int, float] = {}
            for c in run_.table("compute"):
                total[c["batch_size"]] = total.get(c["batch_size"], 0.0) + c["median_s"]
            for b, seconds in total.items():
                add("units apart", b, seconds)
    return out


def read(db: Path) -> None:
    found = timings(db)
    order = ["units apart", "whole step, 1 at once", "whole step, 2 at once", "DDP compute",
             "DDP step"]
    print(f"{'':22} {'b32 ms':>7} {'b64 ms':>7}  b32/b64  fixed (2 x b32 - b64) ms  runs")
    for kind in [k for k in order if k in found]:
        by = found[kind]
        m32, m64 = st.median(by[32]), st.median(by[64])
        print(f"{kind:22} {m32 * 1e3:7.2f} {m64 * 1e3:7.2f}  {m32 / m64:7.2f}  "
              f"{(2 * m32 - m64) * 1e3:24.1f}  {len(by[32])}/{len(by[64])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "read"))
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.what == "run":
        run(args.db, args.rounds)
    else:
        read(args.db)


if __name__ == "__main__":
    main()
