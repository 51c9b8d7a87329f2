"""The findings report's records: what each section found, typed, before it is written.

Each section is a frozen record holding its Markdown table, the numbers the prose and the
figures read (by name, not by position) and its rows of findings.csv.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmodel.accuracy.cost import StalenessCost
from perfmodel.accuracy.model import AccuracyModel
from perfmodel.accuracy.penalty import ObservedPenalty, StudyPenalty
from perfmodel.findings.common import STUDY
from perfmodel.memory import MemoryBreakdown

CSV_FIELDS = ("finding", "cluster", "workload", "workers", "config", "metric", "value",
              "study")


@dataclass(frozen=True, kw_only=True, slots=True)
class CsvRow:
    """One number of the report, as a row of findings.csv."""

    finding: str          # ddp_speedup, fsdp_memory, async_saving, accuracy_penalty, ...
    cluster: str          # a100, a10g, local (measured here), harness (staleness harness)
    workload: str
    workers: int | str    # a worker count, or a staleness profile name (homo-8, het-16)
    config: str
    metric: str
    value: float

    def as_dict(self) -> dict[str, Any]:
        return {"finding": self.finding, "cluster": self.cluster, "workload": self.workload,
                "workers": self.workers, "config": self.config, "metric": self.metric,
                "value": round(float(self.value), 6), "study": STUDY.get(self.finding, "")}


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """1. DDP throughput over one worker, per (cluster, workload), at SPEEDUP_WORKERS."""

    table: str
    curves: dict[tuple[str, str], tuple[float, ...]]
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryPair:
    ddp: MemoryBreakdown
    fsdp: MemoryBreakdown
    fsdp_checkpointed: MemoryBreakdown      # FSDP full-shard with full activation checkpointing


@dataclass(frozen=True, kw_only=True)
class Memory:
    """2. Peak memory per device of DDP and FSDP, per (cluster, workload, workers)."""

    table: str
    pairs: dict[tuple[str, str, int], MemoryPair]
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True)
class Saving:
    """3. async-ps time saving over sync-ps, per (cluster, variation), at ASYNC_WORKERS."""

    table: str
    savings: dict[tuple[str, str], tuple[float, ...]]
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class AccuracyPoint:
    """One staleness profile x mitigation of the harness runs, observed against the model."""

    setting: str               # "momentum lr 0.05"
    mitigation: str            # none, staleness-aware, dc
    mean_staleness: float
    observed_points: float     # observed penalty at the setting's budget (mean over seeds)
    model_points: float        # the model's penalty
    held_out: bool             # the profile was left out of the fit
    observed_unstable: bool    # in at least half of its seeds
    model_unstable: bool


@dataclass(frozen=True, kw_only=True)
class AccuracyPenalty:
    """4. What staleness costs in accuracy: the recorded harness runs against the model."""

    table: str
    points: tuple[AccuracyPoint, ...]
    runs: dict[str, Any]       # the harness runs the model was fitted on (as recorded)
    model: AccuracyModel
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True)
class ProtocolResult:
    label: str                 # "async-ps staleness-aware", "ssp-ps s=3", ...
    samples_per_s: float
    saving: float              # 1 - X_sync / X, as a fraction
    costs: tuple[StalenessCost, ...]    # one per accuracy-model setting, in its order


@dataclass(frozen=True, kw_only=True)
class Mitigations:
    """5. The mitigated protocols' throughput against their accuracy cost."""

    table: str
    protocols: tuple[ProtocolResult, ...]
    rows: tuple[CsvRow, ...]

    def protocol(self, label: str) -> ProtocolResult:
        return next(p for p in self.protocols if p.label == label)


@dataclass(frozen=True, kw_only=True)
class LocalRuns:
    """6. The latest real local mlp runs against the `local` profile (table None: none)."""

    table: str | None
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredPsRun:
    """One real async/ssp mlp PS run of the store against its predicted accuracy."""

    run_id: int
    workers: int
    protocol: str              # "async", "ssp s=0", "async staleness-aware, lr 0.01"
    updates: int
    mean_staleness: float
    accuracy: float            # measured, at the last evaluation
    predicted_accuracy: float
    band: float                # ± half-width of the predicted band
    agrees: bool
    divergence_risk: str       # low, near, unstable (predicted)
    observed_unstable: bool


@dataclass(frozen=True, kw_only=True)
class MeasuredPs:
    """7. Every real async/ssp mlp PS run of the store against the predicted band."""

    table: str
    runs: tuple[MeasuredPsRun, ...]
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassPenalty:
    """One workload class x setting x mitigation x cluster variation x worker count."""

    klass: str                 # the workload class: mlp-digits, cnn-digits, ...
    cluster: str
    variation: str             # "jitter CV 0.02 (profile)", "1 straggler at 0.5"
    model: StudyPenalty        # synchronous steps counted linearly (as the harness runs)
    noise_scaled: StudyPenalty  # synchronous steps counted with the measured noise scale
    long_budget: StudyPenalty  # linear counting at LONG_BUDGET times the class's budget
    observed: ObservedPenalty | None    # from the class's homo-N harness runs, where run
    observed_unstable: bool    # those runs unstable in at least half of their seeds


@dataclass(frozen=True, kw_only=True)
class ClassPenalties:
    """8. The study's penalty per workload class, at the same epochs and the same time."""

    text: str                  # the section's tables and prose, Markdown
    points: tuple[ClassPenalty, ...]
    rows: tuple[CsvRow, ...]


@dataclass(frozen=True, kw_only=True)
class Findings:
    """Everything the report says. `local` and `measured` are None in a model-only report."""

    speedup: Speedup
    memory: Memory
    saving: Saving
    accuracy: AccuracyPenalty
    mitigations: Mitigations
    local: LocalRuns | None
    measured: MeasuredPs | None
    classes: ClassPenalties
    store: str | None = None    # the measurement store sections 6-7 were read from

    @property
    def model_only(self) -> bool:
        return self.local is None and self.measured is None

    @property
    def rows(self) -> tuple[CsvRow, ...]:
        """findings.csv in the sections' order."""
        parts = (self.speedup, self.memory, self.saving, self.accuracy, self.mitigations,
                 self.measured, self.local, self.classes)
        return tuple(r for part in parts if part is not None for r in part.rows)
