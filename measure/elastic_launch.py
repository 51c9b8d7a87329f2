"""Launch runs whose membership changes: torchrun elastic mode with workers killed on
schedule (measure/runs/elastic_ddp.py), and a parameter server that loses and gains a worker
(measure/runs/elastic_ps.py). Reuses measure/launch.py: its torchrun command, environment,
capacity check and `supervise` (which leaves no orphans).

Elastic DDP runs under

    torchrun --nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint localhost:PORT
             --rdzv-id ID --rdzv-conf last_call_timeout=1 --max-restarts R
             --nproc-per-node N -m measure.worker RUN_DIR

with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch 2.13's agent otherwise hands every attempt
the same TCPStore without a per-attempt prefix, and the restarted workers' process-group
init could read the previous attempt's keys and hang (seen here in 1 of 4 trial runs).
last_call_timeout (≥ 1 s, an integer) is how long the rendezvous waits for more nodes once
MIN are there, and so part of every restart when MIN < MAX.

Kills: the i-th `Kill(rank, at_step)` SIGKILLs that rank's process in attempt i (each kill
causes one restart) as soon as its records show step `at_step` done; the launcher looks every
0.2 s (launch.POLL_S), so the rank may get a few steps further. The kill times go to
RUN_DIR/kills.json. After the run, `recoveries()` derives each recovery from the ranks'
records and the kills, and the launcher appends them to rank 0's file as "elastic" records
with event "recovery" and source "launcher" (the store keeps them in other_records), so
calibration finds the detection, restart and lost-work figures with the run.
Times are epoch seconds from one host's clock: on several nodes they need synchronised clocks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from measure.launch import (
    Job,
    LaunchResult,
    Progress,
    check_capacity,
    new_run_dir,
    supervise,
    torchrun_command,
    worker_env,
)
from measure.recorder import Recorder, read_records
from perfmodel.errors import PerfmodelError

LAST_CALL_S = 1                 # rendezvous last-call wait (torch requires >= 1 s)
MONITOR_S = 0.1                 # torchrun --monitor-interval (its default): failure polling
KILLS_FILE = "kills.json"
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True, slots=True)
class Kill:
    rank: int
    at_step: int                # SIGKILL once the rank has recorded this step


def parse_kills(text: str) -> tuple[Kill, ...]:
    """'1@30,0@70': kill rank 1 at step 30 of the first attempt, rank 0 at step 70 of the
    second."""
    kills = []
    for item in text.split(","):
        rank, _, step = item.strip().partition("@")
        if not rank.isdigit() or not step.isdigit():
            raise PerfmodelError(f"kill '{item.strip()}' is not RANK@STEP (example: 1@30,0@70)")
        kills.append(Kill(int(rank), int(step)))
    return tuple(kills)


def check_kills(kills: Sequence[Kill], nproc: int, steps: int) -> None:
    """Every kill names a rank that exists and a step inside the run, before anything starts
    (a kill that cannot happen would leave an "ok" run without the failure it was for)."""
    for i, k in enumerate(kills, 1):
        if not 0 <= k.rank < nproc:
            raise PerfmodelError(f"kill {i} ({k.rank}@{k.at_step}): rank {k.rank} does not "
                                 f"exist; the run has ranks 0..{nproc - 1}")
        if not 0 <= k.at_step < steps - 1:
            raise PerfmodelError(f"kill {i} ({k.rank}@{k.at_step}): step {k.at_step} is not "
                                 f"inside the run, whose {steps} steps leave room for kills at "
                                 f"steps 0..{steps - 2}")


def check_membership_ps(config: dict, workers: int) -> None:
    """The elastic PS plan against the run (measure/runs/elastic_ps.py checks it again in the
    ranks): a leaving worker that trains, a leave inside its steps, a join that can happen."""
    plan = (config.get("options") or {}).get("elastic_ps") or {}
    standby, who = int(plan.get("standby", 1)), int(plan.get("leave_worker", 0))
    after, join = int(plan.get("leave_after_steps", 10)), int(plan.get("join_after_updates", 10))
    steps = int(config.get("steps", 20))
    active = workers - standby
    if active < 1:
        raise PerfmodelError(f"{standby} standby workers leave none of the {workers} workers "
                             f"to start training")
    if not 0 <= who < active:
        raise PerfmodelError(f"the leaving worker {who} does not exist among the {active} "
                             f"workers that start training (0..{active - 1})")
    if not 1 <= after < steps:
        raise PerfmodelError(f"the leave after {after} steps is not inside the run's {steps} "
                             f"steps per worker (1..{steps - 1})")
    budget = steps * active
    if standby and join >= budget - after:
        raise PerfmodelError(f"a join after {join} updates cannot happen: the run applies "
                             f"{budget} updates, at least {after} of them before the leave")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def elastic_command(run_dir: Path, nproc: int, *, min_nodes: int, max_nodes: int,
                    max_restarts: int) -> list[str]:
    """measure.launch's torchrun command in elastic mode on this host."""
    args = ["--nnodes", f"{min_nodes}:{max_nodes}", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"localhost:{free_port()}", "--rdzv-id", uuid.uuid4().hex[:12],
            "--rdzv-conf", f"last_call_timeout={LAST_CALL_S}"]
    command = torchrun_command(run_dir, nproc, args)
    command[command.index("--max-restarts") + 1] = str(max_restarts)
    return command


class Killer:
    """A supervise() progress callback that kills ranks on schedule (see the module doc)."""

    def __init__(self, run_dir: Path, kills: Sequence[Kill], progress: Progress | None):
        self.run_dir, self.kills, self.progress = run_dir, list(kills), progress
        self.offsets: dict[Path, int] = {}
        self.pids: dict[tuple[int, int], int] = {}         # (rank, attempt) -> pid
        self.steps: dict[tuple[int, int], int] = {}        # (rank, attempt) -> last step
        self.done: list[dict[str, Any]] = []

    def __call__(self, count: int) -> None:
        if self.progress is not None:
            self.progress(count)
        if len(self.done) == len(self.kills):
            return
        self._read()
        kill, attempt = self.kills[len(self.done)], len(self.done)
        pid = self.pids.get((kill.rank, attempt))
        if pid is None or self.steps.get((kill.rank, attempt), -1) < kill.at_step:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.done.append({"rank": kill.rank, "attempt": attempt, "pid": pid,
                          "at_step": kill.at_step,
                          "step_seen": self.steps[(kill.rank, attempt)], "time": time.time()})
        tmp = self.run_dir / (KILLS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.done, indent=2) + "\n")
        os.replace(tmp, self.run_dir / KILLS_FILE)

    def _read(self) -> None:
        for path in self.run_dir.glob("rank*.jsonl"):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r.get("type") == "elastic" and r.get("event") == "attempt":
                    self.pids[(r["rank"], r["attempt"])] = r["pid"]
                elif r.get("type") == "step" and "attempt" in r:
                    key = (r["rank"], r["attempt"])
                    self.steps[key] = max(self.steps.get(key, -1), r["step"])


# ---------------------------------------------------------------- what a recovery cost


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """One kill and the restart it caused, from the records (epoch-second differences)."""

    attempt: int                    # the attempt that was killed
    killed_rank: int
    steps_done: int                 # steps completed when killed (most advanced rank)
    resumed_step: int               # the checkpoint the next attempt resumed from
    lost_steps: int
    lost_work_s: float              # wall time of the lost steps in the killed attempt
    step_s: float                   # median step of the killed attempt
    detection_s: float | None       # kill -> first survivor stopped (agent SIGTERM or error)
    rendezvous_s: float | None      # -> the next attempt's processes started
    startup_s: float | None         # -> their process group up (import torch, init)
    reload_s: float                 # checkpoint load, slowest rank
    restart_s: float | None         # detected -> every rank ready to train again
    recovery_s: float | None        # kill -> the lost progress regained


def recoveries(records: list[dict], kills: list[dict]) -> list[Recovery]:
    out = []
    for kill in kills:
        a, t_kill = kill["attempt"], kill["time"]
        steps = [r for r in records if r.get("type") == "step" and r.get("attempt") == a]
        nxt = [r for r in records if r.get("type") == "step" and r.get("attempt") == a + 1]
        ev = [r for r in records if r.get("type") == "elastic"]
        ready = [r for r in ev if r["event"] == "ready" and r["attempt"] == a + 1]
        if not steps or not ready:
            continue
        done = max(r["step"] for r in steps) + 1
        resumed = ready[0]["step"]
        wall: dict[int, float] = {}
        for r in steps:
            wall[r["step"]] = max(wall.get(r["step"], 0.0), r["wall_s"])
        stopped = [r["time"] for r in ev if r["event"] == "stopped" and r["attempt"] == a]
        started = [r for r in ev if r["event"] == "attempt" and r["attempt"] == a + 1]
        detected = min(stopped) if stopped else None
        spawned = min((r["spawned_at"] for r in started if r.get("spawned_at")), default=None)
        entered = max((r["entered_at"] for r in started), default=None)
        regained = [r["end_time"] for r in nxt if r["step"] == done - 1]
        if not regained and resumed >= done:    # killed just after a checkpoint: nothing
            regained = [r["time"] for r in ready]   # lost, regained once every rank is ready
        out.append(Recovery(
            attempt=a, killed_rank=kill["rank"], steps_done=done, resumed_step=resumed,
            lost_steps=done - resumed,
            lost_work_s=sum(w for s, w in wall.items() if s >= resumed),
            step_s=float(sorted(wall.values())[len(wall) // 2]),
            detection_s=_diff(detected, t_kill), rendezvous_s=_diff(spawned, detected),
            startup_s=_diff(entered, spawned), reload_s=max(r["reload_s"] for r in ready),
            restart_s=_diff(max(r["time"] for r in ready), detected),
            recovery_s=_diff(max(regained), t_kill) if regained else None))
    return out


def _diff(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def checkpoint_write_s(records: list[dict], attempt: int | None = None) -> list[float]:
    return [r["write_s"] for r in records
            if r.get("type") == "elastic" and r.get("event") == "checkpoint"
            and (attempt is None or r.get("attempt") == attempt)]


def measured_costs(records: list[dict]) -> dict[str, float]:
    """Medians of what the run's recoveries cost, in the names of the model's parameters
    (perfmodel.sim.elastic.ElasticConfig): for calibration. `records` are a run's records,
    e.g. the JSON of its "elastic" rows in the store's other_records."""
    def median(values: list[float]) -> float | None:
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    found = [r for r in records if r.get("type") == "elastic" and r.get("event") == "recovery"]
    costs = {"detection_s": median([r["detection_s"] for r in found]),
             "restart_s": median([r["restart_s"] for r in found]),
             "checkpoint_write_s": median(checkpoint_write_s(records)),
             "lost_steps": median([r["lost_steps"] for r in found])}
    return {k: v for k, v in costs.items() if v is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class FirstStart:
    """What the first attempt shows before any failure: the inputs of a recovery forecast."""

    step_s: float                   # median step
    checkpoint_write_s: float       # median write (0 if none yet)
    startup_s: float                # first process started -> every rank ready to train
    detection_s: float              # expected: the agent polls its workers every MONITOR_S
    restart_s: float                # expected: poll + last call + startup + reload (≈ write)


def first_start(records: list[dict]) -> FirstStart:
    ev = [r for r in records if r.get("type") == "elastic" and r.get("attempt") == 0]
    spawned = [r["spawned_at"] for r in ev if r["event"] == "attempt" and r.get("spawned_at")]
    ready = [r["time"] for r in ev if r["event"] == "ready"]
    walls = sorted(r["wall_s"] for r in records
                   if r.get("type") == "step" and r.get("attempt") == 0)
    if not spawned or not ready or not walls:
        raise PerfmodelError("the run's first attempt left no start, ready or step records")
    writes = sorted(checkpoint_write_s(records, attempt=0))
    write = writes[len(writes) // 2] if writes else 0.0
    startup = max(ready) - min(spawned)
    return FirstStart(step_s=walls[len(walls) // 2], checkpoint_write_s=write,
                      startup_s=startup, detection_s=MONITOR_S,
                      restart_s=MONITOR_S + LAST_CALL_S + startup + write)


# ---------------------------------------------------------------- launching


def launch_elastic(config: dict, nproc: int, kills: Sequence[Kill], *, min_nodes: int = 1,
                   max_nodes: int = 2, max_restarts: int | None = None,
                   run_root: Path | None = None, timeout_s: float | None = None,
                   progress: Progress | None = None, oversubscribe: bool = False,
                   journal: Path | None = None) -> tuple[LaunchResult, list[Recovery]]:
    """An elastic_ddp run of `nproc` local ranks with `kills`; store-ready run directory."""
    check_kills(kills, nproc, int(config.get("steps", 0)))
    if not 1 <= min_nodes <= max_nodes:
        raise PerfmodelError(f"--nnodes {min_nodes}:{max_nodes} needs 1 <= MIN <= MAX")
    restarts = len(kills) if max_restarts is None else max_restarts
    if restarts < len(kills):
        raise PerfmodelError(f"{len(kills)} kills need at least {len(kills)} restarts, "
                             f"got --max-restarts {restarts}")
    over = check_capacity(config, nproc, oversubscribe=oversubscribe)
    run_dir = new_run_dir({**config, "oversubscribed": over}, run_root)
    job = Job(command=elastic_command(run_dir, nproc, min_nodes=min_nodes,
                                      max_nodes=max_nodes, max_restarts=restarts),
              env=worker_env(config, local=True, extra=ELASTIC_ENV))
    killer = Killer(run_dir, kills, progress)
    result = supervise(run_dir, [job], timeout_s=timeout_s, progress=killer,
                       oversubscribed=over, journal=journal,
                       extra_info={"elastic": {"nnodes": f"{min_nodes}:{max_nodes}",
                                               "max_restarts": restarts,
                                               "kills": [asdict(k) for k in kills]}})
    if result.ok and len(killer.done) < len(kills):
        k = kills[len(killer.done)]
        result = replace(result, status="failed",
                         reason=f"kill {len(killer.done) + 1} ({k.rank}@{k.at_step}) never "
                                f"happened: the run finished first")
        _amend_launch_info(run_dir, result)
    found = recoveries(read_records(run_dir), killer.done)
    recorder = Recorder(run_dir, 0)
    try:
        for r in found:
            recorder.write("elastic", event="recovery", source="launcher", **asdict(r))
    finally:
        recorder.close()
    return result, found


def launch_membership_ps(config: dict, workers: int, *, run_root: Path | None = None,
                         timeout_s: float | None = None, progress: Progress | None = None,
                         oversubscribe: bool = False, journal: Path | None = None
                         ) -> LaunchResult:
    """An elastic_ps run: one server and `workers` workers (standby ones idle at first)."""
    check_membership_ps(config, workers)
    standby = int(((config.get("options") or {}).get("elastic_ps") or {}).get("standby", 1))
    busy = {**config, "kind": "ps"}          # the server and idle standbys use no core
    over = check_capacity(busy, workers + 1 - standby, oversubscribe=oversubscribe)
    run_dir = new_run_dir({**config, "oversubscribed": over}, run_root)
    job = Job(command=torchrun_command(run_dir, workers + 1),
              env=worker_env(config, local=True))
    return supervise(run_dir, [job], timeout_s=timeout_s, progress=progress,
                     oversubscribed=over, journal=journal)


def _amend_launch_info(run_dir: Path, result: LaunchResult) -> None:
    path = run_dir / "launch.json"
    try:
        info = json.loads(path.read_text())
        info.update(status=result.status, reason=result.reason)
        path.write_text(json.dumps(info, indent=2) + "\n")
    except (OSError, json.JSONDecodeError):
        pass
