"""`perfmodel calibrate`, the profile it writes, and predictions made from real measurements.

Most tests read tests/fixtures/local_runs.json, real runs recorded on a 2-core CPU host (see
tests/fixtures/README.md), through the real measurement store, so they launch no torch job.
The held-out checks calibrate on part of those runs and predict the rest (issue 4): the
α–β collective model (Thakur, Rabenseifner & Gropp 2005) for larger messages, the roofline
compute model (perfmodel/sim/compute.py) for a larger batch, and the DDP simulation for runs
the calibration never saw. Their bounds come from the recorded spread (README).
One slow test runs the real `perfmodel calibrate --cluster local --quick` end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from calibration import hardware
from calibration.fit_compute import fit_compute
from calibration.fit_network import fit_link
from calibration.from_store import (
    calibrate_runs,
    collective_samples,
    fit_from_runs,
    unit_timings,
)
from calibration.hardware import Gpu, Hardware, choose_base
from calibration.profile_writer import write_profile
from calibration.suite import CROWDED_DDP_REPEATS, CROWDED_PS_REPEATS, build_suite, reusable_run
from measure.store import Store
from perfmodel.cluster import Link, load_cluster, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.collectives import collective_s
from perfmodel.sim.compute import pass_seconds
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import load_workload
from tests.fixtures.runs_json import load_into_store

FIXTURE = Path(__file__).parent / "fixtures" / "local_runs.json"
TRAIN_MAX_BYTES = 2**20          # held-out network: fit on <= 1 MiB, predict 2 to 16 MiB
# Bounds of the held-out checks on the median |relative error| over the held-out points,
# derived from the recorded spread in tests/fixtures/README.md: about 1.6x the noise of a
# 3-repeat median (network), 2x the noise of a median of 8 blocks (compute: σ ≈ 20 % per
# block, so 2 x 1.25 x 0.20 / √8 ≈ 18 %); DDP: under the profile's own 1σ, from the profile.
NETWORK_HELD_OUT_TOL = 0.35
COMPUTE_HELD_OUT_TOL = 2 * 1.25 * 0.20 / 8**0.5
INTERVAL_COVERAGE = 0.9


def _invoke(args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "perfmodel", *args], capture_output=True,
                          text=True, env=env)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(store, {kind/role: [run ids]}) of the recorded fixture in a fresh store."""
    root = tmp_path_factory.mktemp("recorded")
    store = Store(root / "store.sqlite")
    load_into_store(FIXTURE, store, root / "runs")
    roles: dict[str, list[int]] = defaultdict(list)
    for row in store.list_runs():
        role = "suite" if row.config.get("calibration") else "extra"
        roles[role].append(row.id)
        roles[f"{role}:{row.kind}"].append(row.id)
    return store, dict(roles)


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    monkeypatch.setenv("PERFMODEL_PROFILES", str(folder))
    return folder


def _runs(store, ids):
    return [store.get_run(i) for i in ids]


# ---------------------------------------------------------------- honesty about hardware

CPU_HOST = Hardware(host="box", cpu="AMD EPYC", cores=2, gpus=())
H100_HOST = Hardware(host="box", cpu="Xeon", cores=32,
                     gpus=(Gpu(name="NVIDIA H100 80GB HBM3", memory_GiB=79.6),))
A10G_HOST = Hardware(host="box", cpu="AMD EPYC", cores=48,
                     gpus=tuple(Gpu(name="NVIDIA A10G", memory_GiB=22.5) for _ in range(4)))


def test_gpu_profiles_are_refused_without_their_gpu():
    with pytest.raises(PerfmodelError, match=r"no CUDA device.*perfmodel calibrate --cluster "
                                             r"a100.*shipped spec-derived"):
        choose_base("a100", CPU_HOST)
    with pytest.raises(PerfmodelError, match="found 1x NVIDIA H100 80GB HBM3, not the NVIDIA "
                                             "A10G"):
        choose_base("a10g", H100_HOST)
    assert choose_base("a10g", A10G_HOST).base == "a10g"


def test_local_and_new_names_build_on_what_is_found():
    assert choose_base("local", CPU_HOST).base == "local"
    assert choose_base("mybox", CPU_HOST).base == "local"
    assert choose_base("mybox", A10G_HOST).base == "a10g"
    # an H100 builds on the shipped h100 profile (issue 12 added it)
    assert choose_base("h100box", H100_HOST).base == "h100"


@pytest.mark.skipif(bool(hardware.detect().gpus), reason="this machine has GPUs")
def test_cli_refuses_a100_on_this_machine_in_one_line(tmp_path):
    proc = _invoke(["calibrate", "--cluster", "a100", "--db", str(tmp_path / "s.sqlite")])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "found no CUDA device" in lines[0] and "--cluster a100" in lines[0]
    assert not (tmp_path / "s.sqlite").exists()          # refused before measuring anything


# ---------------------------------------------------------------- the suite and resuming


def _write_run(store: Store, root: Path, config: dict, records: list[dict], *,
               started_at: str, host: str = "box", status: str = "ok") -> int:
    """Ingest a hand-made run: config.json, launch.json and rank0's records."""
    run_dir = root / f"run{len(store.list_runs()):03d}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "launch.json").write_text(json.dumps({"started_at": started_at}))
    start = {"type": "start", "rank": 0, "backend": "gloo", "device": "cpu", "host": host,
             "world_size": config.get("workers", 1), "torch_version": "2.13.0+cpu"}
    lines = [start, *({"rank": 0, **r} for r in records), {"type": "done", "rank": 0}]
    (run_dir / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return store.ingest(run_dir, status, "" if status == "ok" else "boom")


def test_stored_runs_are_reused_only_when_they_match(tmp_path):
    # what makes calibrate resumable: each measurement maps to a recent successful run of
    # the same config on this host, and nothing else stands for it
    import datetime as dt

    store = Store(tmp_path / "s.sqlite")
    suite = build_suite("cpu", suite="local")
    now = dt.datetime(2025, 3, 1, 12, tzinfo=dt.UTC)
    fresh = (now - dt.timedelta(hours=1)).isoformat()
    stale = (now - dt.timedelta(days=3)).isoformat()
    first, second = suite[0], suite[1]
    good = _write_run(store, tmp_path, first.config, [], started_at=fresh)
    _write_run(store, tmp_path, second.config, [], started_at=stale)              # too old
    _write_run(store, tmp_path, second.config, [], started_at=fresh, host="other")
    _write_run(store, tmp_path, second.config, [], started_at=fresh, status="failed")
    _write_run(store, tmp_path, {**second.config, "seed": 1}, [], started_at=fresh)
    rows = store.list_runs()
    assert reusable_run(rows, first, host="box", torch_version="2.13.0+cpu", now=now) == good
    assert reusable_run(rows, second, host="box", torch_version="2.13.0+cpu", now=now) is None
    assert reusable_run(rows, first, host="box", torch_version="2.14.0", now=now) is None
    # repeats of one configuration are distinct measurements
    ddp = [m for m in suite if m.config["kind"] == "ddp"]
    assert len({json.dumps(m.config, sort_keys=True) for m in ddp}) == len(ddp)


def test_quick_suite_is_smaller_and_every_suite_names_its_runs():
    full, quick = build_suite("cpu", suite="local"), build_suite("cpu", suite="local",
                                                                 quick=True)
    assert sum(m.progress_total for m in quick) < sum(m.progress_total for m in full)
    assert {m.config["kind"] for m in full} == {"collectives", "compute", "ddp", "ps", "fsdp"}
    assert {m.config["kind"] for m in quick} == {"collectives", "compute", "ddp", "ps"}
    # FSDP's copies (compute.copy_GBps): on the workload whose parameters weigh most
    # against its FLOPs, twice, a variant set B does not run at 2 workers
    fsdp = [m for m in full if m.config["kind"] == "fsdp"]
    assert [(m.config["workload"], m.config["workers"], m.config["options"]["fsdp"]["variant"])
            for m in fsdp] == [("mlp", 2, "grad-op")] * 2
    assert build_suite("cuda", suite="x") and not any(
        m.config["kind"] == "fsdp" for m in build_suite("cuda", suite="x"))
    # compute under core sharing: 1, 2 and 3 processes at once, interleaved, oversubscribing
    # for each compute workload (their working sets differ: compute.by_workload); --quick
    # times the first workload only
    def concurrent(suite):
        return [m for m in suite
                if (m.config.get("options") or {}).get("compute", {}).get("concurrent")]

    cores = concurrent(full)
    assert [m.nproc for m in cores] == [1, 2, 3] * 6 + [1] * 3      # + the late 1-process round
    assert [m.config["workload"] for m in cores[:9]] == [
        w for w in ("cnn-small", "mlp", "transformer-small") for _ in range(3)]
    assert all(m.oversubscribe and m.optional for m in cores)
    assert {m.config["workload"] for m in concurrent(quick)} == {"cnn-small"}
    crowded = [m for m in full if m.key.startswith("collectives-shared")]
    launches = [m for m in full if m.config["kind"] == "collectives" and m not in crowded]
    assert [m.optional for m in launches] == [False, True, True]
    # sweeps with twice and four times as many ranks as cores (core sharing at two crowding
    # levels), ring collectives only, right after each 2-rank launch (one sweep's fit varied
    # 0.08-0.29 between calibrations; one u did not hold from 4 to 8 ranks)
    assert len(crowded) == 2 * len(launches) == 6
    assert [m.nproc for m in crowded] == [4, 8] * 3
    for shared in crowded:
        assert shared.oversubscribe and shared.optional
        assert shared.config["ops"] == ["all-reduce", "all-gather", "reduce-scatter"]
        before = full[full.index(shared) - (1 if shared.nproc == 4 else 2)]
        assert before in launches
        assert before.config["calibration"]["repeat"] == shared.config["calibration"]["repeat"]
    assert [m.nproc for m in quick if m.key.startswith("collectives-shared")] == [4]
    assert not any(m.key.startswith("collectives-shared")
                   for m in build_suite("cuda", suite="x", ranks=8))
    from calibration.suite import comparable as same
    older = json.loads(json.dumps(launches[0].config))
    older["ops"] = older["ops"] * 3          # a store's one launch of three sweeps
    assert same(older) == same(launches[0].config)
    # two workloads' PS servers (server.update needs two gradient sizes), twice each in the
    # full suite; only the first is required, so older stores still calibrate
    servers = [m for m in full if m.config["kind"] == "ps" and "compute_mode" not in m.config]
    assert [m.config["workload"] for m in servers] == ["cnn-small"] * 2 + ["mlp"] * 2
    # the crowded timed-wait PS runs (compute.timed_wait_spread_ms and
    # server.crowded_message_factor), full suite on a CPU host: 5 workers of equal speed and
    # a server on 2 cores, asynchronous (no held-out config), CROWDED_PS_REPEATS alike
    ps_waits = [m for m in full if m.config.get("compute_mode") == "timed-wait"
                and m.config["kind"] == "ps"]
    assert len(ps_waits) == CROWDED_PS_REPEATS == 3
    assert [m.config["calibration"]["repeat"] for m in ps_waits] == [1, 2, 3]
    timed = ps_waits[0]
    def unmarked(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "calibration"}
    assert all(unmarked(m.config) == unmarked(timed.config) for m in ps_waits)
    # and the crowded DDP timed waits (compute.ddp_cpu_work_factor, tests/test_ddp_cpu_work.py)
    ddp_waits = [m for m in full if m.key.startswith("ddp-crowded-")]
    assert [m.config.get("compute_mode") for m in ddp_waits] == ["timed-wait"] * \
        CROWDED_DDP_REPEATS
    assert timed.config["kind"] == "ps" and timed.config["workers"] == 5 and timed.nproc == 6
    assert timed.config["options"]["ps"]["mode"] == "async" and timed.config["speed"] == []
    assert timed.oversubscribe and timed.optional and timed.config["workload"] == "mlp"
    waits = timed.config["compute_wait_s"]
    assert len(waits["forward"]) == len(waits["backward"]) == len(load_workload("mlp").units)
    assert all(x > 0 for x in waits["forward"] + waits["backward"])
    assert not any(m.config.get("compute_mode") for m in quick)
    assert not any(m.config.get("compute_mode") for m in build_suite("cuda", suite="x"))
    assert [m.optional for m in servers] == [False, True, True, True]
    assert [m.config["workload"] for m in quick if m.config["kind"] == "ps"] == [
        "cnn-small", "mlp"]
    assert all(m.optional for m in fsdp)        # stores from before still calibrate
    assert not any(m.optional for m in full
                   if m not in cores + launches + crowded + servers + fsdp + ps_waits + ddp_waits)
    assert not any(m.oversubscribe for m in full
                   if m not in cores + crowded + ps_waits + ddp_waits)
    assert all(m.oversubscribe and m.optional for m in ps_waits)
    # the PS round-trip check: no server evaluation inside any timed round trip
    for suite in (full, quick):
        for ps in [m for m in suite if m.config["kind"] == "ps"]:
            updates = ps.config["steps"] + ps.config["warmup_steps"]
            assert ps.config["options"]["ps"]["eval_every"] > updates
    # a PS run stored before that change still stands for the measurement
    from calibration.suite import comparable
    older = json.loads(json.dumps(ps.config))
    del older["options"]["ps"]["eval_every"]
    assert comparable(older) == comparable(ps.config)
    assert all(m.config["calibration"]["suite"] == "local" for m in full)
    # the network in 3 launches of one sweep, spread over the suite (not one machine state)
    where = [i for i, m in enumerate(full) if m in launches]
    assert len(where) == 3 and where[0] == 0
    assert all(b - a > 1 for a, b in zip(where, where[1:], strict=False))
    assert all(m.config["ops"] == ["all-reduce", "all-gather", "reduce-scatter", "ping-pong"]
               for m in launches)
    # a launch stored before ping-pong joined the sweep stands for one (no p2p fit then)
    older = json.loads(json.dumps(launches[0].config))
    older["ops"] = ["all-reduce", "all-gather", "reduce-scatter"]
    assert same(older) == same(launches[0].config)
    assert len({json.dumps(m.config, sort_keys=True) for m in launches}) == 3
    assert [m.config["kind"] for m in quick].count("collectives") == 2     # 2 ranks, 4 ranks
    with pytest.raises(PerfmodelError, match="unknown workload 'nope'"):
        build_suite("cpu", suite="local", workloads=("nope",))


# ---------------------------------------------------------------- bad input


def test_too_few_points_say_what_is_missing_and_how_to_measure_it(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    rows = [{"type": "collective", "op": "all-reduce", "bytes": b, "time_s": t}
            for b, t in ((1024, 1e-3), (2048, 1.1e-3))]
    run = _write_run(store, tmp_path, {"kind": "collectives", "workers": 2}, rows,
                     started_at="2025-03-01T12:00:00+00:00")
    with pytest.raises(PerfmodelError, match=r"intra_node: need collective timings .* found 2 "
                                             r".*perfmodel measure collectives"):
        fit_from_runs(store, [run], name="x")
    empty = _write_run(store, tmp_path, {"kind": "selftest", "workers": 1}, [],
                       started_at="2025-03-01T12:00:00+00:00")
    with pytest.raises(PerfmodelError, match="nothing to calibrate from"):
        fit_from_runs(store, [empty], name="x")


def test_non_physical_fits_are_errors(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    # times that fall as messages grow: the fit would need a negative bandwidth
    rows = [{"type": "collective", "op": "all-reduce", "bytes": b, "time_s": 1.0 / b}
            for b in (1e3, 1e4, 1e5, 1e6)]
    run = _write_run(store, tmp_path, {"kind": "collectives", "workers": 2}, rows,
                     started_at="2025-03-01T12:00:00+00:00")
    with pytest.raises(PerfmodelError, match=r"intra_node.bandwidth_GBps: .*non-positive"):
        fit_from_runs(store, [run], name="x")


def test_ddp_faster_than_its_own_compute_is_refused(recorded, tmp_path):
    # overlap slowdown s from compute_s ≈ rest + s·backward: steps far faster than the
    # compute profile's forward + optimizer alone need s < 0
    store, roles = recorded
    compute = roles["suite:compute"]
    ddp = store.get_run(roles["suite:ddp"][0])
    steps = [{"type": "step", "step": i, "wall_s": 1e-5, "compute_s": 1e-6, "comm_wait_s": 0.0,
              "loss": 1.0, "samples": 1} for i in range(5)]
    fast = _write_run(store, tmp_path, ddp.row.config, steps,
                      started_at="2025-03-01T12:00:00+00:00")
    with pytest.raises(PerfmodelError, match=r"compute.overlap_slowdown: the fit gives"):
        fit_from_runs(store, [*compute, fast], name="x")


# ---------------------------------------------------------------- the profile it writes


def test_profile_from_recorded_runs_is_used_by_predict_with_an_interval(recorded, profiles):
    store, roles = recorded
    data = fit_from_runs(store, roles["suite"], name="recorded", base="local")
    written = write_profile(data)
    assert written.path == profiles / "recorded.toml" and written.backup is None
    raw = tomllib.loads(written.path.read_text())
    prov = raw["provenance"]
    assert prov["source"] == "measured" and prov["runs"] == len(roles["suite"])
    assert "torch 2.13" in prov["versions"] and prov["host"] and prov["devices"]
    cal = raw["calibration"]
    assert {"network_rms_rel", "compute_rms_rel", "run_spread_cv"} <= set(cal)
    for field in ("intra_node.latency_us", "intra_node.bandwidth_GBps",
                  "compute.overhead_us_per_unit", "compute.overlap_slowdown",
                  "server.apply_GBps", "device.memory_overhead_fraction"):
        assert field in cal["residuals"], field
    assert raw["intra_node"]["bandwidth_GBps"] > 0 and raw["server"]["apply_GBps"] > 0

    proc = _invoke(["predict", "--cluster", "recorded", "--strategy", "ddp", "--workers", "2",
                    "--workload", "mlp", "--json"], {"PERFMODEL_PROFILES": str(profiles)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    iv, mean = out["step_time_interval_s"], out["step_time_s"]["mean"]
    assert out["provenance"]["source"] == "measured"
    assert iv["low"] < mean < iv["high"] and iv["coverage"] == INTERVAL_COVERAGE
    assert "recorded.toml" in iv["source"] and out["step_time_interval_reason"] is None
    text = _invoke(["predict", "--cluster", "recorded", "--strategy", "ddp", "--workers", "2",
                    "--workload", "mlp"], {"PERFMODEL_PROFILES": str(profiles)})
    assert "90% interval" in text.stdout


def test_spec_profiles_say_plainly_there_is_no_interval():
    proc = _invoke(["predict", "--cluster", "a10g", "--strategy", "ddp", "--workers", "8",
                    "--workload", "resnet50", "--json"])
    out = json.loads(proc.stdout)
    assert out["step_time_interval_s"] is None
    assert "spec-derived" in out["step_time_interval_reason"]


def test_recalibrating_backs_up_the_previous_profile(recorded, profiles):
    store, roles = recorded
    data = fit_from_runs(store, roles["suite"], name="twice")
    write_profile(data)
    first = (profiles / "twice.toml").read_bytes()
    again = write_profile({**data, "description": "second"})
    assert again.backup is not None and again.backup.read_bytes() == first
    assert load_cluster("twice").description == "second"


@pytest.mark.parametrize("edit, field", [
    (("\nbandwidth_GBps = ", "\nbandwidth_GBps = -2.0 #"), "intra_node.bandwidth_GBps"),
    (("run_spread_cv = ", 'run_spread_cv = "lots" #'), "calibration.run_spread_cv"),
    (('source = "measured"', 'source = "guessed"'), "provenance.source"),
])
def test_profile_edited_into_nonsense_is_one_line_naming_file_and_field(recorded, profiles,
                                                                        edit, field):
    store, roles = recorded
    path = write_profile(fit_from_runs(store, roles["suite"], name="edited")).path
    old, new = edit
    path.write_text(path.read_text().replace(old, new, 1))
    proc = _invoke(["predict", "--cluster", "edited", "--strategy", "ddp", "--workers", "2",
                    "--workload", "mlp"], {"PERFMODEL_PROFILES": str(profiles)})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and f"'{field}'" in lines[0]


# ---------------------------------------------------------------- held out (README bounds)


def _median_abs(errors) -> float:
    return float(np.median(np.abs(errors)))


def test_held_out_network_larger_messages(recorded):
    # fit the α–β link on the 2-rank all-reduce sweeps up to 1 MiB, predict 2 to 16 MiB
    # (DDP's buckets: 1 MiB first, then up to 25 MiB). all-gather and reduce-scatter are left
    # out: gloo on CPU slows down per byte beyond 4 MiB, which no flat-beyond-the-ends
    # efficiency curve extrapolates (README: they come out 50-80 % too fast)
    store, roles = recorded
    samples = [s for s in collective_samples(_runs(store, roles["suite:collectives"]))
               if s.op == "all-reduce"]
    fit = fit_link([s for s in samples if s.bytes <= TRAIN_MAX_BYTES])
    cluster = dataclasses.replace(load_cluster("local"), intra_node=Link(
        bandwidth_GBps=fit.bandwidth_GBps.value, latency_us=fit.latency_us.value,
        efficiency_by_bytes=fit.efficiency_by_bytes))
    measured = defaultdict(list)
    for s in samples:
        if s.bytes > TRAIN_MAX_BYTES:
            measured[s.bytes].append(s.time_s)
    errors = [collective_s("all-reduce", cluster, 2, n) / np.median(t) - 1
              for n, t in measured.items()]
    assert len(errors) == 4
    assert _median_abs(errors) <= NETWORK_HELD_OUT_TOL, errors


@pytest.mark.xfail(strict=True, reason=(
    "the model misses the larger batches by -41 % (cnn-small) and -39 % (mlp), against 18 % "
    "of timing noise. Core sharing (issue 14, now modelled: perfmodel/sim/cores.py) cannot "
    "explain it: these are timings of one process alone, where the sharing factor is 1; "
    "cache effects growing with the batch, or other work on the host while they were "
    "recorded, are not modelled; strict, so a fix shows up as XPASS. Keeping the FLOP "
    "efficiency curve (the network's bias test, calibration/fit.py) passed it at -7/-18/+9 %, "
    "but as a 0.09-0.92 zigzag over FLOP bins of different layers that left the held-out "
    "DDP runs no better (-42/-47/-14 % against -29/-56/-40 %): not adopted"))
def test_held_out_compute_larger_batch(recorded):
    # fit overhead and efficiency on a quarter and half of each workload's batch, predict
    # its forward + backward passes at the whole batch (the batch training runs use)
    store, roles = recorded
    timings, flops, _ = unit_timings(_runs(store, roles["suite:compute"]))
    full = {u: load_workload(u.split("/")[0]).batch_size for u in flops}
    train = [t for t in timings if t.batch_size < full[t.unit]]
    test = [t for t in timings if t.batch_size == full[t.unit]]
    fit = fit_compute(train, flops, peak_TFLOPS=0.08)
    base = load_cluster("local")
    cluster = dataclasses.replace(base, compute=dataclasses.replace(
        base.compute, efficiency_by_flops=fit.efficiency_by_flops,
        overhead_us_per_unit=fit.overhead_us_per_unit.value))
    per_workload = defaultdict(lambda: [0.0, 0.0])
    for t in test:
        ratio = 2.0 if t.phase == "backward" else 1.0
        pair = per_workload[t.unit.split("/")[0]]
        pair[0] += pass_seconds(cluster, flops[t.unit] * t.batch_size * ratio, "fp32")
        pair[1] += t.median_s
    errors = [p / m - 1 for p, m in per_workload.values()]
    assert len(errors) == 3
    assert _median_abs(errors) <= COMPUTE_HELD_OUT_TOL, errors


def _held_out_ddp(recorded):
    """The whole model: calibrate on the suite, simulate the extra DDP runs (another batch
    size, another workload); per run the mean step's error against the measured median
    step, its log, the profile's own σ and whether the 90 % interval holds it."""
    store, roles = recorded
    path = write_profile(calibrate_runs(store, roles["suite"]).profile("heldout")).path
    cluster = parse_profile(tomllib.loads(path.read_text()), path)
    errors, log_errors, sigmas, inside = [], [], [], 0
    for run in _runs(store, roles["extra:ddp"]):
        row = run.row
        scenario = Scenario(cluster=cluster, workload=load_workload(row.workload),
                            workers=row.workers, batch_size=row.batch_size, steps=20)
        measured = float(np.median([s["wall_s"] for s in run.table("steps")]))
        p = predict("ddp", scenario)
        errors.append(p.summary.step_time_s.mean / measured - 1)
        log_errors.append(math.log(p.summary.step_time_s.mean / measured))
        sigmas.append(p.interval.sigma_rel)
        inside += p.interval.low_s <= measured <= p.interval.high_s
    assert len(errors) == 3
    return errors, log_errors, sigmas, inside


def test_held_out_ddp_runs_the_calibration_never_saw_inside_the_90_interval(recorded,
                                                                           profiles):
    # the 90 % interval should hold each run: >= 2 of 3 happens with probability 0.97 if the
    # stated coverage is right (binomial), so failing this says the interval is too narrow
    errors, _, _, inside = _held_out_ddp(recorded)
    assert inside >= 2, errors


@pytest.mark.xfail(strict=True, reason=(
    "within the profile's own 1σ (log scale; set A's step residual and run spread, an "
    "estimate no held-out run enters: tests/fixtures/README.md) until session 42: the "
    "overlap slowdown over the all-reduce seconds beside backward (perfmodel/sim/ddp.py "
    "overlap_share) fits set A's DDP runs better, so σ fell 0.55 -> 0.36, while the three "
    "held-out errors, all smaller, -19/-56/-42 -> -18/-54/-33 %, leave a median |log| of "
    "0.39: this busy-host fixture's compute misses the larger batches by ~40 % "
    "(test_held_out_compute_larger_batch), which no in-sample residual holds; strict, so a "
    "fix shows up as XPASS"))
def test_held_out_ddp_runs_the_calibration_never_saw_within_its_own_sigma(recorded, profiles):
    errors, log_errors, sigmas, _ = _held_out_ddp(recorded)
    assert _median_abs(log_errors) <= float(np.median(sigmas)), (errors, sigmas)


# ---------------------------------------------------------------- end to end (real runs)


@pytest.mark.slow
def test_calibrate_local_end_to_end_then_resume(tmp_path):
    env = {"PERFMODEL_PROFILES": str(tmp_path / "profiles"),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    db = str(tmp_path / "store.sqlite")
    first = _invoke(["calibrate", "--cluster", "local", "--quick", "--db", db, "--json"], env)
    assert first.returncode == 0, first.stderr[-2000:]
    out = json.loads(first.stdout)
    assert out["runs"]["measured"] and not out["runs"]["reused"]
    assert Path(out["profile"]) == tmp_path / "profiles" / "local.toml"
    assert "intra_node.bandwidth_GBps" in out["residuals"]
    # everything is stored now: a second calibration measures nothing and backs up the first
    again = _invoke(["calibrate", "--cluster", "local", "--quick", "--db", db, "--json"], env)
    assert again.returncode == 0, again.stderr[-2000:]
    out2 = json.loads(again.stdout)
    assert out2["runs"]["measured"] == [] and out2["backup"]
    pred = _invoke(["predict", "--cluster", "local", "--strategy", "ddp", "--workers", "2",
                    "--workload", "mlp", "--json"], env)
    assert pred.returncode == 0, pred.stderr
    assert json.loads(pred.stdout)["provenance"]["source"] == "measured"
