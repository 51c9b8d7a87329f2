"""benchmarks/ddp_floor_cpu.py on committed data: report 62's crowded DDP timed waits.

Golden figures: docs/model.md ("Where the DDP timed waits' errors come from") quotes these
medians; the floor's idle comes from perfmodel/sim/cores.py `node_cpu_floor_s` itself, so a
change to the floor's sleeps shows here. No torch job runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from factories import load_benchmark

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "reports/local-2026-12-07-heldout-62"


def _module():
    return load_benchmark("ddp_floor_cpu")


@pytest.fixture(scope="module")
def rows():
    return _module().report_rows(REPORT)


def _median(rows, ranks, field):
    return float(np.median([r[field] for r in rows if r["ranks"] == ranks]))


def test_every_crowded_rank_count_is_read(rows):
    counts = {n: sum(r["ranks"] == n for r in rows) for n in (4, 6, 8)}
    assert counts == {4: 5, 6: 4, 8: 5}


def test_idle_medians_as_docs_quote_them(rows):
    # docs/model.md: 62 at 4 / 8 ranks 10.0 / 6.9 ms idle against the floor's 9.8 ms
    assert _median(rows, 4, "idle_ms") == pytest.approx(10.0, abs=0.05)
    assert _median(rows, 8, "idle_ms") == pytest.approx(6.9, abs=0.05)
    assert _median(rows, 6, "idle_ms") == pytest.approx(21.8, abs=0.05)
    assert _median(rows, 4, "idle_model_ms") == pytest.approx(9.8, abs=0.05)


def test_floor_idle_is_the_floor_with_no_work(rows):
    """The script's idle is node_cpu_floor_s with no collective and no own work: the sleeps
    the Sleeper leaves, the same for every rank count of one workload and batch."""
    idle = {r["idle_model_ms"] for r in rows}
    assert len({round(x, 9) for x in idle}) == 1
    assert 0 < idle.pop() < min(r["step_s"] for r in rows) * 1e3
