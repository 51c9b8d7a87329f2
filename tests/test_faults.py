"""Fault suite for measurement (issue 15): what a killed, interrupted or starved run leaves.

Each real fault (marked slow) starts a 2-rank gloo job that would run for an hour (the
selftest "hang" mode, or a `perfmodel measure ddp` of 100000 steps), waits until both ranks
are up, then: kill -9 of the launcher, of torchrun, of a rank; SIGINT and SIGTERM to the
launcher; a run folder on a full disk (a tiny tmpfs; skipped where mounting is not allowed).
Each must leave no process of the run (checked in /proc: every torchrun and rank names the
run directory on its command line), a failed run in the store with the reason, and the store
readable. The fast part: a corrupt store, a missing torch, options that cannot fit the run,
all refused before anything starts, and the journal that stores an orphaned run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from measure import session
from measure.launch import live_processes, write_journal
from measure.store import Store
from perfmodel.commands.progress import RunsProgress
from tests.inprocess import as_in_a_terminal, run_cli

REPO = Path(__file__).resolve().parent.parent
UP_S = 120                  # torch import and gloo init on loaded cores
GONE_S = 15                 # the run's processes must be gone within this after the fault


# ------------------------------------------------------------------ helpers




def one_line_error(code: int, err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("perfmodel: error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def hang_config() -> dict:
    return {"kind": "selftest", "workers": 2, "steps": 3, "seed": 0, "timeout_s": 600,
            "threads_per_worker": 1, "options": {"selftest": {"mode": "hang"}}}


LAUNCHER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from measure import session
    from measure.store import Store
    root = Path(sys.argv[2])
    stored = session.run(json.loads(sys.argv[1]), 2, Store(root / "m.sqlite"),
                         run_root=root / "runs")
    print(json.dumps({"run_id": stored.run_id, "reason": stored.reason}), flush=True)
""")


def start_launcher(root: Path) -> subprocess.Popen:
    """session.run (what `perfmodel measure` calls) of a hanging selftest job, in a process
    whose temporary directory is ROOT/tmp (torchrun must leave nothing there)."""
    (root / "tmp").mkdir()
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps(hang_config()),
                             str(root), str(REPO)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(root / "tmp")},
                            preexec_fn=as_in_a_terminal)


def wait_until_up(root: Path, proc: subprocess.Popen, record: str = "start") -> Path:
    """The run directory, once both ranks have written a `record` record."""
    deadline = time.monotonic() + UP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the launcher ended before its ranks were up"
        for run_dir in root.glob("**/runs/*"):
            files = list(run_dir.glob("rank*.jsonl"))
            if len(files) == 2 and all(f'"type": "{record}"' in f.read_text() for f in files):
                return run_dir
        time.sleep(0.2)
    raise AssertionError(f"ranks not up after {UP_S} s")


def processes_of(run_dir: Path, what: str) -> list[int]:
    """Live pids of the run's "torchrun" or its "ranks"."""
    found = []
    for pid in live_processes(run_dir):
        with contextlib.suppress(OSError):
            torchrun = b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
            if torchrun == (what == "torchrun"):
                found.append(pid)
    return sorted(found)


def gone(run_dir: Path) -> bool:
    """No process of the run is left, waiting up to GONE_S for them to exit."""
    deadline = time.monotonic() + GONE_S
    while live_processes(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stored_run(root: Path):
    """The one run in the store, which must open and read."""
    runs = Store(root / "m.sqlite").list_runs()
    assert len(runs) == 1, runs
    return runs[0]


def finish(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ fast: refused up front


def no_launch(monkeypatch):
    """Fail the test if anything is launched."""
    import measure.launch as launch_module

    def refuse(*args, **kwargs):
        raise AssertionError("a run was launched")
    monkeypatch.setattr(launch_module.subprocess, "Popen", refuse)


def test_a_corrupt_store_is_refused_before_the_torch_job(tmp_path, monkeypatch):
    no_launch(monkeypatch)
    db = tmp_path / "m.sqlite"
    db.write_bytes(b"not a database, " * 64)
    before = db.read_bytes()
    code, _, err = run_cli(["measure", "ddp", "--workers", "2", "--workload", "mlp",
                            "--oversubscribe", "--db", str(db)],
                           env={"XDG_DATA_HOME": str(tmp_path / "data")})
    one_line_error(code, err, "not a usable SQLite measurement store", "left untouched")
    assert db.read_bytes() == before and not (tmp_path / "data").exists()


BLOCK_TORCH = textwrap.dedent("""
    import sys
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named '{name}'")
    sys.meta_path.insert(0, NoTorch())
    sys.path.insert(0, sys.argv[1])
    sys.argv = ["perfmodel", *sys.argv[2:]]
    from perfmodel.cli import main
    main()
""")


def test_without_torch_measure_says_what_to_install_and_stores_nothing(tmp_path):
    """torch hidden by a meta-path blocker in a fresh process: one line, exit 2, no store,
    no run folder, no torchrun."""
    db, data = tmp_path / "m.sqlite", tmp_path / "data"
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(REPO), "measure", "ddp",
                           "--workers", "2", "--workload", "mlp", "--db", str(db)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_DATA_HOME": str(data)})
    one_line_error(proc.returncode, proc.stderr, "pip install torch==2.13.0 first")
    assert not db.exists() and not data.exists()


@pytest.mark.parametrize("args", [["calibrate", "--cluster", "local"],
                                  ["compare", "--cluster", "local", "--quick"]])
def test_without_torch_calibrate_and_compare_say_to_install_torch(args, tmp_path,
                                                                   monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "torch" else real(name, *a, **k))
    no_launch(monkeypatch)
    db = tmp_path / "m.sqlite"
    code, _, err = run_cli([*args, "--db", str(db)],
                           env={"XDG_DATA_HOME": str(tmp_path / "data")})
    line = one_line_error(code, err, "pip install torch==2.13.0 first")
    assert "extra" not in line and "store" not in line
    assert not db.exists()


@pytest.mark.parametrize("args, words", [
    (["ddp", "--workers", "2", "--kill", "9@15"], ("rank 9 does not exist", "0..1")),
    (["ddp", "--workers", "2", "--steps", "40", "--kill", "1@39"], ("not inside the run",)),
    (["ddp", "--workers", "2", "--kill", "1@15,0@-1"], ("is not RANK@STEP",)),
    (["ps", "--workers", "3", "--leave", "2@5"], ("leaving worker 2 does not exist",)),
    (["ps", "--workers", "3", "--steps", "20", "--leave", "0@20"], ("not inside the run",)),
    (["ps", "--workers", "3", "--steps", "4", "--leave", "0@2", "--join-after", "9"],
     ("cannot happen",)),
])
def test_elastic_options_are_checked_against_the_run_before_launching(args, words, tmp_path,
                                                                       monkeypatch):
    no_launch(monkeypatch)
    db = tmp_path / "m.sqlite"
    code, _, err = run_cli(["measure", "elastic", *args, "--workload", "mlp", "--db", str(db)],
                           env={"XDG_DATA_HOME": str(tmp_path / "data")})
    one_line_error(code, err, *words)
    assert not db.exists()


@pytest.mark.parametrize("args, words", [
    (["--strategy", "async-ps", "--checkpoint-interval-s", "600"],
     ("--checkpoint-interval-s does not apply to --strategy async-ps", "ddp")),
    (["--strategy", "ddp", "--sync-ps-on-departure", "wait"],
     ("--sync-ps-on-departure does not apply to --strategy ddp", "sync-ps")),
    (["--strategy", "ddp", "--events", "join:3@10"], ("worker 3 is already in the job",)),
])
def test_predict_options_that_do_not_fit_are_errors(args, words):
    code, _, err = run_cli(["predict", "--workers", "16", *args])
    one_line_error(code, err, *words)


def test_an_orphaned_run_is_stored_failed_by_the_next_command(tmp_path):
    """A journal entry whose launcher is dead (a finished child's pid): `perfmodel runs`
    stores that run as failed with the reason, and removes the entry."""
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(hang_config()))
    store = Store(tmp_path / "m.sqlite")
    entry = write_journal(store.journal_dir, run_dir)
    dead = subprocess.Popen(["true"])
    dead.wait()
    info = json.loads(entry.read_text())
    entry.write_text(json.dumps({**info, "pid": dead.pid}))
    live = write_journal(store.journal_dir, tmp_path / "runs" / "r2")  # this process: alive
    code, out, err = run_cli(["runs", "--db", str(store.path), "--json"])
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["status"] == "failed" and row["reason"].startswith(
        f"launcher pid {dead.pid} died before storing the run")
    assert not entry.exists() and live.exists()


def test_the_progress_bar_counts_each_run_once():
    """Two runs of 6 and 4 records: the bar ends at 10 of 10, not 14 (the 138/132 overrun)."""
    class Bar:
        pos, label = 0, ""

        def update(self, n: int) -> None:
            self.pos += n

        def render_progress(self) -> None:
            pass

    progress = RunsProgress(command="t", label="t", bar=False, lines=False)
    progress.bar = Bar()
    progress.begin(10)
    for size in (6, 4):
        update = progress.start("run", size)
        update(size + 5)                  # a run that writes more records than foreseen
        assert progress.bar.pos <= 10
        progress.finish("done")
    assert progress.bar.pos == 10


# ------------------------------------------------------------------ slow: real faults


@pytest.mark.slow
def test_kill_9_of_perfmodel_measure_ends_torchrun_and_every_rank(tmp_path):
    """The real CLI, killed with -9 mid-run: torchrun and both ranks die with it (parent-death
    signals), and the next command stores the run as failed: 'launcher pid N died'."""
    db, data = tmp_path / "m.sqlite", tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "perfmodel", "measure", "ddp", "--workers",
                             "2", "--workload", "mlp", "--steps", "100000", "--warmup-steps",
                             "0", "--oversubscribe", "--db", str(db)],
                            cwd=REPO, env={**os.environ, "XDG_DATA_HOME": str(data)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = wait_until_up(data, proc)
    assert len(processes_of(run_dir, "ranks")) == 2
    proc.kill()
    proc.wait()
    assert gone(run_dir)
    code, out, err = run_cli(["runs", "--db", str(db), "--json"])
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["status"] == "failed" and row["reason"].startswith(
        f"launcher pid {proc.pid} died")
    assert not list(Store(db).journal_dir.glob("*"))


@pytest.mark.slow
def test_kill_9_of_torchrun_fails_the_run_naming_it(tmp_path):
    proc = start_launcher(tmp_path)
    run_dir = wait_until_up(tmp_path, proc)
    (torchrun,) = processes_of(run_dir, "torchrun")
    os.kill(torchrun, signal.SIGKILL)
    out = finish(proc)
    assert out["reason"] == f"torchrun (pid {torchrun}) was killed by SIGKILL; every rank " \
                            "was stopped"
    assert gone(run_dir) and stored_run(tmp_path).reason == out["reason"]


@pytest.mark.slow
def test_kill_9_of_a_rank_fails_the_run_naming_the_rank(tmp_path):
    proc = start_launcher(tmp_path)
    run_dir = wait_until_up(tmp_path, proc)
    os.kill(processes_of(run_dir, "ranks")[0], signal.SIGKILL)
    out = finish(proc)
    row = stored_run(tmp_path)
    assert row.status == "failed" and "was killed by SIGKILL" in out["reason"]
    assert out["reason"].startswith("rank ") and gone(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("sig, reason", [(signal.SIGINT, "interrupted (Ctrl-C)"),
                                         (signal.SIGTERM, "terminated (SIGTERM)")])
def test_sigint_and_sigterm_stop_every_rank_and_store_the_run_failed(sig, reason, tmp_path):
    proc = start_launcher(tmp_path)
    run_dir = wait_until_up(tmp_path, proc)
    proc.send_signal(sig)
    out = finish(proc)
    assert out["reason"] == f"{reason}; every rank was stopped"
    row = stored_run(tmp_path)
    assert row.status == "failed" and row.reason == out["reason"] and gone(run_dir)
    assert not list(Store(tmp_path / "m.sqlite").journal_dir.glob("*"))
    assert not (run_dir / "torchelastic").exists()      # torchrun's empty log folders,
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))    # neither here nor in TMPDIR


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs, all but 8 KiB of it taken; skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        (mount / "filler").write_bytes(b"\0" * (248 * 1024))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_under_the_run_folder_fails_the_run_saying_so(tmp_path, full_disk):
    config = {**hang_config(), "options": {"selftest": {"mode": "ok"}}, "steps": 2000}
    store = Store(tmp_path / "m.sqlite")
    stored = session.run(config, 2, store, run_root=full_disk / "runs", oversubscribe=True,
                         timeout_s=120)
    assert stored.result.status == "failed" and stored.reason.startswith(
        f"the disk of {full_disk / 'runs'} is full"), stored.reason
    assert gone(stored.run_dir)
    row = store.get_run(stored.run_id).row
    assert row.status == "failed" and row.reason == stored.reason
