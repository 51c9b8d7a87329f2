"""Parameter-server training: synchronous, asynchronous and bounded-staleness (SSP) PS.

Model (DESIGN.md "Parameter server"; a closed queueing network, the machine-repairman model):
N workers and `servers` server processes; the parameters are sharded evenly over the servers,
each with its own fair-share link (the cluster's `server.link`, fairshare.py) and its own FIFO
apply step. One worker step:

  pull   every shard's parameters (param_bytes / servers from each server, all at once),
  compute forward + backward (compute.unit_times with no optimizer work, times StepNoise),
  push   every shard's gradient (params x grad_bytes / servers to each server, all at once),
  apply  on each server, FIFO: gradient bytes / (server.apply_GBps x 1e9) seconds.

The worker's next pull waits for its own gradient's apply (a server answers a worker's
messages in order), so one cycle = pull + compute + push + apply queue + apply: the exact
mean-value analysis of mva.py predicts async-ps throughput.

- async-ps (Dean et al. 2012, Downpour SGD): a server applies each gradient on arrival.
  Staleness = server version when applying - version the worker pulled (Zhang et al. 2016).
- sync-ps: each server adds every gradient of a step to a running sum as it arrives (one
  apply's worth of memory traffic each: read sum and gradient, write sum), applies the average
  once when all N have arrived, then every worker pulls. Staleness 0 by construction.
- ssp-ps (Ho et al., NIPS 2013): async apply, and a worker more than s clocks (completed steps)
  ahead of the slowest waits before its next pull; s = 0 is synchronous progress.

Records: one StepRecord per worker step (start = the end of its previous step; comm_exposed_s
= pull + push durations, which contention on the fair-share link stretches; wait_s = SSP wait
+ apply queue + apply, or the barrier in sync-ps), one UpdateRecord per gradient, one
CommRecord per pull and push on every server's link.

Assumptions to know:
- Workers draw steps from a shared budget of workers x steps mini-batches (a shared data
  queue) in async-ps and ssp-ps, so fast workers do more steps than slow ones and the run
  never ends with one straggler working alone; in sync-ps every worker does `steps`.
- Shards are symmetric (same bytes to every server at the same instants), so every server
  evolves exactly like server 0: the model simulates server 0 and copies its transfer records
  to the others; versions and staleness are server 0's.
- Only the servers' links are modelled; a worker's own NIC is assumed never the bottleneck.
- Delay compensation (DC-ASGD, Zheng et al. 2017) makes the server also compute
  g + λ g⊙g⊙(w_now − w_old) and keep each worker's w_old: unfused elementwise passes (g⊙g,
  w_now − w_old, their product, the scaled add, the backup copy at each pull) touch about 3x the
  bytes of a plain SGD apply (read w, read g, write w), so an apply is charged 1 + 3 = 4 plain
  applies (DC_ASGD_EXTRA_APPLY). The staleness-aware rate α₀/τ (Zhang et al. 2016) costs no
  time; it is recorded in the result's notes for the accuracy model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import simpy

from perfmodel import memory as memory_model
from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown
from perfmodel.sim.compute import StepNoise, unit_times
from perfmodel.sim.engine import CountingEnvironment
from perfmodel.sim.fairshare import FairShareLink
from perfmodel.sim.records import CommRecord, SimResult, StepRecord, UpdateRecord
from perfmodel.sim.scenario import Scenario

DC_ASGD_EXTRA_APPLY = 3.0      # delay compensation's extra server work, in plain applies


def _check_servers(servers: object) -> None:
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise PerfmodelError(f"servers must be a whole number of at least 1, got {servers!r}")


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PerfmodelError(f"{name} must be true or false, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncPSOptions:
    servers: int = 1                    # parameter shards, one server (link, apply) each

    def __post_init__(self):
        _check_servers(self.servers)


@dataclass(frozen=True, kw_only=True, slots=True)
class AsyncPSOptions:
    servers: int = 1                    # parameter shards, one server (link, apply) each
    staleness_aware_lr: bool = False    # scale each gradient by α₀/τ (Zhang et al. 2016)
    delay_compensation: bool = False    # DC-ASGD on the server (Zheng et al. 2017)

    def __post_init__(self):
        _check_servers(self.servers)
        _check_flag("staleness_aware_lr", self.staleness_aware_lr)
        _check_flag("delay_compensation", self.delay_compensation)


@dataclass(frozen=True, kw_only=True, slots=True)
class SSPPSOptions:
    servers: int = 1                    # parameter shards, one server (link, apply) each
    staleness_bound: int = 3            # s: max clocks a worker may run ahead of the slowest

    def __post_init__(self):
        _check_servers(self.servers)
        s = self.staleness_bound
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise PerfmodelError(f"staleness bound must be a whole number >= 0, got {s!r}")


class _ComputeTimes:
    """Forward + backward seconds of (worker, step): nominal x StepNoise. Rows (one per step,
    every worker) are drawn in step order, so a pair gets the same draw whatever the event
    order: common random numbers across strategies, bandwidths and options."""

    def __init__(self, noise: StepNoise, nominal_s: float):
        self.noise, self.nominal_s, self.rows = noise, nominal_s, []

    def seconds(self, worker: int, step: int) -> float:
        while step >= len(self.rows):
            self.rows.append((self.noise.draw() * self.nominal_s).tolist())
        return self.rows[step][worker]


class _Server:
    """Server 0: its shard's link, its FIFO apply step and its model version.

    Shards are symmetric: every worker sends the same bytes to every server at the same
    instants, so all servers' links and apply queues evolve identically and their transfers
    end together. The model therefore simulates server 0 only (exactly, and `servers` times
    cheaper) and copies its transfer records to the other servers' links.
    """

    def __init__(self, env: simpy.Environment, scenario: Scenario, servers: int,
                 apply_factor: float):
        wl, cluster = scenario.workload, scenario.cluster
        self.records: list[CommRecord] = []
        link = getattr(cluster, cluster.server.link)
        self.link = FairShareLink.from_link(env, "server0", self.records, link)
        self.apply = simpy.Resource(env, capacity=1)
        self.pull_bytes = wl.param_bytes / servers
        self.push_bytes = wl.params * wl.precision_spec.grad_bytes / servers
        self.apply_s = apply_factor * self.push_bytes / (cluster.server.apply_GBps * 1e9)
        self.version = 0                # updates applied so far
        self.arrived = 0                # sync-ps: gradients of the current step summed
        self.applied = env.event()      # sync-ps: fires with the version the average went onto


class _PSRun:
    """One simulation: the server, the workers' shared state, and the records."""

    def __init__(self, scenario: Scenario, servers: int, apply_factor: float = 1.0,
                 staleness_bound: int | None = None):
        self.env = env = CountingEnvironment()
        self.workers, self.steps_each, self.servers = scenario.workers, scenario.steps, servers
        self.step_records: list[StepRecord] = []
        self.update_records: list[UpdateRecord] = []
        self.server = _Server(env, scenario, servers, apply_factor)
        nominal = unit_times(scenario.cluster, scenario.workload, scenario.batch_size,
                             optimizer_param_fraction=0).step_s
        self.compute = _ComputeTimes(StepNoise(scenario, scenario.rng()), nominal)
        self.budget = scenario.workers * scenario.steps     # async/ssp: shared mini-batches
        self.bound = staleness_bound                          # ssp: s; None = unbounded
        self.clock = [0] * scenario.workers                   # completed steps per worker
        self.at_clock = Counter({0: scenario.workers})
        self.slowest = 0
        self.unblock: dict[int, simpy.Event] = {}             # slowest clock -> waiters

    def run(self, worker, notes: tuple[str, ...]) -> SimResult:
        for w in range(self.workers):
            self.env.process(worker(w))
        self.env.run()
        comms = tuple(CommRecord(c.kind, c.worker, c.start_s, c.end_s, c.bytes, f"server{i}")
                      for c in self.server.records for i in range(self.servers))
        return SimResult(steps=tuple(self.step_records), updates=tuple(self.update_records),
                         comms=comms, events=self.env.events, notes=notes)

    # -- the worker's phases, as seen on server 0 ------------------------------------------

    def applying(self, w: int):
        """async: push, then apply on arrival (FIFO); returns (pushed at, version applied to)."""
        server = self.server
        yield from server.link.transfer("push", w, server.push_bytes)
        pushed = self.env.now
        with server.apply.request() as req:
            yield req
            version = server.version
            yield self.env.timeout(server.apply_s)
            server.version += 1
        return pushed, version

    def accumulating(self, w: int):
        """sync: push, add to the step's sum (FIFO); the last gradient's arrival applies the
        average once and releases everyone. Returns (pushed at, version applied to)."""
        env, server = self.env, self.server
        yield from server.link.transfer("push", w, server.push_bytes)
        pushed, barrier = env.now, server.applied
        with server.apply.request() as req:
            yield req
            yield env.timeout(server.apply_s)
        server.arrived += 1
        if server.arrived < self.workers:
            return pushed, (yield barrier)
        server.arrived = 0
        with server.apply.request() as req:
            yield req
            version = server.version
            yield env.timeout(server.apply_s)
            server.version += 1
        server.applied = env.event()
        barrier.succeed(version)
        return pushed, version

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
            yield from self._one_step(w, step, ready, self.applying)
            self._completed(w)
            step, ready = step + 1, env.now

    def sync_worker(self, w: int):
        for step in range(self.steps_each):
            yield from self._one_step(w, step, self.env.now, self.accumulating)

    def _one_step(self, w: int, step: int, ready: float, deliver):
        env = self.env
        t_pull = env.now
        read = self.server.version
        yield from self.server.link.transfer("pull", w, self.server.pull_bytes)
        t_compute = env.now
        yield env.timeout(self.compute.seconds(w, step))
        t_push = env.now
        pushed, applied = yield from deliver(w)
        end = env.now
        self.step_records.append(StepRecord(
            worker=w, step=step, start_s=ready, end_s=end, compute_s=t_push - t_compute,
            comm_exposed_s=(t_compute - t_pull) + (pushed - t_push),
            wait_s=(t_pull - ready) + (end - pushed)))
        self.update_records.append(UpdateRecord(worker=w, step=step, version_read=read,
                                                version_applied=applied, time_s=end))

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


class _PSStrategy:
    name = ""
    Options: type = SyncPSOptions

    def __init__(self, options=None):
        self.options = self.Options() if options is None else options

    def memory(self, scenario: Scenario) -> Mapping[str, MemoryBreakdown]:
        """{"worker": ..., "server": ...}: see perfmodel.memory.ps_memory."""
        return memory_model.ps_memory(scenario, self.options.servers)


class SyncPS(_PSStrategy):
    """Synchronous PS: every step waits for all N gradients, one averaged update."""

    name = "sync-ps"
    Options = SyncPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        run = _PSRun(scenario, self.options.servers)
        return run.run(run.sync_worker, (
            "sync-ps: every worker does `steps` steps; servers sum gradients as they arrive "
            "and apply the average once per step",))


class AsyncPS(_PSStrategy):
    """Asynchronous PS: every gradient applied on arrival, whatever version it was read on."""

    name = "async-ps"
    Options = AsyncPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        opts = self.options
        factor = 1.0 + (DC_ASGD_EXTRA_APPLY if opts.delay_compensation else 0.0)
        notes = ["async-ps: workers share a budget of workers x steps mini-batches"]
        if opts.staleness_aware_lr:
            notes.append("staleness-aware learning rate alpha0/tau: no time cost")
        if opts.delay_compensation:
            notes.append(f"delay compensation (DC-ASGD): each apply charged {factor:g} plain "
                         "applies")
        run = _PSRun(scenario, opts.servers, apply_factor=factor)
        return run.run(run.async_worker, tuple(notes))


class SSPPS(_PSStrategy):
    """Stale-synchronous PS: async applies, no worker more than s clocks ahead."""

    name = "ssp-ps"
    Options = SSPPSOptions

    def simulate(self, scenario: Scenario) -> SimResult:
        s = self.options.staleness_bound
        run = _PSRun(scenario, self.options.servers, staleness_bound=s)
        return run.run(run.async_worker, (
            f"ssp-ps: staleness bound s = {s}; workers share a budget of workers x steps "
            "mini-batches",))
