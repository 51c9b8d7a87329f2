"""Measure one run and store it: launch, supervise, ingest into the store, hand back its id.

What `perfmodel measure`, `perfmodel calibrate` (calibration/driver.py) and `perfmodel
compare` (perfmodel/compare/) all call, so every run is launched and stored the same way:

- `run`: one run with torchrun (measure/launch.py), or split over two emulated nodes behind
  a capped link (measure/netem.py, root only);
- `run_elastic_ddp`: DDP under torchrun's elastic mode with ranks killed on schedule
  (measure/elastic_launch.py);
- `run_membership_ps`: an asynchronous parameter server that a worker leaves and a standby
  joins.

Before anything is launched each checks that torch is installed (else one line: install
torch==2.13.0 first; nothing stored), opens and checks the store (a corrupt one is refused
before the torch job), and stores as failed any run whose launcher died before storing it
(`recover_orphans`). While a run goes, a journal entry in the store's folder
(`Store.journal_dir`, one small JSON file per run: the launcher's pid and its start time, the
run directory) says who is running it; it is removed once the run is stored. A launcher
killed with -9 takes torchrun and the ranks with it (measure/lifeline.py); its entry stays,
and the next command stores that run as failed: "launcher pid N died ...".

Each stores the run with every rank's records in the measurement store (measure/store.py),
whether it succeeded, failed or was interrupted, and returns a `StoredRun`; what a person
reads about it comes from measure/summary.py. Progress goes to an optional callback object
(`Progress`: a bar, lines, or nothing). No torch here: only the launched ranks import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from measure import lifeline
from measure.elastic_launch import (
    Kill,
    Recovery,
    check_kills,
    check_membership_ps,
    launch_elastic,
    launch_membership_ps,
)
from measure.launch import (
    LaunchResult,
    journal_entry,
    launch,
    live_processes,
    require_torch,
    signal_pids,
)
from measure.netem import launch_capped
from measure.protocol import RunProtocol, protocol_record
from measure.store import Store
from perfmodel.errors import PerfmodelError

Update = Callable[[int], None]     # called with the progress records seen so far


class Progress(Protocol):
    """Progress over a series of runs: the CLI's bar (perfmodel/commands/progress.py)."""

    def begin(self, total: int) -> None:
        """The runs to come take `total` progress records in all."""

    def start(self, label: str, size: int) -> Update:
        """A run of `size` progress records starts; returns its update callback."""

    def finish(self, line: str) -> None:
        """The run ended; `line` says how."""


class NoProgress:
    """Progress that shows nothing (tests, library callers)."""

    def begin(self, total: int) -> None:
        pass

    def start(self, label: str, size: int) -> Update:
        return _ignore

    def finish(self, line: str) -> None:
        pass


def _ignore(done: int) -> None:
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredRun:
    """A launched run and its id in the store."""

    run_id: int
    result: LaunchResult
    recoveries: tuple[Recovery, ...] = ()      # elastic DDP: one per kill, from the launcher

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def interrupted(self) -> bool:
        return self.result.interrupted

    @property
    def reason(self) -> str:
        return self.result.reason

    @property
    def wall_s(self) -> float:
        return self.result.wall_s

    @property
    def run_dir(self) -> Path:
        return self.result.run_dir

    def outcome(self, label: str) -> str:
        """One line for a progress report: `label: run 12, 9 s` (and why it failed)."""
        return (f"{label}: run {self.run_id}, {self.wall_s:.0f} s"
                + ("" if self.ok else f", FAILED: {self.reason}"))


def store_result(store: Store, result: LaunchResult,
                 recoveries: Sequence[Recovery] = ()) -> StoredRun:
    """Ingest a finished launch's run directory into the store; its journal entry goes."""
    run_id = store.ingest(result.run_dir, result.status, result.reason)
    with contextlib.suppress(OSError):
        journal_entry(store.journal_dir, result.run_dir).unlink()
    return StoredRun(run_id=run_id, result=result, recoveries=tuple(recoveries))


def prepare(store: Store) -> list[int]:
    """Before a launch: torch is here, the store opens and is sound, and runs orphaned by a
    dead launcher are stored as failed (their ids are returned)."""
    require_torch()
    store.check()
    return recover_orphans(store)


def recover_orphans(store: Store) -> list[int]:
    """Store as failed every run in the journal whose launcher is gone (killed before it
    could store it), after stopping whatever is left of it; return the new run ids."""
    ids = []
    folder = store.journal_dir
    if not folder.is_dir():
        return ids
    for entry in sorted(folder.glob("*.json")):
        try:
            info = json.loads(entry.read_text())
            pid, started, run_dir = int(info["pid"]), info.get("pid_start"), Path(info["run_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if lifeline.alive(pid, started):
            continue                    # still running (this or another launcher)
        claimed = entry.with_name(f"{entry.name}.{os.getpid()}.claimed")
        try:
            os.rename(entry, claimed)   # one recoverer per entry, even if two commands start
        except OSError:
            continue
        for _ in range(3):              # a process of the run that outlived its launcher
            pids = live_processes(run_dir)
            if not pids:
                break
            signal_pids(pids)
        if (run_dir / "config.json").is_file():
            ids.append(store.ingest(run_dir, "failed",
                                    f"launcher pid {pid} died before storing the run (killed?); "
                                    f"no process of it is left"))
        with contextlib.suppress(OSError):
            claimed.unlink()
    return ids


def run(config: dict, nproc: int, store: Store, *, torchrun_args: Sequence[str] = (),
        link_rate_Gbps: float | None = None, progress: Update | None = None,
        oversubscribe: bool = False, timeout_s: float | None = None,
        run_root: Path | None = None, protocol: RunProtocol | None = None) -> StoredRun:
    """Launch one run of `nproc` local ranks (behind a link capped at `link_rate_Gbps`, if
    given), wait until no process of it is left, and store it. With `protocol`
    (measure/protocol.py) it first waits for the load to settle and plans the ranks' cores;
    what it saw goes into the run's config.json as `protocol`, stored with the run."""
    if torchrun_args and link_rate_Gbps is not None:
        raise PerfmodelError("--link-rate-Gbps emulates two nodes on this host; it cannot be "
                             "combined with --nnodes/--rdzv-endpoint")
    prepare(store)
    config = with_protocol(config, nproc, protocol)
    if link_rate_Gbps is not None:
        result = launch_capped(config, nproc, link_rate_Gbps, run_root=run_root,
                               progress=progress, oversubscribe=oversubscribe,
                               timeout_s=timeout_s, journal=store.journal_dir)
    else:
        result = launch(config, nproc, torchrun_args=torchrun_args, run_root=run_root,
                        progress=progress, oversubscribe=oversubscribe, timeout_s=timeout_s,
                        journal=store.journal_dir)
    return store_result(store, result)


def with_protocol(config: dict, nproc: int, protocol: RunProtocol | None, *,
                  no_pin: str = "") -> dict:
    """`config` with the protocol's record (measure/protocol.py: settle first, then plan
    the pinning; `no_pin` says why this kind of run is never pinned)."""
    if protocol is None:
        return config
    if no_pin:
        protocol = dataclasses.replace(protocol, pin=False)
    record = protocol_record(protocol, config, nproc)
    if no_pin:
        record["pin_skipped"] = no_pin
    return {**config, "protocol": record}


def run_elastic_ddp(config: dict, nproc: int, kills: Sequence[Kill], store: Store, *,
                    min_nodes: int = 1, max_nodes: int = 2, max_restarts: int | None = None,
                    timeout_s: float | None = None, progress: Update | None = None,
                    oversubscribe: bool = False, run_root: Path | None = None,
                    protocol: RunProtocol | None = None) -> StoredRun:
    """An elastic DDP run with `kills`, stored with the launcher's recovery records
    (settled first with `protocol`; never pinned: torchrun restarts its ranks)."""
    check_kills(kills, nproc, int(config.get("steps", 0)))
    prepare(store)
    config = with_protocol(config, nproc, protocol,
                           no_pin="elastic runs restart their ranks: not pinned")
    result, found = launch_elastic(config, nproc, kills, min_nodes=min_nodes,
                                   max_nodes=max_nodes, max_restarts=max_restarts,
                                   run_root=run_root, timeout_s=timeout_s, progress=progress,
                                   oversubscribe=oversubscribe, journal=store.journal_dir)
    return store_result(store, result, found)


def run_membership_ps(config: dict, workers: int, store: Store, *,
                      timeout_s: float | None = None, progress: Update | None = None,
                      oversubscribe: bool = False, run_root: Path | None = None,
                      protocol: RunProtocol | None = None) -> StoredRun:
    """An asynchronous PS run that a worker leaves and a standby joins, stored (settled
    first with `protocol`; never pinned: the standby is launched apart)."""
    check_membership_ps(config, workers)
    prepare(store)
    config = with_protocol(config, workers + 1, protocol,
                           no_pin="a standby joins from another launch: not pinned")
    result = launch_membership_ps(config, workers, run_root=run_root, timeout_s=timeout_s,
                                  progress=progress, oversubscribe=oversubscribe,
                                  journal=store.journal_dir)
    return store_result(store, result)
