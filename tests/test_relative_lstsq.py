"""relative_lstsq (calibration/fit.py): a coefficient listed in zero_ok that comes out negative
within noise of 0 is fixed at 0 and the rest refitted, down to the last one."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit import relative_lstsq


def test_a_last_coefficient_fixed_at_zero_is_refitted_not_left_negative():
    # with every listed coefficient fixed the refit used to be skipped, leaving it negative
    # (report 25's set A: a link latency of -2.4 to -3.1 us)
    fit = relative_lstsq(np.ones((4, 1)), np.array([1.0, 1.01, 0.99, 1.0]),
                         np.array([1.0, 1.02, 1.0, 1.0]), zero_ok=(0,))
    assert fit.coef[0] == 0.0 and fit.stderr[0] == 0.0
    assert fit.rel == pytest.approx([0.0, 0.01 / 1.01, 0.01 / 0.99, 0.0])
