"""Section 8 of the findings report (perfmodel/findings/classes.py) rendered from hand-made
penalties: the tables' cells, the study-range marks, and the per-class prose; then the
section built from the shipped models and runs lands in the report and the CSV."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfmodel.accuracy.penalty import ObservedPenalty, StudyPenalty
from perfmodel.findings.classes import (
    HOMOGENEOUS,
    TABLE_CLUSTER,
    in_study_range,
    section_text,
)
from perfmodel.findings.predicted import STRAGGLER
from perfmodel.findings.records import ClassPenalty


def _penalty(n: int, epochs: float, time: float, *, unstable: bool = False,
             sync: float = 0.95, mitigation: str = "staleness-aware",
             setting: str = "momentum lr 0.05") -> StudyPenalty:
    """A StudyPenalty whose two penalties are `epochs` and `time` points."""
    async_acc = sync - epochs / 100
    return StudyPenalty(workload="toy", setting=setting, mitigation=mitigation, workers=n,
                        mean_staleness=n - 1, throughput_ratio=1.5, budget_updates=100,
                        worth=0.5, sync_efficiency=1.0, unstable=unstable,
                        chance_accuracy=0.1, sync_accuracy_same_epochs=sync,
                        sync_accuracy_same_time=async_acc + time / 100,
                        async_accuracy=0.1 if unstable else async_acc)


def _point(klass: str, p: StudyPenalty, observed: ObservedPenalty | None = None,
           variation: str = HOMOGENEOUS) -> ClassPenalty:
    return ClassPenalty(klass=klass, cluster=TABLE_CLUSTER, variation=variation, model=p,
                        noise_scaled=replace(p, sync_efficiency=0.5,  # async 1 and 2 ahead
                                             sync_accuracy_same_epochs=p.async_accuracy - 0.01,
                                             sync_accuracy_same_time=p.async_accuracy - 0.02),
                        long_budget=replace(p, sync_accuracy_same_epochs=p.async_accuracy),
                        observed=observed, observed_unstable=False)


@pytest.fixture
def points():
    pts = []
    for variation in (HOMOGENEOUS, STRAGGLER):
        # "steady": 2, 10 (in range), 30, 50 points at the same epochs; half that in time
        for n, e in zip((4, 8, 16, 32), (2.0, 10.0, 30.0, 50.0), strict=True):
            seen = ObservedPenalty(same_epochs_points=e + 1, same_time_points=e / 2 + 1,
                                   seeds=10) if n == 8 else None
            pts.append(_point("steady", _penalty(n, e, e / 2), seen, variation))
        # "shaky": unstable from 16 workers on
        for n in (4, 8, 16, 32):
            pts.append(_point("shaky", _penalty(n, 1.0, 0.5, unstable=n >= 16,
                                                mitigation="none"), variation=variation))
        # "flat": learns nothing in its budget (synchronous 0.5 points above chance)
        for n in (4, 8, 16, 32):
            pts.append(_point("flat", _penalty(n, 0.0, 0.0, sync=0.105, setting="adam lr 0.003"),
                              variation=variation))
    return tuple(pts)


CLASSES = {"steady": ("x", ()), "shaky": ("x", ()), "flat": ("x", ())}


def test_study_range_is_inclusive():
    assert in_study_range(4.0) and in_study_range(17.0)
    assert not in_study_range(3.99) and not in_study_range(17.01)


def test_tables_render_cells_marks_and_unstable(points):
    text = section_text(points, CLASSES)
    row = ("| steady | momentum lr 0.05 | staleness-aware | 2.0 / 1.0 | **10.0** / **5.0** | "
           "30.0 / **15.0** | 50.0 / 25.0 |")
    assert text.count(row) == 2                  # homogeneous and one-straggler tables
    assert "| shaky | momentum lr 0.05 | none | 1.0 / 0.5 | 1.0 / 0.5 | U | U |" in text
    # the observed table: only N = 8 was run, with its seeds in brackets
    assert ("| steady | momentum lr 0.05 | staleness-aware | – | **11.0** / **6.0** (10) | – "
            "| – |") in text
    assert text.count("| r = X_async / X_sync | | | 1.50 | 1.50 | 1.50 | 1.50 |") == 4
    # the noise-scaled table, and what the prose counts from it (homogeneous, stable cells)
    assert ("| steady | momentum lr 0.05 | staleness-aware | -1.0 / -2.0 | -1.0 / -2.0 | "
            "-1.0 / -2.0 | -1.0 / -2.0 |") in text
    assert "async is ahead at the same wall-clock time in 10 of the 10 stable cells" in text


def test_prose_says_where_the_range_arises(points):
    text = section_text(points, CLASSES)
    assert "- model, same epochs: steady momentum lr 0.05 staleness-aware N = 8 (10.0)\n" in text
    assert ("- model, same time: steady momentum lr 0.05 staleness-aware N = 8 (5.0); "
            "steady momentum lr 0.05 staleness-aware N = 16 (15.0)\n") in text
    assert "- runs, same epochs: steady momentum lr 0.05 staleness-aware N = 8 (11.0)\n" in text
    lines = text.splitlines()
    steady = lines[lines.index("- **steady**") + 1]
    assert steady == ("  - momentum lr 0.05, staleness-aware: model E 2.0 to 50.0, T 1.0 to "
                      "25.0 points at N = 4, 8, 16, 32 (10 U: 0.0); runs E 11.0, T 6.0 at "
                      "N = 8")
    shaky = lines[lines.index("- **shaky**") + 1]
    assert shaky == ("  - momentum lr 0.05, none: model unstable at N = 16, 32; model E 1.0, "
                     "T 0.5 points at N = 4, 8 (10 U: 0.0)")
    flat = lines[lines.index("- **flat**") + 1]
    assert "0.5 points above chance" in flat and "learns nothing" in flat


def test_the_section_is_in_the_report_and_csv():
    from perfmodel.findings.classes import class_penalties

    cp = class_penalties()
    names = {p.klass for p in cp.points}
    assert names == {"mlp-digits", "cnn-digits", "logreg-tabular", "transformer-seq"}
    # the model's penalty at the same time exceeds the one at the same epochs only by what
    # the synchronous curve falls between U/r and U (r > 1): a measured curve may fall late in
    # the budget (logreg-tabular's synchronous mean peaks at 0.991 and ends at 0.982)
    assert all(p.model.throughput_ratio > 1 for p in cp.points)
    for p in cp.points:
        fall = max(0.0, p.model.sync_accuracy_same_time - p.model.sync_accuracy_same_epochs)
        assert p.model.same_time_points <= p.model.same_epochs_points + 100 * fall + 1e-9
    assert any(p.model.same_time_points < p.model.same_epochs_points for p in cp.points)
    metrics = {r.metric for r in cp.rows if r.finding == "accuracy_loss"}
    assert {"same_epochs_points", "same_time_points", "throughput_ratio",
            "observed_same_epochs_points"} <= metrics
    assert "## " not in cp.text                  # the report adds the heading
