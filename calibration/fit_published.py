"""Fit the spec profiles' compute efficiencies on the FIT set of the published points.

    python -m calibration.fit_published [--write]

Parameters (perfmodel/sim/compute.py's roofline), fitted by least squares on the log of
predicted / published throughput over the points with `set = "fit"` only (never the
held-out ones):
- per GPU architecture (Ampere: a100, a100-80gb, a10g, a10g-8; Hopper: h100, h200) the
  top of the matmul efficiency curve eff(F) = e_max x F / (F + F_half) of a unit pass's
  FLOPs F, stored sampled at every decade as `compute.efficiency_by_flops` (at least 0.01);
- shared: the curve's knee F_half (the Hopper fit points alone, two, cannot place it),
  `compute.memory_efficiency` (fraction of HBM bandwidth the memory-bound op class
  reaches) and `compute.launch_us_per_kernel`.
A GPU without fit points takes its architecture's values (A10G: the A100's, assumed; H200:
the H100's, same chip). `--write` rewrites those three lines of each spec profile.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from perfmodel.cluster import SHIPPED_PROFILES, load_cluster
from perfmodel.published import load_published, predict_point

ARCH = {"a100": "ampere", "a100-80gb": "ampere", "a10g": "ampere", "a10g-8": "ampere",
        "h100": "hopper", "h200": "hopper"}
ARCHS = ("ampere", "hopper")
DECADES = tuple(10.0 ** k for k in range(8, 16))


def curve(e_max: float, log_half: float) -> tuple[tuple[float, float], ...]:
    half = 10.0 ** log_half
    return tuple((f, max(0.01, round(e_max * f / (f + half), 4))) for f in DECADES)


def unpack(x: np.ndarray) -> dict:
    return {"ampere": (x[0], x[2]), "hopper": (x[1], x[2]), "memory_efficiency": x[3],
            "launch_us_per_kernel": x[4]}


def with_params(cluster, params: dict):
    e_max, log_half = params[ARCH[cluster.name]]
    compute = replace(cluster.compute, efficiency_by_flops=curve(e_max, log_half),
                      memory_efficiency=params["memory_efficiency"],
                      launch_us_per_kernel=params["launch_us_per_kernel"],
                      overhead_us_per_unit=0.0)
    return replace(cluster, compute=compute)


def fit() -> tuple[dict, list]:
    points = [p for p in load_published() if p.set == "fit"]
    clusters = {p.cluster: load_cluster(p.cluster) for p in points}

    def residuals(x):
        params = unpack(x)
        return [np.log(predict_point(p, with_params(clusters[p.cluster], params)).predicted
                       / p.value) for p in points]

    x0 = np.array([0.6, 0.5, 10.0, 0.6, 5.0])
    lo, hi = [0.2, 0.2, 7.0, 0.1, 1.0], [0.95, 0.95, 14.0, 0.95, 30.0]
    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3)
    return unpack(result.x), [(p.id, float(np.expm1(r))) for p, r in
                              zip(points, residuals(result.x), strict=True)]


def write(params: dict) -> None:
    for name, arch in ARCH.items():
        path = SHIPPED_PROFILES / f"{name}.toml"
        text = path.read_text(encoding="utf-8")
        table = ", ".join(f"[{f:.0e}, {e}]".replace("e+", "e") for f, e in curve(*params[arch]))
        subs = {"efficiency_by_flops": f"[{table}]",
                "memory_efficiency": f"{params['memory_efficiency']:.3f}",
                "launch_us_per_kernel": f"{params['launch_us_per_kernel']:.2f}"}
        for key, value in subs.items():
            text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
        path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.fit_published",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the spec profiles")
    args = parser.parse_args(argv)
    params, errors = fit()
    for arch in ARCHS:
        e_max, log_half = params[arch]
        print(f"{arch}: e_max {e_max:.3f}, F_half 1e{log_half:.2f} FLOPs")
    print(f"memory_efficiency {params['memory_efficiency']:.3f}, "
          f"launch_us_per_kernel {params['launch_us_per_kernel']:.2f}")
    for pid, err in errors:
        print(f"  fit {pid:28s} {err:+.1%}")
    if args.write:
        write(params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
