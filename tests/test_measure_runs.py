"""Real training runs (measure/runs, measure/training.py with its settings, data and timing
modules, measure/memtrack.py).

The slow tests launch real torchrun jobs of 2-3 gloo processes on CPU, a few seconds each.
What they check and where it comes from:
- DDP keeps replicas bit-identical: every rank all-reduces the same averaged gradient and
  applies the same optimizer step (Li et al., "PyTorch Distributed", VLDB 2020, sec. 3).
- FSDP's shards reassemble to the parameters of a single process that trains on the union
  of the ranks' batches: the mean of per-rank mean gradients (equal batches) is the mean
  gradient of the union (Zhao et al., "PyTorch FSDP", VLDB 2023: FSDP is data parallel).
- Synchronous PS: every gradient is applied to the version it was computed on, τ = 0.
- Asynchronous PS with N equal workers: mean τ ≈ N − 1 (DESIGN.md, "Parameter server").
- Memory with fp32 Adam: 4Ψ params + 4Ψ grads + 8Ψ moments + activations (ZeRO,
  Rajbhandari et al. 2020, sec. 3.1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from measure.context import RunContext  # noqa: E402
from measure.data import DataSource  # noqa: E402
from measure.memtrack import measure_memory, saved_activation_bytes  # noqa: E402
from measure.models import MODELS  # noqa: E402
from measure.recorder import Recorder, read_records  # noqa: E402
from measure.runs import compute  # noqa: E402
from measure.runs.ddp import bucket_arguments  # noqa: E402
from measure.runs.ps import parse_options  # noqa: E402
from measure.settings import parse_settings  # noqa: E402
from measure.timing import median_iqr  # noqa: E402
from measure.training import build_model, make_optimizer  # noqa: E402
from perfmodel.errors import PerfmodelError  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
JOB_TIMEOUT_S = 240
MLP_PARAMS = 3_225_610          # measure/models.py build_mlp: 64-1024-1024-1024-1024-10

FSDP_ATOL = 1e-5                # float32 sums in another order (reduce-scatter vs one batch)
FSDP_RTOL = 1e-4
SLOWDOWN_MIN_RATIO = 1.3        # speed 0.25 makes compute 4x; contention on 2 cores blurs it
# (at speed 0.5 one CI run saw 1.14x: the fast rank's compute is stretched by the same
# contention, so the signal needs room above the noise)
ASYNC_STALENESS_TOL = 0.2       # |mean τ − (N − 1)| while all N workers are pushing
MEMORY_REL_TOL = 0.10           # issue 3: measured vs params + grads + optimizer + activations
CORES_SLACK = 0.05              # /proc/stat counts whole jiffies (10 ms): a short window rounds


def job(tmp_path: Path, nproc: int, **config) -> list[dict]:
    """Run one real torchrun job of `nproc` gloo processes; return every rank's records."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = {"workers": nproc, "seed": 3, "speed": [], "options": {}, "timeout_s": 60,
            "threads_per_worker": 1}
    (run_dir / "config.json").write_text(json.dumps({**base, **config}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc), "-m", "measure.worker", str(run_dir)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    records = read_records(run_dir)
    errors = [r["message"] for r in records if r["type"] == "error"]
    assert done.returncode == 0, f"job failed: {errors or done.stderr[-2000:]}"
    return records


def of(records: list[dict], type_: str, rank: int | None = None) -> list[dict]:
    return [r for r in records if r["type"] == type_ and (rank is None or r["rank"] == rank)]


# ---------------------------------------------------------------- real multi-process jobs


@pytest.mark.slow
def test_ddp_replicas_stay_identical_and_a_slowed_rank_computes_longer(tmp_path):
    records = job(tmp_path, 2, kind="ddp", workload="mlp", batch_size=16, steps=6,
                  warmup_steps=1, speed=[1.0, 0.25])
    s0, s1 = of(records, "summary", 0)[0], of(records, "summary", 1)[0]
    assert s0["param_hash"] == s1["param_hash"]             # bit-identical replicas
    assert s0["param_checksum"] == s1["param_checksum"]
    for rank in (0, 1):
        steps = of(records, "step", rank)
        assert [r["step"] for r in steps] == list(range(1, 7))
        for r in steps:
            assert r["comm_wait_s"] >= 0 and r["compute_s"] > 0
            assert r["compute_s"] + r["comm_wait_s"] == pytest.approx(r["wall_s"])
    # speed 0.25 sleeps compute_s·(1/0.25 − 1) = 3·compute_s more after each step's compute
    fast = np.median([r["compute_s"] for r in of(records, "step", 0)])
    slow = np.median([r["compute_s"] for r in of(records, "step", 1)])
    assert slow > SLOWDOWN_MIN_RATIO * fast
    memory = of(records, "memory", 0)[0]
    assert memory["method"] == "MemTracker"
    assert memory["params_bytes"] == 4 * MLP_PARAMS           # fp32 parameters, all of them
    assert s0["bucket_count"] >= 1 and s0["first_bucket_MiB"] == 1.0   # torch's default
    for s in (s0, s1):      # measure/cpu_meter.py over the timed steps: real CPU work done
        assert s["cpu_s"] > 0 and s["cpu_window_s"] > 0
        assert 0 <= s["host_busy_cores"] <= os.cpu_count() + CORES_SLACK


@pytest.mark.slow
def test_fsdp_shards_reassemble_to_single_process_training(tmp_path):
    records = job(tmp_path, 2, kind="fsdp", workload="mlp", batch_size=8, steps=3,
                  warmup_steps=1, options={"fsdp": {"variant": "full-shard",
                                                    "save_params": True}})
    summary = of(records, "summary", 0)[0]
    fsdp_params = torch.load(tmp_path / "run" / "params.pt")
    assert of(records, "summary", 1)[0]["param_hash"] == summary["param_hash"]
    assert of(records, "memory", 0)[0]["method"] == "FSDPMemTracker"

    spec = MODELS["mlp"]
    model = build_model(spec, 3, "cpu")
    optimizer = make_optimizer(spec, model.parameters())
    sources = [DataSource(spec, 8, 3, rank, "cpu") for rank in (0, 1)]
    for _ in range(summary["optimizer_steps"]):
        batches = [s.next_batch() for s in sources]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        spec.loss(model(x), y).backward()
        optimizer.step()
    reference = dict(model.named_parameters())
    assert fsdp_params.keys() == reference.keys()
    for name, tensor in fsdp_params.items():
        torch.testing.assert_close(tensor, reference[name].detach(), atol=FSDP_ATOL,
                                   rtol=FSDP_RTOL)


@pytest.mark.slow
def test_sync_ps_has_zero_staleness_and_learns_digits(tmp_path):
    records = job(tmp_path, 3, kind="ps", workers=2, workload="mlp", batch_size=16, steps=8,
                  warmup_steps=1, options={"ps": {"mode": "sync", "eval_every": 3}})
    updates = of(records, "update", 0)
    assert len(updates) == 2 * 9                              # one per gradient
    assert all(u["version_applied"] == u["version_read"] for u in updates)
    evals = of(records, "eval", 0)
    assert [e["step"] for e in evals] == [0, 3, 6, 9]
    assert all(e["data"] == "digits-test-359" for e in evals)
    assert evals[-1]["loss"] < evals[0]["loss"]                # real learning on real data
    assert of(records, "summary", 0)[0]["mean_staleness"] == 0.0
    assert len(of(records, "step", 1)) == len(of(records, "step", 2)) == 8


@pytest.mark.slow
def test_async_ps_staleness_is_about_n_minus_one(tmp_path):
    workers, steps = 2, 20
    records = job(tmp_path, 3, kind="ps", workers=workers, workload="mlp", batch_size=8,
                  steps=steps, warmup_steps=2,
                  options={"ps": {"mode": "async", "lr": 0.01, "eval_every": 1000}})
    updates = of(records, "update", 0)
    assert len(updates) == workers * (steps + 2)
    taus = [u["version_applied"] - u["version_read"] for u in updates]
    assert min(taus) >= 0 and max(taus) > 0
    # Steady state: after the warm-up, while every worker is still pushing (the run's end,
    # when one worker has finished, is a different system with fewer workers).
    last = {u["worker"]: i for i, u in enumerate(updates)}
    end = min(last.values())
    steady = [t for u, t in zip(updates[:end], taus[:end], strict=True) if u["step"] >= 2]
    assert abs(np.mean(steady) - (workers - 1)) <= ASYNC_STALENESS_TOL
    for u in updates:       # the server's own clock around each update (record_update)
        assert u["recv_s"] >= 0 and u["apply_s"] > 0 and u["pack_s"] > 0 and u["reply_s"] >= 0
    for rank in (0, 1, 2):  # the server and each worker meter their own timed part
        s = of(records, "summary", rank)[0]
        assert s["cpu_s"] > 0 and s["cpu_window_s"] > 0


# ---------------------------------------------------------------- in-process checks


def test_memory_of_adam_matches_model_state_plus_activations():
    torch.manual_seed(0)
    width, batch = 256, 256
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))

    def step():
        # Gradients kept between steps (set_to_none=False), as ZeRO's 4Ψ + 4Ψ + 8Ψ assumes.
        optimizer.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    step()                                                    # creates Adam's moments
    psi = sum(p.numel() for p in model.parameters())
    activations = saved_activation_bytes(step)                # what autograd saved
    memory = measure_memory(model, optimizer, step, device="cpu", steps=2)
    assert memory["method"] == "MemTracker"
    assert memory["params_bytes"] == 4 * psi
    assert memory["optimizer_bytes"] == 8 * psi + 4 * len(list(model.parameters()))  # + steps
    expected = 4 * psi + 4 * psi + 8 * psi + activations
    assert memory["peak_bytes"] == pytest.approx(expected, rel=MEMORY_REL_TOL)
    parts = ("params", "grads", "optimizer", "activations", "other")
    assert sum(memory[f"{p}_bytes"] for p in parts) == memory["peak_bytes"]


def test_compute_profile_times_every_unit_and_both_passes(tmp_path):
    config = {"kind": "compute", "workload": "mlp", "seed": 0,
              "options": {"compute": {"batch_sizes": [2, 4], "repeats": 3, "warmup": 1,
                                      "min_block_s": 0.0}}}
    recorder = Recorder(tmp_path, 0)
    compute.run(RunContext(rank=0, world_size=1, local_rank=0, backend="gloo", device="cpu",
                           run_dir=tmp_path, recorder=recorder, config=config))
    recorder.close()
    records = read_records(tmp_path)
    units = [name for name, _ in build_model(MODELS["mlp"], 0, "cpu").named_children()]
    seen = {(r["unit"], r["batch_size"], r["pass"]) for r in of(records, "compute")}
    assert seen == {(u, b, p) for u in units for b in (2, 4) for p in ("forward", "backward")}
    for r in of(records, "compute"):
        assert r["median_s"] > 0 and r["iqr_s"] >= 0 and r["repeats"] == 3
        assert r["warning"] is None or "IQR/median" in r["warning"]
    assert of(records, "summary")[0]["throughput_samples_per_s"] > 0


def test_ddp_bucket_options_follow_torch_semantics():
    # torch 2.13 _BucketCapacityConfig: default cap 25 MiB with a 1 MiB first bucket; a set
    # cap also sizes the first bucket; a separate first bucket needs bucket_cap_mb_list.
    assert bucket_arguments({}) == ({}, 25.0, 1.0)
    assert bucket_arguments({"bucket_cap_MiB": 5}) == ({"bucket_cap_mb": 5.0}, 5.0, 5.0)
    assert bucket_arguments({"bucket_cap_MiB": 5, "first_bucket_MiB": 0.5}) == (
        {"bucket_cap_mb_list": [0.5, 5.0]}, 5.0, 0.5)
    with pytest.raises(PerfmodelError):
        bucket_arguments({"bucket_cap_MiB": -1})


def test_bad_settings_are_explained():
    with pytest.raises(PerfmodelError, match="one relative speed per worker"):
        parse_settings({"kind": "ddp", "workload": "mlp", "speed": [1.0]}, 2)
    with pytest.raises(PerfmodelError, match="needs 3 processes"):
        parse_settings({"kind": "ps", "workload": "mlp", "workers": 2}, 2)
    with pytest.raises(PerfmodelError, match="unknown workload"):
        parse_settings({"kind": "ddp", "workload": "nope"}, 2)
    with pytest.raises(PerfmodelError, match="ps mode"):
        parse_options({"mode": "eventually"})


def test_data_sources_differ_by_rank_and_repeat_by_seed():
    spec = MODELS["mlp"]
    a, b = DataSource(spec, 8, 1, 0, "cpu").next_batch(), DataSource(spec, 8, 1, 1, "cpu")
    again = DataSource(spec, 8, 1, 0, "cpu").next_batch()
    assert torch.equal(a[0], again[0]) and not torch.equal(a[0], b.next_batch()[0])


def test_median_iqr_matches_numpy_quartiles():
    assert median_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0)
