"""The CUDA path of the measurement layer: NCCL collectives and CUDA memory statistics.

Runs only where CUDA devices are present (tests/conftest.py skips it elsewhere, saying why).
"""

from __future__ import annotations

import pytest

from measure.launch import launch
from measure.store import Store

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _run(tmp_path, config: dict, nproc: int):
    result = launch(config, nproc, run_root=tmp_path / "runs")
    store = Store(tmp_path / "m.sqlite")
    run_id = store.ingest(result.run_dir, result.status, result.reason)
    return result, store.get_run(run_id)


def test_collectives_use_nccl_and_report_busbw(tmp_path):
    n = _gpus()
    config = {"kind": "collectives", "workers": n, "workload": "", "seed": 0,
              "timeout_s": 120, "ops": ["all-reduce"], "min_bytes": 1 << 20,
              "max_bytes": 1 << 24, "factor": 4, "iters": 5, "warmup_iters": 2,
              "dtype": "float32"}
    result, run = _run(tmp_path, config, n)
    assert result.ok, result.reason
    assert run.row.backend == "nccl"
    rows = run.table("collectives")
    assert rows and all(r["algbw_GBps"] > 0 for r in rows)
    # busbw = algbw x 2(n-1)/n (nccl-tests): 0 on one GPU, the traffic between GPUs.
    assert all((r["busbw_GBps"] > 0) == (n > 1) for r in rows)


def test_ddp_memory_comes_from_cuda_allocator_statistics(tmp_path):
    n = min(_gpus(), 2)
    config = {"kind": "ddp", "workers": n, "workload": "mlp", "batch_size": 64, "steps": 5,
              "warmup_steps": 2, "seed": 0, "speed": [], "options": {"ddp": {}},
              "timeout_s": 120, "threads_per_worker": 1}
    result, run = _run(tmp_path, config, n)
    assert result.ok, result.reason
    memory = run.table("memory")
    assert memory and all(m["method"] == "cuda.max_memory_allocated" for m in memory)
    assert all(m["peak_bytes"] > 0 for m in memory)


def test_gpu_check_measures_calibrates_and_reports(tmp_path):
    """`perfmodel gpu-check`'s path on a real GPU, one workload at both default precisions
    in two minutes: every case measured, the allocator's reserve at least what it handed
    out, a calibrated profile and a report. Accuracy is the report's to say, not a bound
    here (no independent bound on a GPU we have not seen)."""
    from perfmodel.compare.gpu_check import run_check

    results = run_check(tmp_path, workloads=("resnet50",), budget_s=120, batch=32,
                        say=lambda _: None)
    assert len(results["cases"]) == 2
    for case in results["cases"]:
        m = case["measured"]
        assert m["memory_method"] == "cuda.max_memory_allocated"
        assert m["reserved_bytes"] >= m["allocated_bytes"] > 0 and m["step_s"] > 0
    assert (tmp_path / "report.md").is_file()
    assert any(p.suffix == ".toml" for p in tmp_path.iterdir())
