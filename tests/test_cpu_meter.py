"""measure/cpu_meter.py and how a comparison reads it (perfmodel/compare/matching.py
`cpu_use`) and reports it (summary.cpu_lines, the noise table)."""

from __future__ import annotations

import dataclasses

import pytest

from measure import cpu_meter
from perfmodel.compare import report, summary
from perfmodel.compare.matching import Comparison, Quantity, cpu_use, thread_cores

EXACT = 1e-12
STAT = """cpu  100 10 50 800 40 5 5 0 0 0
cpu0 50 5 25 400 20 3 2 0 0 0
cpu1 50 5 25 400 20 2 3 0 0 0
intr 12345
"""


def _stat(tmp_path, text: str):
    path = tmp_path / "stat"
    path.write_text(text)
    return path


def test_host_jiffies_reads_the_aggregate_line_and_counts_cpus(tmp_path):
    busy, total, cpus = cpu_meter.host_jiffies(_stat(tmp_path, STAT))
    assert busy == 100 + 10 + 50 + 5 + 5 + 0       # user nice system irq softirq steal
    assert total == busy + 800 + 40                 # + idle iowait
    assert cpus == 2


@pytest.mark.parametrize("text", ["", "cpu  1 2\n", "intr 1\n", "cpu  a b c d e f g h\n"])
def test_an_unreadable_or_short_stat_gives_no_host_numbers(tmp_path, text):
    assert cpu_meter.host_jiffies(_stat(tmp_path, text)) is None
    assert cpu_meter.host_jiffies(tmp_path / "missing") is None


def test_usage_is_the_busy_share_of_the_window_times_the_cpus():
    start = cpu_meter.CpuMark(wall_s=10.0, process_s=1.0, thread_s=0.5, host=(100, 1000, 2))
    end = cpu_meter.CpuMark(wall_s=12.0, process_s=2.5, thread_s=1.1, host=(250, 1200, 2))
    u = cpu_meter.usage(start, end)
    assert u["cpu_s"] == pytest.approx(1.5, rel=EXACT)
    assert u["thread_cpu_s"] == pytest.approx(0.6, rel=EXACT)
    assert u["cpu_window_s"] == pytest.approx(2.0, rel=EXACT)
    assert u["host_busy_cores"] == pytest.approx(150 / 200 * 2, rel=EXACT)
    no_host = cpu_meter.usage(start, cpu_meter.CpuMark(wall_s=12.0, process_s=2.5,
                                                       thread_s=1.1, host=None))
    assert "host_busy_cores" not in no_host


def test_a_run_uses_the_sum_of_its_ranks_rates_and_the_median_host():
    rows = [{"rank": r, "key": k, "value": v} for r, k, v in [
        (0, "cpu_s", 0.6), (0, "cpu_window_s", 1.0), (0, "host_busy_cores", 1.9),
        (1, "cpu_s", 1.6), (1, "cpu_window_s", 2.0), (1, "host_busy_cores", 1.7),
        (2, "cpu_s", 0.5), (2, "cpu_window_s", 0.0), (2, "host_busy_cores", 1.8),
        (0, "throughput_samples_per_s", 5.0)]]
    own, host = cpu_use(rows)
    assert own == pytest.approx(0.6 + 0.8, rel=EXACT)     # rank 2's empty window left out
    assert host == pytest.approx(1.8, rel=EXACT)
    assert cpu_use([{"rank": 0, "key": "elapsed_s", "value": 1.0}]) == (None, None)


def test_the_training_threads_part_is_the_sum_of_their_rates():
    rows = [{"rank": r, "key": k, "value": v} for r, k, v in [
        (0, "cpu_s", 0.6), (0, "thread_cpu_s", 0.2), (0, "cpu_window_s", 1.0),
        (1, "cpu_s", 1.6), (1, "thread_cpu_s", 0.5), (1, "cpu_window_s", 2.0),
        (2, "thread_cpu_s", 0.5), (2, "cpu_window_s", 0.0)]]
    assert thread_cores(rows) == pytest.approx(0.2 + 0.25, rel=EXACT)
    own, _ = cpu_use(rows)
    assert thread_cores(rows) < own                       # gloo's threads did the rest
    assert thread_cores([{"rank": 0, "key": "cpu_s", "value": 1.0}]) is None


def test_the_noise_table_shows_the_training_threads_part():
    row = dataclasses.replace(_row("tw4", "timed-wait", 1.72, 1.71, 0.1), thread_cores=0.75)
    assert any(line.startswith("| tw4 |") and line.endswith("| 1.72 (0.75) / 1.71 |")
               for line in report.noise_table([row]))


def _row(key: str, mode: str, own: float | None, host: float | None,
         error: float) -> Comparison:
    q = {name: Quantity(predicted=None) for name in ("throughput", "peak_memory",
                                                    "staleness_mean")}
    q["step_time"] = Quantity(predicted=1.0 + error, measured=1.0, low=0.9, high=1.1,
                              values=(0.9, 1.0, 1.1))
    return Comparison(key=key, label=key, what="t", strategy="ddp", mode=mode, workers=8,
                      run_ids=(1,), failed=(), quantities=q, staleness_w1=None,
                      predicted_breakdown={}, measured_breakdown={}, own_cores=own,
                      host_cores=host)


def test_cpu_lines_name_other_work_and_the_cpu_bound_timed_wait_runs():
    rows = [_row("tw8", "timed-wait", 1.95, 1.99, -0.2), _row("tw4", "timed-wait", 1.2,
                                                              1.6, -0.05),
            _row("real", "real", 1.98, 2.0, 0.01)]
    lines = summary.cpu_lines(rows, cores=2)
    assert "1.20–1.98 of the 2 cores" in lines[0]
    assert "other work took 0.02–0.40 cores (most beside tw4)" in lines[0]
    assert lines[1].startswith("Timed-wait runs that were CPU-bound")
    assert "tw8 (1.95 cores, step time -20.0%)" in lines[1]
    assert "tw4" not in lines[1] and "real" not in lines[1]
    assert rows[1].other_cores == pytest.approx(0.4, rel=1e-9)


def test_without_the_meter_the_load_average_line_stays():
    rows = [_row("a", "real", None, None, 0.3), _row("b", "real", None, None, 0.2)]
    assert summary.cpu_lines(rows, cores=2) == []
    lines = summary.why_missed(rows, loads=[1.0, 2.0], cores=2)
    assert any("load average cannot separate" in line for line in lines)
    assert not any(line.startswith("CPU during") for line in lines)


def test_the_noise_table_shows_run_and_host_cores():
    table = report.noise_table([_row("tw8", "timed-wait", 1.95, 1.99, -0.2),
                                _row("old", "real", None, None, 0.1)])
    assert any(line.startswith("| tw8 |") and line.endswith("| 1.95 / 1.99 |")
               for line in table)
    assert any(line.startswith("| old |") and line.endswith("| – |") for line in table)


# ---------------------------------------------------------------- PS server phases


def test_server_phases_are_medians_over_the_steady_updates_only():
    from perfmodel.compare.matching import server_phases

    def update(worker, step, t, recv):
        return {"worker": worker, "step": step, "time_s": t, "version_read": 0,
                "version_applied": 0, "recv_s": recv, "apply_s": 0.002, "pack_s": 0.001,
                "reply_s": 0.005}
    rows = [update(0, 0, 0.1, 9.0), update(1, 0, 0.2, 9.0),         # warm-up: left out
            update(0, 1, 0.3, 0.010), update(1, 1, 0.4, 0.010), update(1, 2, 0.45, 0.016),
            update(0, 2, 0.5, 0.011), update(1, 3, 0.7, 7.0)]
    # steady: timed steps strictly before worker 0's last update (t = 0.5); the mean (the
    # server's time per update), not the median
    phases = server_phases(rows, warmup_steps=1)
    assert phases["recv_s"] == pytest.approx(0.012, rel=EXACT)
    assert phases["update_s"] == pytest.approx(0.002 + 0.001, rel=EXACT)    # apply + pack
    old = [{k: v for k, v in u.items() if k != "pack_s"} for u in rows]
    assert server_phases(old, warmup_steps=1) == {}                # not recorded: nothing


def test_the_server_phase_table_and_line_name_the_largest_gap():
    row = _row("async-tw8", "timed-wait", 1.9, 2.0, -0.3)
    row = Comparison(**{**row.__dict__, "strategy": "async-ps", "server_phases": {
        "recv_s": (0.005, 0.009), "update_s": (0.003, 0.005), "reply_s": (0.005, 0.006)},
        "predicted_breakdown": {
        "compute_s": 0.02, "comm_exposed_s": 0.07, "wait_s": 0.0}, "measured_breakdown": {
        "compute_s": 0.02, "comm_wait_s": 0.11}})
    table = report.server_phase_table([row])
    assert "| async-tw8 | -30.0 % | 5.00 / 9.00 | 3.00 / 5.00 | 5.00 / 6.00 | 13.00 / 20.00 |" \
        in table
    line = summary.server_lines([row])[0]
    assert line.endswith("the largest gap is in receive (wait + push).")
    assert "(sum 20.0 vs 13.0)" in line
    assert report.server_phase_table([_row("ddp", "real", None, None, 0.0)]) == []


def test_the_models_server_phases_reply_to_every_sync_worker_and_once_async():
    from perfmodel.cluster import load_cluster
    from perfmodel.compare.protocol import HeldOut, model_options, scenario_for
    from perfmodel.compare.run import model_server_phases
    from perfmodel.predict import predict

    profile = load_cluster("local")
    phases = {}
    for strategy in ("sync-ps", "async-ps"):
        h = HeldOut(key=strategy, what="t", strategy=strategy, workload="mlp", workers=3)
        p = predict(strategy, scenario_for(h, profile, steps=4, seed=0),
                    **model_options(h, cpu=True))
        phases[strategy] = model_server_phases(p)
    sync, async_ = phases["sync-ps"], phases["async-ps"]
    assert sync["reply_s"] == pytest.approx(3 * async_["reply_s"], rel=EXACT)
    assert sync["recv_s"] == async_["recv_s"] and sync["update_s"] == async_["update_s"]


def test_the_thread_counter_is_the_calling_threads_alone():
    """CPU burnt on another thread (as gloo's) is in cpu_s, not in thread_cpu_s."""
    import threading

    start = cpu_meter.mark()
    spin = threading.Thread(target=lambda: sum(i * i for i in range(2_000_000)))
    spin.start()
    spin.join()
    u = cpu_meter.usage(start)
    assert u["cpu_s"] - u["thread_cpu_s"] > 0.02
    assert u["thread_cpu_s"] < u["cpu_s"]
