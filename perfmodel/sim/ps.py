"""Parameter-server training: synchronous, asynchronous and bounded-staleness (SSP) PS.

Model (DESIGN.md "Parameter server"; a closed queueing network, the machine-repairman model):
N workers and `servers` servers holding shards of the parameters (psnet.py: placement,
sharding, and the links as hardware). One worker step:

  pull    every server's shard, all at once, each over its route (the server node's NIC out
          and the worker node's NIC in; the intra-node link within a node), every link
          direction carrying one message at a time, first come first served,
  compute forward + backward (compute.unit_times with no optimizer work) and the worker's two
          copies (compute.ps_worker_seconds: the pulled parameters into the model, the
          gradients into the push buffer), times StepNoise,
  push    every shard's gradient, all at once, over the reverse routes,
  apply   on each server, first come first served: the workload's optimizer over the shard
          (compute.optimizer_seconds: model-state bytes at compute.optimizer_GBps, as DDP's
          optimizer step is charged), plus DC-ASGD's extra passes; a CPU host's serial
          server (psnet `server_slot`) also packs the reply (a copy of the shard's
          parameters at compute.optimizer_GBps) and receives, applies and sends in turn.

A message that crosses two link directions has arrived when both have carried it; a route's
latency is a pure delay added on delivery. The worker's next pull waits for its gradient's
apply on every server (a server answers a worker in order), so one cycle = pull + compute +
push + apply queue + apply, and where one link direction or the apply is the bottleneck,
exact mean-value analysis (mva.py) predicts async-ps throughput.

A CPU host's server (psnet.serial_server: measure/runs/ps.py's one thread) replies as part of
the apply: receive a push, apply, reply at once to every worker the apply frees - the pusher,
and under SSP everyone the slowest worker's push releases, in worker order - then receive
the next push (`serial_worker`, `_push_and_apply`, `_ready_after`: the real server's clocks). So
a reply never queues behind pushes that arrived during its apply, and a straggler whose push
releases the others gets its own reply last when it has the highest rank.

- async-ps (Dean et al. 2012, Downpour SGD): a server applies each gradient on arrival.
  Staleness = server 0's version when applying - its version when the worker pulled
  (Zhang et al. 2016); every worker updates every server once a step, so server 0 speaks
  for all.
- sync-ps: each server adds every gradient of a step to a running sum as it arrives (one
  elementwise pass at server.apply_GBps), applies the optimizer once when all N have
  arrived, then every worker pulls. Staleness 0 by construction.
- ssp-ps (Ho et al., NIPS 2013): async apply, and a worker more than s clocks (completed steps)
  ahead of the slowest waits before its next pull; s = 0 is synchronous progress.

Records: one StepRecord per worker step (start = the end of its previous step; comm_exposed_s
= pull + push durations, stretched by contention; wait_s = SSP wait + apply queue + apply, or
the barrier in sync-ps), one UpdateRecord per gradient, one CommRecord per pull and push
between a worker and a server.

Events: a transfer is arithmetic on when its link directions are next free (no event of
its own); a worker waits on one event per pull (all shards), one per compute and one per push-and-
apply (all shards; on a serial server the push, apply and the next pull are one event); FCFS
applies are arithmetic, not a simpy.Resource.

Assumptions to know:
- Workers draw steps from a shared budget of workers x steps mini-batches (a shared data
  queue) in async-ps and ssp-ps, so fast workers do more steps than slow ones and the run
  never ends with one straggler working alone; in sync-ps every worker does `steps`.
- A server takes gradients in the order their transfers finish; with unequal route latencies
  (colocated: intra- and inter-node senders) that can differ from the order of arrival by
  the latency difference (microseconds).
- Colocated servers share their node's NIC, their device's memory and its compute: on a
  GPU the apply and the hosting worker's passes share that one device; on a CPU host
  (`topology.compute_cpu_cores_per_node` > 0) every worker and server of a node shares its
  cores. Both are processor sharing with the server's duty cycle (perfmodel/sim/cores.py),
  found as a fixed point: simulate, measure how busy each side was while the other
  computed, stretch the compute and the applies, simulate again (`_sharing_stretch`). On a
  CPU host a slow worker (speed s < 1) holds a core for the first s of its compute only: the
  rest is the sleep measure/timing.py's Straggler adds (`_busy_part`). Each speed class of
  workers gets its own compute stretch, from the time its own spans overlap the others':
  a fast worker beside a straggler that sleeps half its span shares a core less often than
  the straggler does beside it (until session 25 one stretch, pooled over the node's
  workers, for all of them: the 2-worker real async straggler's fast worker stretched x1.24
  where it took its unshared time within 7 %, docs/model.md). In a timed wait a worker holds
  a core only for its own CPU work, the same at any speed, and the node's workers share one
  stretch (`_stretch_classes`; the runs: a straggler's compute before its sleep is as long
  as the fast workers').
- Delay compensation (DC-ASGD, Zheng et al. 2017) makes the server also compute
  g + λ g⊙g⊙(w_now − w_old) and keep each worker's w_old: unfused elementwise passes (g⊙g,
  w_now − w_old, their product, the scaled add, the backup copy at each pull) touch about 3x
  the bytes of a plain SGD apply (read w, read g, write w), so an apply is charged the
  optimizer plus 3 elementwise passes over the shard's gradient at server.apply_GBps
  (DC_ASGD_EXTRA_PASSES). The staleness-aware rate α₀/τ (Zhang et al. 2016) scales the
  gradient inside the optimizer's own pass: no time; it is noted for the accuracy model.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from heapq import heappush

import numpy as np
import simpy
from simpy.events import NORMAL, Event

from perfmodel import memory as memory_model
from perfmodel.cluster import ClusterProfile, Link
from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown
from perfmodel.sim import cores, psnet
from perfmodel.sim.collectives import link_transfer_s
from perfmodel.sim.compute import (
    StepNoise,
    optimizer_seconds,
    ps_worker_host_seconds,
    ps_worker_seconds,
)
from perfmodel.sim.engine import CountingEnvironment, quiet_gc
from perfmodel.sim.records import (
    CommRecord,
    LazyRecords,
    SimResult,
    StepRecord,
    UpdateRecord,
    maker,
)
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import Workload

SAME_TIME_REL = 1e-12          # times this close (relative) are one instant (rounding)
DC_ASGD_EXTRA_PASSES = 3.0     # delay compensation's extra server work, in elementwise passes
SHARING_ROUNDS = 8             # simulations at most to settle the core-sharing fixed point
SHARING_TOLERANCE = 0.01       # ... stop when no stretch moves by more than this (relative)
SHARING_DELAY_STREAM = 1      # the core-wait draws' own random stream (beside the seed)
UNDAMPED_ROUNDS = 3            # later rounds are damped (the mean of the old and new stretch)


def _check_servers(servers: object) -> None:
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise PerfmodelError(f"servers must be a whole number of at least 1, got {servers!r}")


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PerfmodelError(f"{name} must be true or false, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncPSOptions:
    servers: int = 1                    # parameter shards, one server each
    server_placement: str | None = None  # dedicated | colocated; None = the profile's default

    def __post_init__(self):
        _check_servers(self.servers)
        psnet.check_placement(self.server_placement)


@dataclass(frozen=True, kw_only=True, slots=True)
class AsyncPSOptions:
    servers: int = 1                    # parameter shards, one server each
    server_placement: str | None = None  # dedicated | colocated; None = the profile's default
    staleness_aware_lr: bool = False    # scale each gradient by α₀/τ (Zhang et al. 2016)
    delay_compensation: bool = False    # DC-ASGD on the server (Zheng et al. 2017)

    def __post_init__(self):
        _check_servers(self.servers)
        psnet.check_placement(self.server_placement)
        _check_flag("staleness_aware_lr", self.staleness_aware_lr)
        _check_flag("delay_compensation", self.delay_compensation)


@dataclass(frozen=True, kw_only=True, slots=True)
class SSPPSOptions:
    servers: int = 1                    # parameter shards, one server each
    server_placement: str | None = None  # dedicated | colocated; None = the profile's default
    staleness_bound: int = 3            # s: max clocks a worker may run ahead of the slowest

    def __post_init__(self):
        _check_servers(self.servers)
        psnet.check_placement(self.server_placement)
        s = self.staleness_bound
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise PerfmodelError(f"staleness bound must be a whole number >= 0, got {s!r}")


class _ComputeTimes:
    """Forward + backward seconds of (worker, step): nominal x StepNoise. Rows (one per step,
    every worker) are drawn in step order, so a pair gets the same draw whatever the event
    order: common random numbers across strategies, bandwidths and options.

    Under core sharing (`stretch`: x per worker, cores.py) a step takes nominal x noise x
    (1 + (x − 1)·d): d is the delay waiting for a core over its mean, drawn per worker and
    step from `delay` (a generator of its own, so the noise draws stay common) as 2·Beta(α, α):
    mean 1, between no wait and twice the mean, CV `compute.sharing_delay_cv` = 1/√(2α + 1)
    (calibration/fit_cores.py fits it so), or exactly 1 where that is 0. Without it a fast
    worker beside a straggler kept an exact 2:1 rhythm with it on a serial server, every
    straggler's push meeting the same phase of the fast worker's cycle (slow worker's
    staleness 1.96 in reports 39-40 against 1.61-1.90 measured in 36-40, docs/model.md).

    In a timed wait (`paid_s` > 0: the worker's own CPU work a step, which the harness pays
    back from its sleeps) the stretch is that work's, and only the wait for a core is added:
    nominal x StepNoise + paid x (x − 1)·d / speed, as DDP's copies in a timed wait. A
    straggler's sleep (measure/timing.py `Straggler.delay`) is its measured compute so far x
    (1/speed − 1), and that compute includes the wait for a core, so the wait is slowed
    down with the rest (until session 28 it was added once, after the slowdown)."""

    def __init__(self, noise: StepNoise, nominal_s: float, stretch=None, paid_s: float = 0.0,
                 delay: tuple[float, np.random.Generator] | None = None):
        self.noise, self.rows = noise, []
        self.nominal_s, self.extra_s, self.timed = nominal_s, 0.0, paid_s > 0
        self.delay_s, self.delay_cv, self.delay_rng = None, 0.0, None
        if stretch is None:
            return
        lost = np.asarray(stretch) - 1.0
        # the mean delay a step waits for a core: seconds (timed wait: slowed down with the
        # rest by a straggler's sleep), else per nominal second
        self.delay_s = paid_s * lost * noise.slowdown if paid_s > 0 else nominal_s * lost
        if delay is not None:
            self.delay_cv, self.delay_rng = delay
        elif paid_s > 0:
            self.extra_s = self.delay_s
        else:
            self.nominal_s = nominal_s * np.asarray(stretch)

    def seconds(self, worker: int, step: int) -> float:
        while step >= len(self.rows):
            self.rows.append(self._row().tolist())
        return self.rows[step][worker]

    def _row(self) -> np.ndarray:
        noise = self.noise.draw()
        if self.delay_rng is None:
            return noise * self.nominal_s + self.extra_s
        alpha = (1.0 / self.delay_cv**2 - 1.0) / 2.0     # 2·Beta(α, α): mean 1, this CV
        d = 2.0 * self.delay_rng.beta(alpha, alpha, noise.shape[0])
        if self.timed:
            return noise * self.nominal_s + self.delay_s * d
        return noise * (self.nominal_s + self.delay_s * d)


class _Server:
    """One server: its shard, its first-come-first-served apply step and its model version.

    FCFS needs no simpy.Resource: the apply of a gradient reaching the server at time a
    starts at max(a, the previous apply's end), so it is arithmetic on `busy_until`.
    `finishes` holds the ends of applies not yet known to be complete, so the version a
    pull reads (applies complete by then) is `applied_by(now)`.
    """

    def __init__(self, index: int, shard_params: float, apply_s: float, accumulate_s: float):
        self.index, self.shard_params = index, shard_params
        self.apply_s, self.accumulate_s = apply_s, accumulate_s
        self.busy_until = 0.0
        self.started = 0                # applies queued so far: the next one's version
        self.finishes: deque[float] = deque()
        self.completed = 0
        self.arrived = 0                # sync-ps: gradients of the current step summed
        self.spans: list[tuple[float, float]] | None = None   # busy spans, when tracked

    def apply(self, arrival_s: float, service_s: float) -> tuple[float, int]:
        """Queue one apply of `service_s` seconds; (its end, the version it is applied to)."""
        end = max(arrival_s, self.busy_until) + service_s
        self.busy_until = end
        if self.spans is not None:
            self.spans.append((end - service_s, end))
        version = self.started
        self.started += 1
        self.finishes.append(end)
        return end, version

    def applied_by(self, now: float) -> int:
        # An apply ending at `now` counts: `_fire_at` wakes a waiter at now' + (end - now'),
        # which rounding can put one ulp before `end` (sync-ps, 1 worker, speed 0.859375:
        # the step after an apply read the version before it). SAME_TIME_REL absorbs that.
        now = now + SAME_TIME_REL * now
        while self.finishes and self.finishes[0] <= now:
            self.finishes.popleft()
            self.completed += 1
        return self.completed


def _fire_at(env: simpy.Environment, event: simpy.Event, at_s: float, value=None) -> None:
    """Trigger `event` at time `at_s` >= now: a Timeout's mechanics on an event a process
    already waits on, so a whole transfer or exchange costs the waiter one event.
    (`Environment.schedule` inlined, with its arithmetic: the time is now + (at_s - now).)"""
    event._ok, event._value = True, value
    now = env._now
    heappush(env._queue, (now + (at_s - now), NORMAL, next(env._eid), event))


# The records, built with their slots set directly: the frozen dataclasses' __init__ sets
# each field through object.__setattr__, 2-3x slower, and a 4096-worker run makes 330,000
# (only if they are read: the run keeps rows of their fields, records.LazyRecords).
_step_record, _update_record, _comm_record = maker(StepRecord), maker(UpdateRecord), \
    maker(CommRecord)


@lru_cache(maxsize=256)
def _full_bandwidth_s(link: Link, nbytes: float) -> float:
    """Seconds a message of `nbytes` holds a direction of `link`: the same for every worker of
    a kind, and the efficiency lookup cost ~40 ms a 4096-worker run (once per route)."""
    return psnet.work_bytes(link, nbytes) / (link.bandwidth_GBps * 1e9)


def server_pass_s(cluster: ClusterProfile, wl: Workload, share_params: float) -> float:
    """One elementwise pass over a shard's gradient at server.apply_GBps (sync-ps's sum)."""
    return share_params * wl.precision_spec.grad_bytes / (cluster.server.apply_GBps * 1e9)


def server_apply_s(cluster: ClusterProfile, wl: Workload, share_params: float,
                   dc_passes: float = 0.0, crowded: bool = False) -> float:
    """A server's apply of one gradient to a shard of `share_params` parameters, and DC-ASGD's
    extra passes. On a CPU host (a serial server, measure/runs/ps.py) the apply includes the
    pack of the parameters into the reply buffer: where calibration measured that server's
    own time per update (`server.update_*`, calibration/fit_ps.py) it is latency + gradient
    bytes / rate, times server.crowded_update_factor on a `crowded` node (more processes
    than cores) where calibration measured that too; elsewhere the workload's optimizer over
    the shard plus the pack, a copy at the rate the optimizer streams bytes
    (compute.optimizer_GBps)."""
    extra = dc_passes * server_pass_s(cluster, wl, share_params)
    if not psnet.serial_server(cluster):
        return optimizer_seconds(cluster, wl, share_params / wl.params) + extra
    srv = cluster.server
    update = srv.update_s(share_params * wl.precision_spec.grad_bytes)
    if update is not None:
        if crowded and srv.crowded_update_factor is not None:
            update *= srv.crowded_update_factor
        return update + extra
    pack_s = share_params * wl.precision_spec.param_bytes / (cluster.compute.optimizer_GBps
                                                             * 1e9)
    return optimizer_seconds(cluster, wl, share_params / wl.params) + pack_s + extra


def message_s(cluster: ClusterProfile, kind: str, nbytes: float) -> float:
    """One `kind` ("push" or "pull") message of `nbytes` between a worker and a server, alone
    (no queue, no core sharing): a serial server's as measured at it where calibration did
    (cluster.Server `message_s`), else a one-way transfer on the server's link."""
    measured = cluster.server.message_s(kind, nbytes) if psnet.serial_server(cluster) else None
    if measured is not None:
        return measured
    return link_transfer_s(getattr(cluster, cluster.server.link).point_to_point(), nbytes)


class _PSRun:
    """One simulation: the servers, the network's pools, the workers' state, the records."""

    def __init__(self, scenario: Scenario, servers: int, placement: str | None,
                 dc_passes: float = 0.0, staleness_bound: int | None = None,
                 service: Callable[[float], float] | None = None,
                 stretch: tuple[list[float], list[float], list[float]] | None = None):
        self.env = env = CountingEnvironment()
        wl, cluster = scenario.workload, scenario.cluster
        self.workers, self.steps_each = scenario.workers, scenario.steps
        self.step_records: list[tuple] = []     # rows of StepRecord's fields
        self.update_records: list[tuple] = []   # rows of UpdateRecord's fields
        self.comm_rows: list[tuple] = []
        self.hardware = psnet.hardware(cluster, wl, scenario.workers, servers, placement)
        self.layout = psnet.Layout(cluster, scenario.workers, self.hardware)
        grad_bytes, param_bytes = wl.precision_spec.grad_bytes, wl.precision_spec.param_bytes
        # nodes running more PS processes than cores (a serial server's phases are then as
        # the calibration's crowded runs measured them, where it did: cluster.Server)
        self.crowded = _crowded_nodes(cluster, self.layout, scenario.workers,
                                      [k for k, share in enumerate(self.hardware.shard_params)
                                       if share > 0], self.hardware.nodes)
        self.servers = []
        for k, share in enumerate(self.hardware.shard_params):
            if share <= 0:
                continue                # a server with no parameters takes no part
            crowded = self.layout.serial_server and self.crowded[self.layout.node_of_server[k]]
            self.servers.append(_Server(k, share,
                                        server_apply_s(cluster, wl, share, dc_passes, crowded),
                                        server_pass_s(cluster, wl, share)))
        self.server0 = self.servers[0]
        # the pool each server's work holds besides its own FCFS (a serial server: psnet)
        self.slots = [self.layout.server_slot(s.index) for s in self.servers]
        self.nservers = len(self.servers)
        self.pull_bytes = [s.shard_params * param_bytes for s in self.servers]
        self.push_bytes = [s.shard_params * grad_bytes for s in self.servers]
        # (worker x servers + server position) -> route, per kind; filled on first use
        self.pull_routes: list[tuple | None] = [None] * (self.workers * self.nservers)
        self.push_routes: list[tuple | None] = [None] * (self.workers * self.nservers)
        # link direction (psnet.Layout's pool index) -> when it is free
        self.link_free = [0.0] * len(self.layout.pool_bandwidth_Bps)
        self.server_names = [f"server{s.index}" for s in self.servers]
        self.service = service          # None: every transfer and apply takes its mean
        nominal = ps_worker_seconds(cluster, wl, scenario.batch_size)
        # a timed wait's own CPU work (paid back from the sleeps, still holding a core)
        self.paid_s = ps_worker_host_seconds(cluster, wl) if cluster.timed_wait else 0.0
        # core/device sharing (cores.py): (per-worker compute stretch, per-server apply
        # stretch, per-node transfer stretch) from the previous round of the fixed point,
        # and the spans it measures
        self.cluster, self.stretch = cluster, stretch
        self.workload_name = wl.name
        worker_stretch, server_stretch, link_stretch = stretch or (None, None, None)
        cv = cluster.compute.sharing_delay_cv
        delay = ((cv, np.random.default_rng((scenario.seed, SHARING_DELAY_STREAM)))
                 if cv > 0 and worker_stretch is not None else None)
        self.compute = _ComputeTimes(StepNoise(scenario, scenario.rng()), nominal,
                                     worker_stretch, self.paid_s, delay)
        self.compute_spans: list[list[tuple[float, float]]] | None = None
        self.speeds = scenario.speeds
        # CPU-driven transfers (gloo over loopback): each side of a message keeps a core
        # busy copying while it carries it; None where the links move data themselves
        self.link_stretch = link_stretch
        self.copy_spans: list[list[tuple[float, float]]] | None = None
        if stretch is not None:
            self.compute_spans = [[] for _ in range(scenario.workers)]
            if link_stretch is not None:
                self.copy_spans = [[] for _ in range(self.hardware.nodes)]
            for server, x in zip(self.servers, server_stretch, strict=True):
                server.apply_s, server.accumulate_s = x * server.apply_s, x * server.accumulate_s
                server.spans = []
        self.budget = scenario.workers * scenario.steps     # async/ssp: shared mini-batches
        self.bound = staleness_bound                          # ssp: s; None = unbounded
        self.clock = [0] * scenario.workers                   # completed steps per worker
        self.at_clock = Counter({0: scenario.workers})
        self.slowest = 0
        self.unblock: dict[int, simpy.Event] = {}             # slowest clock -> waiters
        # serial servers (async/ssp): each server's clocks, as measure/runs/ps.py keeps them
        # (only where the servers are serial: nothing else reads them)
        n = scenario.workers if self.layout.serial_server else 0
        self.srv_clock = [[0] * n for _ in self.servers]
        self.srv_at_clock = [Counter({0: n}) for _ in self.servers]
        self.srv_slowest = [0] * len(self.servers)
        self.srv_held: list[set[int]] = [set() for _ in self.servers]
        self.pending: list[list | None] = [None] * n      # w -> its next pull's state
        self.barrier = env.event()                            # sync-ps: this step's release
        self.released: list[float] = []                       # sync-ps: each server's release

    def go(self, worker) -> None:
        """Simulate every worker to the end (async/ssp on serial servers: serial_worker)."""
        if worker == self.async_worker and self.layout.serial_server:
            worker = self.serial_worker
        for w in range(self.workers):
            self.env.process(worker(w))
        with quiet_gc():
            self.env.run()

    def result(self, notes: tuple[str, ...]) -> SimResult:
        if self.stretch is not None:
            notes = (*notes, _sharing_note(self))
        return SimResult(steps=LazyRecords(_step_record, self.step_records),
                         updates=LazyRecords(_update_record, self.update_records),
                         comms=LazyRecords(_comm_record, self.comm_rows),
                         events=self.env.events, notes=notes)

    # -- the network ---------------------------------------------------------------------

    def _route(self, w: int, i: int, kind: str) -> tuple:
        """(sender's link direction, receiver's, seconds at full bandwidth, latency, bytes,
        the crowded host's factor on those seconds or 0)."""
        server = self.servers[i].index
        r = self.layout.route(w, server, kind)
        nbytes = (self.pull_bytes if kind == "pull" else self.push_bytes)[i]
        if r.link is None or nbytes <= 0:          # same device: no link at all
            return (None, None, 0.0, 0.0, nbytes, 0.0)
        # a serial server's messages as measured at it, where they were (cluster.Server),
        # and on a crowded node as measured there
        srv = self.cluster.server
        measured = srv.message_s(kind, nbytes) if self.layout.serial_server else None
        crowded = (self.crowded[self.layout.node_of_worker[w]]
                   or self.crowded[self.layout.node_of_server[server]])
        factor = (srv.crowded_message_factor or 0.0) if crowded and measured is not None \
            else 0.0
        if measured is not None:
            return (r.pools[0], r.pools[1], measured, 0.0, nbytes, factor)
        return (r.pools[0], r.pools[1], _full_bandwidth_s(r.link, nbytes), r.latency_s, nbytes,
                0.0)

    def send(self, w: int, i: int, kind: str, routes: list, start_s: float | None = None
             ) -> float:
        """Carry one message between worker w and server position i (`routes`: this kind's
        cache), posted now or at `start_s` (later: a serial server's reply booked with the
        push it answers); the time it arrives.

        Every link direction (a NIC's out or in, a device link's out or in) carries one
        message at a time, first come first served: a NIC sends the messages posted by its
        node's workers back to back, and a server receives one message at a time and sends
        one reply at a time (measure/runs/ps.py: `recv(src=None)`, apply, reply). A message
        crosses the sender's out and the receiver's in, each FCFS, and has arrived when both
        have carried it (the switch buffers between them), plus the route's latency: the
        tighter (busier) side decides. On a CPU host (a serial server: gloo over loopback,
        measure/runs/ps.py's blocking send and recv) there is no buffer between the two
        sides: the sender's process copies the bytes out while the receiver's copies them
        in, so a message holds both directions over the same span, from when both are free
        (a sender whose receiver is busy waits, and spends no CPU meanwhile: its copy span,
        which core sharing counts, is the span the bytes move). On a node with more
        processes than cores a serial server's message takes at least
        cluster.Server.crowded_message_factor times its 1-worker time where calibration
        measured it: the rest of the span waits for the scheduler and holds no core (the copy
        span stays the shared copies' length, ending with the message). All of it is
        arithmetic on when each direction is free: a transfer costs no event of its own.
        """
        key = w * self.nservers + i
        route = routes[key]
        if route is None:
            route = routes[key] = self._route(w, i, kind)
        out, into, seconds, latency, nbytes, crowd_factor = route
        now = self.env._now if start_s is None else start_s
        at = now
        if out is not None:
            alone_s = seconds if self.service is None else self.service(seconds)
            carry_s = alone_s       # ... and the span its copies hold a core
            if self.link_stretch is not None:
                carry_s *= self.link_stretch[self.layout.node_of_worker[w]]
            busy_s = carry_s
            if crowd_factor * alone_s > carry_s:    # a crowded host's wake-ups: no core held
                carry_s = crowd_factor * alone_s
            free = self.link_free
            f = free[out]
            sent = (f if f > now else now) + carry_s            # max(now, free from)
            f = free[into]
            received = (f if f > now else now) + carry_s
            if self.layout.serial_server:       # no buffer between two processes' copies
                sent = received = sent if sent > received else received
            free[out], free[into] = sent, received
            at = (received if received > sent else sent) + latency
            if self.copy_spans is not None:
                self._copying(w, i, kind, sent - busy_s, sent, received - busy_s, received)
        self.comm_rows.append((kind, w, now, at, nbytes, self.server_names[i]))
        return at

    def _copying(self, w: int, i: int, kind: str, *spans: float) -> None:
        """The sender's and the receiver's copy spans, each on its own node."""
        worker_node = self.layout.node_of_worker[w]
        server_node = self.layout.node_of_server[self.servers[i].index]
        sender, receiver = ((worker_node, server_node) if kind == "push"
                            else (server_node, worker_node))
        self.copy_spans[sender].append((spans[0], spans[1]))
        self.copy_spans[receiver].append((spans[2], spans[3]))

    def _after_slot(self, i: int, at_s: float) -> float:
        """When server position i can start work that arrived at `at_s`: a serial server
        also waits for its slot (messages booked on it before)."""
        slot = self.slots[i]
        if slot is None:
            return at_s
        free = self.link_free[slot]
        return free if free > at_s else at_s

    def _hold_slot(self, i: int, until_s: float) -> None:
        """A serial server's work holds its slot until `until_s`: no message meanwhile."""
        slot = self.slots[i]
        if slot is not None and until_s > self.link_free[slot]:
            self.link_free[slot] = until_s

    def _service(self, mean_s: float) -> float:
        return mean_s if self.service is None else self.service(mean_s)

    # -- the worker's phases -------------------------------------------------------------

    def pulling(self, w: int) -> simpy.Event:
        """Every shard's parameters to worker w; fires when the last has arrived."""
        env = self.env
        done = Event(env)
        latest, routes = env._now, self.pull_routes
        for i in range(self.nservers):
            at = self.send(w, i, "pull", routes)
            if at > latest:
                latest = at
        _fire_at(env, done, latest)
        return done

    def applying(self, w: int) -> simpy.Event:
        """async: push every shard, each applied on arrival (FCFS); fires when every server
        has applied it, with (last arrival, server 0's version it was applied to)."""
        done = Event(self.env)
        arrival, version0, last_end = self._push_and_apply(w)
        _fire_at(self.env, done, last_end, (arrival, version0))
        return done

    def _push_and_apply(self, w: int, more: bool | None = None) -> tuple[float, int, float]:
        """w's push to every server, each applied on arrival (FCFS); on serial servers
        (`more` given: w goes on to another step) each then books the replies its clocks
        allow (`_ready_after`). (Last arrival, server 0's version applied, last apply's end.)"""
        arrival = last_end = self.env._now
        version0, routes = 0, self.push_routes
        for i, server in enumerate(self.servers):
            at = self.send(w, i, "push", routes)
            end, version = server.apply(self._after_slot(i, at), self._service(server.apply_s))
            self._hold_slot(i, end)
            if more is not None:
                for v in self._ready_after(i, w, more):
                    self._reply(i, v, end)
            if i == 0:
                version0 = version
            if at > arrival:
                arrival = at
            if end > last_end:
                last_end = end
        return arrival, version0, last_end

    def accumulating(self, w: int) -> tuple[simpy.Event, list[float]]:
        """sync: push every shard; each server sums it in (FCFS) and, with all N gradients
        of the step, applies the optimizer once. Returns (the step's barrier, [last arrival])."""
        pushed = [self.env._now]
        barrier, routes = self.barrier, self.push_routes
        for i, server in enumerate(self.servers):
            at = self.send(w, i, "push", routes)
            if at > pushed[0]:
                pushed[0] = at
            busy = server.busy_until
            begin = self._after_slot(i, at if at > busy else busy)   # max(at, busy until)
            # a serial server receives a step's first push into the sum itself and adds
            # each later one (measure/runs/ps.py serve_sync): N - 1 passes for N workers
            first_into_sum = self.layout.serial_server and server.arrived == 0
            server.busy_until = begin + (0.0 if first_into_sum
                                         else self._service(server.accumulate_s))
            self._hold_slot(i, server.busy_until)
            if server.spans is not None:
                server.spans.append((begin, server.busy_until))
            server.arrived += 1
            if server.arrived == self.workers:
                server.arrived = 0
                end, _ = server.apply(server.busy_until, self._service(server.apply_s))
                self._hold_slot(i, end)
                self._release(end)
        return barrier, pushed

    def _release(self, end_s: float) -> None:
        """sync: a server applied the step's average; the last one releases every worker."""
        self.released.append(end_s)
        if len(self.released) == len(self.servers):
            barrier, self.barrier = self.barrier, self.env.event()
            _fire_at(self.env, barrier, max(self.released), self.server0.started - 1)
            self.released = []

    # -- whole workers -------------------------------------------------------------------

    def async_worker(self, w: int):
        """async-ps and ssp-ps: pull, compute, push, wait for the apply; repeat while the
        shared budget lasts, first waiting for the slowest worker if SSP holds this one."""
        env, step, ready = self.env, 0, self.env.now
        while True:
            if self.bound is not None and self.slowest < step - self.bound:
                yield self._slowest_reaches(step - self.bound)
            if self.budget == 0:
                return
            self.budget -= 1
            t_pull = env.now
            read = self.server0.applied_by(t_pull)
            yield self.pulling(w)
            t_compute = env.now
            yield env.timeout(self.compute.seconds(w, step))
            t_push = env.now
            if self.compute_spans is not None:
                self.compute_spans[w].append((t_compute, t_push))
            pushed, applied = yield self.applying(w)
            self._record(w, step, ready, t_pull, t_compute, t_push, pushed, read, applied)
            self._completed(w)
            step, ready = step + 1, env.now

    def serial_worker(self, w: int):
        """async-ps and ssp-ps on serial servers (a CPU host: measure/runs/ps.py serve_async,
        one thread per server). A server receives a push, applies it, and at once replies to
        every worker the apply leaves free to go on - the pusher, and under SSP whoever the
        slowest worker's apply releases - in worker order, before it receives the next push.
        So the reply is booked with the push it answers (`_push_and_apply`): booked when the
        worker asks, after the apply, it would queue behind every push that arrived during
        the apply, which the real server receives only after replying."""
        env, step, ready = self.env, 0, self.env.now
        if self.budget == 0:
            return
        self.budget -= 1
        pull = self._expect_pull(w)
        for i in range(self.nservers):      # the first parameters, in worker order at t = 0
            self._reply(i, w, env._now)
        while True:
            t_pull, read = yield pull
            t_compute = env.now
            yield env.timeout(self.compute.seconds(w, step))
            t_push = env.now
            if self.compute_spans is not None:
                self.compute_spans[w].append((t_compute, t_push))
            more = self.budget > 0
            if more:
                self.budget -= 1
                pull = self._expect_pull(w)
            else:
                self.pending[w] = None
            pushed, applied, end = self._push_and_apply(w, more)
            self._record(w, step, ready, t_pull, t_compute, t_push, pushed, read, applied,
                         end)
            if not more:
                return
            step, ready = step + 1, end

    def _expect_pull(self, w: int) -> simpy.Event:
        """w's next pull: fires when every server's reply has arrived, with (when server 0
        began sending it, server 0's version in it)."""
        event = Event(self.env)
        self.pending[w] = [event, self.nservers, 0.0, 0.0, 0]
        return event

    def _reply(self, i: int, w: int, start_s: float) -> None:
        """Server position i sends its shard to worker w, from `start_s` on its one slot
        (after w's last push: a reply nobody computes on, which still holds the slot)."""
        at = self.send(w, i, "pull", self.pull_routes, start_s)
        p = self.pending[w]
        if p is None:
            return
        p[1] -= 1
        if at > p[2]:
            p[2] = at
        if i == 0:
            p[3], p[4] = start_s, self.server0.started
        if p[1] == 0:
            _fire_at(self.env, p[0], p[2], (p[3], p[4]))

    def _ready_after(self, i: int, w: int, more: bool) -> list[int]:
        """Server position i's clocks after w's push (measure/runs/ps.py: clocks, held,
        `ready = sorted(...)`): the workers it replies to now, in worker order. Async: w.
        SSP: w unless it is more than s pushes ahead of the slowest, and whoever the
        slowest's push releases. A worker's last push (`more` false) is answered at once (the
        real worker waits for that reply too) and it stops counting as the slowest."""
        clocks, at_clock, held = self.srv_clock[i], self.srv_at_clock[i], self.srv_held[i]
        c = clocks[w]
        clocks[w] = c + 1
        at_clock[c] -= 1
        if more:
            at_clock[c + 1] += 1
        if self.bound is None:
            return [w]
        slowest = self.srv_slowest[i]
        while at_clock and at_clock[slowest] == 0:
            del at_clock[slowest]
            slowest += 1
        if not at_clock:
            slowest = float("inf")
        moved = slowest != self.srv_slowest[i]
        self.srv_slowest[i] = slowest
        if more:
            held.add(w)
        if not moved:
            if more and clocks[w] - slowest <= self.bound:
                held.discard(w)
            return [] if w in held else [w]
        ready = [v for v in held if clocks[v] - slowest <= self.bound]
        held.difference_update(ready)
        if not more:
            ready.append(w)
        return sorted(ready)

    def sync_worker(self, w: int):
        env = self.env
        for step in range(self.steps_each):
            t_pull = ready = env.now
            read = self.server0.applied_by(t_pull)
            yield self.pulling(w)
            t_compute = env.now
            yield env.timeout(self.compute.seconds(w, step))
            t_push = env.now
            if self.compute_spans is not None:
                self.compute_spans[w].append((t_compute, t_push))
            barrier, pushed = self.accumulating(w)
            applied = yield barrier
            self._record(w, step, ready, t_pull, t_compute, t_push, pushed[0], read, applied)

    def _record(self, w, step, ready, t_pull, t_compute, t_push, pushed, read, applied,
                end=None):
        if end is None:
            end = self.env._now
        self.step_records.append((                    # worker, step, start_s, end_s,
            w, step, ready, end, t_push - t_compute,  # compute_s, comm_exposed_s, wait_s
            (t_compute - t_pull) + (pushed - t_push), (t_pull - ready) + (end - pushed)))
        self.update_records.append((                  # version_read, version_applied, time
            w, step, read, applied, end))

    # -- SSP clocks ----------------------------------------------------------------------

    def _completed(self, w: int) -> None:
        """Advance w's clock; when the slowest clock moves, wake whoever waited for it."""
        c = self.clock[w]
        self.clock[w] = c + 1
        self.at_clock[c] -= 1
        self.at_clock[c + 1] += 1
        while self.at_clock[self.slowest] == 0:
            del self.at_clock[self.slowest]
            self.slowest += 1
            waiters = self.unblock.pop(self.slowest, None)
            if waiters is not None:
                waiters.succeed()

    def _slowest_reaches(self, clock: int) -> simpy.Event:
        if clock not in self.unblock:
            self.unblock[clock] = self.env.event()
        return self.unblock[clock]


def _crowded_nodes(cluster: ClusterProfile, layout: psnet.Layout, workers: int,
                   servers: list[int], nodes: int) -> list[bool]:
    """Per node: does a CPU host run more PS processes (its workers and servers) than it
    has cores? There a serial server's messages take cluster.Server.crowded_message_factor
    times their 1-worker time (`send`) and its update crowded_update_factor times its
    fitted one (`server_apply_s`), where calibration measured them."""
    cores = cluster.compute_cpu_cores_per_node
    if cores <= 0:
        return [False] * nodes
    count = Counter(layout.node_of_worker[w] for w in range(workers))
    count.update(layout.node_of_server[k] for k in servers)
    return [count[node] > cores for node in range(nodes)]


def _sharing_groups(run: _PSRun) -> list[tuple[list[int], list[int], bool]]:
    """Who shares compute with whom: (worker indices, server positions, on CPU cores?).
    A CPU host (compute_cpu_cores_per_node > 0): each node's workers and the servers placed
    on that node share its cores. A GPU: a colocated server shares its host worker's device.
    Dedicated servers on their own nodes share nothing with workers."""
    cluster, layout = run.cluster, run.layout
    server_pos = {s.index: i for i, s in enumerate(run.servers)}
    groups = []
    if cluster.compute_cpu_cores_per_node > 0:
        for node in range(run.hardware.worker_nodes):
            workers = [w for w in range(run.workers) if layout.node_of_worker[w] == node]
            servers = [i for k, i in server_pos.items() if layout.node_of_server[k] == node]
            groups.append((workers, servers, True))
    elif run.hardware.placement == "colocated":
        hosts: dict[int, list[int]] = {}
        for k, i in server_pos.items():
            hosts.setdefault(layout.device_of_server[k], []).append(i)
        groups = [([w], servers, False) for w, servers in sorted(hosts.items())]
    return groups


def _busy_part(span: tuple[float, float], speed: float) -> tuple[float, float]:
    """The part of a compute span that holds a core. On a CPU host a worker of speed s < 1
    is what measure/timing.py's Straggler makes it: its compute, then a sleep of
    compute·(1/s − 1) that holds no core, so only the first s of the span is busy. On a GPU
    (speed 1 here) a slower device is busy for all of it."""
    start, end = span
    return (start, start + (end - start) * min(speed, 1.0))


def _stretch_classes(run: _PSRun, ws: list[int]) -> list[list[int]]:
    """The workers of a node that share one compute stretch. Where compute occupies the
    cores, one class per speed: a straggler computes for the first s of its span, then sleeps
    (`_busy_part`), and feels the others only then. In a timed wait the node's workers are
    one class: each holds a core only for its own CPU work (copies, zero gradients), the
    same work at any speed, and the real runs show it waiting as long (a straggler's compute
    before its sleep within ~1 ms of the fast workers' in four stores of SSP runs, where its
    own stretch gave it 5.5 ms less: docs/model.md, since report 43)."""
    if not run.cluster.compute_occupies_cores:
        return [list(ws)]
    return [[w for w in ws if float(run.speeds[w]) == speed]
            for speed in sorted({float(run.speeds[w]) for w in ws})]


def _sharing_note(run: _PSRun) -> str:
    workers, servers, links = run.stretch
    where = (f"{run.cluster.compute_cpu_cores_per_node} cores per node"
             if run.cluster.compute_cpu_cores_per_node else "the host device")
    copies = ("" if links is None else
              f", transfers (CPU copies) x{min(links):.2f}-{max(links):.2f}")
    return (f"compute shared ({where}; busy processes and server duty cycle as a fixed "
            f"point): worker compute x{min(workers):.2f}-{max(workers):.2f}, server applies "
            f"x{min(servers):.2f}-{max(servers):.2f}{copies}")


def _sharing_stretch(run: _PSRun, first: bool = False
                     ) -> tuple[list[float], list[float], list[float] | None] | None:
    """(compute stretch per worker, apply stretch per server position, transfer stretch per
    node or None) from the busy spans of a finished `run` (cores.fluid_stretch); `first`:
    the starting guess before any run (the node's workers all computing, servers idle), or
    None when nothing shares compute.

    Where communication is CPU-driven too (`comm_cpu_cores_per_node` > 0: gloo on a CPU
    host), both sides of every transfer keep a core busy copying while it is carried: those
    copies count as busy processes for the compute and the applies, and are themselves
    stretched by the sharing beyond the two processes the link was calibrated with (a 2-rank
    collective sweep), s(b)/s(2)."""
    groups = _sharing_groups(run)
    if not groups:
        return None
    cluster = run.cluster
    on_cores_share = partial(cluster.compute_share, workload=run.workload_name)
    workers, servers = [1.0] * run.workers, [1.0] * len(run.servers)
    copying = cluster.comm_cpu_cores_per_node > 0 and all(g[2] for g in groups)
    links = [1.0] * run.hardware.nodes if copying else None
    for node, (ws, ss, on_cores) in enumerate(groups):
        if first:
            if on_cores:
                for w in ws:
                    workers[w] = on_cores_share(cluster.ranks_busy(len(ws)))
            continue
        if cluster.compute_occupies_cores:
            by_worker = {w: [_busy_part(span, run.speeds[w] if on_cores else 1.0)
                             for span in run.compute_spans[w]] for w in ws}
        else:   # a timed wait: only the worker's own CPU work holds a core, at the start
            by_worker = {w: [(a, min(b, a + run.paid_s)) for a, b in run.compute_spans[w]
                             if min(b, a + run.paid_s) > a] for w in ws}
        compute = [span for w in ws for span in by_worker[w]]
        share = on_cores_share if on_cores else cores.device_share
        copies = [run.copy_spans[node]] if copying else []
        applies = [run.servers[i].spans for i in ss]
        # A worker feels the others while it computes, so workers that differ (a straggler
        # holds a core for part of its span) get their own stretch; workers of one speed are
        # alike and share theirs, measured over all of them (module docstring). In a timed
        # wait every worker's busy part is alike, its own CPU work, whatever its speed: one
        # stretch for the node's workers (`_stretch_classes`).
        for alike in _stretch_classes(run, ws):
            own = [span for w in alike for span in by_worker[w]]
            others = [by_worker[v] for v in ws if v not in alike]
            stretch_w = cores.fluid_stretch(own, [*others, *applies, *copies], share)
            for w in alike:
                workers[w] = stretch_w
        for i in ss:     # the server computes beside the workers it overlaps, and the others
            others = [run.servers[j].spans for j in ss if j != i]
            servers[i] = cores.fluid_stretch(run.servers[i].spans, [compute, *others, *copies],
                                             share)
        if copying:
            links[node] = cores.fluid_stretch(run.copy_spans[node], [compute, *applies],
                                              cores.beyond_pair(share))
    return workers, servers, links


class _PSStrategy:
    name = ""
    Options: type = SyncPSOptions

    def __init__(self, options=None):
        self.options = self.Options() if options is None else options
        # Seconds of each transfer and apply from its mean; None = the mean (deterministic).
        # Tests set exponential draws to check the network against exact MVA.
        self.service: Callable[[float], float] | None = None

    def hardware(self, scenario: Scenario) -> psnet.Hardware:
        """Devices and nodes this configuration occupies, servers included."""
        return psnet.hardware(scenario.cluster, scenario.workload, scenario.workers,
                              self.options.servers, self.options.server_placement)

    def memory(self, scenario: Scenario) -> Mapping[str, MemoryBreakdown]:
        """{"worker": ..., "server": ...}: see perfmodel.memory.ps_memory."""
        hw = self.hardware(scenario)
        return memory_model.ps_memory(scenario, self.options.servers,
                                      shard_params=hw.shard_params,
                                      colocated=hw.placement == "colocated")

    def _run(self, scenario: Scenario, worker: str, **kw) -> _PSRun:
        """Simulate `worker` ("sync" or "async") to the end. Where workers and servers share
        compute (a CPU host's cores, a GPU hosting a colocated server) the stretch is a fixed
        point: simulate, measure the busy counts, stretch, simulate again until the stretch
        moves by less than SHARING_TOLERANCE (at most SHARING_ROUNDS - 1 simulations; after
        UNDAMPED_ROUNDS the update is damped, since busy counts measured on a few steps can
        oscillate)."""
        stretch = None
        for rounds in range(SHARING_ROUNDS):
            run = _PSRun(scenario, self.options.servers, self.options.server_placement,
                         service=self.service, stretch=stretch, **kw)
            if stretch is None:
                stretch = _sharing_stretch(run, first=True)
                if stretch is None:                 # nothing shares compute: one run
                    run.go(getattr(run, f"{worker}_worker"))
                    return run
                continue
            run.go(getattr(run, f"{worker}_worker"))
            new = _sharing_stretch(run)
            flat_new = [x for part in new if part is not None for x in part]
            flat_old = [x for part in stretch if part is not None for x in part]
            moved = max(abs(a / b - 1) for a, b in zip(flat_new, flat_old, strict=True))
            if moved < SHARING_TOLERANCE:
                break
            if rounds >= UNDAMPED_ROUNDS:       # still moving: it oscillates, so damp it
                new = tuple(None if x is None else [(a + b) / 2 for a, b in
                                                     zip(x, y, strict=True)]
                            for x, y in zip(new, stretch, strict=True))
            stretch = new
        return run

    def _placement_note(self, run: _PSRun) -> str:
        hw = run.hardware
        shards = sorted(s.shard_params for s in run.servers)
        return (f"{len(hw.shard_params)} {hw.placement} server(s) on {hw.nodes} nodes, "
                f"{hw.devices} devices; shards {shards[0]:,.0f}-{shards[-1]:,.0f} params")


class SyncPS(_PSStrategy):
    """Synchronous PS: every step waits for all N gradients, one averaged update."""

    name = "sync-ps"
    Options = SyncPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        run = self._run(scenario, "sync")
        return run.result((
            "sync-ps: every worker does `steps` steps; servers sum gradients as they arrive "
            "and apply the optimizer once per step", self._placement_note(run)))


class AsyncPS(_PSStrategy):
    """Asynchronous PS: every gradient applied on arrival, whatever version it was read on."""

    name = "async-ps"
    Options = AsyncPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        opts = self.options
        passes = DC_ASGD_EXTRA_PASSES if opts.delay_compensation else 0.0
        run = self._run(scenario, "async", dc_passes=passes)
        notes = ["async-ps: workers share a budget of workers x steps mini-batches",
                 self._placement_note(run)]
        if opts.staleness_aware_lr:
            notes.append("staleness-aware learning rate alpha0/tau: no time cost")
        if opts.delay_compensation:
            notes.append(f"delay compensation (DC-ASGD): each apply charged the optimizer plus "
                         f"{passes:g} elementwise passes over the shard's gradient")
        return run.result(tuple(notes))


class SSPPS(_PSStrategy):
    """Stale-synchronous PS: async applies, no worker more than s clocks ahead."""

    name = "ssp-ps"
    Options = SSPPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        s = self.options.staleness_bound
        run = self._run(scenario, "async", staleness_bound=s)
        return run.result((
            f"ssp-ps: staleness bound s = {s}; workers share a budget of workers x steps "
            "mini-batches", self._placement_note(run)))
