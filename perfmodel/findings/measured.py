"""Sections 6-7 of the findings report, measured on this machine: the latest real local mlp
runs against the `local` profile, and every real async/ssp mlp PS run of the measurement
store against the accuracy band the model predicts from that run's own staleness.

`run_measurements` makes those runs (`perfmodel measure`, torch in subprocesses).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from calibration.fit_accuracy import unstable
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import load_accuracy_model
from perfmodel.errors import PerfmodelError
from perfmodel.findings.common import scenario
from perfmodel.findings.records import CsvRow, LocalRuns, MeasuredPs, MeasuredPsRun
from perfmodel.predict import predict
from perfmodel.sim.strategy import make_strategy

MEASURE_RUNS = (   # (workers, steps, flags): each setting's update budget (calibration/
    # fit_accuracy.py SETTINGS: 200 updates at lr 0.05, 400 at lr 0.01), warm-up included
    (2, 98, ["--mode", "async"]), (3, 65, ["--mode", "async"]),
    (2, 98, ["--mode", "async", "--staleness-aware-lr"]),
    (2, 98, ["--mode", "ssp", "--staleness-bound", "0"]),
    (2, 198, ["--mode", "async", "--lr", "0.01"]), (3, 131, ["--mode", "async", "--lr", "0.01"]),
    (2, 198, ["--mode", "async", "--staleness-aware-lr", "--lr", "0.01"]))
MEASURE_WARMUP = 2
# (kind, workers, flags): section 6's runs
LOCAL_RUNS = (("ddp", 1, ["--steps", "20"]), ("ddp", 2, ["--steps", "20"]),
              ("fsdp", 2, ["--steps", "20"]),
              ("ps", 2, ["--mode", "sync", "--steps", "98", "--oversubscribe"]))
# The two measured tables' headers: a report holding either has measured sections.
LOCAL_HEADER = ("| finding | measured (mlp, 2 workers, this machine) | predicted (`local` "
                "profile) |")
PS_HEADER = ("| run | workers | protocol | updates | mean τ | measured accuracy | predicted | "
             "agrees |")


def run_measurements(db: Path | None, echo: Callable[[str], None] = print) -> None:
    """Run sections 6 and 7's real jobs into the store (`perfmodel measure`, needs torch)."""
    jobs = [("ps", w, ["--steps", str(steps), "--oversubscribe", *flags])
            for w, steps, flags in MEASURE_RUNS] + list(LOCAL_RUNS)
    for kind, workers, flags in jobs:
        cmd = [sys.executable, "-m", "perfmodel", "measure", kind, "--workers", str(workers),
               "--workload", "mlp", "--warmup-steps", str(MEASURE_WARMUP), *flags, "--json"]
        if db is not None:
            cmd += ["--db", str(db)]
        echo("running: " + " ".join(cmd[1:]))
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            raise PerfmodelError(f"`{' '.join(cmd[2:])}` failed (exit status "
                                 f"{done.returncode}); report not written")


# ---------------------------------------------------------------- 6. measured local runs


def measured_local(db: Path | None) -> LocalRuns:
    """Latest real mlp runs in the store against the `local` profile's predictions."""
    from measure.store import Store

    store = Store(db)

    def latest(kind: str, workers: int, mode: str | None = None):
        found = [r for r in store.list_runs(kind=kind, workload="mlp", status="ok")
                 if r.workers == workers and r.config.get("compute_mode", "real") == "real"
                 and "compare" not in r.config
                 and (mode is None or (r.config.get("options") or {}).get("ps", {}).get(
                     "mode") == mode)
                 and not ((r.config.get("options") or {}).get("ps", {}).get(
                     "staleness_aware_lr"))]
        return store.get_run(found[-1].id) if found else None

    def throughput(run) -> float:
        return max(s["value"] for s in run.table("summaries")
                   if s["key"] == "throughput_samples_per_s")

    def peak(run) -> float:
        return max(m["peak_bytes"] for m in run.table("memory"))

    def row(finding: str, metric: str, value: float) -> CsvRow:
        return CsvRow(finding=finding, cluster="local", workload="mlp", workers=2,
                      config="measured", metric=metric, value=value)

    ddp1, ddp2, fsdp2 = latest("ddp", 1), latest("ddp", 2), latest("fsdp", 2)
    sync, asyn = latest("ps", 2, "sync"), latest("ps", 2, "async")
    sc = scenario("local", "mlp", 2)
    rows, lines = [], [LOCAL_HEADER, "|---|---|---|"]
    if ddp1 and ddp2:
        seen = throughput(ddp2) / throughput(ddp1)
        rows.append(row("ddp_speedup", "speedup", seen))
        lines.append(f"| DDP speedup | {seen:.2f}x | {predict('ddp', sc).speedup:.2f}x |")
    if ddp2 and fsdp2:
        seen = peak(ddp2) / peak(fsdp2)
        d, f = (make_strategy(k).memory(sc)["worker"] for k in ("ddp", "fsdp"))
        tensors = (d.peak_bytes - d.framework_bytes) / (f.peak_bytes - f.framework_bytes)
        rows.append(row("fsdp_memory", "peak_reduction", seen))
        lines.append(f"| FSDP peak-memory reduction (tensors, as MemTracker counts them) | "
                     f"{seen:.2f}x | {tensors:.2f}x ({d.peak_bytes / f.peak_bytes:.2f}x with "
                     "the profile's fixed framework memory) |")
    if sync and asyn:
        seen = 1 - throughput(sync) / throughput(asyn)
        x_s, x_a = (predict(k, sc).summary.throughput_samples_per_s
                    for k in ("sync-ps", "async-ps"))
        rows.append(row("async_saving", "time_saving", seen))
        lines.append(f"| async-vs-sync PS time saving | {100 * seen:.0f} % | "
                     f"{100 * (1 - x_s / x_a):.0f} % |")
    return LocalRuns(table="\n".join(lines) if rows else None, rows=tuple(rows))


# ---------------------------------------------------------------- 7. measured PS runs


def measured_ps(db: Path | None) -> MeasuredPs:
    """Every real async/ssp mlp PS run in the store against the model's prediction from its
    own measured staleness: inside the band where the model predicts a stable run, and
    unstable by the harness's own criterion (calibration/fit_accuracy.py) where it does not."""
    from measure.store import Store

    store, model = Store(db), load_accuracy_model()
    found, rows, lines = [], [], [PS_HEADER, "|---|---|---|---|---|---|---|---|"]
    for row in store.list_runs(kind="ps", workload="mlp", status="ok"):
        run = store.get_run(row.id)
        options = (row.config.get("options") or {}).get("ps", {})
        evals = sorted((e for e in run.table("evals") if e.get("accuracy") is not None
                        and math.isfinite(e["accuracy"])), key=lambda e: e["step"])
        mode = options.get("mode")
        if mode not in ("async", "ssp") or not evals or row.config.get(
                "compute_mode", "real") != "real" or "compare" in row.config:
            continue        # `perfmodel compare`'s runs: too few updates for an accuracy
        mitigation = ("staleness-aware" if options.get("staleness_aware_lr") else
                      "dc" if options.get("delay_compensation") else "none")
        protocol = (f"ssp s={options.get('staleness_bound')}" if mode == "ssp"
                    else "async" + ("" if mitigation == "none" else f" {mitigation}"))
        taus = np.array([u["staleness"] for u in run.table("updates")], dtype=float)
        final = evals[-1]["accuracy"]
        lr = options.get("lr")
        if lr is not None:
            protocol += f", lr {lr:g}"
        cost = staleness_cost(taus, mitigation=mitigation, updates=len(taus), lr=lr,
                              model=model)
        seen_unstable = unstable({"diverged": False, "accuracy": [e["accuracy"] for e in evals],
                                  "loss": [e["loss"] for e in evals]})
        if cost.divergence_risk == "unstable":
            agrees = seen_unstable
            predicted = "unstable"
        else:
            agrees = abs(final - cost.accuracy) <= cost.band
            predicted = f"{100 * cost.accuracy:.1f} % ± {100 * cost.band:.1f}"
        found.append(MeasuredPsRun(
            run_id=row.id, workers=row.workers, protocol=protocol, updates=len(taus),
            mean_staleness=float(taus.mean()), accuracy=final,
            predicted_accuracy=cost.accuracy, band=cost.band, agrees=agrees,
            divergence_risk=cost.divergence_risk, observed_unstable=seen_unstable))
        rows.append(CsvRow(finding="measured_ps", cluster="local", workload="mlp",
                           workers=row.workers, config=protocol, metric="accuracy",
                           value=final))
        lines.append(f"| {row.id} | {row.workers} | {protocol} | {len(taus)} | "
                     f"{taus.mean():.2f} | {100 * final:.1f} %"
                     f"{' (unstable)' if seen_unstable else ''} | {predicted} | "
                     f"{'yes' if agrees else 'NO'} |")
    return MeasuredPs(table="\n".join(lines), runs=tuple(found), rows=tuple(rows))
