"""What a simulation returns: frozen per-step, per-update and per-transfer records.

Summaries (predict.py) are derived from these, never accumulated by hand in the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One worker's step: start_s..end_s = compute_s + comm_exposed_s + wait_s."""

    worker: int
    step: int
    start_s: float
    end_s: float
    compute_s: float        # forward + backward + optimizer on this worker
    comm_exposed_s: float   # communication not hidden behind this worker's compute
    wait_s: float           # waiting for other workers (barriers, stragglers, SSP bound)


@dataclass(frozen=True, slots=True)
class UpdateRecord:
    """One gradient applied to the global model (PS) or one synchronous step (DDP/FSDP)."""

    worker: int
    step: int               # the worker's own step that produced the gradient
    version_read: int       # model version the gradient was computed on
    version_applied: int    # model version it was applied to (before applying)
    time_s: float

    @property
    def staleness(self) -> int:
        return self.version_applied - self.version_read


@dataclass(frozen=True, slots=True)
class CommRecord:
    """One transfer or collective on a link, for timelines. worker = -1 for a collective."""

    kind: str               # all-reduce, all-gather, reduce-scatter, push, pull
    worker: int
    start_s: float
    end_s: float
    bytes: float
    link: str = ""


@dataclass(frozen=True, slots=True)
class SimResult:
    steps: tuple[StepRecord, ...]
    updates: tuple[UpdateRecord, ...]
    comms: tuple[CommRecord, ...]
    events: int                             # SimPy events processed
    notes: tuple[str, ...] = field(default=())


def maker(cls: type) -> Callable[..., Any]:
    """A positional constructor of the frozen, slotted record class `cls` (every field in
    order, no defaults) that sets the slots directly. The dataclass's own __init__ goes
    through object.__setattr__ once per field, which is 2-3x slower; the simulators' hot
    loops make hundreds of thousands of records. The instance is the same: equal, frozen."""
    names = cls.__slots__
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    o = _new(_cls)"]
    for name in names:
        ns[f"_set_{name}"] = getattr(cls, name).__set__        # the slot's descriptor
        lines.append(f"    _set_{name}(o, {name})")
    lines.append("    return o")
    exec("\n".join(lines), ns)
    return ns["make"]
