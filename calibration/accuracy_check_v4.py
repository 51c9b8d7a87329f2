"""The fourth held-out accuracy check (issues 14, 16), exactly as accuracy_plan_v4.toml says.

v3's method, unchanged (calibration/accuracy_check_v3.py does the work; this module names the
round): the plan, committed before any v4 run, fixes five new held-out profiles, the same
sixteen seeds for every group (seed-major), the fit data (every run recorded so far, v3's
held-out runs included), the measured curve and v2's rules. Per class (resumable; one torch
thread; run it under `nice -n 19`): held-out runs into perfmodel/data/accuracy/v4/, the model
fitted on the fit data only and written where the plan's class says, the class's model before
v4 kept as v4/<class>_before.toml to compare with (not judged), and every group in
perfmodel/data/heldout/accuracy_check_v4.toml (--write-check).

Usage: python -m calibration.accuracy_check_v4 [--fit-only] [--write-check] CLASS [...]
"""

from __future__ import annotations

from calibration.accuracy_check_v3 import Round, cli
from perfmodel.accuracy.model import ACCURACY_DIR

# mlp-digits's v3 fit lives in v3/ (mlp.toml, the shipped multi-setting model, is not the
# class's); the other classes' model before v4 is the shipped file the plan rewrites
V4 = Round("v4", "fourth", {"mlp-digits": ACCURACY_DIR / "v3" / "mlp-digits.toml"})

if __name__ == "__main__":
    cli(V4, __doc__)
