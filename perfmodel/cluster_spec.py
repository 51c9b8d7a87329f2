"""A spec-derived profile of any GPU a shipped profile describes, on a node and NIC of your
choosing (`perfmodel clusters add`).

No GPU number lives here: the device, compute, server and link-shape fields are copied from
the shipped profile of that GPU (perfmodel/data/profiles/<gpu>.toml, whose [provenance]
cites their sources); what the user states (GPUs per node, NIC rate, optionally the per-GPU
link inside a node and the latencies) replaces the matching fields. The new profile's
citations say, field by field, where each number comes from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.cluster import SHIPPED_PROFILES, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml

CPU_PROFILE = "local"


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSpec:
    """What the user states about the cluster; None = the GPU's shipped profile's value."""

    gpus_per_node: int
    nic_Gbps: float                     # per node, each way (400 for 4x100G EFA, say)
    intra_GBps: float | None = None     # per GPU, each way, inside a node
    intra_latency_us: float | None = None
    inter_latency_us: float | None = None
    description: str | None = None


def gpu_profiles() -> dict[str, Path]:
    """The shipped GPU profiles by name (the GPUs `clusters add --gpu` takes)."""
    return {p.stem: p for p in sorted(SHIPPED_PROFILES.glob("*.toml"))
            if p.stem != CPU_PROFILE}


def spec_profile(name: str, gpu: str, node: NodeSpec) -> dict[str, Any]:
    """The new profile's data (TOML layout), checked by cluster.parse_profile."""
    known = gpu_profiles()
    if gpu not in known:
        raise PerfmodelError(f"--gpu '{gpu}': no shipped profile describes it; choose from: "
                             f"{', '.join(known)}")
    _check(node)
    path = known[gpu]
    base = load_toml(path)
    data = copy.deepcopy(base)
    source = f"perfmodel/data/profiles/{path.name}"
    nic_GBps = node.nic_Gbps / 8
    data["name"] = name
    data["description"] = node.description or (
        f"{node.gpus_per_node}x {base['device']['name']} per node, "
        f"{node.nic_Gbps:g} Gbit/s per node between nodes (spec-derived, perfmodel clusters add)")
    data["topology"] = {"devices_per_node": node.gpus_per_node}
    data["inter_node"]["bandwidth_GBps"] = nic_GBps
    user = [f"topology.devices_per_node = {node.gpus_per_node}: stated (--gpus-per-node)",
            f"inter_node.bandwidth_GBps = {nic_GBps:g}: stated, --nic-Gbps {node.nic_Gbps:g} "
            f"/ 8 bits per byte (per node, each way)"]
    for key, table, field, flag in (
            ("intra_GBps", "intra_node", "bandwidth_GBps", "--intra-GBps"),
            ("intra_latency_us", "intra_node", "latency_us", "--intra-latency-us"),
            ("inter_latency_us", "inter_node", "latency_us", "--inter-latency-us")):
        value = getattr(node, key)
        if value is not None:
            data[table][field] = value
            user.append(f"{table}.{field} = {value:g}: stated ({flag})")
    kept = [f"{t}.{f}" for t, f, k in (("intra_node", "bandwidth_GBps", "intra_GBps"),
                                        ("intra_node", "latency_us", "intra_latency_us"),
                                        ("inter_node", "latency_us", "inter_latency_us"))
            if getattr(node, k) is None]
    kept += ["intra_node.efficiency_by_bytes", "inter_node.efficiency_by_bytes"]
    data["provenance"] = {
        "source": "spec",
        "note": (f"spec-derived by perfmodel clusters add from the shipped '{gpu}' profile "
                 f"and the node the user stated; not calibrated: run `perfmodel calibrate "
                 f"--cluster {name} --from-nccl-tests LOG...` with the cluster's nccl-tests "
                 f"logs to measure the links"),
        "citations": [
            *user,
            f"device.*, compute.*, server.*: the shipped '{gpu}' profile ({source}), "
            f"cited there as below",
            f"{', '.join(kept)}: the '{gpu}' profile's links ({base['description']}), "
            f"cited there as below",
            *(f"'{gpu}': {c}" for c in base["provenance"].get("citations", [])),
        ],
    }
    data.get("inter_node", {}).pop("time_factor_by_op", None)
    parse_profile(data, Path(f"{name}.toml"))
    return data


def _check(node: NodeSpec) -> None:
    if node.gpus_per_node < 1:
        raise PerfmodelError(f"--gpus-per-node must be >= 1, got {node.gpus_per_node}")
    for flag, value in (("--nic-Gbps", node.nic_Gbps), ("--intra-GBps", node.intra_GBps),
                        ("--intra-latency-us", node.intra_latency_us),
                        ("--inter-latency-us", node.inter_latency_us)):
        if value is not None and not (value > 0 and value < 1e7):
            raise PerfmodelError(f"{flag} must be a number > 0, got {value}")
