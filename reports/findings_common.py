"""Shared by reports/make_findings.py and its parts: constants, scenarios, CSV rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.cluster import load_cluster
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

REPO = Path(__file__).resolve().parent.parent

GIB = 2**30
CLUSTERS = ("a100", "a10g")
SPEEDUP_WORKERS = (1, 2, 4, 8, 16, 32)
SPEEDUP_WORKLOADS = ("resnet50", "bert-large")
MEMORY_WORKLOADS = ("gpt2-xl", "bert-large", "resnet50")
MEMORY_WORKERS = (8, 64)
ASYNC_WORKERS = (4, 8, 16, 32)
STUDY = {"ddp_speedup": "2–3x", "fsdp_memory": "4–6x", "async_saving": "up to 28 %",
         "accuracy_loss": "4–17 %"}


def scenario(cluster: str, workload: str, workers: int, **changes: Any) -> Scenario:
    w = load_workload(workload)
    return Scenario(cluster=load_cluster(cluster), workload=w, workers=workers,
                    batch_size=changes.pop("batch_size", w.batch_size), **changes)


def csv_row(finding: str, cluster: str, workload: str, workers: Any, config: str, metric: str,
         value: float) -> dict:
    return {"finding": finding, "cluster": cluster, "workload": workload, "workers": workers,
            "config": config, "metric": metric, "value": round(float(value), 6),
            "study": STUDY.get(finding, "")}


def penalty_text(c) -> str:
    return "unstable" if c.divergence_risk == "unstable" else f"{c.penalty_points:.1f} pts"
