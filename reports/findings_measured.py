"""The findings measured on this machine (reports/make_findings.py sections 6 and 7): real
local runs (`--measure`) and the store's async/ssp PS runs against the accuracy band."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from findings_common import REPO, csv_row, scenario

from calibration.fit_accuracy import (
    unstable,
)
from perfmodel.accuracy.cost import staleness_cost
from perfmodel.accuracy.model import load_accuracy_model
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


# ---------------------------------------------------------------- 6. measured PS runs


def run_measurements(db: Path | None) -> None:
    jobs = [("ps", w, ["--steps", str(steps), "--oversubscribe", *flags])
            for w, steps, flags in MEASURE_RUNS] + list(LOCAL_RUNS)
    for kind, workers, flags in jobs:
        cmd = [sys.executable, "-m", "perfmodel", "measure", kind, "--workers", str(workers),
               "--workload", "mlp", "--warmup-steps", str(MEASURE_WARMUP), *flags, "--json"]
        if db is not None:
            cmd += ["--db", str(db)]
        print("running:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def measured_ps(db: Path | None, rows: list[dict]) -> tuple[str, list]:
    """Every real async/ssp mlp PS run in the store against the model's prediction from its
    own measured staleness: inside the band where the model predicts a stable run, and
    unstable by the harness's own criterion (calibration/fit_accuracy.py) where it does not."""
    from measure.store import Store

    store, model = Store(db), load_accuracy_model()
    found, lines = [], [
        "| run | workers | protocol | updates | mean τ | measured accuracy | predicted | "
        "agrees |", "|---|---|---|---|---|---|---|---|"]
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
        found.append((row.id, row.workers, protocol, len(taus), float(taus.mean()), final,
                      cost.accuracy, cost.band, agrees, cost.divergence_risk, seen_unstable))
        rows.append(csv_row("measured_ps", "local", "mlp", row.workers, protocol, "accuracy",
                         final))
        lines.append(f"| {row.id} | {row.workers} | {protocol} | {len(taus)} | "
                     f"{taus.mean():.2f} | {100 * final:.1f} %"
                     f"{' (unstable)' if seen_unstable else ''} | {predicted} | "
                     f"{'yes' if agrees else 'NO'} |")
    return "\n".join(lines), found


# ---------------------------------------------------------------- 7. measured local runs


LOCAL_RUNS = (("ddp", 1, ["--steps", "20"]), ("ddp", 2, ["--steps", "20"]),
              ("fsdp", 2, ["--steps", "20"]),
              ("ps", 2, ["--mode", "sync", "--steps", "98", "--oversubscribe"]))


def measured_local(db: Path | None, rows: list[dict]) -> str:
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

    ddp1, ddp2, fsdp2 = latest("ddp", 1), latest("ddp", 2), latest("fsdp", 2)
    sync, asyn = latest("ps", 2, "sync"), latest("ps", 2, "async")
    sc = scenario("local", "mlp", 2)
    lines = ["| finding | measured (mlp, 2 workers, this machine) | predicted (`local` "
             "profile) |", "|---|---|---|"]
    if ddp1 and ddp2:
        seen = throughput(ddp2) / throughput(ddp1)
        rows.append(csv_row("ddp_speedup", "local", "mlp", 2, "measured", "speedup", seen))
        lines.append(f"| DDP speedup | {seen:.2f}x | {predict('ddp', sc).speedup:.2f}x |")
    if ddp2 and fsdp2:
        seen = peak(ddp2) / peak(fsdp2)
        d, f = (make_strategy(k).memory(sc)["worker"] for k in ("ddp", "fsdp"))
        tensors = (d.peak_bytes - d.framework_bytes) / (f.peak_bytes - f.framework_bytes)
        rows.append(csv_row("fsdp_memory", "local", "mlp", 2, "measured", "peak_reduction", seen))
        lines.append(f"| FSDP peak-memory reduction (tensors, as MemTracker counts them) | "
                     f"{seen:.2f}x | {tensors:.2f}x ({d.peak_bytes / f.peak_bytes:.2f}x with "
                     "the profile's fixed framework memory) |")
    if sync and asyn:
        seen = 1 - throughput(sync) / throughput(asyn)
        x_s, x_a = (predict(k, sc).summary.throughput_samples_per_s
                    for k in ("sync-ps", "async-ps"))
        rows.append(csv_row("async_saving", "local", "mlp", 2, "measured", "time_saving", seen))
        lines.append(f"| async-vs-sync PS time saving | {100 * seen:.0f} % | "
                     f"{100 * (1 - x_s / x_a):.0f} % |")
    if len(lines) == 2:
        return ("No local mlp DDP/FSDP/PS runs in the store: run `python "
                "reports/make_findings.py --measure` to add them.")
    return "\n".join(lines)
