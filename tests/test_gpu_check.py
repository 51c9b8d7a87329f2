"""`perfmodel gpu-check` (perfmodel/compare/gpu_check.py): the pieces that need no GPU.

The report is rebuilt from recorded measurements (tests/fixtures/gpu_check/, a CPU run of
the same measuring code), so its arithmetic, the calibrated profile and the held-out
protocol are checked here; the command's refusals are checked through the real entry
point. The measuring on CUDA is tests/test_gpu.py's (marked gpu, skipped without one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel.cluster import load_cluster, parse_profile
from perfmodel.compare import gpu_check as gc
from perfmodel.compare.gpu_check_report import error, summary
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml
from tests.inprocess import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_check" / "measured_cpu.json"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    return out, gc.rebuild(FIXTURE, out, "local")


def test_report_puts_both_profiles_beside_every_measured_case(rebuilt):
    out, results = rebuilt
    measured = json.loads(FIXTURE.read_text())
    text = (out / "report.md").read_text()
    assert len(results["cases"]) == len(measured) == 4
    for case, raw in zip(results["cases"], measured, strict=True):
        m = case["measured"]
        assert m["step_s"] == raw["step"]["median_s"]
        assert m["allocated_bytes"] == raw["memory"]["peak_bytes"]
        for label in ("spec", "calibrated"):
            e = error(case[label]["step_s"], m["step_s"])
            assert f"{e:+.1%}" in text
    assert "HELD OUT" in text and "in-sample" in text


def test_calibrated_prediction_is_the_calibrated_profiles_own(rebuilt):
    """The report's calibrated column is perfmodel's prediction with the written profile,
    not a number fitted to the step it is compared with."""
    out, results = rebuilt
    fit = results["fit"]
    assert 0 < fit["e_max"] <= 1 and 0 < fit["memory_efficiency"] <= 1
    case = results["cases"][0]
    spec = gc.predicted(load_cluster("local"), case["workload"], case["precision"],
                        case["blocks"], case["batch_size"])
    assert spec == case["spec"]


def test_calibrated_profile_file_loads(tmp_path):
    from calibration.gpu_check import fit_gpu, profile_text

    measured = json.loads(FIXTURE.read_text())
    fit = fit_gpu(load_cluster("local"), measured)
    path = tmp_path / f"{fit.profile.name}.toml"
    path.write_text(profile_text("local", fit, "test"))
    profile = parse_profile(load_toml(path), path)
    assert profile.provenance.source == "measured"
    assert profile.compute.memory_efficiency == pytest.approx(fit.memory_efficiency, rel=1e-3)


def test_summary_is_median_and_max_of_the_case_errors(rebuilt):
    _, results = rebuilt
    s = summary(results)
    errs = sorted(abs(c["spec"]["step_s"] / c["measured"]["step_s"] - 1)
                  for c in results["cases"])
    assert s["spec_step"]["max_abs"] == pytest.approx(errs[-1])
    assert s["spec_step"]["median_abs"] == pytest.approx((errs[1] + errs[2]) / 2)


def test_plan_cuts_a_case_that_would_not_fit():
    a100 = load_cluster("a100")
    default = gc.plan(["gpt2-xl"], ["bf16-mixed"], a100, memory_bytes=0)
    assert default[0]["blocks"] == gc.DEFAULT_BLOCKS["gpt2-xl"] and not default[0]["notes"]
    small = gc.plan(["gpt2-xl"], ["bf16-mixed"], a100, memory_bytes=4 * 2**30)
    assert small[0]["blocks"] < default[0]["blocks"] and small[0]["notes"]
    fits = gc.predicted(a100, "gpt2-xl", "bf16-mixed", small[0]["blocks"],
                        small[0]["batch_size"])
    assert fits["allocated_bytes"] <= gc.FIT_FRACTION * 4 * 2**30


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_no_gpu_is_one_line_and_exit_2(monkeypatch):
    import calibration.hardware as hardware

    monkeypatch.setattr(hardware, "_nvidia_smi", lambda: ())
    monkeypatch.setattr(hardware, "_driver_listing", lambda: ())
    code, _, err = run_cli(["gpu-check", "--out", "/nonexistent/never-written"])
    assert code == 2
    assert "needs a CUDA GPU" in _one_error_line(err)
    assert not Path("/nonexistent/never-written").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--precisions", "fp8"], "precisions"),
    (["--workloads", "nope"], "unknown workload"),
    (["--budget-s", "5"], "budget-s"),
    (["--from-measured", str(FIXTURE)], "--cluster"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, says):
    code, _, err = run_cli(["gpu-check", *args])
    assert code == 2
    assert says in _one_error_line(err)


def test_measuring_without_cuda_says_why():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from measure.gpu_check import cuda_device
    from perfmodel.errors import PerfmodelError

    with pytest.raises(PerfmodelError, match="needs a CUDA GPU"):
        cuda_device()


@pytest.mark.slow
def test_the_whole_check_runs_on_cpu(tmp_path):
    """The CUDA path's code, run on the CPU with a CPU-sized workload (minutes budget)."""
    pytest.importorskip("torch")
    results = gc.run_check(tmp_path, workloads=("mlp",), precisions=("fp32",),
                           budget_s=60, device="cpu", say=lambda _: None)
    assert (tmp_path / "report.md").is_file() and (tmp_path / "local-gpu-check.toml").is_file()
    (case,) = results["cases"]
    assert case["measured"]["step_s"] > 0 and case["measured"]["allocated_bytes"] > 0


@pytest.mark.slow
def test_a_failing_case_is_reported_and_the_others_kept(tmp_path, monkeypatch):
    """One case raising (a CUDA OOM, a missing kernel) must not lose the cases measured
    before or after it: each is saved to measured.json as it finishes, and the report
    names the failure."""
    pytest.importorskip("torch")
    from measure import gpu_check as gm

    real = gm.measure_case

    def flaky(case, *args, **kwargs):
        if case.precision == "tf32":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore text")
        return real(case, *args, **kwargs)

    monkeypatch.setattr(gm, "measure_case", flaky)
    results = gc.run_check(tmp_path, workloads=("mlp",), precisions=("tf32", "fp32"),
                           budget_s=60, device="cpu", say=lambda _: None)
    failed, kept = results["cases"]
    assert "measured" not in failed and "failed: RuntimeError: CUDA out of memory" in (
        failed["skipped"][0])
    assert kept["measured"]["step_s"] > 0
    saved = json.loads((tmp_path / "measured.json").read_text())
    assert [c["precision"] for c in saved] == ["tf32", "fp32"]
    assert "CUDA out of memory" in (tmp_path / "report.md").read_text()


def test_a_measured_base_profile_is_not_called_spec(tmp_path, monkeypatch):
    """Checking an earlier run's calibrated profile on new measurements (a held-out transfer
    check) labels it as the base profile with its provenance, never as spec-derived."""
    from calibration.gpu_check import fit_gpu, profile_text

    fit = fit_gpu(load_cluster("local"), json.loads(FIXTURE.read_text()))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "local-gpu-check.toml").write_text(profile_text("local", fit, "run 1 of a test"))
    monkeypatch.setenv("PERFMODEL_PROFILES", str(profiles))
    gc.rebuild(FIXTURE, tmp_path / "out", "local-gpu-check")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Base profile: `local-gpu-check` (run 1 of a test)" in text and "| base ms |" in text
    assert "spec" not in text.split("## Calibration")[0].lower().replace("spec-", "")


def _synthetic_cases(truth, precisions=("tf32", "bf16-mixed")):
    """Unit passes of resnet50 and a 2-block bert-large timed exactly by `truth`'s model."""
    from calibration.gpu_check import cut_workload, predicted_passes

    cases = []
    for name, batch, blocks in (("resnet50", 32, None), ("bert-large", 4, 2)):
        for precision in precisions:
            w = cut_workload(name, precision, blocks)
            passes = [{"unit": u.name, "phase": phase, "batch_size": b}
                      for b in (batch // 2, batch) for u in w.units
                      for phase in ("forward", "backward")]
            for p, s in zip(passes, predicted_passes(truth, w, passes), strict=True):
                p["median_s"] = float(s)
            cases.append({"workload": name, "precision": precision, "batch_size": batch,
                          "blocks": blocks, "unit_passes": passes})
    return cases


def test_each_precision_gets_its_own_curve_and_kernel_cost_back():
    """Passes timed by a profile whose TF32 and autocast-BF16 differ (as they did on an
    H200) give those per-precision parameters back: the model family holds the truth and
    the data are noise-free, so the only error is the profile's 4-decimal curve."""
    from calibration.gpu_check import fit_gpu, with_compute

    base = load_cluster("h200")
    truth = with_compute(base, (0.5, 9.0, 0.45, 10.0),
                         {"tf32": (0.35, 14.0), "bf16-mixed": (0.22, 24.0)})
    fit = fit_gpu(base, _synthetic_cases(truth))
    assert fit.by_precision["tf32"] == pytest.approx((0.35, 14.0), rel=0.01)
    assert fit.by_precision["bf16-mixed"] == pytest.approx((0.22, 24.0), rel=0.01)
    assert fit.memory_efficiency == pytest.approx(0.45, rel=0.01)
    assert max(abs(r) for r in fit.unit_pass_rel) < 0.01
    # and the written profile carries them: a bf16-mixed pass is the bf16-mixed fit's
    profile = fit.profile.compute
    assert profile.launch_us("bf16-mixed") == pytest.approx(24.0, rel=0.01)
    assert profile.launch_us("fp16-mixed") == profile.launch_us_per_kernel    # not measured


def test_by_precision_round_trips_through_the_profile_file(tmp_path):
    from calibration.gpu_check import fit_gpu, profile_text, with_compute

    base = load_cluster("h200")
    truth = with_compute(base, (0.5, 9.0, 0.45, 10.0),
                         {"tf32": (0.35, 14.0), "bf16-mixed": (0.22, 24.0)})
    fit = fit_gpu(base, _synthetic_cases(truth))
    path = tmp_path / f"{fit.profile.name}.toml"
    path.write_text(profile_text("h200", fit, "test"))
    loaded = parse_profile(load_toml(path), path).compute
    for p in ("tf32", "bf16-mixed", "fp32"):
        assert loaded.launch_us(p) == pytest.approx(fit.profile.compute.launch_us(p), rel=1e-3)
        assert loaded.efficiency(1e10, p) == pytest.approx(
            fit.profile.compute.efficiency(1e10, p), rel=1e-3)


def test_an_unknown_precision_in_a_profile_is_refused(tmp_path):
    text = (Path(load_cluster("h200").path).read_text()
            + '\n[compute.by_precision.int3]\nefficiency_by_flops = [[1e9, 0.5]]\n'
              'launch_us_per_kernel = 5.0\n')
    path = tmp_path / "h200.toml"
    path.write_text(text)
    with pytest.raises(PerfmodelError, match="unknown precision 'int3'"):
        parse_profile(load_toml(path), path)


REPORTS = Path(__file__).parent.parent / "reports"


@pytest.mark.parametrize("profile, median, worst", [
    ("h200-gpu-check", 0.088, 0.329),     # the frozen runs-1+2 profile (the check)
    ("h200", 0.184, 0.510),               # the spec profile beside it
])
def test_h200_held_out_figures_are_the_ones_published(tmp_path, monkeypatch, profile, median,
                                                      worst):
    """README and docs/gpu-check.md quote run 3's held-out step errors; rebuilt from the
    recorded measurements with the frozen profile they must still be those figures (a
    model change that moves them must re-state them)."""
    monkeypatch.setenv("PERFMODEL_PROFILES", str(REPORTS / "gpu-check-2026-12-04-fitset"))
    results = gc.rebuild(REPORTS / "gpu-check-2026-12-04-heldout3" / "measured.json",
                         tmp_path, profile)
    s = summary(results)["spec_step"]
    assert s["cases"] == 8
    assert s["median_abs"] == pytest.approx(median, abs=0.0005)
    assert s["max_abs"] == pytest.approx(worst, abs=0.0005)


def test_deadlines_share_the_budget_by_predicted_step_time():
    due = gc.deadlines(100.0, 90.0, [0.2, 0.6, 0.2])
    assert due == pytest.approx([118.0, 172.0, 190.0])     # 18 + 54 + 18 s of 90
    assert gc.deadlines(0.0, 60.0, [1.0, 1.0, 1.0]) == pytest.approx([20.0, 40.0, 60.0])


def test_plan_gives_fp32_more_of_the_budget_than_bf16():
    """On an H200 fp32 has a fifteenth of BF16's peak: its case must get the larger share
    (run 3 of 2026-12-04 shared equally and the fp32 case ran out before its steps)."""
    cases = gc.plan(("gpt2-xl",), ("fp32", "bf16-mixed"), load_cluster("h200"), 0.0, 16, 8)
    fp32, bf16 = (c["step_s"] for c in cases)
    due = gc.deadlines(0.0, 90.0, [fp32, bf16])
    assert fp32 > 2 * bf16 and due[0] > 60.0


def test_profile_precision_names_are_the_workload_precisions():
    from perfmodel.cluster import PRECISION_NAMES
    from perfmodel.workload import PRECISIONS

    assert set(PRECISION_NAMES) == set(PRECISIONS)
