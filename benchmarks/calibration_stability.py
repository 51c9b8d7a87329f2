"""How much do held-out predictions move when only the calibration session changes?

Give it the measurement stores of several `perfmodel compare --cluster local --calibrate`
sessions on one host. For each store it fits the profile from that store's calibration set A
alone, then from groups of stores pooled (calibration/pool.py), predicts every held-out
configuration of perfmodel/data/heldout/local.toml, and prints each configuration's
predicted step time per fit and the coefficient of variation across fits. It reads no
held-out measurement: the spread it prints is the calibration's own noise, a floor under
any held-out error that one session's calibration can reach.

With --parts it also fixes one part of the profile at a time (the collectives, the
point-to-point link, the CPU-bound collective share, the compute units, the overlap, core
sharing, the server) to the last store's values and prints how far the spread falls: where
the spread comes from.

    python benchmarks/calibration_stability.py STORE1 STORE2 STORE3 ... [--pool-size 3]
        [--parts] [--json out.json]

Stores are grouped for pooling in the order given, into disjoint groups of --pool-size.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tomllib
from pathlib import Path

import numpy as np

from calibration.from_store import calibrate_runs
from calibration.pool import PooledStore, PoolSource
from calibration.profile_writer import to_toml
from measure.store import Store
from perfmodel.cluster import parse_profile
from perfmodel.compare import protocol
from perfmodel.compare.run import predict_all

STEPS, SEED = 20, 0
PARTS = {   # profile keys fixed together, (section, key) or (section,) for a whole table
    "collectives": [("intra_node", "bandwidth_GBps"), ("intra_node", "latency_us"),
                    ("intra_node", "efficiency_by_bytes"), ("intra_node", "time_factor_by_op")],
    "point-to-point": [("intra_node", "p2p")],
    "cpu-bound share": [("topology", "comm_cpu_bound_fraction"),
                        ("topology", "comm_cpu_bound_by_bytes")],
    "compute units": [("compute", "efficiency_by_flops"), ("compute", "overhead_us_per_unit"),
                      ("compute", "optimizer_GBps")],
    "overlap": [("compute", "overlap_slowdown")],
    "core sharing": [("compute", "core_contention"), ("compute", "whole_step_factor"),
                     ("compute", "by_workload")],
    "server": [("server",)],
}


def set_a(path: str) -> PoolSource:
    store = Store(path)
    found, _ = protocol.calibration_set(store.list_runs(), "local", host="", any_host=True)
    if found.missing:
        sys.exit(f"{path}: no complete calibration set A ({len(found.missing)} runs missing)")
    return PoolSource(store, found.ids)


def fitted(sources: list[PoolSource]) -> dict:
    pooled = PooledStore(sources)
    data = calibrate_runs(pooled, pooled.ids).profile("local")
    return tomllib.loads(to_toml(data, header="calibration_stability"))


def step_ms(profile: dict) -> dict[str, float]:
    cluster = parse_profile(profile, Path("calibration_stability.toml"))
    return {r["key"]: r["step_time_s"] * 1e3
            for r in predict_all(protocol.held_out_set(), cluster, None, steps=STEPS,
                                 seed=SEED)}


def spread(fits: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.std([f[k] for f in fits], ddof=1) / np.mean([f[k] for f in fits]))
            for k in fits[0]}


def with_part(profile: dict, reference: dict, part: str) -> dict:
    out = copy.deepcopy(profile)
    for path in PARTS[part]:
        if len(path) == 1:
            out[path[0]] = copy.deepcopy(reference[path[0]])
            continue
        section, key = path
        if key in reference.get(section, {}):
            out.setdefault(section, {})[key] = copy.deepcopy(reference[section][key])
        else:
            out.get(section, {}).pop(key, None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--pool-size", type=int, default=3)
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if len(a.stores) < 2:
        sys.exit("give at least two stores: the spread is across calibration sessions")
    sources = [set_a(s) for s in a.stores]
    singles = [fitted([s]) for s in sources]
    groups = [sources[i:i + a.pool_size] for i in range(0, len(sources), a.pool_size)]
    groups = [g for g in groups if len(g) == a.pool_size]
    single_ms = [step_ms(p) for p in singles]
    pooled_ms = [step_ms(fitted(g)) for g in groups]
    cv_single = spread(single_ms)
    cv_pooled = spread(pooled_ms) if len(pooled_ms) > 1 else {}
    keys = list(cv_single)
    print(f"{len(sources)} calibration sessions; predicted step time (ms) of each held-out "
          f"configuration from each session's set A alone, and from {len(groups)} disjoint "
          f"pools of {a.pool_size}")
    for k in keys:
        one = " ".join(f"{f[k]:6.1f}" for f in single_ms)
        pool = " ".join(f"{f[k]:6.1f}" for f in pooled_ms)
        print(f"  {k:26s} alone {one}  CV {cv_single[k]:5.1%}   pooled {pool}"
              + (f"  CV {cv_pooled[k]:5.1%}" if cv_pooled else ""))
    print(f"median CV alone {np.median(list(cv_single.values())):.1%} "
          f"(max {max(cv_single.values()):.1%})"
          + (f"; pooled by {a.pool_size}: {np.median(list(cv_pooled.values())):.1%} "
             f"(max {max(cv_pooled.values()):.1%})" if cv_pooled else ""))
    by_part = {}
    if a.parts:
        print("median CV alone with one part fixed to the last session's values:")
        for part in PARTS:
            fixed = spread([step_ms(with_part(p, singles[-1], part)) for p in singles])
            by_part[part] = fixed
            print(f"  {part:16s} {np.median(list(fixed.values())):5.1%}")
    if a.json:
        a.json.write_text(json.dumps({"stores": a.stores, "pool_size": a.pool_size,
                                      "alone_ms": single_ms, "pooled_ms": pooled_ms,
                                      "cv_alone": cv_single, "cv_pooled": cv_pooled,
                                      "cv_with_part_fixed": by_part}, indent=1) + "\n")


if __name__ == "__main__":
    main()
