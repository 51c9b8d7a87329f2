"""What the report says around the table: the protocol, the scaling lines, PyTorch's memory
estimates beside the model's, and why a missed target was missed (from the breakdowns).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from perfmodel import strategies as strategy_records
from perfmodel.cluster import data_home, load_cluster
from perfmodel.compare.matching import SERVER_PHASES, Comparison, counts
from perfmodel.compare.protocol import (
    WARMUP_STEPS,
    HeldOut,
    model_options,
    scenario_for,
    timed_steps,
)
from perfmodel.errors import PerfmodelError
from perfmodel.memory import ddp_memory, fsdp_memory
from perfmodel.predict import predict
from perfmodel.sim.scenario import Scenario
from perfmodel.uncertainty import median_variance_factor
from perfmodel.workload import load_workload

TORCH_WORKLOAD = "gpt2-xl"
CACHE_NAME = "torch_memory_cache.json"
SCALING_WORKERS = (1, 2, 4, 8)


# ---------------------------------------------------------------- scaling lines


def scaling_curves(held_out: Sequence[HeldOut], profile, *, steps: int,
                   seed: int, ps_steps: int | None = None) -> dict[str, dict[str, Any]]:
    """Per strategy, the model's throughput at 1-8 workers for its first timed-wait
    configuration without stragglers, and the keys of the runs that share its settings;
    with the rows' own timed steps (protocol.timed_steps)."""
    curves = {}
    for h in held_out:
        if not h.timed_wait or h.speed or h.link_rate_Gbps or h.strategy in curves:
            continue
        family = [g.key for g in held_out if g.timed_wait and not g.speed
                  and (g.strategy, g.workload, g.batch, g.options) ==
                  (h.strategy, h.workload, h.batch, h.options)]
        workers = sorted(set(SCALING_WORKERS) | {g.workers for g in held_out if g.key in family})
        thr = []
        for n in workers:
            g = dataclasses.replace(h, workers=n)
            scenario = scenario_for(g, profile, steps=timed_steps(g, steps, ps_steps), seed=seed)
            p = predict(g.strategy, scenario, **model_options(g))
            thr.append(p.summary.throughput_samples_per_s)
        curves[h.strategy] = {"workers": workers, "throughput": thr, "keys": family,
                              "label": f"{h.workload} b{h.batch}, timed-wait"}
    return curves


def memory_twins(held_out: Sequence[HeldOut], predictions: Sequence[dict[str, Any]],
                 profile, set_a_configs: Sequence[dict[str, Any]], *, seed: int = 0
                 ) -> dict[str, str]:
    """Held-out key -> the set-A training run whose modelled per-worker peak memory is the
    same: same family, workload and workers, and nothing that changes
    memory in the model (a straggler or a slower link does not). Their memory is in-sample.
    """
    twins: dict[str, str] = {}
    by_key = {p["key"]: p for p in predictions}
    seen: dict[tuple, dict[str, float]] = {}
    for c in set_a_configs:
        kind = c.get("kind")
        if kind not in ("ddp", "fsdp", "ps") or not c.get("workload"):
            continue
        options = dict((c.get("options") or {}).get(kind) or {})
        strategy = (f"{options.get('mode', 'sync')}-ps" if kind == "ps" else kind)
        a = HeldOut(key="set-a", what="", strategy=strategy, workload=c["workload"],
                    workers=int(c["workers"]), batch_size=c.get("batch_size"),
                    options=options)
        label = f"{strategy} {a.workload} x{a.workers} b{a.batch}"
        sig = (a.kind, a.workload, a.workers)
        if (sig, label) in seen:
            continue
        p = predict(a.strategy, scenario_for(a, profile, steps=2, seed=seed),
                    **model_options(a))
        w = p.memory["worker"]
        seen[(sig, label)] = {"peak": float(w.peak_bytes), "label": label}
    for h in held_out:
        pred = by_key.get(h.key)
        if pred is None or h.timed_wait:
            continue
        for (sig, label), m in seen.items():
            if sig == (h.kind, h.workload, h.workers) and math.isclose(
                    m["peak"], float(pred["peak_memory_bytes"]), rel_tol=1e-9):
                twins[h.key] = label
    return twins


def timeline_key(rows: Sequence[Comparison]) -> str | None:
    """The configuration drawn as a timeline: DDP at 4 timed-wait workers if there is one."""
    for wanted in (lambda r: r.strategy == "ddp" and r.mode == "timed-wait" and r.workers == 4,
                   lambda r: r.strategy == "ddp", lambda r: True):
        for r in rows:
            if wanted(r):
                return r.key
    return None


# ---------------------------------------------------------------- PyTorch's memory estimate


def torch_memory_rows(ranks_spec: str | None) -> tuple[list[dict[str, Any]], str]:
    """(rows of perfmodel vs PyTorch for GPT-2 XL, a note on how they were made)."""
    if ranks_spec is None or ranks_spec.strip().lower() == "none":
        return [], "Not computed in this run (--quick, or --torch-memory none)."
    try:
        ranks = sorted({int(r) for r in ranks_spec.split(",") if r.strip()})
    except ValueError:
        raise PerfmodelError(f"--torch-memory '{ranks_spec}' is not a comma-separated list "
                             f"of rank counts (or 'none')") from None
    if not ranks or min(ranks) < 1:
        raise PerfmodelError("--torch-memory needs rank counts of at least 1")
    jobs = ([("fsdp", n, "full-shard") for n in ranks] + [("fsdp", ranks[0], "grad-op"),
                                                        ("ddp", ranks[0], "")])
    version = _torch_version()
    cache_path = data_home() / CACHE_NAME
    cache = _read_cache(cache_path)

    def key(job) -> str:
        return json.dumps([TORCH_WORKLOAD, *job, version])

    todo = [j for j in jobs if key(j) not in cache]
    if todo:
        args = ["--workload", TORCH_WORKLOAD,
                "--fsdp", ",".join(str(n) for s, n, v in todo if v == "full-shard"),
                "--grad-op", ",".join(str(n) for s, n, v in todo if v == "grad-op"),
                "--ddp", ",".join(str(n) for s, n, v in todo if s == "ddp")]
        for r in run_torch_memory(args):
            cache[key((r["strategy"], r["ranks"], r["variant"]))] = r
        _write_cache(cache_path, cache)
    rows = [_with_model(cache[key(j)]) for j in jobs]
    seconds = sum(cache[key(j)]["seconds"] for j in jobs)
    note = (f"PyTorch {version}'s own trackers ({rows[0]['method']}; DDP: "
            f"{rows[-1]['method']}) on the real GPT-2 XL module of measure/models.py, batch "
            f"{rows[0]['batch_size']}, one steady training step "
            f"(measure/torch_memory.py; {seconds:.0f} s of CPU when computed; "
            f"{'computed in this run' if todo else 'reused from ' + str(cache_path)}). "
            f"perfmodel's side is its analytic model (perfmodel/memory.py) without framework "
            f"overhead, which the trackers cannot see. Mixed precision differs by design: "
            f"perfmodel counts ZeRO's 2+2+12 bytes per parameter (bf16 weights and "
            f"gradients, fp32 master and Adam); FSDP2 keeps fp32 sharded parameters and "
            f"gradients (the same 16 bytes in other parts); DDP with autocast keeps fp32 "
            f"parameters, gradients and buckets plus bf16 weight copies, which perfmodel "
            f"does not model.")
    return rows, note


def run_torch_memory(args: list[str]) -> list[dict[str, Any]]:
    """PyTorch's estimates, in a process of their own (they import torch, fake a process
    group and take seconds to minutes each)."""
    done = subprocess.run([sys.executable, "-m", "measure.torch_memory", "--json",
                           *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PerfmodelError(f"PyTorch's memory estimate failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _with_model(r: dict[str, Any]) -> dict[str, Any]:
    """A tracker result with perfmodel's analytic peak for the same job beside it."""
    base = load_cluster("a100")
    cluster = dataclasses.replace(base, device=dataclasses.replace(
        base.device, framework_overhead_GiB=0.0, memory_overhead_fraction=0.0))
    sc = Scenario(cluster=cluster, workload=load_workload(r["workload"]), workers=r["ranks"],
                  batch_size=r["batch_size"])
    m = (fsdp_memory(sc, r["variant"], 1) if r["strategy"] == "fsdp"
         else ddp_memory(sc, 25.0, 1.0))
    label = f"FSDP {r['variant']}" if r["strategy"] == "fsdp" else "DDP (autocast bf16)"
    return {"label": label, "ranks": r["ranks"], "model_bytes": m.peak_bytes,
            "torch_bytes": r["peak_bytes"], "torch_parts": r["parts"], "method": r["method"],
            "batch_size": r["batch_size"], "seconds": r["seconds"]}


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise PerfmodelError("PyTorch's memory estimate needs torch; install it or pass "
                             "--torch-memory none") from None


def _read_cache(path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _write_cache(path, cache: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(path)


# ---------------------------------------------------------------- protocol and misses


def meta(*, command: str, cluster: str, data: dict[str, Any], here: str, set_a: dict,
         held_out: Sequence[HeldOut], repeats: int, steps: int, seed: int, found,
         notes: Sequence[str], wall_s: float, torch_note: str,
         ps_steps: int | None = None) -> dict[str, Any]:
    from calibration.hardware import detect
    from perfmodel.compare.protocol import today

    table = data.get("calibration") or {}
    loads = list(found.load.values())
    errors = [table.get(k) for k in ("network_rms_rel", "compute_rms_rel", "run_spread_cv")]
    step = table.get("step_rms_rel")
    if None in errors:
        interval = ("no prediction intervals: the calibration lacks network, compute or "
                    "run-spread errors")
    elif step is not None:
        f_n = median_variance_factor(repeats)
        interval = ("90 % prediction intervals for the median of the "
                    f"{repeats} repeats (perfmodel/uncertainty.py), log-normal with "
                    f"σ² = max(r_step² − s², 0) + s²·f({repeats}): the step-time residual of "
                    f"the runs set A fitted (r_step {step:.1%} RMS, in-sample: no held-out run "
                    f"is used), less one run's spread, which it holds, and set A's run-to-run "
                    f"spread (s {errors[2]:.1%} CV) shrunk for a median of {repeats} "
                    f"(f = {f_n:.3g})"
                    + (f"; timed-wait rows, whose compute is the model's own, take "
                       f"σ² = r_comm² + s²·f({repeats}), r_comm "
                       f"{table['step_comm_rms_rel']:.1%} (the same runs' residual with "
                       f"their measured compute)"
                       if table.get("step_comm_rms_rel") is not None else "")
                    + "; coverage counts a measured median inside its configuration's "
                      "interval")
    else:
        interval = ("90 % prediction intervals (perfmodel/uncertainty.py) from the profile's "
                    f"per-point residuals (network {errors[0]:.1%}, compute {errors[1]:.1%} "
                    f"RMS) and run-to-run spread {errors[2]:.1%}")
    ids = ", ".join(map(str, set_a["ids"])) or "(not recorded)"
    protocol = [
        f"Calibration set A: {set_a['source']}: runs {ids}"
        + (f" ({'; '.join(set_a['labels'])})" if set_a.get("labels") else "") + ".",
        f"Profile fitted from set A with calibration/from_store.py (`profile.toml`): "
        f"{data['provenance'].get('note', '')}.",
        f"Held-out set B: {len(held_out)} configurations, none of them in set A (checked). "
        f"All were predicted first (`predictions.json`, written before the first run), then "
        f"each was measured {repeats} times, runs interleaved; {steps} timed steps after "
        f"{WARMUP_STEPS} warm-up steps per run"
        + (f" ({ps_steps} for a parameter-server run: its staleness is a property of the "
           f"sequence of updates, perfmodel/compare/protocol.py PS_STEPS)"
           if ps_steps is not None and ps_steps != steps else "") + ".",
        "TIMED-WAIT runs (marked in the table): each worker's forward, backward and optimizer "
        "step is a sleep of the calibrated time, less the CPU work the worker does between "
        "its sleeps (measure/timed_wait.py, `Sleeper`), so 4-8 workers fit on 2 cores while "
        "gradients, all-reduces, all-gathers, PS pushes, pulls, the server's apply and every "
        "synchronisation stay real — what a GPU leaves to the CPU. They check "
        "communication, synchronisation and queueing, not compute. The store marks them "
        "oversubscribed (measure/launch.py counts processes, not busy cores).",
        "Held out from the fit, not from the modeller: set B is fixed in "
        "perfmodel/compare/protocol.py, and earlier comparisons of it on this machine led to "
        "model changes (CPU core sharing in collectives; per-kind collective time factors, "
        "fitted on set A's sweep — see `git log perfmodel/sim/collectives.py`). Every "
        "measurement below is new and nothing in the profile is fitted to set B.",
        f"Predictions are seeded (--seed {seed}): the same command gives the same "
        f"predictions from the same calibration runs.",
        interval + ".",
        *notes,
    ]
    return {"command": command, "cluster": cluster, "date": today(), "host": here,
            "hardware": detect().describe(),
            "versions": data["provenance"].get("versions", ""), "wall_s": wall_s,
            "load_range": (f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"),
            "protocol": protocol, "skipped": dict(found.skipped),
            "failed": {k: v for k, v in found.failed.items()}, "repeats": repeats,
            "steps": steps, "ps_steps": steps if ps_steps is None else ps_steps,
            "seed": seed, "set_a": set_a, "torch_memory_note": torch_note,
            "run_protocol": {str(i): p for i, p in getattr(found, "protocol", {}).items()}}


def why_missed(rows: Sequence[Comparison], loads: Sequence[float] = (),
               cores: int | None = None, overlap_slowdown: float | None = None) -> list[str]:
    """What the measurements say about the misses: the sign of the errors against the
    repeats' spread, which part of the step holds the gap (measured breakdown), the load
    before the runs, memory parts and staleness. Each line states numbers from this run;
    where they do not establish a cause, the line says the cause is not known. No line is a
    fixed explanation switched on by a threshold."""
    out = []
    for scope in ("real", "timed-wait"):
        chosen = [r for r in rows if r.mode == scope
                  and r.quantities["step_time"].error is not None]
        errs = [r.quantities["step_time"].error for r in chosen]
        spreads = [r.quantities["step_time"].spread for r in chosen
                   if r.quantities["step_time"].spread is not None]
        if len(errs) < 2:
            continue
        noise = float(np.median(spreads)) if spreads else None
        same = all(e > 0 for e in errs) or all(e < 0 for e in errs)
        line = (f"{scope} step time: errors from {min(errs):+.1%} to {max(errs):+.1%} "
                f"(median |error| {float(np.median(np.abs(errs))):.1%})")
        line += (f" against a median run-to-run spread of {noise:.1%}" if noise is not None
                 else "")
        if same:
            line += (f"; all {len(errs)} {'over' if errs[0] > 0 else 'under'}-predicted, "
                     "a bias of the model or its calibration rather than noise")
        elif noise is not None and float(np.median(np.abs(errs))) <= noise:
            line += "; of both signs and no larger than the noise"
        else:
            line += "; of both signs"
        out.append(line + ".")
    big = [r for r in rows if r.diagnosis]
    for part in ("compute", "communication + waiting"):
        hit = [r for r in big if f"mostly {part}" in r.diagnosis]
        if not hit:
            continue
        gaps = []
        for r in hit:
            p, m = r.predicted_breakdown, r.measured_breakdown
            a = p["compute_s"] if part == "compute" else p["comm_exposed_s"] + p["wait_s"]
            b = m["compute_s"] if part == "compute" else m["comm_wait_s"]
            gaps.append(f"{r.key} (model {a * 1e3:.1f} vs measured {b * 1e3:.1f} ms)")
        extra = (f"; the model stretches overlapped compute by the calibrated overlap "
                 f"slowdown {overlap_slowdown:.2f}x" if part == "compute" and
                 overlap_slowdown and any(r.strategy in ("ddp", "fsdp") for r in hit)
                 else "")
        out.append(f"{part} holds the largest gap in {', '.join(gaps)}{extra}. Why that "
                   f"part differs is not known: the runs record compute and "
                   f"communication + waiting per step, nothing finer.")
    cores = cores or os.cpu_count() or 1
    out += server_lines(rows)
    out += cpu_lines(rows, cores)
    if loads and not any(r.own_cores is not None for r in rows):
        own = sorted({r.workers + (1 if strategy_records.get(r.strategy).is_ps else 0)
                      for r in rows})
        out.append(f"1-minute load average before the runs: {min(loads):.1f}–"
                   f"{max(loads):.1f} on {cores} cores, while a run itself starts "
                   f"{own[0]}–{own[-1]} busy processes: the load average cannot separate "
                   f"other work from the run's own, so whether other work stretched these "
                   f"runs is not known.")
    mem = [r for r in rows if r.quantities["peak_memory"].error is not None
           and abs(r.quantities["peak_memory"].error) > 0.05 and r.measured_memory_parts]
    for r in mem:
        p, m = r.predicted_memory_parts, r.measured_memory_parts or {}
        part = max(p, key=lambda k: abs(p.get(k, 0) - m.get(k, 0)))
        known = (" perfmodel/memory.py's docstring says it leaves out FSDP2's flat "
                 "all-gather output and reduce-scatter input held next to the unsharded "
                 "parameters." if r.strategy == "fsdp" and part == "other" else
                 " Why is not known.")
        out.append(f"peak memory of {r.key} ({r.quantities['peak_memory'].error:+.0%}): the "
                   f"largest gap is in '{part}' (model {p.get(part, 0) / 2**20:.1f} MiB, "
                   f"measured {m.get(part, 0) / 2**20:.1f} MiB).{known}")
    for r in rows:
        err, _ = counts(r, "staleness_mean")
        if err is None or abs(err) <= 0.10:
            continue
        q = r.quantities["staleness_mean"]
        out.append(f"staleness of {r.key} off by {err:+.0%} (mean: model {q.predicted:.2f}, "
                   f"measured {q.measured:.2f}; W1 {r.staleness_w1:.2f} versions); the "
                   f"cause is not known (staleness.png shows where the distributions "
                   f"differ).")
    return out


CPU_BOUND = 0.9     # a run whose own processes keep this share of the cores busy is CPU-bound


def cpu_lines(rows: Sequence[Comparison], cores: int) -> list[str]:
    """What the CPU meter (measure/cpu_meter.py) says: how much other work ran beside the
    runs, and which runs were CPU-bound, with their step-time errors. Nothing where the runs
    did not record it."""
    seen = [r for r in rows if r.own_cores is not None]
    if not seen:
        return []
    own = [r.own_cores for r in seen]
    hosts = [r.host_cores for r in seen if r.host_cores is not None]
    others = [r.other_cores for r in seen if r.other_cores is not None]
    line = (f"CPU during the timed steps (medians over repeats): the runs' own processes kept "
            f"{min(own):.2f}–{max(own):.2f} of the {cores} cores busy")
    if hosts:
        worst = max(seen, key=lambda r: r.other_cores or 0.0)
        line += (f", the whole host {min(hosts):.2f}–{max(hosts):.2f}: other work took "
                 f"{min(others):.2f}–{max(others):.2f} cores (most beside {worst.key})")
    out = [line + "."]
    bound = [r for r in seen if r.mode == "timed-wait" and r.own_cores >= CPU_BOUND * cores]
    if bound:
        def err(r: Comparison) -> str:
            e = r.quantities["step_time"].error
            return "no step time" if e is None else f"step time {e:+.1%}"
        listed = "; ".join(f"{r.key} ({r.own_cores:.2f} cores, {err(r)})" for r in bound)
        out.append(
            f"Timed-wait runs that were CPU-bound (own processes >= {CPU_BOUND:.0%} of the "
            f"cores): {listed}. The model counts a timed-wait worker's compute as sleep that "
            f"leaves the cores free (perfmodel/compare/protocol.py); these numbers say the "
            f"runs' CPU work (communication copies, the server, each worker's own host work "
            f"between its sleeps) filled the cores instead.")
    return out


def server_lines(rows: Sequence[Comparison]) -> list[str]:
    """For each diagnosed PS configuration whose server recorded its phases: the measured
    time per update by phase beside the model's, and the phase with the largest gap."""
    out = []
    for r in rows:
        pairs = {k: v for k, v in r.server_phases.items()
                 if v[0] is not None and v[1] is not None}
        if not r.diagnosis or not pairs:
            continue
        worst = max(pairs, key=lambda k: abs(pairs[k][1] - pairs[k][0]))
        shown = ", ".join(f"{SERVER_PHASES[k]} {m * 1e3:.1f} vs {a * 1e3:.1f}"
                          for k, (a, m) in pairs.items())
        out.append(f"{r.key}: the server's time per update, measured vs model (ms): {shown} "
                   f"(sum {sum(m for _, m in pairs.values()) * 1e3:.1f} vs "
                   f"{sum(a for a, _ in pairs.values()) * 1e3:.1f}); the largest gap is in "
                   f"{SERVER_PHASES[worst]}.")
    return out
