"""The parameter-server network as hardware: where servers sit, what each holds, which links
a push or a pull crosses, and what the servers cost.

DESIGN.md "Parameter server": NICs are full duplex, so every NIC (worker nodes and server
nodes) and every device's intra-node link has an *out* and an *in* side, each with the
profile's per-direction bandwidth, each carrying one message at a time, first come first
served (ps.py `_PSRun.transfer`). A push from worker w to
server k crosses w's node NIC out and k's node NIC in; a pull the reverse; the workers of one
node share their node's NIC. A worker and a server on the same node talk over the intra-node
link instead (w's device out, the server's device in); on the same device, not at all
(a GPU); on a CPU host a server is a process of its own and always crosses loopback, and
its loopback slot is one pool for both directions: measure/runs/ps.py's server is one thread
(blocking recv, apply, pack the reply, blocking send), so it never receives and sends at once,
and never while it applies: its apply holds the same pool (`server_slot`).
Every message is one-way point to point, so it sees a link as a ping-pong sweep does
(`Link.point_to_point`: its own α and bandwidth where calibrated, else the collective fit's).

Placement (`--server-placement`):
- dedicated: server k is an extra node with its own NIC and one server device; the hardware
  counts it (throughput per device including servers);
- colocated: server k runs on a worker's device, round robin over the worker nodes
  (k mod nodes), sharing that node's NIC, that device's memory and its compute (the apply
  and the worker's passes share the device; on a CPU host the node's cores: ps.py
  `_sharing_stretch`, cores.py).
The profile's `server.link` gives the default: inter_node -> dedicated, intra_node (one host,
e.g. `local`) -> colocated.

Sharding by parameter bytes, as MXNet's kvstore does: a unit (layer or block) of at least
BIGARRAY_BOUND_PARAMS parameters is split evenly over all servers, smaller units go whole to
the servers in turn (round robin; MXNet hashes the key). Shards can be unequal; a server with
no parameters takes no part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.cluster import ClusterProfile, Link
from perfmodel.errors import PerfmodelError
from perfmodel.workload import Workload

# MXNet kvstore's MXNET_KVSTORE_BIGARRAY_BOUND default (1,000,000 elements): larger arrays
# are partitioned over every server, smaller ones live whole on one server.
BIGARRAY_BOUND_PARAMS = 1_000_000
PLACEMENTS = ("dedicated", "colocated")


def serial_server(cluster: ClusterProfile) -> bool:
    """Whether a server is measure/runs/ps.py's one-thread process (a CPU host): it receives,
    applies, packs its reply and sends in turn, never two at once."""
    return cluster.compute_cpu_cores_per_node > 0


def default_placement(cluster: ClusterProfile) -> str:
    return "colocated" if cluster.server.link == "intra_node" else "dedicated"


def check_placement(placement: object) -> None:
    if placement is not None and placement not in PLACEMENTS:
        raise PerfmodelError(f"server placement must be one of {', '.join(PLACEMENTS)}, "
                             f"got {placement!r}")


def shard_params(workload: Workload, servers: int) -> tuple[float, ...]:
    """Parameters each server holds (module docstring: big units split, small ones whole)."""
    shares = [0.0] * servers
    turn = 0
    for unit in workload.units:
        if unit.params >= BIGARRAY_BOUND_PARAMS:
            for k in range(servers):
                shares[k] += unit.params / servers
        else:
            shares[turn] += unit.params
            turn = (turn + 1) % servers
    return tuple(shares)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """What a PS configuration occupies."""

    placement: str
    worker_devices: int
    server_devices: int         # extra devices for servers (dedicated), 0 when colocated
    worker_nodes: int
    server_nodes: int           # extra nodes for servers (dedicated), 0 when colocated
    shard_params: tuple[float, ...]

    @property
    def devices(self) -> int:
        return self.worker_devices + self.server_devices

    @property
    def nodes(self) -> int:
        return self.worker_nodes + self.server_nodes

    def to_json(self) -> dict:
        return {"placement": self.placement, "worker_devices": self.worker_devices,
                "server_devices": self.server_devices, "devices": self.devices,
                "worker_nodes": self.worker_nodes, "server_nodes": self.server_nodes,
                "nodes": self.nodes, "servers": len(self.shard_params),
                "shard_params": list(self.shard_params)}


def hardware(cluster: ClusterProfile, workload: Workload, workers: int, servers: int,
             placement: str | None) -> Hardware:
    placement = placement or default_placement(cluster)
    extra = servers if placement == "dedicated" else 0
    return Hardware(placement=placement, worker_devices=workers, server_devices=extra,
                    worker_nodes=cluster.nodes_for(workers), server_nodes=extra,
                    shard_params=shard_params(workload, servers))


@dataclass(frozen=True, slots=True)
class Route:
    """One worker-server pair, one direction: the pools it crosses (indices into the
    network's pool list), the link class's latency and its efficiency-adjusted work."""

    pools: tuple[int, ...]
    latency_s: float
    link: Link | None


class Layout:
    """Pool indices for every node's NIC and every device's intra-node link, per direction,
    and the route of every push and pull."""

    def __init__(self, cluster: ClusterProfile, workers: int, hw: Hardware):
        self.cluster, self.hw = cluster, hw
        per_node = cluster.devices_per_node
        self.node_of_worker = [w // per_node for w in range(workers)]
        servers = len(hw.shard_params)
        if hw.placement == "dedicated":
            self.node_of_server = [hw.worker_nodes + k for k in range(servers)]
            self.device_of_server = [workers + k for k in range(servers)]
        else:
            self.node_of_server = [k % hw.worker_nodes for k in range(servers)]
            if cluster.compute_cpu_cores_per_node > 0:
                # A CPU host: a colocated server is a process of its own beside the workers
                # (measure/runs/ps.py's rank 0), so even the worker it shares cores with
                # reaches it over the intra-node link (loopback): a device slot (pools) of its
                # own, but no hardware of its own; it shares its node's cores (ps.py).
                self.device_of_server = [workers + k for k in range(servers)]
            else:
                self.device_of_server = [self._host(k, workers, per_node)
                                         for k in range(servers)]
        # A CPU host's server is measure/runs/ps.py's process: one thread doing a blocking
        # recv, the apply, then a blocking send, so on its own device slot it receives and
        # sends one message at a time, not both at once: one pool for both directions.
        # (GPU servers and NICs stay full duplex; MXNet/ps-lite servers overlap them.)
        self.serial_server = serial_server(cluster)
        self.nodes = hw.nodes
        self.devices = max(workers, *(d + 1 for d in self.device_of_server))   # pool slots
        # pool index: NIC out of node n = 2n, NIC in = 2n + 1; device d's intra-node out
        # = 2 nodes + 2d, in = 2 nodes + 2d + 1
        # pushes and pulls are one-way messages: the links as a ping-pong sees them
        self.inter, self.intra = (cluster.inter_node.point_to_point(),
                                  cluster.intra_node.point_to_point())
        self.pool_bandwidth_Bps = ([self.inter.bandwidth_GBps * 1e9] * (2 * self.nodes)
                                   + [self.intra.bandwidth_GBps * 1e9] * (2 * self.devices))

    def server_slot(self, server: int) -> int | None:
        """The pool a serial server's own work holds (a CPU host: its loopback slot, which
        its receives and sends hold too), so its apply and its messages take turns; None
        where the server overlaps its applies with its messages."""
        if not self.serial_server:
            return None
        return 2 * self.nodes + 2 * self.device_of_server[server]

    def shared(self, pool: int) -> bool:
        """Whether workers' traffic also uses this server-side pool (colocated servers)."""
        return self.hw.placement == "colocated"

    def _host(self, k: int, workers: int, per_node: int) -> int:
        """The worker device a colocated server runs on: node k mod nodes, then the node's
        devices in turn."""
        node = k % self.hw.worker_nodes
        first = node * per_node
        on_node = min(per_node, workers - first)
        return first + (k // self.hw.worker_nodes) % on_node

    def route(self, worker: int, server: int, kind: str) -> Route:
        """The pools a push (worker -> server) or a pull (server -> worker) crosses."""
        wn, sn = self.node_of_worker[worker], self.node_of_server[server]
        sd = self.device_of_server[server]
        if worker == sd:                                  # colocated on this very device
            return Route((), 0.0, None)
        same_node = wn == sn
        if same_node:
            base, src, dst, link = 2 * self.nodes, worker, sd, self.intra
        else:
            base, src, dst, link = 0, wn, sn, self.inter
        if kind == "pull":
            src, dst = dst, src
        into = base + 2 * dst + 1
        if same_node and kind == "push" and self.serial_server:
            into = self.server_slot(server)     # its one slot: its out pool, both ways
        return Route((base + 2 * src, into), link.latency_s, link)


def work_bytes(link: Link, nbytes: float) -> float:
    """Link capacity a message of `nbytes` uses: nbytes / efficiency(nbytes)."""
    return nbytes * link.seconds_per_byte(nbytes) * link.bandwidth_GBps * 1e9


def servers_per_device(hw: Hardware) -> int:
    """Colocated: the most servers one worker device hosts."""
    return math.ceil(len(hw.shard_params) / hw.worker_devices)
