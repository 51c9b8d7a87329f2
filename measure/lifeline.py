"""Tie a measurement's processes to their launcher, and tell a dead launcher from a live one.

The launcher (`perfmodel measure`, calibrate, compare) starts torchrun in its own process
group; torchrun starts every rank. If the launcher dies without cleaning up (kill -9, an
out-of-memory kill), nothing would stop torchrun and the ranks, re-parented to init, would
train to the end. So each link of the chain asks the kernel for a parent-death signal
(prctl(PR_SET_PDEATHSIG, SIGKILL), Linux only): torchrun dies with its launcher, each rank
with its torchrun. On other systems `die_with_parent` does nothing (documented: there the
launcher's own cleanup on Ctrl-C, SIGTERM, a failure or a timeout is all there is).

Also here: a process's start time from /proc, so that a journal entry (measure/session.py)
naming a launcher's pid is not fooled by the pid being reused. No torch here.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
_prctl = None


def _load_prctl():
    """libc's prctl, looked up before any fork (a forked child should not load libraries)."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask for `sig` when this process's parent dies; True where the platform offers it."""
    prctl = _load_prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def child_setup(parent_pid: int):
    """A Popen preexec_fn: the child dies with `parent_pid` (and exits at once if that
    parent is already gone, the race between fork and prctl)."""
    _load_prctl()

    def setup() -> None:
        die_with_parent()
        if os.getppid() != parent_pid:
            os._exit(1)
    return setup


def tie_rank_to_torchrun(run_dir: Path) -> None:
    """Called first thing in a rank: die with torchrun; exit now if torchrun is already gone
    (the parent is then init or a subreaper, whose command line does not name the run)."""
    if not die_with_parent():
        return
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if str(run_dir).encode() not in args:
        os._exit(1)


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); None if
    there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int, started: int | None) -> bool:
    """Is the process `pid` that started at `started` still running (and no zombie)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if not Path("/proc/self").exists():        # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started
