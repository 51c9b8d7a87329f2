"""DistributedDataParallel: bucketed gradient all-reduce overlapping backward.

Model (torch 2.13 `torch/nn/parallel/distributed.py` and `reducer.cpp`; DESIGN.md):
- each step runs the units' forward in order, then their backward in reverse;
- gradients are bucketed in reverse parameter order, whole tensors as torch fills them: a
  bucket closes once it holds at least its limit, `first_bucket_MiB` for the first (1 MiB,
  `dist._DEFAULT_FIRST_BUCKET_BYTES`), `bucket_cap_MiB` (25 MiB) after, so a tensor larger than
  the cap is a bucket alone (the measured runs' bucket sizes, measure/runs/ddp.py, agree:
  mlp's default buckets are 4,239,400 and 8,663,040 bytes). A unit's gradients become ready
  pro rata through its backward; a workload without per-tensor counts splits units pro rata;
- a bucket's all-reduce starts when the bucket is ready on ALL ranks and the previous bucket's
  all-reduce is done (one communication stream: a `SharedLink`), overlapping the rest of
  backward; the optimizer step runs after the last all-reduce, the next step after that;
- the reducer's own memory-bound passes over the gradients (`reducer.cpp`, with the default
  gradient_as_bucket_view=False that perfmodel/memory.py assumes too), each a read and a write
  of the bucket's bytes, copies at the host's copy rate (`compute.copy_Bps()`: on a CPU
  host the rate fitted from the calibration's FSDP copies, which a timed-wait DDP rank's own
  thread showed its copies run at too, docs/model.md; else `compute.optimizer_GBps`) and
  in-place divides at `compute.optimizer_GBps`, as FSDP's: as a gradient is computed it is
  copied into its bucket (divided by the world size in the same pass, `at::mul_out`, unless a comm
  hook is registered: then the copy is plain and the hook divides the bucket in a pass of its
  own before issuing its all-reduce, as torch's `allreduce_hook` does; bf16_compress_hook's
  cast and divide count as one such pass and its cast back as one more after the all-reduce);
  after the last all-reduce every bucket is copied back into the gradients
  (`finalize_bucket_dense`) before backward returns. The copies and the hooks' divides run on
  the compute thread or stream and delay the backward after them; the last bucket's divide
  and the copy-back follow the backward, so they are exposed (where measure/runs/ddp.py's
  timer sees them). On a CPU host every rank of a node makes these passes at once, so they
  are stretched by `cluster.compute_share(ranks per node)`; in a timed wait only the stretch
  is left, since the harness pays their CPU time back from the sleeps
  (`cores.own_work_s_per_byte`). A timed wait also writes every gradient, as zeros, on the
  rank's own thread right before the reducer copies it (measure/timed_wait.py: the
  gradient of a unit's one-element stand-in output is a fresh full-size tensor): one more
  write of the gradient bytes at the copy rate, counted with the copy in.

One SimPy process drives all workers at once: per-worker clocks are numpy arrays (workers run
independently between collectives; a collective starts at the latest rank's ready time), and
a `reducer` SimPy process, the communication stream, all-reduces the buckets in order on the
shared link. SimPy events per step are O(buckets), independent of the worker count.

Per worker and step, end_s − start_s = compute_s + comm_exposed_s + wait_s, where the blocked
time (end − start − compute) is split by a counterfactual: comm_exposed_s is the blocked time
the worker would have had if every rank had run exactly as fast as it did (communication its
own compute did not hide); wait_s is the rest, time lost because OTHER ranks were late
(stragglers, jitter). Synchronous training: every update has staleness 0.

On a CPU host (`topology.compute_cpu_cores_per_node` > 0) the ranks of a node compute at
once on its cores, so every pass is stretched by `cluster.compute_share(ranks per node)`
(perfmodel/sim/cores.py); on GPUs the factor is 1. In a timed wait with more ranks than cores
a step also fits the node's CPU work (`cores.node_cpu_floor_s`): the sleeps before the first
bucket and the optimizer's, then every all-reduce and every rank's reducer passes on the
cores, the passes filling the share of the cores the crowded all-reduces leave idle
(`topology.comm_cpu_busy_by_level`: a rank's gloo thread reduces one bucket while its
training thread copies the next); those sleeps are shorter by the copy back (and a hook's
last cast back), whose CPU time the harness's Sleeper pays back from the optimizer's and
forward's sleeps right after it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import ALLREDUCE_ALGORITHMS, allreduce_s
from perfmodel.sim.compute import StepNoise, UnitTimes, in_flight_fraction, unit_times
from perfmodel.sim.cores import (
    node_cpu_floor_s,
    node_cpu_work_s,
    own_work_s_per_byte,
    ranks_note,
)
from perfmodel.sim.engine import CountingEnvironment, SharedLink
from perfmodel.sim.records import CommRecord, SimResult, StepRecord, UpdateRecord
from perfmodel.sim.scenario import Scenario
from perfmodel.workload import Workload

MiB = 2**20
MAX_BUCKETS = 100_000       # beyond this a bucket cap is a typo, and the simulation would crawl
GRAD_COMPRESSION = ("none", "bf16")
COMM_HOOKS = ("none", "allreduce")
HARNESS_COMM_HOOK = "allreduce"     # measure/runs/ddp.py times buckets in a wrapped allreduce_hook


@dataclass(frozen=True, slots=True)
class FloorInputs:
    """One step's inputs to the crowded-node CPU floor (cores.node_cpu_floor_s), seconds."""

    ranks: int                  # the node's ranks
    idle_s: float               # sleeps before the first bucket, and the optimizer's
    collectives_s: float        # the all-reduces, back to back
    own_cpu_s: float            # each rank's reducer passes at the unshared rates
    paid_back_s: float          # of those, what the Sleeper pays back from the sleeps


@dataclass(frozen=True, slots=True)
class HostPasses:
    """The reducer's memory-bound passes over the gradients of one step (module docstring),
    in seconds on one rank: copying each unit's gradients into its bucket (forward order, like
    UnitTimes), a hook's divide of each bucket before its all-reduce and its cast back after
    it (DDP's bucket order), and the copy back into the gradients after the last all-reduce."""

    copy_in_s: np.ndarray
    before_s: np.ndarray
    after_s: np.ndarray
    copy_back_s: float

    def total_s(self) -> float:
        return float(self.copy_in_s.sum() + self.before_s.sum() + self.after_s.sum()
                     + self.copy_back_s)

    def in_compute_s(self) -> float:
        """The part a run's timer counts as compute: every pass inside backward (all but the
        last bucket's divide, which follows the backward)."""
        return float(self.copy_in_s.sum() + self.before_s[:-1].sum())


@dataclass(frozen=True, slots=True)
class Bucket:
    """One DDP gradient bucket: its size and when its last gradient is ready."""

    nbytes: float
    ready_backward_s: float     # nominal seconds into backward when its last gradient is ready


def gradient_buckets(workload: Workload, backward_s: np.ndarray, bucket_cap_MiB: float,
                     first_bucket_MiB: float) -> list[Bucket]:
    """Buckets in the order DDP all-reduces them (reverse parameter order).

    `backward_s` is the nominal backward seconds per unit in forward order. Where the workload
    lists each unit's tensors (`Unit.tensor_params`), buckets hold whole tensors as torch's
    `_compute_bucket_assignment_by_size` (reducer.cpp) fills them: tensors in gradient-ready
    order join the open bucket, which closes once it holds at least its limit
    (`first_bucket_MiB` for the first, `bucket_cap_MiB` after), so one tensor larger than the
    cap is a bucket of its own. Else a unit is split pro rata at the limits.
    """
    grad_bytes = np.array([u.params * workload.precision_spec.grad_bytes
                           for u in workload.units], dtype=float)[::-1]
    bwd = np.asarray(backward_s, dtype=float)[::-1]
    total = grad_bytes.sum()
    if total <= 0:
        return []
    first, cap = first_bucket_MiB * MiB, bucket_cap_MiB * MiB
    if (total - first) / cap > MAX_BUCKETS:
        raise PerfmodelError(f"a {bucket_cap_MiB:g} MiB bucket cap splits {total / MiB:,.0f} MiB "
                             f"of gradients into more than {MAX_BUCKETS:,} buckets; raise it")
    if all(u.tensor_params or not u.params for u in workload.units):
        return _whole_tensor_buckets(workload, bwd, first, cap)
    ends = list(np.arange(first, total, cap)) + [total]   # byte offset where each bucket ends
    cum_bytes, cum_bwd = np.cumsum(grad_bytes), np.cumsum(bwd)
    buckets, previous = [], 0.0
    for end in ends:
        u = int(np.searchsorted(cum_bytes, end, side="left"))   # unit holding the last byte
        u = min(u, len(grad_bytes) - 1)
        fraction = (end - (cum_bytes[u] - grad_bytes[u])) / grad_bytes[u]
        ready = cum_bwd[u] - bwd[u] + min(fraction, 1.0) * bwd[u]
        buckets.append(Bucket(nbytes=float(end - previous), ready_backward_s=float(ready)))
        previous = end
    return buckets


def _whole_tensor_buckets(workload: Workload, bwd_reversed: np.ndarray, first: float,
                          cap: float) -> list[Bucket]:
    """gradient_buckets over whole tensors (its docstring); a tensor's gradient is ready its
    share of bytes of the way through its unit's backward (tensors in reverse order too)."""
    element = workload.precision_spec.grad_bytes
    buckets, size, limit, elapsed = [], 0.0, first, 0.0
    for unit, unit_s in zip(workload.units[::-1], bwd_reversed, strict=True):
        unit_bytes, done = unit.params * element, 0.0
        for params in unit.tensor_params[::-1]:
            done += params * element
            size += params * element
            if size >= limit:
                buckets.append(Bucket(nbytes=size, ready_backward_s=float(
                    elapsed + unit_s * done / unit_bytes)))
                size, limit = 0.0, cap
        elapsed += unit_s
    if size > 0:
        buckets.append(Bucket(nbytes=size, ready_backward_s=float(elapsed)))
    return buckets


def overlapped_s(buckets: list[Bucket], durations: np.ndarray, backward_s: float) -> float:
    """Seconds of all-reduce that run before backward ends (`backward_s` after it starts):
    one stream, so bucket b's all-reduce starts once it is ready and the one before it has
    ended, and runs for its `durations[b]`; each counts up to backward's end."""
    end = total = 0.0
    for bucket, seconds in zip(buckets, durations, strict=True):
        start = max(bucket.ready_backward_s, end)
        end = start + float(seconds)
        total += max(0.0, min(end, backward_s) - start)
    return total


def link_name(scenario: Scenario) -> str:
    return "inter_node" if scenario.cluster.nodes_for(scenario.workers) > 1 else "intra_node"


def sync_step_records(step: int, start: np.ndarray, end: np.ndarray, compute: np.ndarray,
                      alone_end: np.ndarray) -> tuple[list[StepRecord], list[UpdateRecord]]:
    """One synchronous step's records for every worker.

    `alone_end` is when each worker would have ended had every rank run as it did; the
    blocked time up to it is comm_exposed_s, the rest wait_s (see the module docstring).
    """
    blocked = np.maximum(end - start - compute, 0.0)
    exposed = np.clip(alone_end - start - compute, 0.0, blocked)
    wait = blocked - exposed
    rows = zip(start.tolist(), end.tolist(), compute.tolist(), exposed.tolist(),
               wait.tolist(), strict=True)
    steps, updates = [], []
    for w, (s, e, c, x, wt) in enumerate(rows):
        steps.append(StepRecord(w, step, s, e, c, x, wt))
        updates.append(UpdateRecord(w, step, step, step, e))
    return steps, updates


class DDP:
    """PyTorch DistributedDataParallel."""

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Options:
        bucket_cap_MiB: float = 25.0     # DDP(bucket_cap_mb=...)
        first_bucket_MiB: float = 1.0    # dist._DEFAULT_FIRST_BUCKET_BYTES
        allreduce: str = "auto"          # NCCL algorithm: ring | tree | auto (the faster)
        grad_compression: str = "none"   # none | bf16 (ddp_comm_hooks bf16_compress_hook)
        comm_hook: str = "none"          # none | allreduce (a Python hook that divides, such
                                         # as default_hooks.allreduce_hook; module docstring)

        def __post_init__(self):
            if self.comm_hook not in COMM_HOOKS:
                raise PerfmodelError(f"unknown comm hook '{self.comm_hook}'; choose from: "
                                     f"{', '.join(COMM_HOOKS)}")
            if self.comm_hook != "none" and self.grad_compression != "none":
                raise PerfmodelError("grad_compression bf16 is a comm hook of its own; "
                                     "give comm_hook or grad_compression, not both")
            if self.grad_compression not in GRAD_COMPRESSION:
                raise PerfmodelError(f"unknown gradient compression '{self.grad_compression}'"
                                     f"; choose from: {', '.join(GRAD_COMPRESSION)}")
            if not self.bucket_cap_MiB > 0:
                raise PerfmodelError(f"bucket_cap_MiB must be positive, got {self.bucket_cap_MiB}")
            if not self.first_bucket_MiB > 0:
                raise PerfmodelError(
                    f"first_bucket_MiB must be positive, got {self.first_bucket_MiB}")
            if self.allreduce not in ALLREDUCE_ALGORITHMS:
                raise PerfmodelError(f"unknown all-reduce algorithm '{self.allreduce}'; "
                                     f"choose from: {', '.join(ALLREDUCE_ALGORITHMS)}")

    name = "ddp"

    def __init__(self, options: Options | None = None):
        self.options = options if options is not None else DDP.Options()

    def memory(self, scenario: Scenario):
        from perfmodel.memory import ddp_memory

        return {"worker": ddp_memory(scenario, self.options.bucket_cap_MiB,
                                     self.options.first_bucket_MiB)}

    def _wire(self, scenario: Scenario, backward_s: np.ndarray):
        """(buckets, their bytes on the wire, their all-reduce seconds). On the wire a bucket
        is in the reduce dtype (fp32 under autocast), or bf16 with the compression hook
        (which casts the bucket, all-reduces it and casts back)."""
        buckets = gradient_buckets(scenario.workload, backward_s,
                                   self.options.bucket_cap_MiB, self.options.first_bucket_MiB)
        p = scenario.workload.precision_spec
        wire = (2 if self.options.grad_compression == "bf16" else p.reduce_bytes) / p.grad_bytes
        wire_bytes = [b.nbytes * wire for b in buckets]
        durations = np.array([allreduce_s(scenario.cluster, scenario.workers, nbytes,
                                          self.options.allreduce) for nbytes in wire_bytes])
        return buckets, wire_bytes, durations

    @staticmethod
    def busy(scenario: Scenario) -> int:
        """Ranks sharing a node's compute cores (a CPU host; no effect on a GPU)."""
        cluster = scenario.cluster
        return cluster.ranks_busy(min(scenario.workers, cluster.devices_per_node))

    def host_passes(self, scenario: Scenario, buckets: list[Bucket], *,
                    unshared: bool = False) -> HostPasses:
        """The reducer's passes over the gradients (none with one worker: no reducer here).
        On a CPU host all ranks of a node make them at once and share its cores; in a timed
        wait only that sharing is left (cores.own_work_s_per_byte), and the harness's zero
        gradients are written with the copy in (module docstring). `unshared`: the passes'
        own CPU seconds at the copy and divide rates, what cores.node_cpu_floor_s counts."""
        cluster, wl = scenario.cluster, scenario.workload
        nbytes = np.array([b.nbytes for b in buckets])
        if scenario.workers < 2 or not buckets:
            zeros = np.zeros(len(buckets))
            return HostPasses(np.zeros(len(wl.units)), zeros, zeros, 0.0)
        if unshared:
            copy = 1.0 / cluster.compute.copy_Bps()
            divide = 1.0 / (cluster.compute.optimizer_GBps * 1e9)
        else:
            ranks = min(scenario.workers, cluster.devices_per_node)
            copy = own_work_s_per_byte(cluster, ranks, wl.name, cluster.compute.copy_Bps())
            divide = own_work_s_per_byte(cluster, ranks, wl.name)
        grads = np.array([u.params * wl.precision_spec.grad_bytes for u in wl.units])
        hooked = self.options.comm_hook != "none" or self.options.grad_compression != "none"
        bf16 = self.options.grad_compression == "bf16"
        written = 2.0 if cluster.timed_wait else 1.0               # + a timed wait's zeros
        return HostPasses(copy_in_s=grads * copy * written, before_s=nbytes * divide * hooked,
                          after_s=nbytes * divide * bf16,
                          copy_back_s=float(nbytes.sum() * copy))

    def host_compute_s(self, scenario: Scenario) -> float:
        """Seconds of the reducer's passes a run counts as compute (HostPasses.in_compute_s),
        with the default buckets and the passes' own unit times."""
        alone = unit_times(scenario.cluster, scenario.workload, scenario.batch_size,
                           busy=self.busy(scenario))
        buckets, _, _ = self._wire(scenario, alone.backward_s)
        return self.host_passes(scenario, buckets).in_compute_s()

    def in_flight(self, scenario: Scenario, alone: UnitTimes | None = None) -> float:
        """Share of backward during which all-reduces are in flight (compute/in_flight_fraction);
        `alone`: the unit times without the overlap slowdown, if already computed."""
        if scenario.workers < 2:
            return 0.0
        alone = alone or unit_times(scenario.cluster, scenario.workload, scenario.batch_size,
                                    busy=self.busy(scenario))
        _, _, durations = self._wire(scenario, alone.backward_s)
        return in_flight_fraction(float(durations.sum()), float(alone.backward_s.sum()))

    def overlap_share(self, scenario: Scenario, alone: UnitTimes | None = None) -> float:
        """Backward runs 1 + (compute.overlap_slowdown - 1) x this share slower with the
        all-reduces beside it. On a GPU the share of backward with all-reduces in flight
        (`in_flight`): NCCL's kernels take SMs and HBM only while they run. On a CPU-driven
        link (gloo on a CPU host: topology.comm_cpu_cores_per_node > 0) the seconds of
        all-reduce that run while backward still does (`overlapped_s`, on the host's own
        link: a capped link between emulated nodes adds waits, not CPU work) over backward's:
        gloo's threads take the rank's core from backward for as long as they reduce beside
        it, and an all-reduce after backward takes it from nothing. So the cost is the same
        in seconds at every batch where the overlapped buckets are (the mlp's first bucket,
        4.2 MB, all-reduced beside backward at batch 32 and 64 alike), and grows with the
        buckets that start before backward ends (1 MiB buckets: three of the mlp's four).
        `alone`: the unit times without the slowdown."""
        cluster = scenario.cluster
        if scenario.workers < 2 or not cluster.comm_cpu_cores_per_node:
            return self.in_flight(scenario, alone)
        alone = alone or unit_times(cluster, scenario.workload, scenario.batch_size,
                                    busy=self.busy(scenario))
        backward_s = float(alone.backward_s.sum())
        own = dataclasses.replace(scenario, cluster=dataclasses.replace(
            cluster, inter_node=cluster.intra_node))
        buckets, _, durations = self._wire(own, alone.backward_s)
        return overlapped_s(buckets, durations, backward_s) / backward_s \
            if backward_s > 0 else 0.0

    def _floor_inputs(self, scenario: Scenario, plain: UnitTimes, backward_s: float,
                      buckets: list[Bucket], durations: np.ndarray) -> FloorInputs:
        """What cores.node_cpu_floor_s needs of one step (module docstring): the sleeps
        before the first bucket and the optimizer's (`plain`: the unit times without the
        overlap slowdown; `backward_s`: backward with it), the all-reduces' time, each
        rank's own passes at the unshared rates, and the part of them paid back."""
        ranks = min(scenario.workers, scenario.cluster.devices_per_node)
        communicate = scenario.workers > 1 and bool(buckets)
        idle_s = float(plain.forward_s.sum()) + plain.optimizer_s + (
            buckets[0].ready_backward_s * float(plain.backward_s.sum()) / backward_s
            if communicate and backward_s > 0 else 0.0)
        own = self.host_passes(scenario, buckets, unshared=True)
        return FloorInputs(ranks=ranks, idle_s=idle_s, collectives_s=float(durations.sum()),
                           own_cpu_s=own.total_s(),
                           paid_back_s=own.copy_back_s + float(own.after_s[-1:].sum()))

    def floor_inputs(self, scenario: Scenario) -> FloorInputs:
        """This scenario's inputs to the crowded-node floor, as `simulate` times them."""
        plain, times = self._unit_times(scenario)
        buckets, _, durations = self._wire(scenario, times.backward_s)
        return self._floor_inputs(scenario, plain, float(times.backward_s.sum()), buckets,
                                  durations)

    def node_cpu_work_s(self, scenario: Scenario) -> float:
        """The CPU work (core-seconds) per step that the crowded-node floor counts for this
        scenario (cores.node_cpu_work_s): what calibration compares with the CPU its crowded
        DDP timed waits burned (compute.ddp_cpu_work_factor). As `simulate` times it."""
        floor = self.floor_inputs(scenario)
        return node_cpu_work_s(scenario.cluster, floor.ranks, floor.collectives_s,
                               floor.own_cpu_s, scenario.workload.name)

    def _unit_times(self, scenario: Scenario) -> tuple[UnitTimes, UnitTimes]:
        """(the unit times alone, the same with backward slowed by the all-reduces beside it:
        compute.overlap_slowdown over `overlap_share`)."""
        cluster, n = scenario.cluster, scenario.workers
        plain = unit_times(cluster, scenario.workload, scenario.batch_size,
                           busy=self.busy(scenario))
        if n < 2:
            return plain, plain
        slow = 1.0 + (cluster.compute.overlap_slowdown - 1.0) * self.overlap_share(scenario,
                                                                                   plain)
        return plain, dataclasses.replace(plain, backward_s=plain.backward_s * slow)

    def simulate(self, scenario: Scenario) -> SimResult:
        cluster, n = scenario.cluster, scenario.workers
        # Backward runs slower with the all-reduces beside it (overlap_share).
        plain, times = self._unit_times(scenario)
        forward_s, backward_s = float(times.forward_s.sum()), float(times.backward_s.sum())
        # The overlap slowdown lasts as long as the all-reduces are in flight, which a slow
        # or jittery worker does not lengthen: it is added to, not scaled with, its compute.
        plain_s = float(plain.forward_s.sum() + plain.backward_s.sum())
        overlap_extra_s = forward_s + backward_s - plain_s
        buckets, wire_bytes, durations = self._wire(scenario, times.backward_s)
        communicate = n > 1 and bool(buckets)
        # The reducer's passes: copies as gradients arrive and the hook's divides delay the
        # rest of backward; the last bucket's divide and the copy back follow it.
        host = self.host_passes(scenario, buckets)
        host_in_s = host.in_compute_s()
        nbytes = np.array([b.nbytes for b in buckets])
        copied_s = host.copy_in_s.sum() * np.cumsum(nbytes) / max(nbytes.sum(), 1.0)
        host_ready_s = (copied_s + np.cumsum(host.before_s))[:, None]
        ready_s = np.array([forward_s + b.ready_backward_s for b in buckets])
        # A timed wait on a node with more ranks than cores: the cores must do the
        # collectives' and every rank's own CPU work (cores.node_cpu_floor_s).
        floor = self._floor_inputs(scenario, plain, backward_s, buckets, durations)
        floor_s = node_cpu_floor_s(cluster, floor.ranks, floor.idle_s, floor.collectives_s,
                                   floor.own_cpu_s, scenario.workload.name,
                                   paid_back_s=floor.paid_back_s, beside_collectives=True,
                                   work_factor=cluster.compute.ddp_cpu_work_factor)
        durations = durations + host.after_s
        # An all-reduce chain from bucket b on, back to back: max_b(ready_b + rest_b) ends it.
        rest_s = np.cumsum(durations[::-1])[::-1]

        env = CountingEnvironment()
        comms: list[CommRecord] = []
        link = SharedLink(env, link_name(scenario), comms)
        noise = StepNoise(scenario, scenario.rng())
        steps: list[StepRecord] = []
        updates: list[UpdateRecord] = []

        def reducer(issue: np.ndarray):
            """The communication stream: all-reduce each bucket once every rank has it."""
            for b in range(len(buckets)):
                if issue[b] > env.now:
                    yield env.timeout(issue[b] - env.now)
                yield from link.transfer("all-reduce", -1, wire_bytes[b], durations[b])
            return env.now

        def training():
            clock = np.zeros(n)
            for step in range(scenario.steps):
                slow = noise.draw()
                start = clock
                # The overlap slowdown and the reducer's passes are the rank's own work, added
                # to (not scaled with) a slow or jittery worker's passes, as in fsdp.py.
                passes = plain_s * slow + overlap_extra_s             # forward + backward
                backward_end = start + passes + host_in_s
                comm_end, alone_comm_end = -np.inf, np.full(n, -np.inf)
                if communicate:
                    # bucket b is ready the same share of the way through each worker's passes
                    ready = start + np.outer(ready_s, passes / (forward_s + backward_s)) \
                        + host_ready_s
                    comm_end = yield env.process(reducer(ready.max(axis=1)))
                    # counterfactual: the same chain if every rank had this worker's times
                    alone_comm_end = (ready + rest_s[:, None]).max(axis=0)
                optimizer = times.optimizer_s * slow
                after = host.copy_back_s + optimizer
                clock = np.maximum(np.maximum(backward_end, comm_end) + after, start + floor_s)
                alone_end = np.maximum(np.maximum(backward_end, alone_comm_end) + after,
                                       start + floor_s)
                compute = passes + host_in_s + times.optimizer_s * slow
                s, u = sync_step_records(step, start, clock, compute, alone_end)
                steps.extend(s)
                updates.extend(u)
                yield env.timeout(max(0.0, clock.max() - env.now))

        env.process(training())
        env.run()
        note = (f"{len(buckets)} gradient buckets per step ({self.options.first_bucket_MiB:g} MiB "
                f"first, {self.options.bucket_cap_MiB:g} MiB cap), {self.options.allreduce} "
                f"all-reduce over {link.name}")
        return SimResult(steps=tuple(steps), updates=tuple(updates), comms=tuple(comms),
                         events=env.events,
                         notes=(note, *ranks_note(cluster, cluster.ranks_busy(
                             min(n, cluster.devices_per_node)), scenario.workload.name)))
