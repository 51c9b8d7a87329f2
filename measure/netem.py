"""A link-rate cap for real measurements: two emulated nodes on one host, joined by a slow link.

Two network namespaces ("node 0" and "node 1") are joined by a veth pair; a token-bucket
filter on each end (`tc qdisc add dev D root tbf rate R burst B latency L`, tc-tbf(8)) caps
what each node sends at R Gbit/s, each direction, as a full-duplex NIC would. netem (delay,
loss) is absent from this kernel, so only the rate is emulated. The ranks of each node run
under their own torchrun inside their namespace, joined by torchrun's multi-node rendezvous
(`--nnodes 2 --node-rank k --rdzv-backend c10d --rdzv-endpoint <node 0 address>:<port>`), so a
capped run also exercises the multi-node launch path on one host. Ranks in one namespace
talk over its own stack (uncapped), like GPUs in one node.

Needs root (namespaces, tc); anywhere else `capped_link` raises a PerfmodelError saying why
the cap is unavailable. The namespaces are deleted whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from measure.launch import (
    Job,
    LaunchResult,
    Progress,
    check_capacity,
    new_run_dir,
    supervise,
    torchrun_command,
    worker_env,
)
from measure.protocol import PIN_OFFSET_ENV
from perfmodel.errors import PerfmodelError

SUBNET = "10.213.0"          # private addresses, visible only inside the two namespaces
QUEUE_LATENCY_MS = 50        # tbf: longest a packet may wait for tokens before being dropped
MIN_BURST_BYTES = 128 * 1024  # tbf bucket; at least one GSO packet, and rate x 4 ms above that


@dataclass(frozen=True, kw_only=True, slots=True)
class CappedLink:
    namespaces: tuple[str, str]
    devices: tuple[str, str]
    addresses: tuple[str, str]
    rate_Gbps: float


def tbf_burst_bytes(rate_Gbps: float) -> int:
    """A bucket that holds 4 ms of traffic (tbf needs more than rate / HZ), at least 128 KiB."""
    return max(MIN_BURST_BYTES, int(rate_Gbps * 1e9 / 8 * 0.004))


@contextlib.contextmanager
def capped_link(rate_Gbps: float) -> Iterator[CappedLink]:
    """Two namespaces joined by a veth pair capped at `rate_Gbps` each way; removed on exit."""
    if rate_Gbps <= 0:
        raise PerfmodelError(f"the link rate must be positive, got {rate_Gbps} Gbit/s")
    if os.geteuid() != 0:
        raise PerfmodelError("the link-rate cap needs root (network namespaces and tc); "
                             "skipped — run as root, or measure without --link-rate-Gbps")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise PerfmodelError("the link-rate cap needs the `ip` and `tc` commands (iproute2); "
                             "skipped")
    token = uuid.uuid4().hex[:6]
    link = CappedLink(namespaces=(f"perfmodel-{token}-0", f"perfmodel-{token}-1"),
                      devices=(f"pm{token}a", f"pm{token}b"),
                      addresses=(f"{SUBNET}.1", f"{SUBNET}.2"), rate_Gbps=rate_Gbps)
    created: list[str] = []
    try:
        for ns in link.namespaces:
            _ip(["netns", "add", ns], why="cannot create a network namespace")
            created.append(ns)
        (ns0, ns1), (dev0, dev1) = link.namespaces, link.devices
        _ip(["link", "add", dev0, "netns", ns0, "type", "veth", "peer", "name", dev1,
             "netns", ns1], why="cannot create the veth pair")
        rate = f"{rate_Gbps * 1000:g}mbit"
        burst = str(tbf_burst_bytes(rate_Gbps))
        for ns, dev, addr in zip(link.namespaces, link.devices, link.addresses, strict=True):
            _ip(["-n", ns, "link", "set", "lo", "up"], why="cannot bring up loopback")
            _ip(["-n", ns, "addr", "add", f"{addr}/24", "dev", dev], why="cannot set address")
            _ip(["-n", ns, "link", "set", dev, "up"], why="cannot bring up the veth")
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                  "rate", rate, "burst", burst, "latency", f"{QUEUE_LATENCY_MS}ms"],
                 why="cannot add the tbf rate limit")
        yield link
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def launch_capped(config: dict, nproc: int, rate_Gbps: float, *, run_root: Path | None = None,
                  progress: Progress | None = None, oversubscribe: bool = False,
                  timeout_s: float | None = None, journal: Path | None = None) -> LaunchResult:
    """Run one measurement split over two emulated nodes (node 0 takes the odd rank out)
    whose link is capped at `rate_Gbps`; the run records `link_rate_Gbps`."""
    if nproc < 2:
        raise PerfmodelError(f"a capped link joins two nodes: need at least 2 processes, "
                             f"got {nproc}")
    over = check_capacity(config, nproc, oversubscribe=oversubscribe)
    config = {**config, "oversubscribed": over, "link_rate_Gbps": rate_Gbps}
    per_node = ((nproc + 1) // 2, nproc // 2)
    with capped_link(rate_Gbps) as link:
        run_dir = new_run_dir(config, run_root)
        port = _free_port(link.namespaces[0], link.addresses[0])
        jobs = []
        for k in (0, 1):
            args = ["--nnodes", "2", "--node-rank", str(k), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{link.addresses[0]}:{port}",
                    "--rdzv-id", run_dir.name, "--local-addr", link.addresses[k],
                    # node 0 hosts the rendezvous store: c10d cannot infer it from a
                    # namespace address the hostname does not resolve to
                    "--rdzv-conf", f"is_host={int(k == 0)}"]
            command = ["ip", "netns", "exec", link.namespaces[k],
                       *torchrun_command(run_dir, per_node[k], args)]
            # both nodes' ranks share this host's cores: node 1's pin after node 0's
            env = worker_env(config, local=False, extra={
                "GLOO_SOCKET_IFNAME": link.devices[k], PIN_OFFSET_ENV: str(sum(per_node[:k]))})
            jobs.append(Job(command=command, env=env, log_name=f"torchrun-node{k}.log"))
        return supervise(run_dir, jobs, timeout_s=timeout_s, progress=progress,
                         oversubscribed=over, journal=journal,
                         extra_info={"link_rate_Gbps": rate_Gbps,
                                     "tbf_burst_bytes": tbf_burst_bytes(rate_Gbps),
                                     "nproc_per_node": list(per_node)})


def _free_port(namespace: str, address: str) -> int:
    """A port the OS hands out when binding port 0 on `address` inside `namespace`."""
    code = (f"import socket; s = socket.socket(); s.bind(({address!r}, 0)); "
            "print(s.getsockname()[1])")
    out = _run(["ip", "netns", "exec", namespace, sys.executable, "-c", code],
               why="cannot pick a free port")
    return int(out.strip())


def _ip(args: list[str], *, why: str) -> str:
    return _run(["ip", *args], why=why)


def _run(command: list[str], *, why: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise PerfmodelError(f"link-rate cap skipped: {why} ({' '.join(command[:4])} ...: "
                             f"{detail[-1] if detail else f'exit code {done.returncode}'})")
    return done.stdout
