"""`perfmodel calibrate --from-profiler`: profiler traces fit the compute roofline terms.

tests/fixtures/profiler/mlp_cpu.pt.trace.json.gz is a real torch.profiler trace of the `mlp`
workload's module training 10 steps on this shared 2-core CPU (record_trace.py beside it).
The synthetic trace below is timed from known terms, so the fit must give them back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from calibration.from_profiler import attribute, fit_traces, load_events, op_class
from perfmodel.cli import cli
from perfmodel.cluster import load_cluster
from perfmodel.workload import load_workload

TRACE = Path(__file__).parent / "fixtures" / "profiler" / "mlp_cpu.pt.trace.json.gz"


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_PROFILES", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def test_the_real_trace_is_attributed_to_every_unit_phase_and_step():
    w = load_workload("mlp")
    trace = attribute(load_events(TRACE), TRACE, [u.name for u in w.units])
    assert trace.steps == 10 and trace.device == "CPU"
    assert {(p.unit, p.phase) for p in trace.passes} == {
        (u.name, ph) for u in w.units for ph in ("forward", "backward")}
    assert len(trace.passes) == 10 * 2 * len(w.units)
    big = [p for p in trace.passes if p.unit in ("hidden1", "hidden2", "hidden3")]
    assert all(p.matmul_s > p.memory_s for p in big)        # 1024x1024 GEMMs dominate


def test_op_classes_follow_the_workload_files():
    assert op_class("aten::linear") == op_class("AddmmBackward0") == "matmul"
    assert op_class("ConvolutionBackward0") == op_class("aten::mm") == "matmul"
    assert op_class("aten::relu") == op_class("ReluBackward0") == "memory"


def test_calibrate_from_a_real_trace_writes_the_compute_terms(profiles):
    result = CliRunner().invoke(cli, ["calibrate", "--cluster", "cpuprof", "--workload", "mlp",
                                      "--from-profiler", str(TRACE), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    profile = load_cluster("cpuprof")
    assert out["base"] == "local" and profile.provenance.source == "measured"
    assert 0 < profile.compute.efficiency(1e8) <= 1
    assert profile.compute.launch_us_per_kernel > 0 and profile.compute.memory_efficiency > 0
    assert str(TRACE.resolve()) in (profiles / "cpuprof.toml").read_text()
    assert out["unit_pass_reproduction"]["points"] == 10
    predicted = CliRunner().invoke(cli, ["predict", "--cluster", "cpuprof", "--workload",
                                         "mlp", "--strategy", "ddp", "--workers", "2"])
    assert predicted.exit_code == 0, predicted.output


def synthetic_trace(w, batch, launch_us, rate, memory_GBps, steps=3):
    """nn.Module calls and ops timed by the roofline with known terms (one thread)."""
    events, ts, seq = [], 0.0, 0
    for _ in range(steps):
        root = {"ph": "X", "cat": "python_function", "name": "nn.Module: Sequential_0",
                "tid": 1, "ts": ts, "dur": 0.0}
        events.append(root)
        backward = []
        for i, u in enumerate(w.units):
            parts = [("aten::linear", u.forward_kernels * launch_us
                      + 1e6 * u.forward_flops_per_sample * batch / rate),
                     ("aten::relu", 1e6 * u.forward_bytes_per_sample * batch / memory_GBps / 1e9)]
            start = ts
            for name, dur in parts:
                events.append({"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": ts,
                               "dur": dur, "args": {"Sequence number": seq}})
                back = "AddmmBackward0" if name == "aten::linear" else "ReluBackward0"
                scale = 2 * dur if name == "aten::relu" else (
                    2 * u.forward_kernels * launch_us
                    + 2e6 * u.forward_flops_per_sample * batch / rate)
                backward.append((back, scale, seq))
                seq, ts = seq + 1, ts + dur
            events.append({"ph": "X", "cat": "python_function", "name": f"nn.Module: U_{i}",
                           "tid": 1, "ts": start, "dur": ts - start})
        root["dur"] = ts - root["ts"]
        for name, dur, s in reversed(backward):
            events.append({"ph": "X", "cat": "cpu_op", "tid": 1, "ts": ts, "dur": dur,
                           "name": f"autograd::engine::evaluate_function: {name}",
                           "args": {"Sequence number": s}})
            ts += dur
    return {"traceEvents": events}


def test_a_trace_timed_from_known_terms_gives_them_back(tmp_path):
    w, batch, peak = load_workload("mlp"), 64, load_cluster("local").device.peak_TFLOPS["fp32"]
    rate = 0.5 * peak * 1e12
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(synthetic_trace(w, batch, launch_us=20.0, rate=rate,
                                               memory_GBps=5.0)))
    data, _ = fit_traces([path], name="syn", workload=w, batch=batch)
    c = data["compute"]
    assert c["launch_us_per_kernel"] == pytest.approx(20.0, rel=0.02)
    assert c["memory_efficiency"] == pytest.approx(0.5, rel=0.02)    # 5 of local's 10 GB/s
    assert all(e == pytest.approx(0.5, rel=0.02) for _, e in c["efficiency_by_flops"])
    assert data["calibration"]["unit_pass_reproduction"]["max_rel"] < 0.02


@pytest.mark.parametrize(("args", "says"), [
    (["--from-profiler", str(TRACE)], "--workload"),
    (["--workload", "transformer-small", "--from-profiler", str(TRACE)], "units"),
    (["--workload", "mlp", "--from-profiler", __file__], "not a profiler trace"),
])
def test_bad_traces_are_one_line_and_exit_2(profiles, args, says):
    result = CliRunner().invoke(cli, ["calibrate", "--cluster", "x", *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert result.output.strip().count("\n") == 0


def test_on_a_gpu_kernel_time_is_charged_to_the_op_that_launched_it():
    w = load_workload("mlp")
    units = [u.name for u in w.units]
    cpu = synthetic_trace(w, 64, launch_us=20.0, rate=1e11, memory_GBps=5.0)
    gpu = {"deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "traceEvents": []}
    for i, e in enumerate(cpu["traceEvents"]):
        if e["cat"] == "cpu_op":
            e = {**e, "args": {**e["args"], "External id": i}}
            gpu["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "tid": 7,
                                       "ts": e["ts"], "dur": e["dur"],
                                       "args": {"External id": i}})
        gpu["traceEvents"].append(e)
    expected = attribute(cpu, Path("cpu.json"), units)
    got = attribute(gpu, Path("gpu.json"), units)
    assert got.device == "NVIDIA H100 80GB HBM3"
    assert [(p.unit, p.phase, p.step) for p in got.passes] == \
        [(p.unit, p.phase, p.step) for p in expected.passes]
    for a, b in zip(got.passes, expected.passes, strict=True):
        assert a.matmul_s == pytest.approx(b.matmul_s) and a.memory_s == pytest.approx(b.memory_s)
