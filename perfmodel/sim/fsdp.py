"""Fully Sharded Data Parallel: per-unit all-gather and reduce-scatter, prefetched.

Model (Zhao et al., "PyTorch FSDP", VLDB 2023; FSDP2 `fully_shard` docs; DESIGN.md):
- every unit is wrapped; its parameters are sharded 1/N per rank;
- forward: all-gather the unit's parameters (params x compute_bytes: param_dtype) before its
  forward; full-shard frees them afterwards (reshard_after_forward=True);
- backward (reverse order): full-shard all-gathers the unit again before its backward;
  grad-op (reshard_after_forward=False, ZeRO-2-like) keeps them and skips that all-gather;
  after the unit's backward its gradients (params x reduce_bytes: reduce_dtype) are
  reduce-scattered;
- prefetch k: the all-gather of the unit k places ahead is issued when a unit's compute
  starts, so it overlaps that compute (k = 0: issued when the previous unit's compute ends;
  FSDP1's BACKWARD_PRE / forward_prefetch, FSDP2's implicit prefetching);
- the optimizer steps over this rank's 1/N of the parameters after the last reduce-scatter;
- FSDP2's copies around every collective are the rank's own memory-bound work
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): an all-gather of b bytes copies
  the rank's shard in (`_foreach_copy_`, b/N) and the gathered output out into the unsharded
  parameters (`split_with_sizes_copy`, b); a reduce-scatter of g bytes copies the unsharded
  gradients in (`_chunk_cat`, g) and divides the reduced shard (`div_`, g/N; the sharded
  gradient is a view of it). On gloo (`blocking`, below) each collective copies its whole
  buffer once more inside ProcessGroupGloo (b, g), the reduced shard is copied out (g/N), and
  gloo, which cannot average, has the whole input divided (g, in place). Counted with
  torch.profiler on torch 2.13 (`copy_bytes`): a full-shard step copies 7.5x the parameter
  bytes at 2 gloo ranks (6.75x at 4), grad-op 5x (4.5x), each within 0.1x of the count.
  Copies move at `compute.copy_GBps` (fitted on a CPU host from the calibration's FSDP
  run: they ran at 4-5 GB/s where the optimizer streams 13 GB/s; elsewhere the optimizer's
  `compute.optimizer_GBps`, the same kind of foreach pass over memory), divides at
  optimizer_GBps, stretched by core sharing like
  the passes (`copy_seconds`), every rank of the node copying at once; in a timed wait the
  harness pays their CPU time back from the sleeps, leaving the stretch
  (`cores.own_work_s_per_byte`), and with more ranks than cores the step fits the node's CPU
  work: every sleep (gloo's collectives block) less the copies the Sleeper pays back from
  it, every collective on all cores, every rank's copies (`cores.node_cpu_floor_s`). On GPUs
  a full-shard step copies (1 + 1/N) b twice and (1 + 1/N) g: bert-large's 1.34 GB on 8
  A100s 4.8 ms of a 62 ms step (batch 8).
Traffic per rank is 3Ψ(N−1)/N for full-shard and 2Ψ(N−1)/N for grad-op, against DDP's
2Ψ(N−1)/N (ZeRO, Rajbhandari et al. 2020: 1.5x).

Simplification: all-gathers and reduce-scatters share ONE FIFO link. NCCL runs them on
separate streams that share the network's bandwidth; FIFO keeps the bytes and their order
and gives the same total, but it cannot overlap an all-gather with a reduce-scatter.

Blocking collectives (`FSDP.blocking`: where the profile's communication is CPU-driven,
`topology.comm_cpu_cores_per_node` > 0, i.e. gloo on a CPU host): FSDP2 on gloo issues
each all-gather and reduce-scatter synchronously (measure/runs/fsdp.py times the call and
waits on it), so the rank stands still until it is done: nothing overlaps compute, no pass
is stretched by `compute.overlap_slowdown`, and a unit's backward waits for the previous
unit's reduce-scatter. Prefetch then only orders the all-gathers; it hides nothing.
On a CPU host every pass is also stretched by `cluster.compute_share(ranks per node)` (core
sharing, perfmodel/sim/cores.py).

Same vectorised design as `ddp.py`: one SimPy process drives all workers with numpy clocks,
each collective is a SimPy process on the shared link and starts when the last rank issues it;
records, the wait_s / comm_exposed_s split and staleness 0 are as documented there.
With 1 worker there is no communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import allgather_s, reduce_scatter_s
from perfmodel.sim.compute import StepNoise, UnitTimes, in_flight_fraction, unit_times
from perfmodel.sim.cores import node_cpu_floor_s, own_work_s_per_byte, ranks_note
from perfmodel.sim.ddp import link_name, sync_step_records
from perfmodel.sim.engine import CountingEnvironment, SharedLink
from perfmodel.sim.records import CommRecord, SimResult, StepRecord, UpdateRecord
from perfmodel.sim.scenario import Scenario

VARIANTS = ("full-shard", "grad-op")


def collective(env, link: SharedLink, kind: str, nbytes: float, duration_s: float,
               issue_s: float):
    """SimPy process: a collective issued by the last rank at `issue_s`; returns its end time."""
    if issue_s > env.now:
        yield env.timeout(issue_s - env.now)
    yield from link.transfer(kind, -1, nbytes, duration_s)
    return env.now


class _Network:
    """Launches collectives on the shared link, and replays them per worker as if every rank
    had this worker's timing (the counterfactual behind comm_exposed_s)."""

    def __init__(self, env, link: SharedLink, workers: int):
        self.env, self.link, self.workers = env, link, workers
        self.alone_free = np.zeros(workers)      # per worker: when its counterfactual link frees
        self.pending = {}

    def launch(self, key, kind: str, nbytes: float, duration_s: float,
               issue: np.ndarray, alone_issue: np.ndarray) -> None:
        """Issue a collective; per rank it is issued at `issue` (`alone_issue` counterfactual)."""
        if self.workers == 1 or nbytes <= 0:
            return
        proc = self.env.process(collective(self.env, self.link, kind, nbytes, duration_s,
                                           float(issue.max())))
        self.alone_free = np.maximum(alone_issue, self.alone_free) + duration_s
        self.pending[key] = (proc, self.alone_free)

    def wait(self, key, clock: np.ndarray, alone: np.ndarray):
        """Generator: block every worker until collective `key` is done; returns both clocks."""
        if key not in self.pending:
            return clock, alone
        proc, alone_end = self.pending.pop(key)
        end = yield proc
        return np.maximum(clock, end), np.maximum(alone, alone_end)


def _unit_bytes(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Per unit: the bytes an all-gather gathers (param_dtype) and a reduce-scatter reduces
    (reduce_dtype), MixedPrecisionPolicy's two sizes."""
    p = scenario.workload.precision_spec
    params = np.array([u.params for u in scenario.workload.units], dtype=float)
    return params * p.compute_bytes, params * p.reduce_bytes


def copy_bytes(scenario: Scenario, regather: bool, blocking: bool) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Per unit: bytes FSDP2 copies in its forward and in its backward around the unit's
    collectives (module docstring), each byte read once and written once; none with 1 rank.
    Counted with torch.profiler on torch 2.13 (mlp and cnn-small, 2 and 4 gloo ranks, both
    variants: within 0.1x the parameter bytes). A timed wait on a CPU host also writes each
    unit's whole gradient as zeros before its reduce-scatter copies it in (measure/
    timed_wait.py, as in perfmodel/sim/ddp.py): g more in backward."""
    n = scenario.workers
    if n < 2:
        return np.zeros(len(scenario.workload.units)), np.zeros(len(scenario.workload.units))
    b, g = _unit_bytes(scenario)
    cluster = scenario.cluster
    zeros = 1.0 if cluster.timed_wait else 0.0
    # shard in + output out; gloo: its flat output copied out once more
    gather = b * (1.0 / n + 1.0 + (1.0 if blocking else 0.0))
    # gradients in; gloo: a clone of the input and the reduced shard copied out
    scatter = g * (1.0 + zeros + (1.0 + 1.0 / n if blocking else 0.0))
    return gather, (gather if regather else 0.0) + scatter


def divide_bytes(scenario: Scenario, blocking: bool) -> np.ndarray:
    """Per unit: gradient bytes the reduce-scatter divides in place (backward): the whole
    input on gloo, which cannot average, the reduced shard elsewhere."""
    n = scenario.workers
    if n < 2:
        return np.zeros(len(scenario.workload.units))
    g = _unit_bytes(scenario)[1]
    return g if blocking else g / n


def copy_seconds(scenario: Scenario, regather: bool, busy: float, blocking: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per unit: seconds of FSDP2's copies (at compute.copy_GBps) and in-place divides
    (at compute.optimizer_GBps) in its forward and in its backward, every rank of the node
    copying at once (cores.own_work_s_per_byte)."""
    cluster, wl = scenario.cluster, scenario.workload
    forward, backward = copy_bytes(scenario, regather, blocking)
    copy = own_work_s_per_byte(cluster, busy, wl.name, cluster.compute.copy_Bps())
    divide = own_work_s_per_byte(cluster, busy, wl.name)
    return forward * copy, backward * copy + divide_bytes(scenario, blocking) * divide


def unpaid_copy_s(scenario: Scenario, regather: bool, blocking: bool, waits: UnitTimes
                  ) -> float:
    """A timed wait's copies beyond its sleeps, per step: measure/timed_wait.py's Sleeper
    pays the copies' CPU time back from the sleeps (`cores.own_work_s_per_byte` leaves only
    the wait for a core), but only as far as the sleeps go; CPU time beyond the step's
    sleeps (`waits`: forward, backward and optimizer) is exposed: the step computes
    C·s + max(W − C, 0), which is W + C·(s − 1) + max(C − W, 0). 0 outside a timed wait
    (a CPU host whose compute does not occupy the cores)."""
    if not scenario.cluster.timed_wait:
        return 0.0
    slept_s = float(waits.forward_s.sum() + waits.backward_s.sum()) + waits.optimizer_s
    return max(copy_cpu_s(scenario, regather, blocking) - slept_s, 0.0)


def copy_cpu_s(scenario: Scenario, regather: bool, blocking: bool) -> float:
    """One rank's CPU seconds in FSDP2's copies and divides of a step, unshared."""
    cluster = scenario.cluster
    forward, backward = copy_bytes(scenario, regather, blocking)
    return (float(forward.sum() + backward.sum()) / cluster.compute.copy_Bps()
            + float(divide_bytes(scenario, blocking).sum())
            / (cluster.compute.optimizer_GBps * 1e9))


class FSDP:
    """PyTorch FullyShardedDataParallel (FSDP2 `fully_shard` on every unit)."""

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Options:
        variant: str = "full-shard"     # full-shard | grad-op (reshard_after_forward=False)
        prefetch: int = 1               # units all-gathered ahead; 0 = none

        def __post_init__(self):
            if self.variant not in VARIANTS:
                raise PerfmodelError(f"unknown FSDP variant '{self.variant}'; choose from: "
                                     f"{', '.join(VARIANTS)}")
            if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) \
                    or self.prefetch < 0:
                raise PerfmodelError(f"prefetch must be a whole number >= 0, got {self.prefetch}")

    name = "fsdp"

    def __init__(self, options: Options | None = None):
        self.options = options if options is not None else FSDP.Options()

    def memory(self, scenario: Scenario):
        from perfmodel.memory import fsdp_memory

        return {"worker": fsdp_memory(scenario, self.options.variant, self.options.prefetch)}

    @staticmethod
    def blocking(cluster) -> bool:
        """Whether collectives block the rank: where communication is CPU-driven (gloo)."""
        return cluster.comm_cpu_cores_per_node > 0

    def host_compute_s(self, scenario: Scenario) -> float:
        """Seconds of FSDP2's copies a run counts as compute (all of them: they sit inside
        forward and backward)."""
        n = scenario.workers
        copy_f, copy_b = copy_seconds(scenario, self.options.variant == "full-shard",
                                      min(n, scenario.cluster.devices_per_node),
                                      self.blocking(scenario.cluster))
        return float(np.sum(copy_f) + np.sum(copy_b))

    def in_flight(self, scenario: Scenario, alone: UnitTimes | None = None) -> float:
        """Share of forward + backward during which all-gathers and reduce-scatters are in
        flight (compute/in_flight_fraction): their seconds over the passes' seconds."""
        cluster, n, wl = scenario.cluster, scenario.workers, scenario.workload
        if n < 2:
            return 0.0
        p = wl.precision_spec
        gathers = sum(allgather_s(cluster, n, u.params * p.compute_bytes) for u in wl.units)
        scatters = sum(reduce_scatter_s(cluster, n, u.params * p.reduce_bytes) for u in wl.units)
        comm_s = (2 if self.options.variant == "full-shard" else 1) * gathers + scatters
        alone = alone or unit_times(cluster, wl, scenario.batch_size,
                                    optimizer_param_fraction=1.0 / n,
                                    busy=cluster.ranks_busy(min(n, cluster.devices_per_node)))
        return in_flight_fraction(comm_s, float(alone.forward_s.sum() + alone.backward_s.sum()))

    def overlap_share(self, scenario: Scenario, alone: UnitTimes | None = None) -> float:
        """The share of the overlapped passes the overlap slowdown stretches: `in_flight`
        (DDP.overlap_share's counterpart, which differs on a CPU-driven link; on one, FSDP
        on gloo blocks on its collectives and overlaps nothing)."""
        return self.in_flight(scenario, alone)

    def simulate(self, scenario: Scenario) -> SimResult:
        cluster, n, wl = scenario.cluster, scenario.workers, scenario.workload
        units = len(wl.units)
        blocking = self.blocking(cluster)
        # MixedPrecisionPolicy: gathers in param_dtype, reduce-scatters in reduce_dtype.
        param_bytes = [u.params * wl.precision_spec.compute_bytes for u in wl.units]
        grad_bytes = [u.params * wl.precision_spec.reduce_bytes for u in wl.units]
        gather_s = [allgather_s(cluster, n, b) for b in param_bytes]
        scatter_s = [reduce_scatter_s(cluster, n, b) for b in grad_bytes]
        k = 0 if blocking else self.options.prefetch   # blocking: a gather waits its turn
        ahead = max(k, 1)                       # all-gathers in flight when a phase begins
        regather = self.options.variant == "full-shard"
        # Compute runs slower while collectives are in flight (compute.overlap_slowdown).
        # Blocking (gloo) collectives overlap nothing, so they slow nothing either.
        busy = cluster.ranks_busy(min(n, cluster.devices_per_node))
        plain = unit_times(cluster, wl, scenario.batch_size, optimizer_param_fraction=1.0 / n,
                           busy=busy)
        times = unit_times(cluster, wl, scenario.batch_size, optimizer_param_fraction=1.0 / n,
                           overlapped=("forward", "backward") if n > 1 and not blocking
                           else (), in_flight=self.in_flight(scenario, plain), busy=busy)
        # The slowdown lasts as long as collectives are in flight, which a slow or jittery
        # worker does not lengthen: added to each pass, not scaled with it.
        # FSDP2's copies are the rank's own work, added like the slowdown (a straggler's
        # emulated compute does not slow them).
        copy_f, copy_b = copy_seconds(scenario, regather, min(n, cluster.devices_per_node),
                                      blocking)
        extra_f = times.forward_s - plain.forward_s + copy_f
        extra_b = times.backward_s - plain.backward_s + copy_b
        extra_b[0] += unpaid_copy_s(scenario, regather, blocking, plain)
        # A timed wait on a node with more ranks than cores: the cores must do the
        # collectives' and every rank's own CPU work (cores.node_cpu_floor_s). Blocking,
        # they idle through the sleeps less the copies, whose CPU the Sleeper pays back
        # from the next sleep (each of FSDP2's copies is followed by one).
        collectives_s = (2.0 if regather else 1.0) * sum(gather_s) + sum(scatter_s)
        idle_s = float(plain.forward_s.sum() + plain.backward_s.sum()) + plain.optimizer_s
        own_s = copy_cpu_s(scenario, regather, blocking)
        floor_s = node_cpu_floor_s(cluster, min(n, cluster.devices_per_node),
                                   idle_s if blocking else 0.0, collectives_s, own_s,
                                   wl.name, paid_back_s=own_s)

        env = CountingEnvironment()
        comms: list[CommRecord] = []
        link = SharedLink(env, link_name(scenario), comms)
        net = _Network(env, link, n)
        noise = StepNoise(scenario, scenario.rng())
        steps: list[StepRecord] = []
        updates: list[UpdateRecord] = []

        def gather(phase: str, u: int, clock: np.ndarray, alone: np.ndarray) -> None:
            net.launch((phase, u), "all-gather", param_bytes[u], gather_s[u], clock, alone)

        def training():
            clock = np.zeros(n)
            for step in range(scenario.steps):
                slow = noise.draw()
                start = t = ta = clock          # t: real clocks; ta: counterfactual clocks
                for u in range(min(ahead, units)):
                    gather("forward", u, t, ta)
                for u in range(units):
                    t, ta = yield from net.wait(("forward", u), t, ta)
                    if k and u + k < units:
                        gather("forward", u + k, t, ta)
                    d = plain.forward_s[u] * slow + extra_f[u]
                    t, ta = t + d, ta + d
                    if not k and u + 1 < units:
                        gather("forward", u + 1, t, ta)
                order = list(range(units - 1, -1, -1))   # backward: last unit first
                if regather:
                    for u in order[:ahead]:
                        gather("backward", u, t, ta)
                for j, u in enumerate(order):
                    if regather:
                        t, ta = yield from net.wait(("backward", u), t, ta)
                        if k and j + k < units:
                            gather("backward", order[j + k], t, ta)
                    d = plain.backward_s[u] * slow + extra_b[u]
                    t, ta = t + d, ta + d
                    net.launch(("scatter", u), "reduce-scatter", grad_bytes[u], scatter_s[u],
                               t, ta)
                    if blocking:
                        t, ta = yield from net.wait(("scatter", u), t, ta)
                    if regather and not k and j + 1 < units:
                        gather("backward", order[j + 1], t, ta)
                for u in order:
                    t, ta = yield from net.wait(("scatter", u), t, ta)
                optimizer = times.optimizer_s * slow
                clock = np.maximum(t + optimizer, start + floor_s)
                alone_end = np.maximum(ta + optimizer, start + floor_s)
                compute = ((plain.forward_s.sum() + plain.backward_s.sum()
                            + times.optimizer_s) * slow + extra_f.sum() + extra_b.sum())
                s, up = sync_step_records(step, start, clock, compute, alone_end)
                steps.extend(s)
                updates.extend(up)
                yield env.timeout(max(0.0, clock.max() - env.now))

        env.process(training())
        env.run()
        notes = (f"{self.options.variant}, prefetch {self.options.prefetch}: all-gathers and "
                 f"reduce-scatters share one FIFO link ({link.name}); the optimizer updates "
                 f"1/{n} of the parameters",)
        if blocking and n > 1:
            notes += ("collectives block the rank (gloo: FSDP2 issues them synchronously); "
                      "none overlaps compute",)
        notes += ranks_note(cluster, cluster.ranks_busy(min(n, cluster.devices_per_node)),
                            wl.name)
        return SimResult(steps=tuple(steps), updates=tuple(updates), comms=tuple(comms),
                         events=env.events, notes=notes)
