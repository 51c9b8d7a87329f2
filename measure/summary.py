"""What a person reads about one stored run: its summary (a dict for --json) and the text.

`summarize` works from the run's stored records (measure/store.py Run), never from the
launcher, so a run summarised now and one read back from the store later say the same.
Collective sweeps print in nccl-tests' columns (doc/PERFORMANCE.md: size count type redop
time algbw busbw); elastic runs add one line per recovery or membership change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from measure.recorder import read_records

MIB = 2**20
NCCL_TYPE = {"float32": "float", "float16": "half", "float64": "double"}  # nccl-tests names
ELASTIC_EVENTS = ("recovery", "membership", "left", "join_sent")


def summarize(run) -> dict[str, Any]:
    """The numbers a person wants after a run, from its stored records (measure.store.Run)."""
    row = run.row
    out: dict[str, Any] = {
        "run_id": row.id, "kind": row.kind, "status": row.status, "reason": row.reason,
        "workload": row.workload, "workers": row.workers, "world_size": row.world_size,
        "backend": row.backend, "wall_s": row.wall_s, "oversubscribed": bool(row.oversubscribed),
        "link_rate_Gbps": row.link_rate_Gbps,
    }
    seen = row.config.get("protocol")
    if seen:                            # measure/protocol.py: the wait and the pinning
        out["protocol"] = seen
    steps = run.table("steps")
    if steps:
        wall = np.array([s["wall_s"] for s in steps], dtype=float)
        q1, med, q3 = np.percentile(wall, [25, 50, 75])
        reported = [s["value"] for s in run.table("summaries")
                    if s["key"] == "throughput_samples_per_s"]
        if reported:
            throughput = max(reported)
        else:       # each rank's own rate, summed
            throughput = sum(
                sum(s["samples"] or 0 for s in mine) / sum(s["wall_s"] for s in mine)
                for r in {s["rank"] for s in steps}
                if (mine := [s for s in steps if s["rank"] == r]))
        last = {s["rank"]: s["loss"] for s in steps if s["loss"] is not None}
        out |= {"throughput_samples_per_s": throughput,
                "step_time_s": {"median": med, "iqr": q3 - q1, "count": len(steps)},
                "compute_s_median": float(np.median([s["compute_s"] for s in steps])),
                "comm_wait_s_median": float(np.median([s["comm_wait_s"] for s in steps])),
                "final_loss": float(np.mean(list(last.values()))) if last else None}
    memory = run.table("memory")
    if memory:
        out["peak_memory_bytes"] = {str(m["rank"]): m["peak_bytes"] for m in memory}
        out["memory_method"] = memory[0].get("method")
    updates = run.table("updates")
    if updates:
        tau = np.array([u["staleness"] for u in updates], dtype=float)
        out["staleness"] = {"mean": float(tau.mean()), "max": float(tau.max()),
                            "updates": len(updates)}
    evals = run.table("evals")
    if evals:
        final = max(evals, key=lambda e: (e["step"] or 0))
        out["accuracy"] = final.get("accuracy")
    if run.table("collectives"):
        out["collectives"] = [{k: c[k] for k in ("op", "bytes", "count", "dtype", "time_s",
                                                 "algbw_GBps", "busbw_GBps", "busbw_factor")}
                              for c in run.table("collectives")]
        out["ranks"] = [{"rank": r["rank"], "host": r.get("host") or row.host or "localhost",
                         "device": r.get("device") or row.device or "cpu"}
                        for r in sorted(run.table("ranks"), key=lambda r: r["rank"])]
    if run.table("compute"):
        out["compute"] = [{k: c.get(k) for k in ("unit", "batch_size", "pass", "median_s",
                                                 "iqr_s", "repeats")}
                          for c in run.table("compute")]
    return out


def render(s: dict[str, Any]) -> str:
    head = (f"run {s['run_id']}: {s['kind']}"
            + (f" {s['workload']}" if s.get("workload") else "")
            + f", {_processes(s['world_size'])} ({s['backend'] or '?'})"
            + (f", link capped at {s['link_rate_Gbps']:g} Gbit/s" if s["link_rate_Gbps"] else "")
            + (", OVERSUBSCRIBED" if s["oversubscribed"] else "")
            + f": {s['status'].upper()}" + (f" — {s['reason']}" if s["reason"] else ""))
    lines = [head]
    if s.get("protocol"):
        p = s["protocol"]
        load = (f"1-min load {p['load_before']:.2f} -> {p['load_after']:.2f}"
                if p.get("load_before") is not None and p.get("load_after") is not None
                else "1-min load unknown")
        waited = (f" after waiting {p['waited_s']:.0f} s"
                  + ("" if p.get("settled") else " (did not settle)")
                  if "waited_s" in p else "")
        pinned = ("ranks pinned to cores " + ", ".join(str(c) for c in p["pin_cores"])
                  if p.get("pinned") else f"not pinned ({p.get('pin_skipped', '?')})")
        lines.append(f"  machine          {load}{waited}; {pinned}")
    if "step_time_s" in s:
        st = s["step_time_s"]
        lines += [f"  throughput       {s['throughput_samples_per_s']:,.1f} samples/s",
                  f"  step time        median {_ms(st['median'])}   IQR {_ms(st['iqr'])}   "
                  f"({st['count']} step records)",
                  f"  per step         compute {_ms(s['compute_s_median'])} | comm wait "
                  f"{_ms(s['comm_wait_s_median'])} (medians)"]
        if s.get("final_loss") is not None:
            lines.append(f"  final loss       {s['final_loss']:.4f}")
    if "peak_memory_bytes" in s:
        peaks = s["peak_memory_bytes"]
        lines.append(f"  peak memory      {max(peaks.values()) / MIB:,.1f} MiB max over ranks "
                     f"({s['memory_method']}): "
                     + ", ".join(f"r{r} {v / MIB:,.1f}" for r, v in peaks.items()))
    if "staleness" in s:
        t = s["staleness"]
        lines.append(f"  staleness        mean {t['mean']:.2f}, max {t['max']:.0f} over "
                     f"{t['updates']} updates")
    if s.get("accuracy") is not None:
        lines.append(f"  accuracy         {s['accuracy']:.4f} (held-out)")
    if "collectives" in s:
        lines.append(render_collectives(s["collectives"], s.get("ranks", ()),
                                        s["backend"]))
    if "compute" in s:
        lines.append(render_compute(s["compute"]))
    return "\n".join(lines)


def render_collectives(rows: list[dict], ranks=(), backend: str | None = None) -> str:
    """nccl-tests' layout: a '#  Rank N Group 0 Pid P on HOST device D' line per rank, then
    per collective a '# <op>' heading and the columns size count type redop time algbw busbw,
    so calibration/nccl_tests.py reads the output back (`perfmodel calibrate
    --from-nccl-tests`)."""
    out = ["#", "# Using devices"] if ranks else []
    out += [f"#  Rank {r['rank']:>2} Group  0 Pid {0:>6} on {r['host']:>10} device "
            f"{r['rank']:>2} [0x00] {r['device']} ({backend or '?'})" for r in ranks]
    for op in dict.fromkeys(r["op"] for r in rows):
        out += [f"# {op}",
                f"#{'size':>12} {'count':>12} {'type':>7} {'redop':>6} {'time':>10} "
                f"{'algbw':>8} {'busbw':>8}",
                f"#{'(B)':>12} {'(elements)':>12} {'':>7} {'':>6} {'(us)':>10} "
                f"{'(GB/s)':>8} {'(GB/s)':>8}"]
        for r in (r for r in rows if r["op"] == op):
            redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
            out.append(f" {r['bytes']:>12} {r['count']:>12} "
                       f"{NCCL_TYPE.get(r['dtype'], r['dtype']):>7} {redop:>6} "
                       f"{r['time_s'] * 1e6:>10.1f} {r['algbw_GBps']:>8.3f} "
                       f"{r['busbw_GBps']:>8.3f}")
    return "\n".join(out)


def render_compute(rows: list[dict]) -> str:
    out = [f"  {'unit':<16} {'batch':>6} {'pass':<9} {'median':>10} {'IQR/median':>10}"]
    for r in rows:
        med, iqr = r["median_s"] or 0.0, r["iqr_s"] or 0.0
        ratio = iqr / med if med else 0.0
        out.append(f"  {str(r['unit']):<16} {r['batch_size']:>6} {str(r['pass']):<9} "
                   f"{_ms(med):>10} {ratio:>9.0%}" + ("  noisy" if ratio > 0.10 else ""))
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def _processes(n: int | None) -> str:
    return "? processes" if n is None else f"{n} process" + ("es" if n != 1 else "")


def elastic_events(run_dir: Path) -> list[dict[str, Any]]:
    """The recoveries and membership changes an elastic run recorded (type "elastic")."""
    return [{k: v for k, v in r.items() if k not in ("type", "rank")}
            for r in read_records(run_dir) if r.get("type") == "elastic"
            and r.get("event") in ELASTIC_EVENTS]


def render_elastic_event(e: dict[str, Any]) -> str:
    """One line for a recovery, a membership change, a leave or a join."""
    def s(key: str) -> str:
        v = e.get(key)
        return "?" if v is None else f"{v:.2f} s"

    if e["event"] == "recovery":
        return (f"recovery of attempt {e['attempt']} (rank {e['killed_rank']} killed after "
                f"step {e['steps_done'] - 1}): detection {s('detection_s')}, restart "
                f"{s('restart_s')} (rendezvous {s('rendezvous_s')}, start-up "
                f"{s('startup_s')}, reload {s('reload_s')}), lost {e['lost_steps']} steps "
                f"({s('lost_work_s')}), recovered in {s('recovery_s')}")
    if e["event"] == "membership":
        rates = ", ".join(f"{w} {e[f'update_rate_{w}_per_s']:.1f}/s"
                          for w in ("before", "gone", "after")
                          if f"update_rate_{w}_per_s" in e)
        return (f"updates {e['updates']}: rate {rates}; joiner's first gradient "
                f"{s('join_s')} after the parameters were sent")
    return f"{e['event']}: worker {e.get('worker')} at server version {e.get('version')}"
