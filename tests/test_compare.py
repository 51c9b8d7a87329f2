"""`perfmodel compare` (perfmodel/compare/, measure/timed_wait.py's timed-wait compute mode).

What is checked and why:
- error arithmetic: error = (predicted − measured) / measured over the median of repeats,
  spread = (max − min) / median (torch.utils.benchmark and nccl-tests report medians and
  spreads of repeats), and the headline's median and max absolute errors;
- the held-out protocol: set B shares no configuration with calibration set A;
- bad input: a calibration from another host is refused in one line, a store without the
  calibration runs names the command that measures them, a failed run is left out of every
  number and listed;
- the report: report.md's table, comparisons.csv and the numbers each figure plotted agree;
- steady windows: staleness and PS throughput are read while every worker is still pushing
  (the N − 1 mean staleness of asynchronous SGD holds for the N-worker system: DESIGN.md);
- timed-wait compute: every parameter gets a gradient, backward waits unit by unit in
  reverse order (DDP buckets in reverse parameter order, torch 2.13 reducer), and oversleep
  is paid back;
- end to end (slow): a real --quick comparison on 2 CPU workers, bracketed (--bracket).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfmodel.compare import figures, report
from perfmodel.compare.matching import (
    Comparison,
    Quantity,
    counts,
    headline,
    relative_error,
    steady_staleness,
    steady_throughput,
)
from perfmodel.compare.protocol import (
    HeldOut,
    check_disjoint,
    check_host,
    held_out_set,
    model_options,
    run_config,
)
from perfmodel.errors import PerfmodelError
from perfmodel.sim.ddp import HARNESS_COMM_HOOK as HARNESS_DDP_HOOK

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "local_runs.json"
EXACT = 1e-12                   # pure arithmetic
E2E_TIMEOUT_S = 900
TORCH_MEMORY_REL = 0.15         # model vs PyTorch's tracker on a small model (mlp)


# ---------------------------------------------------------------- error arithmetic


def test_relative_error_is_predicted_minus_measured_over_measured():
    assert relative_error(110.0, 100.0) == pytest.approx(0.10, abs=EXACT)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.10, abs=EXACT)
    assert relative_error(0.0, 0.0) == 0.0              # sync PS: staleness 0 = 0
    assert relative_error(1.0, 0.0) is None             # relative error undefined
    assert relative_error(None, 1.0) is None


def test_quantity_takes_the_median_of_repeats_and_their_spread():
    q = Quantity.of(12.0, [10.0, 8.0, 11.0], interval=(9.0, 13.0))
    assert q.measured == 10.0 and (q.low, q.high) == (8.0, 11.0)
    assert q.error == pytest.approx(0.2, abs=EXACT)
    assert q.spread == pytest.approx(0.3, abs=EXACT)   # (11 − 8) / 10
    assert q.inside is True
    assert Quantity.of(12.0, [15.0, 15.0], interval=(9.0, 13.0)).inside is False
    assert Quantity.of(1.0, [None]).measured is None


def _row(key: str, pred: float, meas: list[float], mode: str = "real",
         strategy: str = "ddp") -> Comparison:
    q = Quantity.of(pred, meas)
    none = Quantity.of(None, [])
    return Comparison(
        key=key, label=key, what="test", strategy=strategy, mode=mode, workers=2,
        run_ids=(1, 2), failed=(), quantities={"throughput": q, "step_time": q,
                                               "peak_memory": none, "staleness_mean": none},
        staleness_w1=None, predicted_breakdown={"compute_s": 0.05, "comm_exposed_s": 0.01,
                                                "wait_s": 0.0},
        measured_breakdown={"compute_s": 0.05, "comm_wait_s": 0.02})


def _ssp_row(per_worker: dict, speed=(1.0, 1.0, 1.0, 0.5)) -> Comparison:
    pred = float(np.mean([p for p, _ in per_worker.values()]))
    meas = float(np.mean([m for _, m in per_worker.values()]))
    base = _row("ssp", 0.1, [0.1], "timed-wait", "ssp-ps")
    q = dict(base.quantities, staleness_mean=Quantity.of(pred, [meas]))
    return dataclasses.replace(base, quantities=q, speed=speed, workers=len(speed),
                               staleness_per_worker=per_worker)


def test_staleness_counts_each_speeds_mean_not_one_exchangeable_worker():
    # the SSP row of reports/local-2026-12-03-heldout-p2pcurve: three equal workers served in
    # a different order than the model's (worker 0 first) and one at half speed
    r = _ssp_row({0: (0.45, 0.82), 1: (1.36, 1.55), 2: (2.18, 1.91), 3: (3.2, 3.3)})
    fast = r.staleness_by_speed[1.0]
    assert fast == (pytest.approx(3.99 / 3), pytest.approx(4.28 / 3))
    assert r.staleness_by_speed[0.5] == (pytest.approx(3.2), pytest.approx(3.3))
    assert r.staleness_worst_worker[0] == 0                # -45 %: shown, not counted
    assert counts(r, "staleness_mean")[0] == pytest.approx(3.99 / 4.28 - 1)
    # a class mean can be wrong: the fast workers' staleness a third too high is counted
    wrong = _ssp_row({0: (1.1, 0.82), 1: (2.1, 1.55), 2: (2.6, 1.91), 3: (3.2, 3.3)})
    assert counts(wrong, "staleness_mean")[0] == pytest.approx(5.8 / 4.28 - 1)
    # workers of different speeds each are a class of one
    two = _ssp_row({0: (0.57, 0.64), 1: (1.6, 1.7)}, speed=(1.0, 0.5))
    assert two.staleness_worst_speed[0] == 1.0
    assert counts(two, "staleness_mean")[0] == pytest.approx(0.57 / 0.64 - 1)


def test_headline_median_and_max_of_absolute_errors():
    rows = [_row("a", 1.1, [1.0]), _row("b", 0.8, [1.0]), _row("c", 1.02, [1.0], "timed-wait")]
    h = headline(rows, "step_time")
    assert h.count == 3
    assert h.median_abs == pytest.approx(0.10, abs=1e-9)      # |+10 %|, |−20 %|, |+2 %|
    assert h.max_abs == pytest.approx(0.20, abs=1e-9) and h.worst == "b"
    assert headline(rows, "step_time", "timed-wait").count == 1


def test_a_large_error_is_attributed_to_the_part_that_differs_most():
    row = _row("big", 2.0, [1.0])       # +100 %: model comm 10 ms vs measured 20 ms
    assert "mostly communication" in row.diagnosis
    assert _row("small", 1.05, [1.0]).diagnosis == ""


# ---------------------------------------------------------------- steady windows


def test_steady_window_ends_at_the_first_workers_last_update():
    # worker 0 pushes at t = 1..4, worker 1 at t = 1.5 and 5; warm-up: step 0
    updates = [{"worker": w, "step": s, "time_s": t, "version_read": v, "version_applied": v + d}
               for w, s, t, v, d in [(0, 0, 1.0, 0, 0), (1, 0, 1.5, 0, 1), (0, 1, 2.0, 1, 1),
                                     (0, 2, 3.0, 2, 1), (0, 3, 4.0, 3, 1), (1, 1, 5.0, 1, 4)]]
    assert steady_staleness(updates, 1).tolist() == [1.0, 1.0]    # t = 2, 3 (< 4)
    # after t0 = 1.5 (last warm-up update) up to t = 4: three updates of 8 samples in 2.5 s
    assert steady_throughput(updates, 1, 8) == pytest.approx(3 * 8 / 2.5, rel=EXACT)


# ---------------------------------------------------------------- protocol


def test_held_out_set_is_disjoint_from_the_calibration_suite():
    from calibration.suite import build_suite

    for quick in (False, True):
        for suite_quick in (False, True):
            suite = build_suite("cpu", suite="local", quick=suite_quick)
            check_disjoint(held_out_set(quick), [m.config for m in suite])


def test_held_out_set_is_read_from_its_data_file():
    # the set the Python table defined before it became perfmodel/data/heldout/local.toml
    # (checked field by field against a dump of that table when it moved)
    full, quick = held_out_set(), held_out_set(quick=True)
    assert [h.key for h in quick] == ["ddp-mlp-b32", "async-ps-mlp-straggler", "ddp-mlp-tw2"]
    assert [h.key for h in full] == [
        "ddp-mlp-b32", "ddp-mlp-bucket1", "ddp-transformer-small", "ddp-mlp-straggler",
        "ddp-mlp-link", "fsdp-mlp", "sync-ps-mlp", "async-ps-mlp-straggler", "ddp-mlp-tw4",
        "ddp-mlp-tw8", "fsdp-grad-op-mlp-tw4", "sync-ps-mlp-tw4", "async-ps-mlp-tw8",
        "ssp-ps-mlp-tw4-straggler"]
    by_key = {h.key: h for h in full}
    assert by_key["ssp-ps-mlp-tw4-straggler"] == HeldOut(
        key="ssp-ps-mlp-tw4-straggler", what="SSP (bound 1), 4 workers, a straggler "
        "(timed-wait)", strategy="ssp-ps", workload="mlp", workers=4,
        speed=(1.0, 1.0, 1.0, 0.5), options={"mode": "ssp", "staleness_bound": 1},
        timed_wait=True)
    assert by_key["ddp-mlp-link"].link_rate_Gbps == 1.0
    assert by_key["ddp-mlp-b32"].batch_size == 32 and by_key["fsdp-mlp"].batch_size is None
    assert sum(h.timed_wait for h in full) == 6


def test_a_broken_held_out_file_is_one_line_naming_the_field(tmp_path):
    path = tmp_path / "heldout.toml"
    path.write_text('[[full]]\nkey = "a"\nwhat = ""\nstrategy = "ddp"\nworkload = "mlp"\n'
                    'workers = 2\nspeed = [1, -1]\n')
    with pytest.raises(PerfmodelError, match=r"field 'full\[0\]\.speed' must be a list"):
        held_out_set(path=path)
    path.write_text('[[full]]\nkey = "a"\nwhat = ""\nstrategy = "ddp"\nworkload = "mlp"\n'
                    'workers = 2\nbucket = 1\n')
    with pytest.raises(PerfmodelError, match="unknown field.*bucket"):
        held_out_set(path=path)
    with pytest.raises(PerfmodelError, match=r"no \[\[quick\]\] configurations"):
        held_out_set(quick=True, path=path)


def test_a_held_out_configuration_also_in_set_a_is_refused():
    from calibration.suite import build_suite

    suite = build_suite("cpu", suite="local")
    ddp = next(m.config for m in suite if m.config["kind"] == "ddp")
    same = HeldOut(key="dup", what="same as set A", strategy="ddp", workload=ddp["workload"],
                   workers=ddp["workers"])
    with pytest.raises(PerfmodelError, match="also in the calibration set"):
        check_disjoint((same,), [m.config for m in suite])


def test_options_and_timed_wait_config_describe_the_same_run():
    from perfmodel.cluster import load_cluster

    bucket = HeldOut(key="b", what="", strategy="ddp", workload="mlp", workers=2,
                     options={"bucket_cap_MiB": 1.0})
    # torch: a bucket cap set by hand is also the first bucket's size (measure/runs/ddp.py),
    # and the run times its buckets in a comm hook that divides them (measure/runs/ddp.py)
    assert model_options(bucket) == {"bucket_cap_MiB": 1.0, "first_bucket_MiB": 1.0,
                                     "comm_hook": "allreduce"}
    from measure.runs.ddp import HOOKS, allreduce_hook
    assert HOOKS[HARNESS_DDP_HOOK] is allreduce_hook
    tw = HeldOut(key="t", what="", strategy="fsdp", workload="mlp", workers=4,
                 options={"variant": "full-shard"}, timed_wait=True)
    config = run_config(tw, load_cluster("local"), steps=3, seed=0, repeat=1)
    wait = config["compute_wait_s"]
    assert config["compute_mode"] == "timed-wait" and len(wait["forward"]) == 5
    assert config["options"] == {"fsdp": {"variant": "full-shard"}}


def test_a_compare_ps_run_evaluates_outside_its_updates():
    """The server's evaluations would stall replies the model does not time: a compare PS
    run evaluates before its first and after its last update only."""
    from perfmodel.cluster import load_cluster

    ps = HeldOut(key="p", what="", strategy="async-ps", workload="mlp", workers=3)
    config = run_config(ps, load_cluster("local"), steps=10, seed=0, repeat=1)
    total_updates = (10 + config["warmup_steps"]) * 3
    assert config["options"]["ps"]["eval_every"] > total_updates


# ---------------------------------------------------------------- bad input


def test_a_calibration_from_another_host_is_refused_in_one_line():
    with pytest.raises(PerfmodelError) as e:
        check_host("gpu-node-7", "this-box", allow=False, what="profile.toml")
    assert "\n" not in str(e.value) and "gpu-node-7" in str(e.value)
    assert check_host("this-box", "this-box", allow=False, what="x") is None
    assert check_host("other", "this-box", allow=True, what="x").startswith("warning:")


def _measured_profile(tmp_path: Path, host: str) -> Path:
    import tomllib

    from perfmodel.tomlfile import to_toml

    data = tomllib.loads((REPO / "perfmodel" / "data" / "profiles" / "local.toml").read_text())
    data["provenance"] |= {"source": "measured", "host": host}
    data["calibration"] = {"network_rms_rel": 0.1, "compute_rms_rel": 0.1,
                           "run_spread_cv": 0.1}
    path = tmp_path / "profile.toml"
    path.write_text(to_toml(data))
    return path


def _cli(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "perfmodel", "compare", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_cli_refuses_a_profile_calibrated_on_another_host(tmp_path):
    profile = _measured_profile(tmp_path, "somewhere-else")
    done = _cli("--cluster", "local", "--quick", "--profile", str(profile), "--db",
                str(tmp_path / "db.sqlite"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "somewhere-else" in lines[0] and "not on this host" in lines[0]


def test_cli_names_the_command_that_measures_missing_calibration_runs(tmp_path):
    done = _cli("--cluster", "local", "--db", str(tmp_path / "empty.sqlite"), "--out",
                str(tmp_path / "out"))
    assert done.returncode == 2
    assert "perfmodel calibrate --cluster local" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _write_run(root: Path, name: str, *, throughput: float, wall: float,
               config: dict | None = None) -> Path:
    """A stored-run directory as the launcher leaves it: config (a 2-rank DDP mlp's unless
    given), launch info, rank records (two timed steps of `wall` seconds each)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = config or {"kind": "ddp", "workers": 2, "workload": "mlp", "batch_size": 32,
                        "steps": 2, "warmup_steps": 2, "seed": 0, "speed": [],
                        "options": {"ddp": {}}}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "launch.json").write_text(json.dumps({"host": "h", "wall_s": 1.0}))
    for rank in (0, 1):
        records = [{"type": "start", "rank": rank, "world_size": 2, "host": "h"}]
        records += [{"type": "step", "rank": rank, "step": s, "wall_s": wall,
                     "compute_s": 0.75 * wall, "comm_wait_s": 0.25 * wall, "samples": 32}
                    for s in (2, 3)]
        records.append({"type": "memory", "rank": rank, "peak_bytes": 100, "params_bytes": 40,
                        "grads_bytes": 40, "optimizer_bytes": 20, "activations_bytes": 0,
                        "other_bytes": 0, "method": "MemTracker"})
        if rank == 0:
            records.append({"type": "summary", "rank": 0,
                            "throughput_samples_per_s": throughput})
        (run_dir / f"rank{rank}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in records) + "\n")
    return run_dir


def _prediction(key: str = "k") -> dict:
    return {"key": key, "label": key, "what": "test", "strategy": "ddp", "kind": "ddp",
            "mode": "real", "workers": 2, "throughput_samples_per_s": 600.0,
            "step_time_s": 0.1, "breakdown": {"compute_s": 0.07, "comm_exposed_s": 0.03,
                                              "wait_s": 0.0},
            "step_time_interval_s": {"low": 0.08, "high": 0.12, "coverage": 0.9},
            "peak_memory_bytes": 110.0,
            "memory_parts": {"params": 40.0, "grads": 40.0, "optimizer": 20.0,
                             "activations": 0.0, "other": 10.0},
            "staleness_values": [], "staleness_mean": None}


def test_a_failed_run_is_left_out_of_every_number_and_listed(tmp_path):
    from measure.store import Store
    from perfmodel.compare.run import collect

    store = Store(tmp_path / "db.sqlite")
    good = [store.ingest(_write_run(tmp_path, f"ok{i}", throughput=t, wall=w), "ok")
            for i, (t, w) in enumerate([(500.0, 0.10), (520.0, 0.12)])]
    bad = store.ingest(_write_run(tmp_path, "bad", throughput=1.0, wall=99.0), "failed",
                       "rank 1 failed: RuntimeError: boom")
    # one failed run reported by the launcher, one stored as failed but passed as ok
    rows = collect(store, [_prediction()], {"k": [*good, bad]}, {"k": [(999, "timed out")]})
    row = rows[0]
    assert row.run_ids == tuple(good)
    assert {i for i, _ in row.failed} == {bad, 999}
    assert row.quantities["throughput"].measured == pytest.approx(510.0, rel=EXACT)
    assert row.quantities["step_time"].high == pytest.approx(0.12, rel=EXACT)
    meta = {"cluster": "local", "date": "d", "command": "perfmodel compare", "host": "h",
            "hardware": "cpu", "versions": "v", "wall_s": 60.0, "load_range": "1–2",
            "protocol": ["p"], "skipped": {}}
    report.write_markdown(tmp_path / "report.md", meta=meta, rows=rows, figures={},
                          torch_rows=[], why_missed=[])
    text = (tmp_path / "report.md").read_text()
    assert f"run {bad}: rank 1 failed: RuntimeError: boom" in text
    assert "run 999: timed out" in text


# ---------------------------------------------------------------- the report agrees


def _table(md: str) -> dict[str, list[str]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| config |"))
    rows = {}
    for ln in lines[start + 1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) < 10:
            break
        rows[cells[0]] = cells
    return rows


def _number(cell: str) -> float | None:
    m = re.match(r"^([+-]?[\d,]*\.?\d+)", cell.replace("–", "").strip())
    return float(m.group(1).replace(",", "")) if m else None


def check_report_agrees(out: Path) -> None:
    """report.md's table, comparisons.csv and the plotted numbers say the same."""
    with open(out / "comparisons.csv", newline="") as f:
        csv_rows = {r["key"]: r for r in csv.DictReader(f)}
    table = _table((out / "report.md").read_text())
    assert set(table) == set(csv_rows)
    for key, cells in table.items():
        for i, q in enumerate(report.QUANTITIES):
            _, scale, digits = report.UNITS[q]
            pred, meas, err = cells[3 + 3 * i: 6 + 3 * i]
            for cell, field in ((pred, "predicted"), (meas, "measured")):
                value = csv_rows[key][f"{q}_{field}"]
                if value == "":
                    assert cell.startswith("–"), (key, q, cell)
                else:   # the table rounds to `digits` decimals
                    assert _number(cell) == pytest.approx(float(value) * scale,
                                                          abs=0.51 * 10**-digits), (key, q)
            value = csv_rows[key][f"{q}_error"]
            if value:
                assert _number(err) == pytest.approx(100 * float(value), abs=0.051)
    doc = json.loads((out / "comparisons.json").read_text())
    for name, info in doc["figures"].items():
        assert (out / info["file"]).stat().st_size > 1000, name
        assert f"]({info['file']})" in (out / "report.md").read_text()
    by_key = {c["key"]: c for c in doc["comparisons"]}
    for q, points in doc["figures"]["scatter"]["points"].items():
        for key, measured, predicted in points:
            if " worker " in key:       # staleness per worker: (predicted, measured) in the JSON
                base, worker = key.rsplit(" worker ", 1)
                p, m = by_key[base]["staleness_per_worker"][worker]
                assert (measured, predicted) == (pytest.approx(m), pytest.approx(p))
                continue
            assert measured == pytest.approx(float(csv_rows[key][f"{q}_measured"]), rel=1e-9)
            assert predicted == pytest.approx(float(csv_rows[key][f"{q}_predicted"]), rel=1e-9)


def test_report_table_csv_and_figures_agree(tmp_path):
    rows = [_row("ddp-a", 0.11, [0.1, 0.12]), _row("ps-b", 0.2, [0.25, 0.3], "timed-wait",
                                                     "async-ps")]
    drawn = figures.draw_all(rows, tmp_path, curves={}, timeline_row=None,
                             timeline_data=None, torch_points=[])
    meta = {"cluster": "local", "date": "d", "command": "perfmodel compare", "host": "h",
            "hardware": "cpu", "versions": "v", "wall_s": 60.0, "load_range": "1–2",
            "protocol": ["p"], "skipped": {}}
    report.write_csv(rows, tmp_path / "comparisons.csv")
    report.write_json(meta, rows, drawn, [], tmp_path / "comparisons.json")
    report.write_markdown(tmp_path / "report.md", meta=meta, rows=rows, figures=drawn,
                          torch_rows=[], why_missed=[])
    check_report_agrees(tmp_path)
    assert "Targets missed" in (tmp_path / "report.md").read_text()


# ---------------------------------------------------------------- timed-wait compute


def test_timed_wait_model_waits_unit_by_unit_and_gives_every_parameter_a_gradient(
        monkeypatch):
    torch = pytest.importorskip("torch")
    from measure import data, models, settings, timed_wait

    slept: list[float] = []
    monkeypatch.setattr(timed_wait.Sleeper, "sleep", lambda self, s: slept.append(s))
    config = {"kind": "ddp", "workers": 1, "workload": "mlp", "compute_mode": "timed-wait",
              "compute_wait_s": {"forward": [1, 2, 3, 4, 5], "backward": [10, 20, 30, 40, 50],
                                 "optimizer": 7}}
    spec = settings.parse_settings(config, world_size=1).spec
    model = spec.build()
    x, y = spec.example_batch(4, torch.Generator().manual_seed(0))
    spec.loss(model(x), y).backward()
    # forward in unit order, then backward in reverse unit order
    assert slept == [1, 2, 3, 4, 5, 50, 40, 30, 20, 10]
    real = models.MODELS["mlp"].build()
    shapes = [p.shape for p in real.parameters()]
    assert [p.grad.shape for p in model.parameters()] == shapes
    assert math.isnan(data.evaluate(model, spec, x, y)[0])     # nothing computed


def test_sleeper_pays_back_oversleep(monkeypatch):
    pytest.importorskip("torch")
    from measure import timed_wait

    clock, cpu = [0.0], [0.0]
    monkeypatch.setattr(timed_wait.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(timed_wait.time, "thread_time", lambda: cpu[0])
    # every sleep overshoots by 2 ms
    monkeypatch.setattr(timed_wait.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s
                                                                             + 0.002))
    sleeper = timed_wait.Sleeper()
    for _ in range(10):
        sleeper.sleep(0.010)
    # 10 waits of 10 ms: within one overshoot of 100 ms, not 10 overshoots late
    assert clock[0] == pytest.approx(0.100, abs=0.0021)
    # 1 ms of CPU work between sleeps is paid back too; blocked (non-CPU) time is not
    start = clock[0]
    for _ in range(10):
        cpu[0] += 0.001
        clock[0] += 0.001 + 0.005           # 1 ms computing, 5 ms blocked on a peer
        sleeper.sleep(0.010)
    assert clock[0] - start == pytest.approx(0.100 + 0.050, abs=0.0041)


def test_timed_wait_config_is_checked():
    pytest.importorskip("torch")
    from measure.settings import parse_settings

    base = {"kind": "ddp", "workers": 1, "workload": "mlp", "compute_mode": "timed-wait"}
    with pytest.raises(PerfmodelError, match="compute_wait_s"):
        parse_settings(base, world_size=1)
    with pytest.raises(PerfmodelError, match="seconds"):
        parse_settings({**base, "compute_wait_s": {"forward": [-1], "backward": [1]}},
                                world_size=1)
    with pytest.raises(PerfmodelError, match="compute_mode"):
        parse_settings({**base, "compute_mode": "dreaming"}, world_size=1)
    wrong = {**base, "compute_wait_s": {"forward": [1], "backward": [1]}}
    with pytest.raises(PerfmodelError, match="units"):
        parse_settings(wrong, world_size=1).spec.build()


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_comparison_end_to_end(tmp_path, monkeypatch):
    """A real --quick comparison: set A from the recorded calibration runs of this project's
    VM (tests/fixtures/local_runs.json; another host here, hence --allow-other-host), set B
    measured now on 2 gloo workers, twice each; bracketed (--bracket), its closing set A the
    fixture loaded again (one real comparison serves both: the whole flow is the slow part).
    The command line's --predict-only writes the predictions the comparison writes first."""
    from measure.store import Store
    from perfmodel.compare import bracket, comparison
    from tests.fixtures.runs_json import load_into_store

    db = tmp_path / "db.sqlite"
    load_into_store(FIXTURE, Store(db), tmp_path / "fixture-runs")
    out = tmp_path / "report"
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    args = ["--cluster", "local", "--quick", "--allow-other-host", "--db", str(db),
            "--out", str(out), "--torch-memory", "none", "--repeats", "2"]
    first = _cli(*args, "--predict-only", env=env)
    assert first.returncode == 0, first.stderr
    predictions = json.loads((out / "predictions.json").read_text())["predictions"]
    loaded: list[int] = []

    def closing_set_a(cluster, store, here, **kw):
        assert kw.get("fresh")
        ids = load_into_store(FIXTURE, store, tmp_path / "again")
        loaded.extend(sorted(i for i in ids.values()
                             if store.get_run(i).row.config.get("calibration")))
        return list(loaded)

    monkeypatch.setattr(comparison, "calibrate_set_a", closing_set_a)
    done = comparison.compare(Store(db), "local", out=out, quick=True, repeats=2,
                              allow_other_host=True, torch_memory="none", bracketed=True,
                              command_line=" ".join(["perfmodel", "compare", *args]))
    # the same command predicts the same (seeded), before any run
    again = json.loads((out / "predictions.json").read_text())["predictions"]
    assert again == predictions
    for name in ("report.md", "comparisons.csv", "comparisons.json", "profile.toml",
                 "scatter.png", "memory.png", "timeline.png", bracket.PREDICTIONS,
                 bracket.AFTER, bracket.PROFILE):
        assert (out / name).exists(), name
    check_report_agrees(out)
    doc = json.loads((out / "comparisons.json").read_text())
    assert {c["key"] for c in doc["comparisons"]} == {h.key for h in held_out_set(True)}
    assert all(len(c["runs"].split()) + len(c["failed"]) == 2 for c in doc["comparisons"])
    text = done.report.read_text()
    assert "TIMED-WAIT" in text and "perfmodel compare --cluster local --quick" in text
    assert np.isfinite([c["step_time_error"] for c in doc["comparisons"]
                        if c["step_time_error"] is not None]).all()
    # set B round by round (no drift anchor with --quick)
    assert [r["round"] for r in doc["meta"]["by_round"]] == [1, 2]
    counted = sum((r[mode] or {}).get("rows", 0) for r in doc["meta"]["by_round"]
                  for mode in ("real", "timed-wait"))
    assert counted == sum(len(c["runs"].split()) for c in doc["comparisons"])   # every run once
    assert "Round by round" in text
    # bracketed: the rows are the bracketed predictions; the same set A measured twice
    # predicts what it predicts once; the first set A's headline stands in the report
    second = json.loads((out / bracket.PREDICTIONS).read_text())["predictions"]
    after = json.loads((out / bracket.AFTER).read_text())["predictions"]
    for p, q, r in zip(predictions, second, after, strict=True):
        assert q["step_time_s"] == pytest.approx(p["step_time_s"], rel=1e-9), p["key"]
        assert r["step_time_s"] == pytest.approx(p["step_time_s"], rel=1e-9), p["key"]
    meta = doc["meta"]["bracket"]
    assert meta["ids_after"] == loaded and not set(loaded) & set(meta["ids_before"])
    by_key = {p["key"]: p for p in second}
    for c in doc["comparisons"]:
        assert c["step_time_predicted"] == pytest.approx(by_key[c["key"]]["step_time_s"])
    assert "## Set A before and after set B" in text
    assert all(line in text for line in meta["headline_before"])


@pytest.mark.slow
def test_pytorch_memory_estimate_agrees_with_the_memory_model_on_a_small_model():
    """PyTorch's own trackers under FakeTensorMode (measure/torch_memory.py) against
    perfmodel/memory.py for mlp: DESIGN.md saw 162 vs 168 MiB (DDP) and 46 vs 47 MiB (FSDP,
    4 ranks) on a similar model; here within TORCH_MEMORY_REL of each other."""
    pytest.importorskip("torch")
    from measure.torch_memory import estimate
    from perfmodel.compare.summary import _with_model

    for strategy, ranks in (("fsdp", 4), ("ddp", 2)):
        row = _with_model(estimate("mlp", strategy, ranks))
        assert row["torch_bytes"] > 0
        assert row["model_bytes"] == pytest.approx(row["torch_bytes"], rel=TORCH_MEMORY_REL)


def test_the_report_command_line_carries_the_protocol_options():
    from perfmodel.commands.compare import _protocol_args

    assert _protocol_args(0.5, 30, False) == ""
    assert _protocol_args(0.5, 10, False) == " --settle-max-s 10"
    assert _protocol_args(0.25, 30, True) == " --settle-load 0.25 --no-pin"
