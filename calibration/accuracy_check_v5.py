"""The fifth held-out accuracy check (issue 16), exactly as accuracy_plan_v5.toml says.

cnn-digits alone, with v3's and v4's method unchanged (calibration/accuracy_check_v3.py does
the work; this module names the round): the plan, committed before any v5 run, fixes five new
held-out profiles, the same 112 seeds for every group (seed-major; the count set from the
class's seed SD in v3 and v4, not from any error), the fit data (every cnn-digits run recorded
so far, v4's held-out runs included) and the rules. Held-out runs into
perfmodel/data/accuracy/v5/, the model fitted on the fit data only and written where the
plan's class says, v4's fit kept as v5/cnn-digits_before.toml (not judged), every group in
perfmodel/data/heldout/accuracy_check_v5.toml (--write-check).

Usage: python -m calibration.accuracy_check_v5 [--fit-only] [--write-check] cnn-digits
"""

from __future__ import annotations

from calibration.accuracy_check_v3 import Round, cli

V5 = Round("v5", "fifth")       # cnn-digits's model before v5: the shipped file (v4's fit)

if __name__ == "__main__":
    cli(V5, __doc__)
