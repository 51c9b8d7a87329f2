"""nccl-tests logs into the network fit (calibration/nccl_tests.py).

The hand-written logs in tests/fixtures/nccl_tests/ time each row from known link parameters
(alpha_intra 8 us, alpha_inter 20 us, intra 150 GB/s, inter 12.5 GB/s: the ring model of
perfmodel/sim/collectives.py) with +-1 % noise, so the fit must give them back within a few
per cent: the noise is 1 %, and a wrong ring step count or busbw factor would be off by tens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.fit_network import fit_network
from calibration.nccl_tests import parse_log, read_log
from perfmodel.errors import PerfmodelError

LOGS = Path(__file__).parent / "fixtures" / "nccl_tests"


def test_the_header_gives_ranks_nodes_device_and_op():
    log = read_log(LOGS / "all_reduce_perf_2x8.log")
    assert (log.op, log.ranks, log.nodes) == ("all-reduce", 16, 2)
    assert log.device == "NVIDIA A100-SXM4-80GB"
    assert len(log.samples) == 14 and log.samples[0].bytes == 8     # 8 B x 4 ... 512 MiB
    assert log.samples[0].time_s == pytest.approx(264.68e-6)         # out-of-place, not in-place
    assert log.samples[-1].time_s == pytest.approx(2 * 15 / 16 * 2**29 / 12.5e9, rel=0.02)


def test_the_fit_gives_back_the_links_that_made_the_logs():
    samples = [s for name in ("all_reduce_perf_1x8.log", "all_reduce_perf_2x8.log",
                              "all_gather_perf_2x8.log")
               for s in read_log(LOGS / name).samples]
    fits = fit_network(samples)
    intra, inter = fits["intra_node"], fits["inter_node"]
    assert intra.bandwidth_GBps.value == pytest.approx(150.0, rel=0.03)
    assert intra.latency_us.value == pytest.approx(8.0, rel=0.05)
    assert inter.bandwidth_GBps.value == pytest.approx(12.5, rel=0.03)
    assert inter.latency_us.value == pytest.approx(20.0, rel=0.1)
    assert inter.time_factor_by_op.get("all-gather", 1.0) == pytest.approx(1.0, rel=0.03)


def test_the_op_is_inferred_from_busbw_when_the_name_does_not_say(tmp_path):
    text = (LOGS / "all_gather_perf_2x8.log").read_text().replace("all_gather_perf", "x")
    assert parse_log(text, tmp_path / "run.log").op == "all-gather"
    text = (LOGS / "all_reduce_perf_1x8.log").read_text().replace("all_reduce_perf", "x")
    assert parse_log(text, tmp_path / "run.log").op == "all-reduce"


def test_mpi_prefixes_and_the_old_error_column_are_read(tmp_path):
    old = (LOGS / "all_reduce_perf_1x8.log").read_text().splitlines()
    lines = []
    for line in old:
        line = line.replace("    root", "").replace("#wrong", " error")
        if line and line[0] != "#":
            cols = line.split()
            del cols[4]                                   # no root column
            cols[7], cols[11] = "2e-06", "2e-06"
            line = "  ".join(cols)
        lines.append("[1,0]<stdout>:" + line)
    log = parse_log("\n".join(lines), tmp_path / "all_reduce_perf.log")
    assert (log.ranks, len(log.samples)) == (8, 14)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("      0   264", "      3   264", 1), "#wrong = 3"),
    (lambda t: "\n".join(x for x in t.splitlines() if "Rank" not in x), "no '#  Rank N"),
    (lambda t: t.split("#       size")[0], "no result rows"),
    (lambda t: t.replace("float     sum      -1   264.68", "float", 1), "a row with"),
    (lambda t: t.replace("264.68", "abc", 1), "is not a number"),
])
def test_a_malformed_log_is_one_line_naming_the_line(tmp_path, change, message):
    text = change((LOGS / "all_reduce_perf_2x8.log").read_text())
    with pytest.raises(PerfmodelError, match=message) as e:
        parse_log(text, tmp_path / "all_reduce_perf.log")
    assert "\n" not in str(e.value)
