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


MEMORY_CONFIGS = (
    # (label in the table, csv config, strategy, activation checkpointing)
    ("DDP, bf16 autocast (fp32 params, grads, bucket)", "ddp", "ddp", "none"),
    ("FSDP full-shard (MixedPrecisionPolicy bf16/fp32)", "fsdp", "fsdp", "none"),
    ("FSDP full-shard + full activation checkpointing", "fsdp+full-checkpointing", "fsdp",
     "full"),
)


def fsdp_memory() -> Memory:
    """One row per configuration: DDP under autocast, FSDP full-shard, and FSDP full-shard
    with full activation checkpointing, each against DDP."""
    pairs, rows = {}, []
    lines = ["| cluster | workload | N | batch | configuration | peak GiB | reduction vs DDP | "
             "model state GiB | activations GiB | reduction at batch 1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cluster in CLUSTERS:
        for workload in MEMORY_WORKLOADS:
            for n in MEMORY_WORKERS:
                sc = scenario(cluster, workload, n)
                peaks = {}
                for label, config, strategy, ck in MEMORY_CONFIGS:
                    at = replace(sc, workload=sc.workload.with_checkpointing(ck))
                    m = make_strategy(strategy).memory(at)["worker"]
                    m1 = make_strategy(strategy).memory(replace(at, batch_size=1))["worker"]
                    peaks[config] = (m, m1)
                    ddp, ddp1 = peaks["ddp"]
                    ratio, ratio1 = ddp.peak_bytes / m.peak_bytes, ddp1.peak_bytes / m1.peak_bytes
                    if config != "ddp":
                        rows.append(CsvRow(finding="fsdp_memory", cluster=cluster,
                                           workload=workload, workers=n,
                                           config=f"ddp/{config}", metric="peak_reduction",
                                           value=ratio))
                    lines.append(
                        f"| {cluster} | {workload} | {n} | {sc.batch_size} | {label} | "
                        f"{m.peak_bytes / GIB:.1f} | "
                        + ("—" if config == "ddp" else f"{ratio:.1f}x")
                        + f" | {m.model_state_bytes / GIB:.1f} | "
                        f"{(m.activations_bytes + m.cast_cache_bytes) / GIB:.1f} | "
                        + ("—" if config == "ddp" else f"{ratio1:.1f}x") + " |")
                pairs[(cluster, workload, n)] = MemoryPair(
                    ddp=peaks["ddp"][0], fsdp=peaks["fsdp"][0],
                    fsdp_checkpointed=peaks["fsdp+full-checkpointing"][0])
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
