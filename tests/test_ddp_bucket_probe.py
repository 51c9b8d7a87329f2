"""benchmarks/ddp_bucket_probe.py on its committed store (session 42's probe, 20 DDP runs).

Golden figures: docs/model.md ("What an overlapped bucket costs on a CPU host") quotes these
medians and the per-bucket costs; the model's side is today's DDP with a report's profile as
it was fitted, so a change in how the model costs buckets shows here. No torch job runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import load_benchmark

REPO = Path(__file__).resolve().parent.parent
STORE = REPO / "benchmarks/results/ddp-bucket-probe-2026-12-07.sqlite"
PROFILE = REPO / "reports/local-2026-12-07-heldout-62/profile.toml"


def _module():
    return load_benchmark("ddp_bucket_probe")


def test_the_probe_reads_as_the_docs_quote_it():
    probe = _module()
    got = probe.measured(STORE)
    assert sorted(got) == sorted(probe.CAPS_MiB)
    assert {cap: max(g["buckets"]) for cap, g in got.items()} == {25.0: 1, 8.5: 2, 4.0: 4,
                                                                   1.0: 4}
    assert all(len(g["step"]) == 5 for g in got.values())
    med = {cap: sorted(g["compute"])[2] * 1e3 for cap, g in got.items()}
    assert med[25.0] == pytest.approx(21.0, abs=0.05)
    assert med[1.0] == pytest.approx(28.2, abs=0.05)


def test_per_bucket_cost_is_the_least_squares_slope():
    probe = _module()
    assert probe.per_bucket_ms([1, 2, 4], [0.0, 1.0, 3.0]) == pytest.approx(1.0)
    assert probe.per_bucket_ms([1, 2, 4], [0.0, 2.0, 2.0]) == pytest.approx(
        (1 * 2 + 3 * 2) / (1 + 9))


def test_the_model_charges_compute_for_buckets_that_start_before_backward_ends():
    # the model side with report 62's profile as fitted: four 4.2 MB buckets cost more
    # compute than one bucket ready only at backward's end, which costs none of it
    probe = _module()
    model = probe.modelled(PROFILE, (25.0, 1.0))
    one, four = model[25.0][1], model[1.0][1]
    assert four > one
