"""Sections 1-3 of the findings report, predicted on the shipped spec-derived profiles:
DDP speedup, FSDP peak-memory reduction, and the asynchronous PS time saving."""

from __future__ import annotations

from dataclasses import replace

from perfmodel.findings.common import (
    ASYNC_WORKERS,
    CLUSTERS,
    GIB,
    MEMORY_WORKERS,
    MEMORY_WORKLOADS,
    SPEEDUP_WORKERS,
    SPEEDUP_WORKLOADS,
    scenario,
)
from perfmodel.findings.records import CsvRow, Memory, MemoryPair, Saving, Speedup
from perfmodel.predict import predict
from perfmodel.sim.strategy import make_strategy

# ---------------------------------------------------------------- 1. DDP speedup


def ddp_speedup() -> Speedup:
    curves, rows = {}, []
    for cluster in CLUSTERS:
        for workload in SPEEDUP_WORKLOADS:
            sp = tuple(predict("ddp", scenario(cluster, workload, n)).speedup
                       for n in SPEEDUP_WORKERS)
            curves[(cluster, workload)] = sp
            rows += [CsvRow(finding="ddp_speedup", cluster=cluster, workload=workload,
                            workers=n, config="ddp", metric="speedup", value=s)
                     for n, s in zip(SPEEDUP_WORKERS, sp, strict=True)]
    lines = ["| cluster | workload | " + " | ".join(f"N={n}" for n in SPEEDUP_WORKERS) + " |",
             "|---|---|" + "---|" * len(SPEEDUP_WORKERS)]
    lines += [f"| {c} | {w} | " + " | ".join(f"{s:.2f}x" for s in sp) + " |"
              for (c, w), sp in curves.items()]
    return Speedup(table="\n".join(lines), curves=curves, rows=tuple(rows))


# ---------------------------------------------------------------- 2. FSDP memory


def fsdp_memory() -> Memory:
    pairs, rows = {}, []
    lines = ["| cluster | workload | N | batch | DDP GiB | FSDP GiB | reduction | "
             "FSDP + full checkpointing GiB | reduction | model state only | "
             "reduction at batch 1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cluster in CLUSTERS:
        for workload in MEMORY_WORKLOADS:
            for n in MEMORY_WORKERS:
                sc = scenario(cluster, workload, n)
                ddp = make_strategy("ddp").memory(sc)["worker"]
                fsdp = make_strategy("fsdp").memory(sc)["worker"]
                ck = replace(sc, workload=sc.workload.with_checkpointing("full"))
                fsdp_ck = make_strategy("fsdp").memory(ck)["worker"]
                one = replace(sc, batch_size=1)
                ddp1 = make_strategy("ddp").memory(one)["worker"]
                fsdp1 = make_strategy("fsdp").memory(one)["worker"]
                ratio = ddp.peak_bytes / fsdp.peak_bytes
                state = ddp.model_state_bytes / fsdp.model_state_bytes
                pairs[(cluster, workload, n)] = MemoryPair(ddp=ddp, fsdp=fsdp,
                                                           fsdp_checkpointed=fsdp_ck)
                ck_ratio = ddp.peak_bytes / fsdp_ck.peak_bytes
                rows.append(CsvRow(finding="fsdp_memory", cluster=cluster, workload=workload,
                                   workers=n, config="ddp/fsdp", metric="peak_reduction",
                                   value=ratio))
                rows.append(CsvRow(finding="fsdp_memory", cluster=cluster, workload=workload,
                                   workers=n, config="ddp/fsdp+full-checkpointing",
                                   metric="peak_reduction", value=ck_ratio))
                lines.append(f"| {cluster} | {workload} | {n} | {sc.batch_size} | "
                             f"{ddp.peak_bytes / GIB:.1f} | {fsdp.peak_bytes / GIB:.1f} | "
                             f"{ratio:.1f}x | {fsdp_ck.peak_bytes / GIB:.1f} | "
                             f"{ck_ratio:.1f}x | {state:.0f}x | "
                             f"{ddp1.peak_bytes / fsdp1.peak_bytes:.1f}x |")
    return Memory(table="\n".join(lines), pairs=pairs, rows=tuple(rows))


# ---------------------------------------------------------------- 3. async vs sync

STRAGGLER = "1 straggler at 0.5"
# variation label -> scenario changes (the straggler's speeds depend on the worker count)
VARIATIONS = {"jitter CV 0.02 (profile)": {}, "exponential jitter (CV 1)": {"jitter":
              "exponential"}, STRAGGLER: None}


def async_saving() -> Saving:
    savings, rows = {}, []
    for cluster in CLUSTERS:
        for label, change in VARIATIONS.items():
            found = []
            for n in ASYNC_WORKERS:
                extra = ({"speed": (1.0,) * (n - 1) + (0.5,)} if change is None
                         else dict(change))
                sc = scenario(cluster, "resnet50", n, **extra)
                x_sync = predict("sync-ps", sc).summary.throughput_samples_per_s
                x_async = predict("async-ps", sc).summary.throughput_samples_per_s
                found.append(1 - x_sync / x_async)
                rows.append(CsvRow(finding="async_saving", cluster=cluster,
                                   workload="resnet50", workers=n, config=label,
                                   metric="time_saving", value=found[-1]))
            savings[(cluster, label)] = tuple(found)
    lines = ["| cluster | variation | " + " | ".join(f"N={n}" for n in ASYNC_WORKERS) + " |",
             "|---|---|" + "---|" * len(ASYNC_WORKERS)]
    lines += [f"| {c} | {v} | " + " | ".join(f"{100 * s:.0f} %" for s in sv) + " |"
              for (c, v), sv in savings.items()]
    return Saving(table="\n".join(lines), savings=savings, rows=tuple(rows))
