"""The command line: help everywhere, JSON keys, one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from perfmodel.cli import COMMANDS, cli


def _invoke(args, env=None):
    """Run the real entry point in a subprocess, so error handling is exactly the user's."""
    proc = subprocess.run([sys.executable, "-m", "perfmodel", *args], capture_output=True,
                          text=True, env=env)
    return proc


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help_with_an_example(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


def test_predict_json_has_the_documented_keys():
    proc = _invoke(["predict", "--strategy", "async-ps", "--workers", "4", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("throughput_samples_per_s", "step_time_s", "breakdown", "speedup_vs_1_worker",
                "memory", "staleness", "provenance"):
        assert key in out
    assert set(out["step_time_s"]) == {"mean", "p50", "p95"}
    assert set(out["breakdown"]) == {"compute_s", "comm_exposed_s", "wait_s"}
    assert {"peak_bytes", "parts", "oom"} <= set(out["memory"]["worker"])
    assert {"mean", "p50", "p95", "max", "per_worker_mean"} <= set(out["staleness"])
    assert len(out["staleness"]["per_worker_mean"]) == 4
    assert out["provenance"]["source"] == "spec"


def test_predict_table_is_readable():
    proc = _invoke(["predict", "--strategy", "ddp", "--workers", "8"])
    assert proc.returncode == 0, proc.stderr
    assert "throughput" in proc.stdout and "spec-derived" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["predict", "--strategy", "bogus", "--workers", "4"], "bogus"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--cluster", "nope"], "unknown cluster"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--workload", "nope"],
     "unknown workload"),
    (["predict", "--strategy", "ddp", "--workers", "0"], "at least 1"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--staleness-bound", "2"],
     "does not apply to ddp"),
    (["predict", "--strategy", "fsdp", "--workers", "4", "--bucket-cap-MiB", "10"],
     "applies to ddp"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--speed", "1,1"], "--speed lists 2"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--speed", "1,1,1,1",
      "--stragglers", "1"], "not both"),
    (["predict", "--strategy", "ddp", "--workers", "4", "--jitter", "none",
      "--jitter-cv", "0.1"], "lognormal only"),
    (["predict", "--strategy", "ddp", "--workers", "1", "--workload", "gpt2-xl",
      "--cluster", "a10g"], "GiB"),
    (["sweep", "--workers", "1,x"], "integers"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    proc = _invoke(args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("content", [
    "name = 'broken'\n[device\n",                     # malformed TOML
    "name = 'broken'\ndescription = 'half written'\n",  # cut off after two lines
])
def test_broken_profile_file_names_the_file(tmp_path, content):
    (tmp_path / "broken.toml").write_text(content)
    env = {**os.environ, "PERFMODEL_PROFILES": str(tmp_path)}
    proc = _invoke(["predict", "--strategy", "ddp", "--workers", "2", "--cluster", "broken"],
                   env=env)
    assert proc.returncode == 2
    assert "broken.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_predict_never_imports_torch():
    code = ("import sys; from perfmodel.cli import main; sys.argv=['perfmodel','predict',"
            "'--strategy','async-ps','--workers','16','--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "NO-TORCH" in proc.stderr, proc.stderr


def test_plain_predict_imports_no_plotting_elasticity_or_other_strategies():
    """A plain predict (no elasticity options) stays off matplotlib, perfmodel.goodput,
    sim/elastic.py, numpy.ma (np.percentile's) and the FSDP simulator (DDP's one-worker run
    is the speed-up's baseline, so it is imported); with --events
    the elasticity model is imported, so the check above is not vacuous."""
    def modules(*args):
        code = ("import sys; from perfmodel.cli import main; sys.argv=['perfmodel','predict',"
                f"'--strategy','async-ps','--workers','16',{', '.join(map(repr, args))}]\n"
                "try:\n    main()\nexcept SystemExit:\n    pass\n"
                "print('MODULES', *sorted(sys.modules), file=sys.stderr)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES ")]
        assert line, proc.stderr
        return set(line[0].split()[1:])

    plain = modules("--json")
    for name in ("matplotlib", "perfmodel.goodput", "perfmodel.sim.elastic", "numpy.ma",
                 "perfmodel.sim.fsdp", "torch"):
        assert name not in plain, name
    assert "perfmodel.sim.ps" in plain
    elastic = modules("--events", "fail:3@120,join:3@300", "--json")
    assert {"perfmodel.goodput", "perfmodel.sim.elastic"} <= elastic
    assert "matplotlib" not in elastic


def test_strategy_option_names_match_the_simulators():
    from perfmodel import strategies
    from perfmodel.commands.options import STRATEGY_OPTION_NAMES

    assert strategies.all_option_names() == STRATEGY_OPTION_NAMES


@pytest.mark.parametrize("extra", [[], ["--events", "fail:1@30,join:1@90"]],
                         ids=["plain", "elastic"])
def test_sweep_in_a_pool_writes_the_same_bytes_as_serial(tmp_path, extra):
    """--jobs 2 (a process pool, points largest first) gives the rows of --jobs 1, in the
    same order, byte for byte."""
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        proc = _invoke(["sweep", "--strategies", "ddp,sync-ps,async-ps,ssp-ps",
                        "--workers", "2,3,8", "--steps", "6", "--out", str(out),
                        "--jobs", jobs, *extra])
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    assert (outs[0] / "sweep.json").read_bytes() == (outs[1] / "sweep.json").read_bytes()
    assert (outs[0] / "sweep.csv").read_bytes() == (outs[1] / "sweep.csv").read_bytes()
    rows = json.loads((outs[1] / "sweep.json").read_text())["rows"]
    assert [(r["strategy"], r["workers"]) for r in rows][:4] == [
        ("ddp", 2), ("ddp", 3), ("ddp", 8), ("sync-ps", 2)]


def test_sweep_pool_passes_a_workers_error_on():
    from perfmodel.commands.options import build_scenario
    from perfmodel.errors import PerfmodelError
    from perfmodel.sweep import run_sweep

    kw = dict(cluster="a100", workload="resnet50", batch_size=None, steps=6, seed=0,
              speed=None, stragglers=0, straggler_speed=0.5, jitter="lognormal",
              jitter_cv=None)
    scenarios = [build_scenario(workers=n, **kw) for n in (2, 3)]
    with pytest.raises(PerfmodelError, match="does not apply to ddp"):
        run_sweep(scenarios, ["async-ps", "ddp"], {"ddp": {"servers": 2}}, jobs=2)


def test_sweep_writes_table_csv_json_and_plot(tmp_path):
    out = tmp_path / "sw"
    proc = _invoke(["sweep", "--strategies", "ddp,async-ps", "--workers", "1,4",
                    "--steps", "6", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [(r["strategy"], r["workers"]) for r in rows] == [
        ("ddp", 1), ("ddp", 4), ("async-ps", 1), ("async-ps", 4)]
    assert len((out / "sweep.csv").read_text().splitlines()) == 5
    assert (out / "sweep.png").stat().st_size > 10_000
    assert not (out / "goodput.png").exists() and rows[0]["goodput_samples_per_s"] is None


def test_sweep_with_a_failure_gives_goodput_and_throughput_over_time(tmp_path):
    out = tmp_path / "sw"
    proc = _invoke(["sweep", "--strategies", "ddp,async-ps", "--workers", "2,4",
                    "--steps", "6", "--events", "fail:1@600", "--run-hours", "1",
                    "--restart-s", "60", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = {(r["strategy"], r["workers"]): r
            for r in json.loads((out / "sweep.json").read_text())["rows"]}
    ddp, ps = rows[("ddp", 4)], rows[("async-ps", 4)]
    assert ddp["time_lost_to_restarts_s"] >= 60 and ps["time_lost_to_restarts_s"] == 0
    assert ddp["goodput_samples_per_s"] < ddp["throughput_samples_per_s"]
    assert len(ddp["series_t_s"]) == len(ddp["series_samples_per_s"]) > 10
    assert min(ddp["series_samples_per_s"]) < 0.5 * ddp["throughput_samples_per_s"]
    assert "series_t_s" not in (out / "sweep.csv").read_text().splitlines()[0]
    assert (out / "goodput.png").stat().st_size > 10_000
    assert "goodput/s" in proc.stdout


def test_sweep_refuses_events_for_a_worker_a_point_lacks(tmp_path):
    proc = _invoke(["sweep", "--workers", "2,4", "--events", "fail:3@60", "--out",
                    str(tmp_path / "sw")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_measure_ps_passes_its_learning_rate_to_the_run(monkeypatch):
    import perfmodel.commands.measure as measure

    seen = {}
    monkeypatch.setattr(measure, "execute", lambda config, nproc, **kw: seen.update(config))
    result = CliRunner().invoke(cli, ["measure", "ps", "--workers", "2", "--workload", "mlp",
                                      "--mode", "async", "--lr", "0.01"])
    assert result.exit_code == 0, result.output
    assert seen["options"]["ps"]["lr"] == 0.01
    bad = CliRunner().invoke(cli, ["measure", "ps", "--workload", "mlp", "--lr", "0"])
    assert bad.exit_code == 2


def test_sweep_refuses_an_elasticity_option_no_strategy_of_it_takes(tmp_path):
    args = ["sweep", "--workers", "2,4", "--run-hours", "2", "--checkpoint-interval-s", "100",
            "--out", str(tmp_path)]
    refused = CliRunner().invoke(cli, args + ["--strategies", "async-ps,sync-ps"])
    assert refused.exit_code == 2 and "none of async-ps, sync-ps" in refused.output
    taken = CliRunner().invoke(cli, args + ["--strategies", "ddp,async-ps", "--jobs", "1"])
    assert taken.exit_code == 0, taken.output
