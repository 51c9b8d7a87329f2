"""What every section of the findings report shares: the study's numbers, the grid of
clusters, workloads and worker counts it is reproduced on, and the scenario builder."""

from __future__ import annotations

from typing import Any

from perfmodel.accuracy.cost import StalenessCost
from perfmodel.cluster import load_cluster
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload

GIB = 2**30
CLUSTERS = ("a100", "a10g")
SPEEDUP_WORKERS = (1, 2, 4, 8, 16, 32)
SPEEDUP_WORKLOADS = ("resnet50", "bert-large")
MEMORY_WORKLOADS = ("gpt2-xl", "bert-large", "resnet50")
MEMORY_WORKERS = (8, 64)
ASYNC_WORKERS = (4, 8, 16, 32)
# The study's findings (DESIGN.md), quoted beside each of ours.
STUDY = {"ddp_speedup": "2–3x", "fsdp_memory": "4–6x", "async_saving": "up to 28 %",
         "accuracy_loss": "4–17 %"}


def scenario(cluster: str, workload: str, workers: int, **changes: Any) -> Scenario:
    """The workload's own per-worker batch on a shipped cluster profile, plus `changes`."""
    w = load_workload(workload)
    return Scenario(cluster=load_cluster(cluster), workload=w, workers=workers,
                    batch_size=changes.pop("batch_size", w.batch_size), **changes)


def penalty_text(c: StalenessCost) -> str:
    return "unstable" if c.divergence_risk == "unstable" else f"{c.penalty_points:.1f} pts"


# How the report names the command that writes it (perfmodel/commands/findings.py).
COMMAND = "perfmodel findings"
MEASURE_COMMAND = f"{COMMAND} --measure"
MODEL_ONLY_COMMAND = f"{COMMAND} --model-only"
