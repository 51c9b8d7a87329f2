"""The calibration driver: run the suite's measurements not yet stored, fit, write the profile.

`plan` looks up every measurement of a suite (calibration/suite.py) in the store and keeps
those stored successfully in the last 24 hours on this host (`reusable_run`); `measure`
runs the rest one by one through measure/session.py, each stored as soon as it ends, so an
interrupted calibration resumes where it stopped; `fit_and_write` fits the runs
(calibration/from_store.py) and writes the profile atomically with provenance
(calibration/profile_writer.py), backing up the previous one. `perfmodel calibrate` and
`perfmodel compare --calibrate` call these; progress goes to a measure.session.Progress.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.from_store import fit_from_runs
from calibration.pool import PooledStore, PoolSource
from calibration.profile_writer import write_profile
from calibration.suite import Measurement, newest_runs, reusable_run
from measure import session
from measure.protocol import RunProtocol
from measure.session import NoProgress, Progress
from measure.store import Store
from perfmodel.errors import PerfmodelError, RunFailedError


@dataclass(frozen=True, kw_only=True)
class SuitePlan:
    """A suite split into what the store already holds and what is still to measure."""

    reused: tuple[int, ...]                 # run ids found in the store
    todo: tuple[Measurement, ...]           # measurements to run

    @property
    def progress_total(self) -> int:
        return sum(m.progress_total for m in self.todo)


@dataclass(frozen=True, kw_only=True)
class Written:
    """A fitted profile: its data and where it was written."""

    data: dict[str, Any]
    path: Path
    backup: Path | None                     # the previous profile's copy, if there was one


def plan(suite: Sequence[Measurement], store: Store, *, fresh: bool, host: str,
         torch: str | None, now: dt.datetime | None = None) -> SuitePlan:
    """Which measurements of `suite` the store already holds (none with `fresh`)."""
    stored = [] if fresh else store.list_runs()
    now = now or dt.datetime.now(dt.UTC)
    reused, todo = [], []
    for m in suite:
        found = reusable_run(stored, m, host=host, torch_version=torch, now=now)
        if found is None:
            todo.append(m)
        else:
            reused.append(found)
    return SuitePlan(reused=tuple(reused), todo=tuple(todo))


def measure(suite_plan: SuitePlan, store: Store, *, torchrun: Sequence[str] = (),
            max_time_s: float | None = None, progress: Progress | None = None,
            protocol: RunProtocol | None = None) -> tuple[list[int], list[int]]:
    """Run the measurements still to do; return (run ids of the suite, ids run now).
    `protocol` (measure/protocol.py): settle and pin before each run (None: neither).

    A failed measurement stops the calibration (RunFailedError; what finished is stored);
    Ctrl-C stores the run and raises KeyboardInterrupt.
    """
    progress = progress or NoProgress()
    progress.begin(suite_plan.progress_total)
    ids, measured = list(suite_plan.reused), []
    todo = suite_plan.todo
    for i, m in enumerate(todo, 1):
        update = progress.start(f"[{i}/{len(todo)}] {m.label}", m.progress_total)
        stored = session.run(m.config, m.nproc, store,
                             torchrun_args=torchrun if m.multinode else (),
                             progress=update, timeout_s=max_time_s, protocol=protocol,
                             oversubscribe=m.oversubscribe)
        progress.finish(stored.outcome(m.label))
        if stored.interrupted:
            raise KeyboardInterrupt
        if not stored.ok:
            raise RunFailedError(
                f"measurement '{m.label}' failed (run {stored.run_id}: {stored.reason}); the "
                f"{len(ids)} measurements finished are stored in "
                f"{store.path}: run the same command again to resume")
        ids.append(stored.run_id)
        measured.append(stored.run_id)
    return sorted(ids), measured


def run_suite(suite: Sequence[Measurement], store: Store, *, fresh: bool, host: str,
              torch: str | None, torchrun: Sequence[str] = (), max_time_s: float | None = None,
              progress: Progress | None = None, protocol: RunProtocol | None = None
              ) -> tuple[list[int], list[int]]:
    """`plan` then `measure`: (run ids of the suite, ids run now)."""
    return measure(plan(suite, store, fresh=fresh, host=host, torch=torch), store,
                   torchrun=torchrun, max_time_s=max_time_s, progress=progress,
                   protocol=protocol)


def pool_sources(suite: Sequence[Measurement], stores: Sequence[Store], *, host: str
                 ) -> list[PoolSource]:
    """The runs of `suite` stored in each earlier store (from this host), or a one-line
    error naming a store that lacks some."""
    out = []
    for store in stores:
        found = newest_runs(store.list_runs(), [m for m in suite if not m.multinode],
                            host=host)
        if found.missing:
            raise PerfmodelError(
                f"--pool {store.path}: {len(found.missing)} of this suite's runs are not "
                f"stored there from this host ({host}), e.g. {found.missing[0]}; pool a store "
                f"calibrated with the same options here")
        out.append(PoolSource(store, found.ids))
    return out


def fit_and_write(cluster: str, ids: Sequence[int], store: Store, *, base: str,
                  folder: Path | None = None, pool: Sequence[PoolSource] = ()) -> Written:
    """Fit the runs into the profile `cluster` and write it (the user profile folder),
    pooled with the runs of `pool` (calibration/pool.py)."""
    pooled = PooledStore([PoolSource(store, tuple(ids)), *pool])
    data = fit_from_runs(pooled, pooled.ids, name=cluster, base=base)
    written = write_profile(data, folder)
    return Written(data=data, path=written.path, backup=written.backup)
