"""A measured profile from nccl-tests logs: parse, fit the links, check the busbw it gives back.

`perfmodel calibrate --cluster NAME --from-nccl-tests LOG...` calls `fit_logs`: every log
(calibration/nccl_tests.py; a file of `perfmodel measure collectives` holds one log per
collective) becomes CollectiveSamples, calibration/fit_network.py fits `intra_node` from the
single-node logs and `inter_node` from the multi-node ones, and calibration/profile_writer.py
builds the profile on a base profile (the device, compute and memory fields nccl-tests does
not measure). `reproduce` then runs the written profile through the simulator's collective
times (perfmodel/sim/collectives.py) at every logged row: its busbw against the log's busbw,
busbw = busbw_factor(op, ranks) x size / time (nccl-tests doc/PERFORMANCE.md), computed from
the row's time because the printed column has two decimals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.fit_network import fit_network
from calibration.hardware import model_token
from calibration.nccl_tests import NcclTestsLog, read_logs
from calibration.profile_writer import MeasuredFits, RunInfo, build_profile
from perfmodel.cluster import ClusterProfile, load_cluster, parse_profile, profile_paths
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import busbw_factor, collective_s

MODELLED = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")


@dataclass(frozen=True, kw_only=True, slots=True)
class BusbwRow:
    """One logged row beside the fitted profile's prediction of it."""

    log: str
    op: str
    ranks: int
    nodes: int
    bytes: float
    measured_GBps: float
    model_GBps: float

    @property
    def rel(self) -> float:
        return (self.model_GBps - self.measured_GBps) / self.measured_GBps


def read_all(paths: Sequence[Path]) -> list[NcclTestsLog]:
    if not paths:
        raise PerfmodelError("--from-nccl-tests needs at least one log file")
    return [log for p in paths for log in read_logs(Path(p))]


def choose_base(name: str, base: str | None, logs: Sequence[NcclTestsLog]) -> str:
    """--base, else NAME if it is a profile, else the shipped profile of the logs' GPU."""
    known = profile_paths()
    if base:
        if base not in known and not base.endswith(".toml"):
            raise PerfmodelError(f"--base '{base}': unknown profile; choose from: "
                                 f"{', '.join(sorted(known))}")
        return base
    if name in known:
        return name
    names = {d for log in logs for d in log.device.split(", ") if d}
    tokens = {model_token(d) for d in names}
    if tokens and all(t.startswith("CPU") for t in tokens):
        return "local"
    devices = {p: load_cluster(p).device.name for p in sorted(known) if p != "local"}
    exact = [p for p, d in devices.items() if d in names]
    close = [p for p, d in devices.items() if model_token(d) in tokens]
    if exact or close:
        return (exact or close)[0]
    raise PerfmodelError(f"no profile describes the logs' device ({logs[0].device or '?'}); "
                         f"name the profile the rest comes from with --base (e.g. --base a100)")


def fit_logs(paths: Sequence[Path], *, name: str, base: str | None = None) -> dict[str, Any]:
    """The measured profile's data (TOML layout) fitted from the nccl-tests logs at `paths`."""
    logs = read_all(paths)
    usable = [log for log in logs if log.op in MODELLED]
    if not usable:
        raise PerfmodelError("the logs hold no all-reduce, all-gather, reduce-scatter or "
                             "broadcast rows; the profile's links are fitted from those")
    fits = fit_network([s for log in usable for s in log.samples])
    base_profile = load_cluster(choose_base(name, base, logs))
    devices = tuple(d for log in logs for d in log.device.split(", ") if d)
    info = RunInfo(host=", ".join(sorted({str(log.path.name) for log in logs})),
                   device_names=devices, versions="nccl-tests logs", runs=len(logs))
    data = build_profile(name, base_profile,
                         MeasuredFits(intra_node=fits["intra_node"],
                                      inter_node=fits.get("inter_node")), info)
    data["topology"]["devices_per_node"] = _devices_per_node(usable, base_profile)
    files = sorted(dict.fromkeys(str(Path(p).resolve()) for p in paths))
    prov = data["provenance"]
    prov["host"] = "nccl-tests logs"
    prov["note"] = (f"links fitted by perfmodel calibrate --from-nccl-tests from {len(files)} "
                    f"log file(s) ({len(usable)} collectives, "
                    f"{sum(len(log.samples) for log in usable)} rows); everything else comes "
                    f"from the '{base_profile.name}' profile ({base_profile.provenance.source})")
    prov["logs"] = files
    prov["citations"].insert(0, "nccl-tests busbw and out-of-place time columns "
                                "(github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md)")
    data["description"] = (f"{base_profile.description}; links fitted from nccl-tests logs")
    rows = reproduce(parse_profile(data, Path(f"{name}.toml")), usable)
    data["calibration"]["busbw_reproduction"] = summarise(rows)
    return data


def _devices_per_node(logs: Sequence[NcclTestsLog], base: ClusterProfile) -> int:
    """Ranks per node of the multi-node logs; else the most ranks a single-node log ran."""
    multi = {log.ranks // log.nodes for log in logs if log.nodes > 1}
    if len(multi) > 1:
        raise PerfmodelError(f"the multi-node logs run {sorted(multi)} ranks per node; one "
                             f"profile has one node size: calibrate them separately")
    if multi:
        return multi.pop()
    return max(base.devices_per_node, *(log.ranks for log in logs))


def reproduce(profile: ClusterProfile, logs: Sequence[NcclTestsLog]) -> list[BusbwRow]:
    """Every row of the logs beside the busbw `profile` predicts for it."""
    rows = []
    for log in logs:
        if log.op not in MODELLED or log.ranks < 2:
            continue
        factor = busbw_factor(log.op, log.ranks)
        for s in log.samples:
            if s.bytes <= 0:
                continue
            model_s = collective_s(log.op, profile, log.ranks, s.bytes)
            rows.append(BusbwRow(log=log.path.name, op=log.op, ranks=log.ranks,
                                 nodes=log.nodes, bytes=s.bytes,
                                 measured_GBps=factor * s.bytes / s.time_s / 1e9,
                                 model_GBps=factor * s.bytes / model_s / 1e9))
    return rows


def summarise(rows: Sequence[BusbwRow]) -> dict[str, float | int]:
    rel = [abs(r.rel) for r in rows]
    return {"points": len(rows), "rms_rel": (sum(x * x for x in rel) / len(rel)) ** 0.5,
            "max_rel": max(rel)} if rows else {"points": 0}
