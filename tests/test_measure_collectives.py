"""Collective sweeps (measure/runs/collectives.py) against nccl-tests' definitions
(doc/PERFORMANCE.md: algbw = S/t, busbw = algbw x factor), a real 2-process gloo sweep, and
the link-rate cap (measure/netem.py) holding a 2-rank all-reduce to the capped rate."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
from click.testing import CliRunner

from measure.configs import parse_size
from measure.launch import launch, live_processes
from measure.runs.collectives import OPS, PER_CALL, call_times_s, message_sizes, op_sizes
from measure.store import Store
from measure.summary import render_collectives
from perfmodel.cli import cli
from perfmodel.errors import PerfmodelError

REL_TOL = 1e-9              # busbw is computed from algbw: equal up to float rounding
# nccl-tests doc/PERFORMANCE.md, bus bandwidth factors for n ranks
NCCL_TESTS_FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n,
                     "all-gather": lambda n: (n - 1) / n,
                     "reduce-scatter": lambda n: (n - 1) / n,
                     "broadcast": lambda n: 1.0, "send-recv": lambda n: 1.0,
                     "ping-pong": lambda n: 1.0}   # OSU osu_latency: one way, S / t
CAP_GBPS_TOLERANCE = 0.15   # TCP/IP headers and tbf bursts: measured within 15 % of the cap


def test_sizes_step_by_the_factor_like_nccl_tests():
    assert message_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert message_sizes(8, 100, 4) == [8, 32]
    assert message_sizes(1024, 1024, 2) == [1024]


def test_sharded_ops_round_to_whole_elements_per_rank():
    # 4 ranks of float32: all-gather/reduce-scatter need S a multiple of 16 bytes
    assert op_sizes("all-gather", [8, 16, 32, 100], 4, 4) == [16, 32, 96]
    assert op_sizes("all-reduce", [8, 16, 30], 4, 4) == [8, 16, 28]


def test_ping_pong_time_is_the_mean_and_keeps_the_median_call():
    # three fast round trips and one with a wake-up: the median is the typical call, one way;
    # the mean is of the calls, not of the wall time, which holds the untimed gaps too
    mean, median = call_times_s([2e-4, 2e-4, 2.2e-4, 4.2e-3], wall_s=12.82e-3, iters=4, legs=2)
    assert median == 1.05e-4 and mean == pytest.approx(4.82e-3 / 4 / 2)
    # ops timed back to back (no per-call times) keep nccl-tests' mean
    assert call_times_s([], wall_s=1e-3, iters=10, legs=1) == (1e-4, 1e-4)


def test_cli_sizes_use_binary_multiples():
    assert parse_size("8") == 8
    assert parse_size("64K") == 64 * 1024 and parse_size("16M") == 16 * 2**20
    assert parse_size("1GiB") == 2**30 and parse_size("2MB") == 2 * 2**20
    with pytest.raises(PerfmodelError):
        parse_size("lots")


def test_table_has_nccl_tests_columns():
    rows = [{"op": "all-reduce", "bytes": 1024, "count": 256, "dtype": "float32",
             "time_s": 2e-5, "algbw_GBps": 0.0512, "busbw_GBps": 0.0512, "busbw_factor": 1.0}]
    text = render_collectives(rows)
    assert text.splitlines()[1].split() == ["#", "size", "count", "type", "redop", "time",
                                            "algbw", "busbw"]
    assert text.splitlines()[3].split() == ["1024", "256", "float", "sum", "20.0", "0.051",
                                            "0.051"]


def test_cli_rejects_an_unknown_collective(tmp_path):
    result = CliRunner().invoke(cli, ["measure", "collectives", "--ops", "all-to-all",
                                      "--db", str(tmp_path / "m.sqlite")])
    assert result.exit_code == 2 and "unknown collective 'all-to-all'" in result.output


def test_link_cap_needs_root(monkeypatch):
    from measure.netem import capped_link

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PerfmodelError, match="needs root"), capped_link(1.0):
        pass


@pytest.mark.slow
def test_a_two_rank_gloo_sweep_follows_nccl_tests_definitions(tmp_path):
    config = {"kind": "collectives", "workers": 2, "seed": 0, "timeout_s": 60,
              "threads_per_worker": 1, "ops": list(OPS), "min_bytes": 8,
              "max_bytes": 32 * 1024, "factor": 8, "iters": 3, "warmup_iters": 1,
              "dtype": "float32"}
    result = launch(config, 2, run_root=tmp_path / "runs")
    assert result.ok, result.reason
    store = Store(tmp_path / "m.sqlite")
    rows = store.get_run(store.ingest(result.run_dir, result.status)).table("collectives")
    sizes = [8, 64, 512, 4096, 32768]
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        assert [r["bytes"] for r in mine] == sizes, op          # every size, in order
        for r in mine:
            assert r["count"] == r["bytes"] // 4 and r["dtype"] == "float32"
            assert r["time_s"] > 0
            assert math.isclose(r["algbw_GBps"], r["bytes"] / r["time_s"] / 1e9,
                                rel_tol=REL_TOL)
            assert math.isclose(r["busbw_factor"], NCCL_TESTS_FACTOR[op](2), rel_tol=REL_TOL)
            assert math.isclose(r["busbw_GBps"], r["algbw_GBps"] * r["busbw_factor"],
                                rel_tol=REL_TOL)
            # each rank's CPU time over its wall time, averaged: a process of 1 torch
            # thread plus gloo's I/O threads cannot use more than the 2 cores
            assert 0 < r["cpu_busy_fraction"] <= (os.cpu_count() or 1)
            # ping-pong's calls are timed one by one: their median is stored beside t
            assert ("time_median_s" in r) == (op in PER_CALL)
            # ...each after the sender idled the gap, which is not in its time
            assert ("gap_s" in r) == (op in PER_CALL)
            if op in PER_CALL and r["bytes"] == sizes[0]:
                # counted, the gap alone would make the median one-way time >= gap / 2
                assert r["time_median_s"] < r["gap_s"] / 2
    assert {r["rank"] for r in rows} == {0}
    assert live_processes(result.run_dir) == []


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the link-rate cap needs root (netns, tc)")
def test_a_1_gbit_cap_holds_a_two_rank_all_reduce_to_the_cap(tmp_path):
    """Two ranks on two emulated nodes: a ring all-reduce sends S bytes each way over the
    link (2(n-1)/n = 1), so busbw = link rate = 1 Gbit/s = 0.125 GB/s (DESIGN.md saw 0.96
    Gbit/s with gloo)."""
    from measure.netem import launch_capped

    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                text=True).stdout.split())
    config = {"kind": "collectives", "workers": 2, "seed": 0, "timeout_s": 60,
              "threads_per_worker": 1, "ops": ["all-reduce"], "min_bytes": 4 * 2**20,
              "max_bytes": 16 * 2**20, "factor": 4, "iters": 3, "warmup_iters": 1,
              "dtype": "float32"}
    result = launch_capped(config, 2, 1.0, run_root=tmp_path / "runs", timeout_s=120)
    assert result.ok, result.reason
    store = Store(tmp_path / "m.sqlite")
    run = store.get_run(store.ingest(result.run_dir, result.status))
    assert run.row.link_rate_Gbps == 1.0
    # The cap is a ceiling: busbw never exceeds it (tbf enforces it exactly; seen 0.95-0.97 of
    # it on an idle host). Below it, a loaded 2-core host may not feed the link (seen 0.70),
    # so the floor only checks the data really crossed the capped link and not loopback
    # (uncapped loopback runs at ~1 GB/s, 8x the cap).
    cap_GBps = 1.0 / 8
    best = max(r["busbw_GBps"] for r in run.table("collectives"))
    for r in run.table("collectives"):
        assert r["busbw_GBps"] < (1 + CAP_GBPS_TOLERANCE) * cap_GBps, r
    assert best > 0.5 * cap_GBps
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                               text=True).stdout.split())
    assert not {ns for ns in after - before if ns.startswith("perfmodel-")}
    assert live_processes(result.run_dir) == []


@pytest.mark.slow
def test_measure_collectives_command_stores_the_run_and_prints_json(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))      # run directories go here
    db = tmp_path / "m.sqlite"
    result = CliRunner().invoke(cli, ["measure", "collectives", "--workers", "2", "--ops",
                                      "all-reduce,send-recv,ping-pong", "--max-bytes", "1K",
                                      "--factor", "4", "--iters", "2", "--db", str(db),
                                      "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["status"] == "ok" and out["kind"] == "collectives"
    assert [(c["op"], c["bytes"]) for c in out["collectives"]] == [
        (op, s) for op in ("all-reduce", "send-recv", "ping-pong") for s in (8, 32, 128, 512)]
    assert [r.id for r in Store(db).list_runs(kind="collectives")] == [out["run_id"]]
