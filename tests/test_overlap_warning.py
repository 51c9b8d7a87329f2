"""A calibration whose host changed speed says so: compute.overlap_slowdown below 1
(calibration/from_store.py `overlap_warning`).

Interference can slow compute down while collectives are in flight, never speed it up; a fit
below 1 means the DDP/FSDP runs computed faster than the compute runs' passes alone, so the
host's speed moved between them. The real case: report 43's committed set A fitted 0.70 (its
drift anchor ran x1.39 in set B), report 42's 1.51 (anchor x0.90)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.fit import fit_result
from calibration.from_store import CHECK_FAILED, calibrate_runs, overlap_warning
from measure.store import Store

REPORTS = Path(__file__).resolve().parent.parent / "reports"


@pytest.mark.parametrize("value, loud", [(0.70, True), (0.999, True), (1.0, False),
                                         (1.51, False)])
def test_only_a_slowdown_below_one_is_flagged(value, loud):
    notes = overlap_warning(fit_result("compute.overlap_slowdown", value, 0.01, [0.0, 0.0]))
    assert bool(notes) == loud
    assert all(n.startswith(CHECK_FAILED) and f"{value:.2f}" in n for n in notes)


@pytest.mark.parametrize("report, loud", [("local-2026-12-06-heldout-43", True),
                                          ("local-2026-12-06-heldout-42", False)])
def test_a_committed_set_a_is_flagged_only_where_its_host_changed_speed(report, loud):
    [path] = (REPORTS / report / "pooled").glob("*.sqlite")
    store = Store(str(path))
    cal = calibrate_runs(store, [r.id for r in store.list_runs()])
    flagged = [n for n in cal.notes if "overlap_slowdown" in n and n.startswith(CHECK_FAILED)]
    assert bool(flagged) == loud
    assert (cal.fits.overlap_slowdown.value < 1.0) == loud
