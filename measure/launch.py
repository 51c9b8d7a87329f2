"""Launch one measurement with torchrun and supervise it until every process is gone.

`launch()` writes the run's config.json into a fresh run directory and runs

    python -m torch.distributed.run --standalone --nproc-per-node N -m measure.worker RUN_DIR

(torchrun's multi-node flags --nnodes/--node-rank/--rdzv-endpoint/... replace --standalone when
given, so the same call measures a real cluster). torchrun runs in its own session; it starts
each rank in yet another session (torch/distributed/elastic/multiprocessing/
subprocess_handler), so on Ctrl-C, a timeout or a failed rank the launcher stops torchrun
(SIGTERM, then SIGKILL) and then kills every process whose command line names RUN_DIR, found
in /proc. No orphan survives a run. The launcher's own death is covered too: torchrun is
started with a parent-death signal and each rank asks for one as it starts (measure/
lifeline.py, Linux), so kill -9 of the launcher takes torchrun and every rank with it; a
journal entry written before torchrun starts (`journal`, see measure/session.py) lets the
next command store such a run as failed. SIGTERM to the launcher is handled like Ctrl-C.
torchrun keeps its (empty) log folders in RUN_DIR/torchelastic, removed after the run.

Across real nodes every node runs its own launcher with the same torchrun flags and writes
the records of its own ranks into its own run directory (a directory on a shared filesystem,
given as `run_root`, gathers them all).

The outcome is "ok" or "failed" with a one-line reason: the root cause torchrun reports (the
first rank that died: its error record, or the signal that killed it), "interrupted", or
"timed out". What happened is written to RUN_DIR/launch.json for the store (measure/store.py).
This module does not import torch: the CLI imports it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from measure import lifeline
from measure.recorder import read_records
from perfmodel.cluster import data_home
from perfmodel.errors import PerfmodelError

REPO_ROOT = Path(__file__).resolve().parent.parent
# torchrun flags that describe a multi-node job: with any of them, --standalone is left out.
MULTINODE_FLAGS = ("--nnodes", "--node-rank", "--node_rank", "--rdzv-endpoint",
                   "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend", "--rdzv-id",
                   "--rdzv_id", "--master-addr", "--master_addr", "--master-port",
                   "--master_port")
PROGRESS_TYPES = ("step", "collective", "compute")   # records that count as progress
POLL_S = 0.2                # how often the launcher looks at torchrun and the rank files
TERM_GRACE_S = 5.0          # how long torchrun gets to stop its ranks after SIGTERM

Progress = Callable[[int], None]   # called with the progress records seen so far
TORCH_VERSION = "2.13.0"    # the torch perfmodel's measurements are made with
TORCH_MISSING = (f"torch is not installed in this Python ({sys.executable}); real "
                 f"measurements need it: pip install torch=={TORCH_VERSION} first")
LOG_DIR = "torchelastic"    # torchrun --log-dir inside the run directory (else /tmp)
LOW_DISK_BYTES = 256 * 1024  # less free space than this in the run folder: "disk full"


def torch_installed() -> bool:
    """Whether torch can be imported here, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def require_torch() -> None:
    """Refuse (one line, exit 2) before anything is launched or stored when torch is missing."""
    if not torch_installed():
        raise PerfmodelError(TORCH_MISSING)


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchResult:
    run_dir: Path
    status: str                     # "ok" or "failed"
    reason: str                     # why it failed; "" when ok
    exit_codes: tuple[int | None, ...]   # of each torchrun started here (None: killed by us)
    wall_s: float
    oversubscribed: bool
    interrupted: bool = False       # Ctrl-C: the caller should stop after storing the run

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One torchrun invocation: its command line, extra environment and log file name."""

    command: list[str]
    env: dict[str, str]
    log_name: str = "torchrun.log"


def default_run_root() -> Path:
    return data_home() / "runs"


def new_run_dir(config: dict, run_root: Path | None = None) -> Path:
    """A fresh directory named after the time and kind, holding config.json."""
    root = Path(run_root) if run_root is not None else default_run_root()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = (root / f"{stamp}-{config.get('kind', 'run')}-{uuid.uuid4().hex[:8]}").resolve()
    try:
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True)
                                             + "\n")
    except OSError as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise PerfmodelError(f"cannot create the run folder {run_dir}: {e.strerror or e}; "
                             f"nothing was launched") from e
    return run_dir


def is_multinode(torchrun_args: Sequence[str]) -> bool:
    return any(a.split("=")[0] in MULTINODE_FLAGS for a in torchrun_args)


def torchrun_command(run_dir: Path, nproc: int, torchrun_args: Sequence[str] = ()) -> list[str]:
    node_args = list(torchrun_args) if is_multinode(torchrun_args) else ["--standalone",
                                                                          *torchrun_args]
    return [sys.executable, "-m", "torch.distributed.run", *node_args,
            "--log-dir", str(run_dir / LOG_DIR),
            "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "-m", "measure.worker", str(run_dir)]


def worker_env(config: dict, *, local: bool, extra: dict[str, str] | None = None
               ) -> dict[str, str]:
    """The launcher's environment plus one thread per rank, loopback gloo when local, and the
    checkout on PYTHONPATH so `-m measure.worker` imports from any working directory."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(int(config.get("threads_per_worker", 1)))
    if local:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                        if p)
    env.update(extra or {})
    return env


def compute_processes(config: dict, nproc: int, *, hosts_rank0: bool = True) -> int:
    """Cores the ranks started here want: training ranks x threads (a PS server, rank 0,
    mostly waits for messages and is not counted)."""
    training = nproc - (1 if config.get("kind") == "ps" and hosts_rank0 else 0)
    return max(training, 0) * int(config.get("threads_per_worker", 1))


def check_capacity(config: dict, nproc: int, *, oversubscribe: bool,
                   hosts_rank0: bool = True) -> bool:
    """True when the job oversubscribes this machine (allowed only with `oversubscribe`)."""
    wanted, cores = compute_processes(config, nproc, hosts_rank0=hosts_rank0), os.cpu_count() or 1
    if wanted <= cores:
        return False
    if not oversubscribe:
        raise PerfmodelError(
            f"{wanted} compute processes would share the {cores} CPU cores of this machine, "
            f"so the timings would measure time-sharing; use fewer workers or pass "
            f"--oversubscribe (the run is then marked oversubscribed)")
    return True


def launch(config: dict, nproc: int, *, torchrun_args: Sequence[str] = (),
           run_root: Path | None = None, progress: Progress | None = None,
           oversubscribe: bool = False, timeout_s: float | None = None,
           env: dict[str, str] | None = None, journal: Path | None = None) -> LaunchResult:
    """Run one measurement of `nproc` local ranks; return once no process of it is left."""
    if nproc < 1:
        raise PerfmodelError(f"need at least 1 process per node, got {nproc}")
    multinode = is_multinode(torchrun_args)
    node_rank = _flag_value(torchrun_args, ("--node-rank", "--node_rank"))
    over = check_capacity(config, nproc, oversubscribe=oversubscribe,
                          hosts_rank0=node_rank in (None, "0"))
    config = {**config, "oversubscribed": over}
    run_dir = new_run_dir(config, run_root)
    job = Job(command=torchrun_command(run_dir, nproc, torchrun_args),
              env=worker_env(config, local=not multinode, extra=env))
    return supervise(run_dir, [job], timeout_s=timeout_s, progress=progress,
                     oversubscribed=over, journal=journal)


class TerminatedError(Exception):
    """SIGTERM reached the launcher while it supervised a run."""


def journal_entry(journal: Path, run_dir: Path) -> Path:
    """The journal file of a run: written before torchrun starts, removed once stored."""
    return Path(journal) / f"{run_dir.name}.json"


def write_journal(journal: Path, run_dir: Path) -> Path:
    """Note that this process is launching `run_dir` (pid and its start time), so that if it
    dies before storing the run, the next command can (measure/session.py)."""
    entry = journal_entry(journal, run_dir)
    info = {"pid": os.getpid(), "pid_start": lifeline.start_time(os.getpid()),
            "run_dir": str(run_dir), "started_at": _now()}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n")
        os.replace(tmp, entry)
    except OSError as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise PerfmodelError(f"cannot write the run journal {entry}: {e.strerror or e}; "
                             f"nothing was launched") from e
    return entry


def supervise(run_dir: Path, jobs: Sequence[Job], *, timeout_s: float | None = None,
              progress: Progress | None = None, oversubscribed: bool = False,
              extra_info: dict | None = None, journal: Path | None = None) -> LaunchResult:
    """Start `jobs` (torchrun invocations writing into one run directory), wait for all of
    them, and stop every process of the run on failure, timeout, Ctrl-C or SIGTERM. With
    `journal` (a folder), an entry naming this process is written there first."""
    if journal is not None:
        write_journal(journal, run_dir)
    started_at, t0 = _now(), time.monotonic()
    procs: list[subprocess.Popen] = []
    interrupted = timed_out = False
    how = "interrupted (Ctrl-C)"
    observed: list[int | None] = []
    watcher = _ProgressWatcher(run_dir)
    previous = _catch_sigterm()
    try:
        for job in jobs:
            with open(run_dir / job.log_name, "wb") as log:
                procs.append(subprocess.Popen(job.command, env=job.env, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, cwd=run_dir,
                                              preexec_fn=lifeline.child_setup(os.getpid())))
        while True:
            observed = [p.poll() for p in procs]
            if progress is not None:
                progress(watcher.count())
            if all(c == 0 for c in observed) or any(c not in (None, 0) for c in observed):
                break
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                timed_out = True
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        interrupted = True
    except TerminatedError:
        interrupted, how = True, "terminated (SIGTERM)"
    finally:
        try:
            _stop(procs, run_dir)
        finally:
            _restore_sigterm(previous)
            _remove_empty_tree(run_dir / LOG_DIR)
    if progress is not None:
        progress(watcher.count())
    codes = tuple(p.returncode for p in procs)
    killed = [(p.pid, -c) for p, c in zip(procs, observed, strict=False) if c is not None and c < 0]
    if interrupted:
        status, reason = "failed", f"{how}; every rank was stopped"
    elif timed_out:
        status, reason = "failed", f"timed out after {timeout_s:g} s; every rank was stopped"
    elif all(c == 0 for c in codes):
        status, reason = "ok", ""
    elif killed:
        status, reason = "failed", (f"torchrun (pid {killed[0][0]}) was killed by "
                                    f"{_signal_name(killed[0][1])}; every rank was stopped")
    else:
        status, reason = "failed", failure_reason(run_dir, jobs, codes)
    if status == "failed" and disk_full(run_dir):     # the cause of whatever the ranks said
        reason = f"the disk of {run_dir.parent} is full (what failed next: {reason})"
    result = LaunchResult(run_dir=run_dir, status=status, reason=reason, exit_codes=codes,
                          wall_s=time.monotonic() - t0, oversubscribed=oversubscribed,
                          interrupted=interrupted)
    _write_launch_info(result, jobs, started_at, extra_info or {})
    return result


def failure_reason(run_dir: Path, jobs: Sequence[Job], codes: Sequence[int | None]) -> str:
    """One line saying why the run failed, the cause before its consequences: an error a rank
    raised itself; else a rank killed by a signal (as torchrun reports it, or a rank that
    started and left no last record); else the rank torchrun saw fail first, whose error
    says it lost or waited for its peers; else the exit code."""
    records = read_records(run_dir)
    errors = {r["rank"]: r.get("message", "") for r in records if r.get("type") == "error"}
    own = {rank: msg for rank, msg in errors.items() if not _PEER_FAILURE.search(msg)}
    if own:
        rank = min(own)
        return f"rank {rank} failed: {_first_line(own[rank])}"
    causes = [c for job in jobs for c in _failures(_read(run_dir / job.log_name))]
    for rank, exitcode in causes:
        if exitcode < 0 and exitcode != -signal.SIGTERM:
            return f"rank {rank} was killed by {_signal_name(-exitcode)}"
    started = {r["rank"] for r in records if r.get("type") == "start"}
    ended = {r["rank"] for r in records if r.get("type") in ("done", "error")}
    stopped = {rank for rank, exitcode in causes if exitcode == -signal.SIGTERM}
    silent = sorted(started - ended - stopped)      # gone without a word, not stopped by torchrun
    if silent:
        return f"rank {silent[0]} ended without a last record (killed?)"
    for rank, exitcode in causes:
        if rank in errors:
            return f"rank {rank} failed: {_first_line(errors[rank])}"
        return f"rank {rank} exited with code {exitcode} without recording an error"
    if errors:
        rank = min(errors)
        return f"rank {rank} failed: {_first_line(errors[rank])}"
    tail = _last_lines(run_dir / jobs[0].log_name) if jobs else ""
    code = next((c for c in codes if c not in (None, 0)), None)
    return f"torchrun exited with code {code}" + (f": {tail}" if tail else "")


def disk_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < LOW_DISK_BYTES
    except OSError:
        return False


def live_processes(run_dir: Path) -> list[int]:
    """Pids of processes (other than this one) whose command line names `run_dir`."""
    marker, own = str(run_dir).encode(), os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in args and state != "Z":
            pids.append(int(entry.name))
    return pids


def git_revision() -> str:
    """The perfmodel checkout's commit, with "-dirty" if tracked files changed; "" if unknown."""
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


class _ProgressWatcher:
    """Counts progress records per rank file, reading only what was appended since last time;
    reports the most advanced rank (PS servers and idle ranks write none)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}
        self.counts: dict[Path, int] = {}

    def count(self) -> int:
        for path in self.run_dir.glob("rank*.jsonl"):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            n = 0
            for line in complete.splitlines():
                try:
                    n += json.loads(line).get("type") in PROGRESS_TYPES
                except (json.JSONDecodeError, AttributeError):
                    continue
            self.counts[path] = self.counts.get(path, 0) + n
        return max(self.counts.values(), default=0)


def _stop(procs: Sequence[subprocess.Popen], run_dir: Path) -> None:
    """SIGTERM each torchrun (it stops its ranks), then SIGKILL whatever is left of the run."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
    for p in procs:
        _signal_group(p.pid, signal.SIGKILL)
        p.wait()
    for _ in range(50):
        pids = live_processes(run_dir)
        if not pids:
            return
        for pid in pids:
            _signal_pid(pid, signal.SIGKILL)
        time.sleep(0.1)


def signal_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to each of `pids` (gone already: fine), then give them a moment to go."""
    for pid in pids:
        _signal_pid(pid, sig)
    time.sleep(0.1)


def _catch_sigterm():
    """SIGTERM raises TerminatedError while a run is supervised (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    fired = []

    def handler(signum, frame):
        if not fired:               # once: a second SIGTERM must not cut the cleanup short
            fired.append(signum)
            raise TerminatedError()
    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _remove_empty_tree(path: Path) -> None:
    """torchrun's log folders hold nothing when nothing is redirected: remove them then."""
    if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
        shutil.rmtree(path, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# Errors a rank reports because a peer died or hung (gloo and c10d wording): consequences.
_PEER_FAILURE = re.compile(r"by peer|Connection reset|Connection refused|Broken pipe|"
                           r"Read error|Write error|timed out|Timed out|Timeout|"
                           r"DistNetworkError|DistStoreError")
# One entry of torchrun's ChildFailedError summary ("Failures:" and "Root Cause").
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def _failures(log: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank torchrun lists, its root cause first."""
    root = log.rfind("Root Cause")
    ordered = (log[root:] + "\n" + log[:root]) if root >= 0 else log
    return [(int(r), int(c)) for r, c in _FAILURE.findall(ordered)]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return line if len(line) <= 300 else line[:297] + "..."


def _last_lines(path: Path, n: int = 1) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[:300]


def _flag_value(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    for i, a in enumerate(args):
        key, _, value = a.partition("=")
        if key in names:
            return value if value else (args[i + 1] if i + 1 < len(args) else None)
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write_launch_info(result: LaunchResult, jobs: Sequence[Job], started_at: str,
                       extra: dict) -> None:
    info = {
        "started_at": started_at, "ended_at": _now(), "wall_s": result.wall_s,
        "status": result.status, "reason": result.reason,
        "exit_codes": list(result.exit_codes), "oversubscribed": result.oversubscribed,
        "commands": [job.command for job in jobs], "host": os.uname().nodename,
        "python_version": sys.version.split()[0], "git_revision": git_revision(), **extra,
    }
    with contextlib.suppress(OSError):      # a full disk: the store does without it
        (result.run_dir / "launch.json").write_text(json.dumps(info, indent=2) + "\n")
