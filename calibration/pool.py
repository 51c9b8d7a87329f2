"""Calibration runs of several stores fitted as one: a pooled set A.

On a shared or virtual machine one calibration is a snapshot of the host's state: on the
2-core VM of reports 6-11 (2026-12-04) the 16 MiB ping-pong of a calibration ran 3.5-7.7 ms
from session to session while its three repeats within a session agreed within 5 %, and the
held-out predictions of six independent calibrations spread 16 % (median CV over the 14
configurations; up to 22 %), more than the measured configurations themselves did across
those sessions (benchmarks/calibration_stability.py). Fitting the calibration runs of k
sessions together averages that state out: three pooled sessions spread 3 %.

Only stores of one machine pool: a VM restarted on other hardware computes at another rate
(the VM of 2026-12-05 ran the same units in 0.5-0.65x the time of the one before), and a
pooled fit would take its best compute rate from one and its medians from both.
`calibrate_runs` compares each store's per-unit compute timings with the first's and
refuses a store beyond SAME_MACHINE_RATIO.

`PooledStore` shows the runs of the first store under their own ids and those of the k-th
further store (k = 1, 2, ...) as k * ID_STRIDE + id, so every pooled run keeps a unique id
that says where it came from (`describe`). It offers what the fit reads (`get_run`); nothing
is written to any store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from measure.store import Run, Store
from perfmodel.errors import PerfmodelError

ID_STRIDE = 1_000_000      # pooled id = source * ID_STRIDE + the run's id in its store
# Stores whose per-unit compute timings differ by more than this (median ratio, either way)
# are from different machines and are not pooled (calibration/from_store.py `_one_machine`).
# Where the bound comes from (set A only, 78 common unit timings a pair): the five sessions
# of reports 9-13 (one 2-core VM, 2026-12-04) took 0.956-1.029x each other's timings, every
# pair; the VM of 2026-12-05 (report 15's set A) took 0.616-0.682x theirs. 1.2 lies between,
# four times the same-machine spread away from 1.
SAME_MACHINE_RATIO = 1.2


@dataclasses.dataclass(frozen=True)
class PoolSource:
    """One store's share of a pooled set A."""

    store: Store
    ids: tuple[int, ...]          # run ids in that store


class PooledStore:
    """Read-only view of several stores' runs under unique ids (see the module docstring)."""

    def __init__(self, sources: Sequence[PoolSource]):
        if not sources:
            raise PerfmodelError("a pooled calibration needs at least one store")
        for s in sources:
            if any(i >= ID_STRIDE or i < 1 for i in s.ids):
                raise PerfmodelError(f"{s.store.path}: run ids must lie in 1..{ID_STRIDE - 1} "
                                     f"to be pooled")
        self.sources = tuple(sources)
        self.path = sources[0].store.path

    @property
    def ids(self) -> list[int]:
        """Every pooled run id, source by source."""
        return [k * ID_STRIDE + i for k, s in enumerate(self.sources) for i in s.ids]

    def get_run(self, run_id: int) -> Run:
        k, i = divmod(int(run_id), ID_STRIDE)
        if k >= len(self.sources):
            raise PerfmodelError(f"no pooled run {run_id}: {len(self.sources)} store(s) pooled")
        run = self.sources[k].store.get_run(i)
        return dataclasses.replace(run, row=dataclasses.replace(run.row, id=int(run_id)))

    def describe(self) -> list[str]:
        """One line per store: where its runs came from and the ids they carry here."""
        return [f"{s.store.path}: runs {_span(s.ids)}"
                + (f" as {_span([k * ID_STRIDE + i for i in s.ids])}" if k else "")
                for k, s in enumerate(self.sources)]


def _span(ids: Sequence[int]) -> str:
    """'1-35' for a contiguous run of ids, else the ids listed."""
    ids = sorted(ids)
    if ids and ids[-1] - ids[0] == len(ids) - 1:
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ", ".join(map(str, ids))
