"""Published GPU training throughput (perfmodel/data/published/*.toml) and perfmodel's
prediction of each point.

A point is one published run: model, GPUs, strategy, precision, micro-batch, gradient
accumulation and the figure. Its prediction simulates one optimizer step with the strategy's
model on the point's cluster profile (jitter off): with gradient accumulation, DDP runs
`accumulation - 1` micro-batches without communication (no_sync) and one full step; FSDP
gathers and reduce-scatters on every micro-batch, so the step is `accumulation` full steps
less the optimizer of all but one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from perfmodel.cluster import ClusterProfile, load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.predict import summarise
from perfmodel.sim.compute import unit_times
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.tomlfile import Fields, load_toml
from perfmodel.workload import PRECISIONS, load_workload

PUBLISHED_DIR = Path(__file__).resolve().parent / "data" / "published"
SETS = ("fit", "heldout")
METRICS = ("samples_per_s", "tokens_per_s_per_gpu")


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedPoint:
    id: str
    set: str
    family: str
    model: str
    workload: str
    gpu: str
    cluster: str
    gpus: int
    strategy: str
    framework: str
    precision: str
    batch_per_gpu: int
    grad_accumulation: int
    sequence: int
    activation_checkpointing: str
    metric: str
    value: float
    citation: str
    where: str

    def samples_per_s(self, value: float | None = None) -> float:
        """`value` (default the published one) in samples per second for the whole job."""
        v = self.value if value is None else value
        return v * self.gpus / self.sequence if self.metric == "tokens_per_s_per_gpu" else v

    def in_metric(self, samples_per_s: float) -> float:
        if self.metric == "tokens_per_s_per_gpu":
            return samples_per_s * self.sequence / self.gpus
        return samples_per_s


def _point(raw: dict, path: Path, i: int, sources: dict) -> PublishedPoint:
    f = Fields(raw, path, f"points[{i}].")
    checks = {"set": SETS, "strategy": ("ddp", "fsdp"), "precision": tuple(PRECISIONS),
              "metric": METRICS, "activation_checkpointing": ("none", "selective", "full")}
    for key, allowed in checks.items():
        if f.str(key) not in allowed:
            raise PerfmodelError(f"{path}: points[{i}].{key} must be one of {', '.join(allowed)}")
    source = f.str("source")
    if source not in sources:
        raise PerfmodelError(f"{path}: points[{i}].source '{source}' has no [sources.{source}]")
    return PublishedPoint(
        id=f.str("id"), set=f.str("set"), family=f.str("family"), model=f.str("model"),
        workload=f.str("workload"), gpu=f.str("gpu"), cluster=f.str("cluster"),
        gpus=f.integer("gpus", minimum=1), strategy=f.str("strategy"),
        framework=f.str("framework"), precision=f.str("precision"),
        batch_per_gpu=f.integer("batch_per_gpu", minimum=1),
        grad_accumulation=f.integer("grad_accumulation", 1, minimum=1),
        sequence=f.integer("sequence", 0), activation_checkpointing=f.str(
            "activation_checkpointing"), metric=f.str("metric"),
        value=f.number("value", positive=True), citation=sources[source], where=f.str("where"))


def load_published(path: Path | None = None) -> tuple[PublishedPoint, ...]:
    """Every point of every file in perfmodel/data/published (or of `path`)."""
    paths = [path] if path else sorted(PUBLISHED_DIR.glob("*.toml"))
    points = []
    for p in paths:
        data = load_toml(p)
        sources = {k: Fields(v, p, f"sources.{k}.").str("citation")
                   for k, v in data.get("sources", {}).items()}
        points += [_point(raw, p, i, sources) for i, raw in enumerate(data.get("points", []))]
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise PerfmodelError("published points: duplicate id")
    return tuple(points)


@dataclass(frozen=True, kw_only=True, slots=True)
class PointPrediction:
    point: PublishedPoint
    samples_per_s: float
    step_s: float
    compute_s: float          # one optimizer step's compute (all micro-batches)
    matmul_s: float           # of which matmul/conv/attention FLOPs at the achieved rate
    comm_exposed_s: float

    @property
    def predicted(self) -> float:
        return self.point.in_metric(self.samples_per_s)

    @property
    def error(self) -> float:
        """Signed relative error of the predicted figure, (predicted - published) / published."""
        return self.predicted / self.point.value - 1.0


def predict_point(point: PublishedPoint, cluster: ClusterProfile | None = None
                  ) -> PointPrediction:
    """perfmodel's throughput for `point` on `cluster` (default: the point's profile)."""
    cluster = cluster or load_cluster(point.cluster)
    # the point's own recipe: its precision and its activation checkpointing (recompute)
    workload = (load_workload(point.workload).with_precision(point.precision)
                .with_checkpointing(point.activation_checkpointing))
    scenario = Scenario(cluster=cluster, workload=workload, workers=point.gpus,
                        batch_size=point.batch_per_gpu, steps=4, warmup_steps=1,
                        jitter="none")
    summary = summarise(make_strategy(point.strategy).simulate(scenario), scenario)
    share = 1.0 / point.gpus if point.strategy == "fsdp" else 1.0
    times = unit_times(cluster, workload, point.batch_per_gpu, optimizer_param_fraction=share)
    micro = times.step_s - times.optimizer_s
    full = summary.step_time_s.mean
    extra = point.grad_accumulation - 1
    if point.strategy == "ddp":
        step = full + extra * micro
    else:
        step = (extra + 1) * full - extra * times.optimizer_s
    matmul = _matmul_seconds(cluster, workload, point.batch_per_gpu)
    return PointPrediction(
        point=point, samples_per_s=point.batch_per_gpu * point.grad_accumulation * point.gpus
        / step, step_s=step, compute_s=micro * (extra + 1) + times.optimizer_s,
        matmul_s=matmul * (extra + 1), comm_exposed_s=step - micro * (extra + 1)
        - times.optimizer_s)


def _matmul_seconds(cluster: ClusterProfile, workload, batch: int) -> float:
    """Forward + backward seconds of the matmul op class alone."""
    bare = replace(cluster.compute, overhead_us_per_unit=0.0, launch_us_per_kernel=0.0,
                   memory_efficiency=0.0)
    t = unit_times(replace(cluster, compute=bare), workload, batch, optimizer_param_fraction=0)
    return float(t.forward_s.sum() + t.backward_s.sum())
