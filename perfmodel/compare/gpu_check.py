"""`perfmodel gpu-check`: measure this GPU, calibrate its compute, and report perfmodel's
spec-profile and calibrated predictions beside what was measured.

    perfmodel gpu-check [--out reports/gpu-check-<date>] [--budget-s 420]

The pieces: measure/gpu_check.py measures each case (unit passes, training steps, peak
memory), calibration/gpu_check.py fits the compute of a profile on the unit passes and
optimizer steps only, this module predicts every case's step time and peak memory with the
spec profile of this GPU and with the calibrated one and hands the numbers to
perfmodel/compare/gpu_check_report.py. Step times and peaks are held out: nothing is fitted
on them.

Cases: every workload x precision, at the workload's default batch; GPT-2 XL cut to
DEFAULT_BLOCKS blocks (embeddings, blocks, tied head) to keep the check short. A case whose
spec-predicted peak would exceed FIT_FRACTION of this GPU's memory is cut further (blocks
halved, then the batch) and the report says so. The time budget is shared out: case i must
finish by start + budget x (the spec-predicted step times of cases 0..i) / (all of them),
so a case expected to take longer gets more of the budget (`deadlines`; time a case leaves
unused carries over), each
case stops where it is at its deadline and the report names what it skipped.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calibration.gpu_check import cut_workload, fit_gpu, profile_text
from perfmodel.cluster import ClusterProfile, load_cluster
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.scenario import Scenario

DEFAULT_WORKLOADS = ("resnet50", "bert-large", "gpt2-xl")
DEFAULT_PRECISIONS = ("tf32", "bf16-mixed")
DEFAULT_BLOCKS = {"gpt2-xl": 8}     # middle units kept by default (the rest: full depth)
BUDGET_S = 420.0                    # measuring; torch start-up and the fit come on top
FIT_FRACTION = 0.7                  # of the GPU's memory a case may be predicted to use
MEASURABLE = ("fp32", "tf32", "bf16-mixed")     # measure/gpu_check.py PRECISIONS


def check_names(workloads: Sequence[str], precisions: Sequence[str]) -> None:
    """Refuse unknown workloads and precisions before anything is measured."""
    from perfmodel.workload import workload_paths

    known = workload_paths()
    for name in workloads:
        if name not in known:
            raise PerfmodelError(f"unknown workload '{name}'; choose from "
                                 f"{', '.join(sorted(known))}")
    for precision in precisions:
        if precision not in MEASURABLE:
            raise PerfmodelError(f"gpu-check measures precisions {', '.join(MEASURABLE)}; "
                                 f"not '{precision}'")


def predicted(cluster: ClusterProfile, workload: str, precision: str, blocks: int | None,
              batch: int) -> dict[str, float]:
    """perfmodel's DDP step at 1 worker: mean step seconds and the peak the caching
    allocator would see (the peak less the CUDA context, which max_memory_allocated
    does not count)."""
    w = cut_workload(workload, precision, blocks)
    p = predict("ddp", Scenario(cluster=cluster, workload=w, workers=1, batch_size=batch))
    m = p.memory["worker"]
    return {"step_s": p.summary.step_time_s.mean,
            "allocated_bytes": m.peak_bytes - m.framework_bytes,
            "phase": m.phase}


def plan(workloads: Sequence[str], precisions: Sequence[str], base: ClusterProfile,
         memory_bytes: float, batch: int | None = None,
         blocks: int | None = None) -> list[dict[str, Any]]:
    """The cases to measure, each cut (blocks, then batch) until its spec-predicted peak
    fits FIT_FRACTION of `memory_bytes` (0: no limit)."""
    check_names(workloads, precisions)
    cases = []
    for name in workloads:
        for precision in precisions:
            w = cut_workload(name, precision, None)
            b = batch or w.batch_size
            k = blocks if blocks is not None else DEFAULT_BLOCKS.get(name)
            notes = []
            while True:
                spec = predicted(base, name, precision, k, b)
                if not (memory_bytes > 0
                        and spec["allocated_bytes"] > FIT_FRACTION * memory_bytes):
                    break
                middle = k if k is not None else len(w.units) - 2
                if middle > 1:
                    k = middle // 2
                    notes.append(f"cut to {k} blocks to fit")
                elif b > 1:
                    b //= 2
                    notes.append(f"batch halved to {b} to fit")
                else:
                    raise PerfmodelError(f"{name} at {precision} does not fit this GPU even "
                                         f"at one block and batch 1")
            cases.append({"workload": name, "precision": precision, "batch_size": b,
                          "blocks": k, "notes": notes,
                          "step_s": spec["step_s"]})
    return cases


def deadlines(start: float, budget_s: float, step_s: Sequence[float]) -> list[float]:
    """When each case must be done: the budget shared out in proportion to each case's
    predicted step time (its unit passes and steps scale with it), cumulatively, so the
    last deadline is start + budget and time a case leaves unused carries over. Run 3 on
    an H200 (2026-12-04) shared 90 s equally over fp32, TF32 and BF16 GPT-2 XL cases and
    the fp32 one, 3x the others' step time, ran out before its training steps."""
    weights = [max(float(s), 1e-6) for s in step_s]
    total, done, out = sum(weights), 0.0, []
    for w in weights:
        done += w
        out.append(start + budget_s * done / total)
    return out


def compare(measured: Sequence[dict[str, Any]], base: ClusterProfile, *,
            device: dict[str, Any], budget_s: float,
            elapsed_s: float) -> tuple[dict[str, Any], Any]:
    """(the report's numbers, the GpuFit): calibrate on the unit passes and optimizer
    steps, predict every case with both profiles."""
    fit = fit_gpu(base, measured)
    spec_rel = _unit_pass_errors(base, measured)
    rows = []
    for c in measured:
        row = {k: c.get(k) for k in ("workload", "precision", "batch_size", "blocks",
                                     "notes", "skipped", "params")}
        if "step" in c:
            row["measured"] = {"step_s": c["step"]["median_s"],
                               "step_iqr_s": c["step"]["iqr_s"],
                               "allocated_bytes": c["memory"]["peak_bytes"],
                               "reserved_bytes": c["memory"].get("max_reserved_bytes", 0),
                               "memory_method": c["memory"]["method"]}
            for label, cluster in (("spec", base), ("calibrated", fit.profile)):
                row[label] = predicted(cluster, c["workload"], c["precision"], c["blocks"],
                                       c["batch_size"])
        rows.append(row)
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device, "base_profile": base.name,
            "base_label": "spec" if base.provenance.source == "spec" else "base",
            "base_note": "" if base.provenance.source == "spec" else base.provenance.note,
            "calibrated_profile": fit.profile.name,
            "budget_s": budget_s, "elapsed_s": elapsed_s, "loadavg": list(os.getloadavg()),
            "fit": {"e_max": fit.e_max, "flops_half": 10 ** fit.log_flops_half,
                    "memory_efficiency": fit.memory_efficiency,
                    "launch_us_per_kernel": fit.launch_us_per_kernel,
                    "optimizer_GBps": fit.optimizer_GBps,
                    "by_precision": {k: {"e_max": e, "launch_us_per_kernel": u}
                                     for k, (e, u) in fit.by_precision.items()},
                    "unit_passes": len(fit.unit_pass_rel),
                    "unit_pass_rel_calibrated": list(fit.unit_pass_rel),
                    "unit_pass_rel_spec": spec_rel,
                    "spec": {"memory_efficiency": base.compute.memory_efficiency,
                             "launch_us_per_kernel": base.compute.launch_us_per_kernel,
                             "optimizer_GBps": base.compute.optimizer_GBps,
                             "allocator_reserve_fraction":
                                 base.device.allocator_reserve_fraction}},
            "cases": rows}, fit


def _unit_pass_errors(cluster: ClusterProfile, measured) -> list[float]:
    from calibration.gpu_check import predicted_passes

    out = []
    for c in measured:
        if c.get("unit_passes"):
            w = cut_workload(c["workload"], c["precision"], c["blocks"])
            pred = predicted_passes(cluster, w, c["unit_passes"])
            out += [float(p / m["median_s"] - 1) for p, m in zip(pred, c["unit_passes"],
                                                                   strict=True)]
    return out


def run_check(out: Path, *, workloads: Sequence[str] = DEFAULT_WORKLOADS,
              precisions: Sequence[str] = DEFAULT_PRECISIONS, budget_s: float = BUDGET_S,
              cluster: str | None = None, batch: int | None = None,
              blocks: int | None = None, device: str | None = None,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure, calibrate, compare and write `out`/report.md, results.json, measured.json
    and the calibrated profile. `device` None: this machine's first CUDA GPU (or a
    PerfmodelError saying there is none); "cpu" runs the same path on the CPU (tests)."""
    import json

    from measure import gpu_check as gm

    start = time.monotonic()
    device = device or gm.cuda_device()
    info = gm.device_info(device)
    base = load_cluster(cluster or _base_profile(device))
    cases = plan(workloads, precisions, base, info["memory_bytes"], batch, blocks)
    say(f"gpu-check on {info['name']} against profile '{base.name}': {len(cases)} cases, "
        f"budget {budget_s:.0f} s")
    measured = []
    due = deadlines(start, budget_s, [c["step_s"] for c in cases])
    try:
        for i, (c, deadline) in enumerate(zip(cases, due, strict=True)):
            say(f"[{i + 1}/{len(cases)}] {c['workload']} {c['precision']} batch "
                f"{c['batch_size']}" + (f", {c['blocks']} blocks" if c["blocks"] else "")
                + f" (by {deadline - start:.0f} s)")
            case = gm.Case(workload=c["workload"], precision=c["precision"],
                           batch_size=c["batch_size"], blocks=c["blocks"])
            try:
                record = gm.measure_case(case, device, deadline, say)
            except Exception as e:      # an OOM or a missing kernel loses one case, not all
                why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
                say(f"  failed: {why}")
                record = {"workload": c["workload"], "precision": c["precision"],
                          "batch_size": c["batch_size"], "blocks": c["blocks"],
                          "unit_passes": [], "skipped": [f"the whole case (failed: {why})"]}
            measured.append({**record, "notes": c["notes"]})
            _save(out / "measured.json", json.dumps(measured, indent=1) + "\n")
    finally:
        gm.close()
    say(f"calibrating on {sum(len(c['unit_passes']) for c in measured)} unit passes")
    results, fit = compare(measured, base, device=info, budget_s=budget_s,
                           elapsed_s=time.monotonic() - start)
    (out / f"{fit.profile.name}.toml").write_text(profile_text(
        base.name, fit, f"perfmodel gpu-check on {info['name']}, {results['date']}"),
        encoding="utf-8")
    from perfmodel.compare.gpu_check_report import write_report
    write_report(results, out)
    say(f"wrote {out}/report.md ({time.monotonic() - start:.0f} s)")
    return results


def _save(path: Path, text: str) -> None:
    """Write `text` whole (a temporary file renamed over `path`): after every case, so a
    crash or a Ctrl-C keeps the cases measured so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _base_profile(device: str) -> str:
    """The shipped profile of this GPU (calibration/hardware.py's choice)."""
    from calibration.hardware import choose_base, detect

    if not device.startswith("cuda"):
        return "local"
    return choose_base("gpu-check", detect()).base


def rebuild(measured_path: Path, out: Path, cluster: str) -> dict[str, Any]:
    """The report and the calibrated profile again from a saved measured.json (no GPU
    needed)."""
    import json

    from perfmodel.compare.gpu_check_report import write_report

    try:
        measured = json.loads(measured_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PerfmodelError(f"cannot read gpu-check measurements {measured_path}: {e}") from e
    base = load_cluster(cluster)
    results, fit = compare(measured, base, device={"name": "(from measured.json)"},
                           budget_s=0.0, elapsed_s=0.0)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{fit.profile.name}.toml").write_text(profile_text(
        base.name, fit, f"perfmodel gpu-check --from-measured {measured_path}, "
        f"{results['date']}"), encoding="utf-8")
    write_report(results, out)
    return results

