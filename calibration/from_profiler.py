"""Fit a profile's compute terms from PyTorch profiler traces of a few training steps.

A trace (torch.profiler's Chrome/Kineto JSON, `.json` or `.json.gz`) recorded with
`with_stack=True` holds one `nn.Module: <Class>_<n>` event per module call. Each outermost
call is one forward of the model; its direct child calls are the workload's units in forward
order (the units of measure/models.py are an nn.Sequential's children), so the i-th child is
unit i. Time is attributed per unit, phase and op class (the classes of the workload files:
matmul, conv and attention are "matmul", every other op is memory-bound; perfmodel/workload.py
MATMUL_OPS):

- forward: the top-level ops inside the unit's call (on CPU their own time; on a GPU the
  kernels they launch, matched by the trace's `External id`), not the Python between them;
- backward: each `autograd::engine::evaluate_function: <Node>` event belongs to the unit whose
  forward op has the same `Sequence number` (the loss's to the last unit, which the workload
  files charge with it); its class is the node's op (AddmmBackward0 -> addmm: matmul).
  Gradient accumulation (AccumulateGrad, no sequence number) and the optimizer are left out.

The fit is the simulator's roofline (perfmodel/sim/compute.py `pass_seconds`), per unit pass
with F matmul FLOPs, B memory-bound bytes and k kernels (the workload file's, x the batch; x
backward_flops_ratio, backward_bytes_ratio and 2 for backward):

    memory_efficiency  = sum B / (HBM bandwidth x sum memory-bound time)       (one ratio;
                         above 1 where data stayed in caches, kept and noted)
    t = k x launch + F / (peak x efficiency(F)) + B / (bandwidth x memory_efficiency)

the second by calibration/fit.py `fit_latency_rate` (α = launch_us_per_kernel, the rate and its
curve = efficiency_by_flops relative to the device peak), with the median over steps of each
unit pass. compute.overhead_us_per_unit becomes 0: the launch term carries the fixed cost.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit import fit_latency_rate, fit_result, round_sig
from calibration.fit_compute import FLOPS_BIN_DECADES, MIN_FLOP_COUNTS
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import ClusterProfile, load_cluster, parse_profile, profile_paths
from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import unit_times
from perfmodel.workload import MATMUL_OPS, Workload

MODULE = "nn.Module: "
BACKWARD = "autograd::engine::evaluate_function: "
PHASES = ("forward", "backward")


@dataclass(frozen=True, kw_only=True, slots=True)
class PassTime:
    """One unit's forward or backward in one step: seconds by op class."""

    unit: str
    phase: str
    step: int
    matmul_s: float
    memory_s: float

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.memory_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Trace:
    path: Path
    device: str               # "CPU" or the GPU's name from deviceProperties
    passes: tuple[PassTime, ...]
    steps: int


def load_events(path: Path) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except OSError as e:
        raise PerfmodelError(f"{path}: cannot read: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:
        raise PerfmodelError(f"{path}: not a profiler trace (Chrome trace JSON): {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise PerfmodelError(f"{path}: no 'traceEvents' list: not a PyTorch profiler trace")
    return data


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


def _inside(e: dict, outer: dict) -> bool:
    return (e is not outer and e.get("tid") == outer.get("tid") and e["ts"] >= outer["ts"]
            and _end(e) <= _end(outer))


def _outermost(events: list[dict]) -> list[dict]:
    """Events not inside another of `events` (per thread), in time order."""
    out: list[dict] = []
    for e in sorted(events, key=lambda e: (e.get("tid"), e["ts"], -e.get("dur", 0.0))):
        if not out or not _inside(e, out[-1]):
            out.append(e)
    return sorted(out, key=lambda e: e["ts"])


def op_class(name: str) -> str:
    """'matmul' or 'memory' for an aten op or an autograd node name."""
    op = name.split("::")[-1].strip()
    if op.endswith("0") or "Backward" in op:
        op = re.sub(r"Backward\d*$", "", op)
        op = re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()
    return "matmul" if op in MATMUL_OPS or f"_{op}" in MATMUL_OPS else "memory"


def attribute(data: dict[str, Any], path: Path, units: Sequence[str]) -> Trace:
    """Per step, unit, phase and op class: the seconds the trace spent."""
    events = [e for e in data["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    modules = [e for e in events if str(e.get("name", "")).startswith(MODULE)]
    if not modules:
        raise PerfmodelError(f"{path}: no 'nn.Module: ...' events; record the trace with "
                             f"torch.profiler.profile(with_stack=True) so unit calls are in it")
    roots = _outermost(modules)
    spans: list[tuple[dict, str, int]] = []             # (module call, unit, step)
    for step, root in enumerate(roots):
        children = _outermost([m for m in modules if _inside(m, root)])
        if len(children) != len(units):
            raise PerfmodelError(
                f"{path}: the model call at ts {root['ts']:.0f} us has {len(children)} child "
                f"modules, but the workload has {len(units)} units ({', '.join(units)}); "
                f"trace the workload's own model, whose children are its units")
        spans += [(c, u, step) for c, u in zip(children, units, strict=True)]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    forward: dict[int, tuple[str, int]] = {}             # sequence number -> (unit, step)
    where: dict[int, tuple[str, str, int]] = {}          # id(op) -> (unit, phase, step)
    for span, unit, step in spans:
        for op in ops:
            if _inside(op, span):
                where[id(op)] = (unit, "forward", step)
                if "Sequence number" in op.get("args", {}):
                    forward[op["args"]["Sequence number"]] = (unit, step)
    seqs = sorted(forward)
    nodes = [e for e in ops if e["name"].startswith(BACKWARD)
             and "Sequence number" in e.get("args", {})]
    for node in nodes:
        i = bisect.bisect_right(seqs, node["args"]["Sequence number"]) - 1
        if i >= 0:
            unit, step = forward[seqs[i]]
            where[id(node)] = (unit, "backward", step)
            for op in ops:
                if _inside(op, node):
                    where[id(op)] = (unit, "backward", step)
    totals: dict[tuple[str, str, int], dict[str, float]] = defaultdict(
        lambda: {"matmul": 0.0, "memory": 0.0})
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if kernels:
        by_id = {op["args"]["External id"]: op for op in ops if "External id" in op.get("args", {})}
        for k in kernels:
            op = by_id.get(k.get("args", {}).get("External id"))
            if op is not None and id(op) in where:
                name = op["name"].removeprefix(BACKWARD)
                totals[where[id(op)]][op_class(name)] += k.get("dur", 0.0) * 1e-6
    else:
        counted = [*(op for span, _, _ in spans
                     for op in _outermost([o for o in ops if _inside(o, span)])), *nodes]
        for op in counted:
            if id(op) in where:
                name = op["name"].removeprefix(BACKWARD)
                totals[where[id(op)]][op_class(name)] += op.get("dur", 0.0) * 1e-6
    passes = tuple(PassTime(unit=u, phase=p, step=s, matmul_s=v["matmul"], memory_s=v["memory"])
                   for (u, p, s), v in sorted(totals.items(), key=lambda kv: kv[0][2]))
    props = data.get("deviceProperties") or []
    device = props[0].get("name", "GPU") if kernels and props else "CPU"
    return Trace(path=path, device=device, passes=passes, steps=len(roots))


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitPass:
    """A unit pass's median seconds over the traces' steps, beside its workload counts."""

    unit: str
    phase: str
    matmul_s: float
    memory_s: float
    flops: float
    moved_bytes: float
    kernels: float

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.memory_s


def unit_passes(traces: Sequence[Trace], workload: Workload, batch: int,
                base: ClusterProfile) -> list[UnitPass]:
    c = base.compute
    scale = workload.element_bytes / workload.activation_element_bytes
    out = []
    for u in workload.units:
        for phase in PHASES:
            mine = [p for t in traces for p in t.passes if p.unit == u.name and p.phase == phase]
            if not mine:
                continue
            back = phase == "backward"
            out.append(UnitPass(
                unit=u.name, phase=phase,
                matmul_s=float(np.median([p.matmul_s for p in mine])),
                memory_s=float(np.median([p.memory_s for p in mine])),
                flops=u.forward_flops_per_sample * batch * (c.backward_flops_ratio if back
                                                            else 1.0),
                moved_bytes=scale * u.forward_bytes_per_sample * batch * (
                    c.backward_bytes_ratio if back else 1.0),
                kernels=u.forward_kernels * (2 if back else 1)))
    return out


def fit_compute_terms(passes: Sequence[UnitPass], base: ClusterProfile, precision_key: str
                      ) -> dict[str, Any]:
    """memory_efficiency, launch_us_per_kernel and efficiency_by_flops, with residuals."""
    bw = base.device.memory_bandwidth_GBps * 1e9
    mem = [p for p in passes if p.moved_bytes > 0 and p.memory_s > 0]
    if not mem:
        raise PerfmodelError("the traces show no memory-bound op time in any unit")
    memory_efficiency = sum(p.moved_bytes for p in mem) / (bw * sum(p.memory_s for p in mem))
    notes = [] if memory_efficiency <= 1 else [
        f"memory-bound ops ran at {memory_efficiency:.2f}x the base profile's "
        f"{base.device.memory_bandwidth_GBps:g} GB/s (data in caches); kept as fitted"]
    use = [p for p in passes if p.flops > 0]
    flops = np.array([p.flops for p in use])
    bins = np.unique(np.round(np.log10(flops) / FLOPS_BIN_DECADES))
    if bins.size < MIN_FLOP_COUNTS:
        raise PerfmodelError(f"compute: the traced units have {bins.size} distinct FLOP "
                             f"counts; the fit needs >= {MIN_FLOP_COUNTS} (a model with "
                             f"units of different sizes, or traces at several batch sizes)")
    times = np.array([p.total_s for p in use])
    known = np.array([p.moved_bytes / (bw * memory_efficiency) for p in use])
    fit = fit_latency_rate(np.array([p.kernels for p in use], float), flops, flops, times,
                           known, names=("compute.launch_us_per_kernel",
                                         "compute.efficiency_by_flops"),
                           what=f"{len(use)} unit passes from profiler traces",
                           bin_decades=FLOPS_BIN_DECADES)
    peak = base.device.peak_TFLOPS.get(precision_key, base.device.peak_TFLOPS["fp32"])
    best = fit.rate / (peak * 1e12)
    if best > 1:
        raise PerfmodelError(f"compute.efficiency_by_flops: the traced units reach "
                             f"{fit.rate / 1e12:.4g} TFLOP/s, {best:.2f}x the base profile's "
                             f"peak of {peak:g}; pick a --base with the device's real peak")
    mem_rel = np.array([p.moved_bytes / (bw * memory_efficiency) / p.memory_s - 1 for p in mem])
    return {
        "memory_efficiency": round_sig(memory_efficiency, 4),
        "launch_us_per_kernel": max(fit.latency * 1e6, 0.0),
        "efficiency_by_flops": [[float(x), round_sig(e * best, 4)] for x, e in fit.curve],
        "notes": notes,
        "residuals": [
            fit_result("compute.memory_efficiency", memory_efficiency, 0.0, mem_rel),
            fit_result("compute.launch_us_per_kernel", fit.latency * 1e6,
                       fit.latency_stderr * 1e6, fit.rel),
            fit_result("compute.achieved_TFLOPS", fit.rate / 1e12, fit.rate_stderr / 1e12,
                       fit.rel)],
    }


def choose_base(name: str, base: str | None, traces: Sequence[Trace]) -> str:
    known = profile_paths()
    if base:
        return base
    if name in known:
        return name
    devices = {t.device for t in traces}
    if devices == {"CPU"}:
        return "local"
    for profile in sorted(known):
        if load_cluster(profile).device.name in devices:
            return profile
    raise PerfmodelError(f"no profile describes the traces' device ({', '.join(devices)}); "
                         f"name the profile the rest comes from with --base")


def fit_traces(paths: Sequence[Path], *, name: str, workload: Workload, batch: int,
               base: str | None = None) -> tuple[dict[str, Any], list[UnitPass]]:
    """The profile's data (TOML layout) with its compute fitted from the traces."""
    if not paths:
        raise PerfmodelError("--from-profiler needs at least one trace file")
    units = [u.name for u in workload.units]
    traces = [attribute(load_events(Path(p)), Path(p), units) for p in paths]
    profile = load_cluster(choose_base(name, base, traces))
    passes = unit_passes(traces, workload, batch, profile)
    terms = fit_compute_terms(passes, profile, workload.precision_spec.compute_key)
    info = RunInfo(host="profiler traces", device_names=tuple(t.device for t in traces),
                   versions="torch profiler (Kineto) traces",
                   runs=sum(t.steps for t in traces))
    data = build_profile(name, profile, MeasuredFits(), info)
    data["compute"].update({k: terms[k] for k in ("memory_efficiency", "launch_us_per_kernel",
                                                  "efficiency_by_flops")},
                           overhead_us_per_unit=0.0)
    fields = ["compute.efficiency_by_flops", "compute.launch_us_per_kernel",
              "compute.memory_efficiency", "compute.overhead_us_per_unit"]
    cal = data["calibration"]
    cal["measured"] = fields
    if terms["notes"]:
        cal["notes"] = terms["notes"]
    cal["unmeasured"] = [f for f in cal["unmeasured"] if f not in fields]
    cal["residuals"] = {r.parameter: {"value": r.value, "stderr": r.stderr,
                                      "rms_rel": r.rms_rel, "max_rel": r.max_rel,
                                      "points": r.points} for r in terms["residuals"]}
    files = [str(Path(p).resolve()) for p in paths]
    data["provenance"].update(
        traces=files, workload=workload.name, batch_size=batch,
        note=(f"compute fitted by perfmodel calibrate --from-profiler from {len(files)} trace(s) "
              f"of '{workload.name}' at batch {batch} ({info.runs} steps); everything else "
              f"comes from the '{profile.name}' profile ({profile.provenance.source})"))
    fitted = parse_profile(data, Path(f"{name}.toml"))
    cal["unit_pass_reproduction"] = summarise(reproduce(fitted, workload, batch, passes))
    if cal["unit_pass_reproduction"]["points"]:
        cal["compute_rms_rel"] = cal["unit_pass_reproduction"]["rms_rel"]
    return data, passes


def reproduce(profile: ClusterProfile, workload: Workload, batch: int,
              passes: Sequence[UnitPass]) -> list[tuple[UnitPass, float]]:
    """Each traced unit pass beside the seconds `profile` predicts for it."""
    times = unit_times(profile, workload, batch, optimizer_param_fraction=0.0)
    index = {u.name: i for i, u in enumerate(workload.units)}
    return [(p, float((times.forward_s if p.phase == "forward" else times.backward_s)
                      [index[p.unit]])) for p in passes]


def summarise(rows: Sequence[tuple[UnitPass, float]]) -> dict[str, float | int]:
    rel = np.array([abs(model / p.total_s - 1) for p, model in rows if p.total_s > 0])
    return {"points": int(rel.size), "rms_rel": float(np.sqrt(np.mean(rel**2))),
            "max_rel": float(rel.max())} if rel.size else {"points": 0}
