"""The measurement protocol for a shared machine (measure/protocol.py): settling on a fake
load sequence, pinning applied or skipped, interleaved repeats, the noise floor's arithmetic,
and the CLI options that set it."""

from __future__ import annotations

import statistics

import pytest
from click.testing import CliRunner

from calibration.suite import build_suite
from measure.protocol import (
    MAD_TO_SD,
    RunProtocol,
    Settle,
    apply_pin,
    interleave,
    noise_floor,
    pin_plan,
    protocol_record,
    wait_for_load,
)
from perfmodel.cli import cli
from perfmodel.commands.protocol_options import make_protocol
from perfmodel.errors import PerfmodelError


class FakeHost:
    """A clock that sleep advances, and a load average read from a list, one per look."""

    def __init__(self, loads):
        self.loads, self.now, self.sleeps = list(loads), 0.0, []

    def loadavg(self) -> float:
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def _wait(settle, host, cores=2):
    return wait_for_load(settle, cores=cores, loadavg=host.loadavg, sleep=host.sleep,
                         clock=host.clock)


def test_waits_until_the_load_falls_below_cores_times_the_threshold():
    host = FakeHost([3.0, 2.2, 1.4, 0.9, 0.5])
    r = _wait(Settle(max_load_per_core=0.5, max_wait_s=60, poll_s=5), host)
    assert r.settled and r.threshold_load == 1.0
    assert (r.load_before, r.load_after) == (3.0, 0.9)      # stops at the first look < 1
    assert r.waited_s == 15 and host.sleeps == [5, 5, 5]


def test_gives_up_after_max_wait_and_says_it_did_not_settle():
    host = FakeHost([4.0])                                   # never quietens
    r = _wait(Settle(max_load_per_core=0.5, max_wait_s=12, poll_s=5), host)
    assert not r.settled
    assert r.waited_s == 12 and host.sleeps == [5, 5, 2]    # the last sleep is cut short
    assert r.load_before == r.load_after == 4.0


def test_a_quiet_machine_launches_at_once():
    host = FakeHost([0.2])
    r = _wait(Settle(), host)
    assert r.settled and r.waited_s == 0 and host.sleeps == []


def test_zero_max_wait_never_sleeps():
    host = FakeHost([5.0])
    r = _wait(Settle(max_wait_s=0), host)
    assert not r.settled and host.sleeps == []


@pytest.mark.parametrize("kwargs", [{"max_load_per_core": -1}, {"max_wait_s": float("nan")},
                                    {"poll_s": 0}])
def test_bad_settle_settings_are_refused(kwargs):
    with pytest.raises(PerfmodelError):
        Settle(**kwargs)


def test_pin_plan_gives_each_rank_its_own_cores_when_there_are_enough():
    assert pin_plan(2, 1, (0, 1)) == ((0,), (1,))
    assert pin_plan(2, 2, (0, 1, 2, 3)) == ((0, 1), (2, 3))
    assert pin_plan(3, 1, (4, 5, 6, 7)) == ((4,), (5,), (6,))


def test_pin_plan_skips_when_busy_processes_outnumber_cores():
    assert pin_plan(3, 1, (0, 1)) is None               # a PS server + 2 workers on 2 cores
    assert pin_plan(2, 2, (0, 1, 2)) is None


def test_apply_pin_sets_the_affinity_of_its_local_rank():
    calls = []
    config = {"protocol": {"pin_cores": [[0], [1]]}}
    assert apply_pin(config, 1, lambda pid, cores: calls.append((pid, cores))) == (1,)
    assert calls == [(0, {1})]


def test_apply_pin_counts_the_ranks_of_the_hosts_earlier_torchruns():
    # measure/netem.py: two emulated nodes on one host, each a torchrun from local rank 0
    calls = []
    config = {"protocol": {"pin_cores": [[0], [1]]}}
    assert apply_pin(config, 0, lambda pid, cores: calls.append(cores), offset=1) == (1,)
    assert apply_pin(config, 1, lambda pid, cores: calls.append(cores), offset=1) == ()
    assert calls == [{1}]


def test_apply_pin_does_nothing_without_a_plan_or_when_the_core_is_refused():
    calls = []
    assert apply_pin({}, 0, lambda pid, cores: calls.append(cores)) == ()
    assert apply_pin({"protocol": {"pin_cores": []}}, 0, lambda p, c: calls.append(c)) == ()
    assert calls == []

    def refuse(pid, cores):
        raise OSError(22, "Invalid argument")
    assert apply_pin({"protocol": {"pin_cores": [[9]]}}, 0, refuse) == ()


def test_protocol_record_says_what_was_waited_and_whether_ranks_were_pinned():
    host = FakeHost([2.0, 0.4])
    wait = lambda s, n: wait_for_load(s, cores=n, loadavg=host.loadavg,  # noqa: E731
                                      sleep=host.sleep, clock=host.clock)
    rec = protocol_record(RunProtocol(settle=Settle(poll_s=1)), {"threads_per_worker": 1}, 2,
                          cores=(0, 1), wait=wait)
    assert rec["pinned"] and rec["pin_cores"] == [[0], [1]]
    assert rec["load_before"] == 2.0 and rec["load_after"] == 0.4 and rec["waited_s"] == 1
    over = protocol_record(RunProtocol(), {"threads_per_worker": 1}, 5, cores=(0, 1))
    assert not over["pinned"] and over["pin_cores"] == []
    assert "5 busy processes on 2 cores" in over["pin_skipped"]
    off = protocol_record(RunProtocol(pin=False), {}, 1, cores=(0, 1))
    assert not off["pinned"] and off["pin_skipped"] == "not asked"


def test_interleave_alternates_configurations():
    assert interleave([["a1", "a2", "a3"], ["b1", "b2", "b3"]]) == \
        ["a1", "b1", "a2", "b2", "a3", "b3"]
    assert interleave([["a1", "a2", "a3"], ["b1"], []]) == ["a1", "b1", "a2", "a3"]
    assert interleave([]) == []


def test_calibration_repeats_do_not_run_back_to_back():
    keys = [m.key for m in build_suite("cpu", suite="local")]
    repeats = [i for i, k in enumerate(keys) if k.startswith("ddp-cnn-small-")]
    assert len(repeats) == 3
    assert all(b - a > 1 for a, b in zip(repeats, repeats[1:], strict=False))
    assert sorted(keys) == sorted(k for k in keys)       # nothing lost or doubled
    assert len(set(keys)) == len(keys)


def test_noise_floor_arithmetic():
    values = [100.0, 110.0, 90.0, 104.0, 200.0]         # one outlying run
    f = noise_floor(values)
    med = statistics.median(values)                       # 104
    assert f.runs == 5 and f.median == med
    assert f.spread_rel == pytest.approx((200 - 90) / 104)
    mad = statistics.median(abs(v - med) for v in values)  # |..| = 4, 6, 14, 0, 96 -> 6
    assert mad == 6
    assert f.robust_sd_rel == pytest.approx(MAD_TO_SD * 6 / 104)
    assert f.robust_sd_rel < 0.1 < f.spread_rel          # the outlier moves one, not the other


def test_noise_floor_needs_two_values():
    assert noise_floor([1.0]) is None and noise_floor([]) is None
    assert noise_floor([0.0, 0.0]) is None
    assert noise_floor([2.0, 2.0]).spread_rel == 0


def test_make_protocol_from_the_cli_options():
    p = make_protocol(0.7, 45, False)
    assert p.pin and p.settle == Settle(max_load_per_core=0.7, max_wait_s=45)
    assert make_protocol(0.5, 0, True) == RunProtocol(settle=None, pin=False)


@pytest.mark.parametrize("argv", [["measure", "ddp"], ["calibrate"], ["compare"]])
def test_help_teaches_the_protocol(argv):
    out = CliRunner().invoke(cli, [*argv, "--help"], terminal_width=200).output
    for flag in ("--settle-load", "--settle-max-s", "--no-pin", "PERFMODEL_SETTLE_MAX_S"):
        assert flag in out
    assert "sched_setaffinity" in out and "1-minute load" in out


# ---------------------------------------------------------------- noise floor in compare


def _row(key: str, values: list[float], run_ids: tuple[int, ...]):
    from perfmodel.compare.matching import Comparison, Quantity

    q = Quantity.of(1.0, values)
    none = Quantity.of(None, [])
    return Comparison(
        key=key, label=key, what="test", strategy="ddp", mode="real", workers=2,
        run_ids=run_ids, failed=(), quantities={"throughput": q, "step_time": q,
                                                "peak_memory": none, "staleness_mean": none},
        staleness_w1=None, predicted_breakdown={"compute_s": 0.5, "comm_exposed_s": 0.5,
                                                "wait_s": 0.0},
        measured_breakdown={"compute_s": 0.5, "comm_wait_s": 0.5})


def test_compare_reports_the_noise_floor_per_configuration_and_in_the_headline(tmp_path):
    import json

    from perfmodel.compare import report

    rows = [_row("a", [1.0, 1.1, 0.9], (1, 2, 3)), _row("b", [2.0, 2.0, 2.4], (4, 5, 6))]
    protocol = {str(i): {"load_after": 0.5 + i / 10, "waited_s": 10.0, "pinned": i < 4}
                for i in range(1, 7)}
    meta = {"cluster": "local", "date": "d", "command": "perfmodel compare", "host": "h",
            "hardware": "cpu", "versions": "v", "wall_s": 60.0, "load_range": "1–2",
            "protocol": ["p"], "skipped": {}, "run_protocol": protocol}
    report.write_json(meta, rows, {}, [], tmp_path / "c.json")
    head = json.loads((tmp_path / "c.json").read_text())["headline"]["step_time"]["all"]
    # a: spread 0.2 / 1.0, robust SD 1.4826 x 0.1 / 1.0; b: spread 0.4 / 2, MAD 0 -> 0
    assert head["noise_median"] == pytest.approx((0.2 + 0.2) / 2)
    assert head["noise_robust_sd_median"] == pytest.approx(MAD_TO_SD * 0.1 / 2)
    report.write_markdown(tmp_path / "report.md", meta=meta, rows=rows, figures={},
                          torch_rows=[], why_missed=[])
    md = (tmp_path / "report.md").read_text()
    assert "## Noise floor per configuration" in md
    line_a = next(x for x in md.splitlines() if x.startswith("| a | 3 |"))
    assert "20.0 %" in line_a and "14.8 %" in line_a and "3 of 3" in line_a
    line_b = next(x for x in md.splitlines() if x.startswith("| b | 3 |"))
    assert "0.0 %" in line_b and "0 of 3" in line_b and "30" in line_b   # waited 3 x 10 s


def test_elastic_runs_settle_but_are_never_pinned():
    from measure.session import with_protocol

    config = {"kind": "elastic_ddp", "threads_per_worker": 1}
    assert with_protocol(config, 2, None) is config
    out = with_protocol(config, 2, RunProtocol(), no_pin="elastic runs restart their ranks")
    assert out["protocol"]["pinned"] is False and out["protocol"]["pin_cores"] == []
    assert out["protocol"]["pin_skipped"] == "elastic runs restart their ranks"
    assert "protocol" not in config                      # the caller's dict is left alone
