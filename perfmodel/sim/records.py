"""What a simulation returns: frozen per-step, per-update and per-transfer records.

Summaries (predict.py) are derived from these, never accumulated by hand in the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import starmap
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


class LazyRecords(Sequence):
    """A tuple of records made on first use from `rows`, one tuple of field values per record
    (every field, in the record class's order): `make(*row)` is the record.

    A 4096-worker PS run has 80,000 steps, 80,000 updates and 160,000 transfers; `perfmodel
    predict` reads only the steps' and updates' fields (predict.summarise reads `rows`) and
    never a transfer, and making the 320,000 records cost ~0.3 s of a 2 s prediction. Reading
    it as a sequence (len, index, iterate, compare with a tuple or another one) gives exactly
    the records a tuple would hold; a copy or pickle of it is that tuple.
    """

    __slots__ = ("_make", "rows", "_records")

    def __init__(self, make: Callable[..., Any], rows: list[tuple]):
        self._make, self.rows, self._records = make, rows, None

    def records(self) -> tuple:
        if self._records is None:
            self._records = tuple(starmap(self._make, self.rows))
        return self._records

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.records()[index]

    def __iter__(self) -> Iterator:
        return iter(self.records())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyRecords):
            other = other.records()
        return self.records() == other if isinstance(other, tuple) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.records())

    def __reduce__(self):
        return tuple, (self.records(),)

    def __repr__(self) -> str:
        return f"LazyRecords({len(self)} records)"


@dataclass(frozen=True, slots=True)
class SimResult:
    steps: Sequence[StepRecord]             # a tuple, or LazyRecords of the same records
    updates: Sequence[UpdateRecord]
    comms: Sequence[CommRecord]
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
