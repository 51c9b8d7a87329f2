"""The launcher (measure/launch.py) and `perfmodel measure`: torchrun command lines, the
capacity check, failure reasons, and real 2-process gloo jobs that crash, get killed, hang
or are interrupted — each stored as failed with its reason and leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from measure.launch import (
    Job,
    check_capacity,
    failure_reason,
    launch,
    live_processes,
    torchrun_command,
)
from measure.store import Store
from perfmodel.cli import cli
from perfmodel.errors import PerfmodelError
from tests.inprocess import as_in_a_terminal

REPO = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("collectives", "compute", "ddp", "fsdp", "ps")


def selftest_config(mode: str, *, timeout_s: float = 60, steps: int = 3) -> dict:
    return {"kind": "selftest", "workers": 2, "steps": steps, "seed": 0, "timeout_s": timeout_s,
            "threads_per_worker": 1, "options": {"selftest": {"mode": mode}}}


def no_process_left(run_dir: Path) -> bool:
    """Neither /proc nor pgrep finds a process whose command line names the run directory."""
    pgrep = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    return live_processes(run_dir) == [] and pgrep.stdout.strip() == ""


# ------------------------------------------------------------------ fast: no processes


def test_local_runs_are_standalone_and_multinode_flags_pass_through(tmp_path):
    local = torchrun_command(tmp_path, 4)
    assert local[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert local[-3:] == ["-m", "measure.worker", str(tmp_path)]
    assert local[local.index("--nproc-per-node") + 1] == "4"
    multi = torchrun_command(tmp_path, 8, ["--nnodes", "2", "--node-rank", "1",
                                           "--rdzv-endpoint", "node0:29400"])
    assert "--standalone" not in multi
    assert multi[multi.index("--rdzv-endpoint") + 1] == "node0:29400"


def test_more_compute_processes_than_cores_is_refused_unless_asked(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    config = {"kind": "ddp", "threads_per_worker": 1}
    assert check_capacity(config, 2, oversubscribe=False) is False
    with pytest.raises(PerfmodelError, match="--oversubscribe") as err:
        check_capacity(config, 3, oversubscribe=False)
    assert "\n" not in str(err.value)
    assert check_capacity(config, 3, oversubscribe=True) is True
    # a PS server (rank 0) waits on messages: 2 workers + 1 server fit 2 cores
    assert check_capacity({"kind": "ps"}, 3, oversubscribe=False) is False
    with pytest.raises(PerfmodelError):
        check_capacity({"kind": "ddp", "threads_per_worker": 2}, 2, oversubscribe=False)


def test_launch_refuses_before_starting_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    with pytest.raises(PerfmodelError, match="CPU cores"):
        launch(selftest_config("ok"), 2, run_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


TORCHRUN_TAIL = """
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 6797)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_12:35:34
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 6798)  (SIGKILL)
  error_file: <N/A>
"""


def test_reason_prefers_the_cause_over_its_consequences(tmp_path):
    """Rank 1 was SIGKILLed; rank 0 then lost its peer and recorded a gloo error: the reason
    names rank 1's signal (torchrun's root cause), not rank 0's consequence."""
    (tmp_path / "torchrun.log").write_text(TORCHRUN_TAIL)
    (tmp_path / "rank0.jsonl").write_text(
        json.dumps({"type": "start", "rank": 0}) + "\n"
        + json.dumps({"type": "error", "rank": 0, "message": "RuntimeError: [pair.cc:537] "
                      "Read error [127.0.0.1]:7572: Connection reset by peer."}) + "\n")
    (tmp_path / "rank1.jsonl").write_text(json.dumps({"type": "start", "rank": 1}) + "\n")
    job = Job(command=[], env={})
    assert failure_reason(tmp_path, [job], [1]) == "rank 1 was killed by SIGKILL"
    # a rank that raised on its own is the cause, whatever torchrun saw first
    with open(tmp_path / "rank1.jsonl", "a") as f:
        f.write(json.dumps({"type": "error", "rank": 1, "message": "ValueError: bad"}) + "\n")
    assert failure_reason(tmp_path, [job], [1]) == "rank 1 failed: ValueError: bad"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_measure_subcommand_has_help_with_an_example(name):
    result = CliRunner().invoke(cli, ["measure", name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output and f"perfmodel measure {name}" in result.output


@pytest.mark.parametrize("name", ["compute", "ddp", "fsdp", "ps"])
def test_unknown_workload_is_one_line_listing_the_valid_ones(name, tmp_path):
    result = CliRunner().invoke(cli, ["measure", name, "--workload", "nope",
                                      "--db", str(tmp_path / "m.sqlite")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "unknown workload 'nope'" in lines[0]
    assert "mlp" in lines[0]
    assert not (tmp_path / "m.sqlite").exists()


def test_measure_module_does_not_import_torch():
    code = ("import sys, perfmodel.commands.measure, perfmodel.commands.runs, measure.launch, "
            "measure.store, measure.netem; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------ slow: real torchrun jobs


def launch_and_store(tmp_path, config, **kwargs):
    result = launch(config, 2, run_root=tmp_path / "runs", **kwargs)
    store = Store(tmp_path / "m.sqlite")
    run = store.get_run(store.ingest(result.run_dir, result.status, result.reason))
    return result, run


@pytest.mark.slow
def test_a_good_run_is_stored_ok_with_progress(tmp_path):
    seen = []
    result, run = launch_and_store(tmp_path, selftest_config("ok"), progress=seen.append)
    assert result.ok and run.row.status == "ok", result.reason
    assert len(run.table("steps")) == 2 * 3 and seen[-1] == 3
    assert {r["state"] for r in run.table("ranks")} == {"done"}
    assert no_process_left(result.run_dir)


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_run_with_its_message(tmp_path):
    result, run = launch_and_store(tmp_path, selftest_config("crash"))
    assert run.row.status == "failed"
    assert run.row.reason == "rank 1 failed: RuntimeError: selftest crash on rank 1"
    assert no_process_left(result.run_dir)


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_leaves_no_process(tmp_path):
    result, run = launch_and_store(tmp_path, selftest_config("kill"))
    assert run.row.status == "failed"
    assert run.row.reason == "rank 1 was killed by SIGKILL"
    assert {r["rank"]: r["state"] for r in run.table("ranks")}[1] == "lost"
    assert len(run.table("steps")) >= 2             # what was measured before is kept
    assert no_process_left(result.run_dir)


@pytest.mark.slow
def test_a_hung_run_is_stopped_at_the_time_limit(tmp_path):
    result, run = launch_and_store(tmp_path, selftest_config("hang", timeout_s=600),
                                   timeout_s=12)
    assert run.row.status == "failed" and run.row.reason.startswith("timed out after 12 s")
    assert no_process_left(result.run_dir)


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_and_the_run_is_stored_failed(tmp_path):
    """SIGINT to the launcher only (the ranks run in their own sessions, as they do when a
    user presses Ctrl-C in a terminal): it stops them all and reports 'interrupted'."""
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from measure.launch import launch
        config = {json.dumps(selftest_config("hang", timeout_s=600))}
        r = launch(config, 2, run_root=__import__("pathlib").Path({str(tmp_path)!r}))
        print(json.dumps({{"run_dir": str(r.run_dir), "status": r.status,
                          "reason": r.reason, "interrupted": r.interrupted}}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:            # wait until both ranks have started
        files = list(tmp_path.glob("*/rank*.jsonl"))
        if len(files) == 2 and all(f.stat().st_size for f in files):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out)
    assert result["interrupted"] and result["status"] == "failed"
    assert result["reason"].startswith("interrupted")
    assert no_process_left(Path(result["run_dir"]))


def test_oversubscription_is_recorded_in_the_run_config(tmp_path, monkeypatch):
    import measure.launch as launch_module

    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    seen = {}

    def fake_supervise(run_dir, jobs, **kwargs):
        seen.update(config=json.loads((run_dir / "config.json").read_text()), jobs=jobs,
                    kwargs=kwargs)
    monkeypatch.setattr(launch_module, "supervise", fake_supervise)
    launch(selftest_config("ok"), 2, run_root=tmp_path, oversubscribe=True)
    assert seen["config"]["oversubscribed"] is True and seen["kwargs"]["oversubscribed"]
    env = seen["jobs"][0].env
    assert env["OMP_NUM_THREADS"] == "1" and env["GLOO_SOCKET_IFNAME"] == "lo"


def test_a_hung_peer_is_reported_through_the_timeout_it_caused(tmp_path):
    """Rank 1 hangs; rank 0's receive times out (process-group timeout), torchrun then
    SIGTERMs rank 1: the reason is rank 0's timeout, not rank 1's silence."""
    (tmp_path / "torchrun.log").write_text(
        "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 2)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 1)\n")
    (tmp_path / "rank0.jsonl").write_text(
        json.dumps({"type": "start", "rank": 0}) + "\n"
        + json.dumps({"type": "error", "rank": 0, "message": "RuntimeError: [unbound_buffer"
                      ".cc:78] Timed out waiting 5000ms for recv operation to complete"}) + "\n")
    (tmp_path / "rank1.jsonl").write_text(json.dumps({"type": "start", "rank": 1}) + "\n")
    reason = failure_reason(tmp_path, [Job(command=[], env={})], [1])
    assert reason.startswith("rank 0 failed: RuntimeError") and "Timed out waiting" in reason
