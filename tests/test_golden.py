"""Predictions are unchanged unless a change means to change them.

tests/golden/predictions.json was recorded by `python -m tests.golden_cases` (every strategy x
{1, 8, 64} workers x every shipped cluster x every workload, a sweep and two recommends). A
change that moves a prediction on purpose regenerates it and says why in its commit.
"""

from __future__ import annotations

import json
import math

import pytest

from tests import golden_cases

EXPECTED = json.loads((golden_cases.GOLDEN / "predictions.json").read_text())
CASES = golden_cases.all_cases("{tmp}")


def _same(a, b, path=""):
    """Exact equality, except floats compared to 1e-12 relative (summation order of a dict)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300) or (a != a and b != b), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_golden_set_covers_every_case():
    assert sorted(EXPECTED) == sorted(CASES)
    assert len(EXPECTED) == 5 * 3 * 3 * 6 + len(golden_cases.OTHER_CASES)


@pytest.mark.parametrize("key", sorted(CASES))
def test_prediction_unchanged(key, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in CASES[key]]
    _same(golden_cases.run(args), json.loads(json.dumps(EXPECTED[key])), key)
