"""Job-level membership model: workers that arrive late, leave, fail or come back.

One SimPy process follows the whole job over a timeline of membership events (worker i joins,
leaves or fails at time t), spending the time in states (training, checkpointing, detecting,
restarting, waiting, stalled). While training, progress accrues at the steady rate of the
current membership, which a `RateFn` supplies: perfmodel.goodput simulates each distinct
membership once with the strategy's own step-level model and caches it. The model is
piecewise-steady: within a membership the throughput is the steady-state one; warm-up after a
restart or a join, and the step in flight at a change, are not resolved beyond what is said
below.

Gang-scheduled jobs (DDP, FSDP; torchrun elastic semantics, torch/distributed/elastic/agent/
server/api.py `_invoke_run`): every membership change restarts the worker group.
- fail: the job stops; after `detection_s` (the agent or a collective notices) and
  `restart_s` (rendezvous, process start, process-group init, checkpoint reload) it resumes
  from the last checkpoint with the new membership. Work since that checkpoint is lost.
- leave (an announced departure, e.g. a preemption notice): as fail, without detection.
- join (a late arrival or a rejoin): torchrun restarts the group to admit the new node, so
  it also costs `restart_s` and the work since the last checkpoint.
- Changes during detection or restart are absorbed into it (the rendezvous takes whoever is
  there when it closes), except a fail or leave during restart, which starts it over.
- Below `min_workers` (torchrun --nnodes MIN:MAX) the job waits for joiners, then restarts.
- Checkpoints: after every `checkpoint_interval_s` of training the job writes one, blocking,
  for `checkpoint_write_s`; a change during the write loses it. The interval timer restarts
  after every restart. Young (1974) and Daly (2006) give the interval that maximises goodput.

Parameter-server jobs keep training with whoever is there (only worker failures are modelled;
the servers are assumed reliable and to snapshot in the background, so PS jobs pay no
checkpoint writes):
- async: the rate follows the membership at once; a failed worker's gradient in flight (one
  mini-batch) is lost.
- ssp: as async, but until the failure is detected (`detection_s`) the dead worker's clock
  holds the others back: they run at most `staleness_bound` steps ahead, then stall.
- sync, on_departure="drop": the barrier waits `detection_s` for a failed worker, then drops
  it (an announced leave is dropped at once). "wait": the barrier waits for a joiner to take
  the missing place; no progress until then.
- join: the joiner first pulls the parameters (`join_s`), then contributes.

Records: one `Segment` per stretch of constant state and rate, one `Loss` per piece of work
thrown away. Summaries (perfmodel/goodput.py) are derived from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from perfmodel.errors import PerfmodelError
from perfmodel.sim.engine import CountingEnvironment

EVENT_KINDS = ("join", "leave", "fail")
SCHEDULING = ("gang", "async", "ssp", "sync")
SYNC_ON_DEPARTURE = ("drop", "wait")

# Defaults, to be replaced by measured values (`perfmodel measure elastic` records them).
DEFAULT_DETECTION_S = 15.0        # c10d rendezvous keep-alive: 5 s interval x 3 missed beats
DEFAULT_RESTART_S = 60.0          # rendezvous + process start + process group + reload
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0
DEFAULT_CHECKPOINT_WRITE_S = 10.0

_END = "end"
TIME_EPS_REL = 1e-9             # timers within this (relative) of now have fired


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    kind: str           # "join" | "leave" | "fail"
    worker: int         # 0 .. workers-1
    time_s: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.worker}@{self.time_s:g}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticConfig:
    """What happens to the job's membership, and what a change costs."""

    run_s: float                            # length of the run (wall clock)
    events: tuple[MembershipEvent, ...] = ()
    failure_rate_per_hour: float = 0.0      # per worker (Poisson), instead of `events`
    replace_after_s: float | None = 0.0     # rate mode: a failed worker's replacement joins
                                            # this long after the failure; None = never
    seed: int = 0                           # of the failure sampler's generator
    detection_s: float = DEFAULT_DETECTION_S
    restart_s: float = DEFAULT_RESTART_S
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S   # training time between
    checkpoint_write_s: float = DEFAULT_CHECKPOINT_WRITE_S
    min_workers: int = 1                    # gang: torchrun --nnodes MIN
    sync_on_departure: str = "drop"         # sync-ps: "drop" the missing worker or "wait"
    join_s: float | None = None             # PS joiner's parameter pull; None = from the link

    def __post_init__(self):
        if not (self.run_s > 0 and math.isfinite(self.run_s)):
            raise PerfmodelError(f"the run length must be a positive number of seconds, "
                                 f"got {self.run_s}")
        if not self.checkpoint_interval_s > 0:
            raise PerfmodelError(f"the checkpoint interval must be positive, got "
                      f"{self.checkpoint_interval_s:g} s")
        for name in ("detection_s", "restart_s", "checkpoint_write_s", "failure_rate_per_hour"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PerfmodelError(f"{name} must be a finite number >= 0, got {value}")
        for name in ("replace_after_s", "join_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise PerfmodelError(f"{name} must be a finite number >= 0, got {value}")
        if isinstance(self.min_workers, bool) or not isinstance(self.min_workers, int) \
                or self.min_workers < 1:
            raise PerfmodelError(f"min_workers must be a whole number >= 1, "
                                 f"got {self.min_workers!r}")
        if self.sync_on_departure not in SYNC_ON_DEPARTURE:
            raise PerfmodelError(f"sync_on_departure must be 'drop' or 'wait', got "
                      f"'{self.sync_on_departure}'")
        if self.events and self.failure_rate_per_hour > 0:
            raise PerfmodelError("give either an event schedule or a failure rate, not both")
        for e in self.events:
            if e.kind not in EVENT_KINDS:
                raise PerfmodelError(f"unknown membership event '{e.kind}'; choose from "
                          f"{', '.join(EVENT_KINDS)}")
            if not 0 <= e.time_s < self.run_s:
                raise PerfmodelError(f"event {e} lies outside the run, which lasts "
                                     f"{self.run_s:g} s")


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """How a strategy's job reacts to membership changes."""

    scheduling: str             # "gang" (ddp, fsdp) or the PS protocol: async, ssp, sync
    workers: int                # the pool: workers 0..workers-1
    batch_size: int             # per worker step
    join_s: float = 0.0         # PS: a joiner's parameter pull
    staleness_bound: int = 0    # ssp: s


@dataclass(frozen=True, slots=True)
class Rate:
    """The steady state of one membership, from the strategy's step-level simulation."""

    samples_per_s: float
    step_s: float               # one worker's mean step
    staleness: float = 0.0      # mean staleness of its updates


RateFn = Callable[[tuple[int, ...]], Rate]   # sorted member ids -> their steady rate


@dataclass(frozen=True, slots=True)
class Segment:
    start_s: float
    end_s: float
    state: str                  # training checkpointing detecting restarting waiting stalled
    workers: int                # members contributing
    samples_per_s: float        # progress rate (0 unless training)
    staleness: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Loss:
    time_s: float
    samples: float              # progress thrown away
    seconds: float              # training time that had produced it
    cause: str                  # the event, e.g. "fail:3@120"


@dataclass(frozen=True, slots=True)
class ElasticResult:
    run_s: float
    segments: tuple[Segment, ...]
    losses: tuple[Loss, ...]
    events: tuple[MembershipEvent, ...]     # every event applied, in time order
    restarts: int                           # gang: worker-group restarts
    sim_events: int                         # SimPy events processed


def initial_members(job: Job, events: tuple[MembershipEvent, ...]) -> set[int]:
    """Everyone, except workers whose first event is a join (late arrivals)."""
    first: dict[int, str] = {}
    for e in events:
        first.setdefault(e.worker, e.kind)
    return {w for w in range(job.workers) if first.get(w) != "join"}


def simulate(job: Job, config: ElasticConfig, events: tuple[MembershipEvent, ...],
             rate: RateFn) -> ElasticResult:
    """Follow the job through `events` (time-ordered, checked) for `config.run_s` seconds."""
    if job.scheduling not in SCHEDULING:
        raise PerfmodelError(f"unknown scheduling '{job.scheduling}'")
    timeline = _Timeline(job, config, events, rate)
    return timeline.run()


class _Timeline:
    def __init__(self, job: Job, config: ElasticConfig, events, rate: RateFn):
        self.job, self.config, self.events, self.rate_of = job, config, events, rate
        self.env = CountingEnvironment()
        self.members = initial_members(job, events)
        self.segments: list[Segment] = []
        self.losses: list[Loss] = []
        self.restarts = 0

    def run(self) -> ElasticResult:
        body = self.gang() if self.job.scheduling == "gang" else self.server_based()
        self.process = self.env.process(body)
        self.env.process(self.membership())
        self.env.run()
        return ElasticResult(run_s=self.config.run_s, segments=tuple(self.segments),
                             losses=tuple(self.losses), events=self.events,
                             restarts=self.restarts, sim_events=self.env.events)

    # -- the world: membership events, then the end of the run ----------------------------

    def membership(self):
        """Apply each instant's events to the membership, then tell the job (one interrupt
        per instant); at the end of the run, interrupt it with _END."""
        env, i, events = self.env, 0, self.events
        while i < len(events):
            t = events[i].time_s
            batch = []
            while i < len(events) and events[i].time_s == t:
                batch.append(events[i])
                i += 1
            yield env.timeout(t - env.now)
            for e in batch:
                (self.members.add if e.kind == "join" else self.members.discard)(e.worker)
            self.process.interrupt(tuple(batch))
        yield env.timeout(self.config.run_s - env.now)
        self.process.interrupt(_END)

    def spend(self, state: str, duration_s: float, rate: Rate | None = None, workers: int = 0):
        """Generator: stay in `state` for `duration_s` (inf: until interrupted), recording the
        segment; returns the interrupt's cause, or None when the time ran out."""
        env, start = self.env, self.env.now
        try:
            yield env.timeout(duration_s) if math.isfinite(duration_s) else env.event()
            cause = None
        except simpy.Interrupt as interrupt:
            cause = interrupt.cause
        if env.now > start:
            r = rate.samples_per_s if rate is not None else 0.0
            self.segments.append(Segment(start, env.now, state, workers, r,
                                         rate.staleness if rate is not None else 0.0))
        return cause

    def rate(self, members) -> Rate:
        return self.rate_of(tuple(sorted(members))) if members else Rate(0.0, math.inf)

    # -- gang scheduling (DDP, FSDP) --------------------------------------------------------

    def gang(self):
        cfg, env = self.config, self.env
        progress = saved = 0.0      # samples
        since_s = 0.0               # training seconds since the last checkpoint or restart
        while True:
            if len(self.members) < cfg.min_workers:
                cause = yield from self.spend("waiting", math.inf)
                if cause == _END:
                    return
                if len(self.members) >= cfg.min_workers and \
                        (yield from self.restart(detect=False)) == _END:
                    return
                continue
            members = frozenset(self.members)
            rate = self.rate(members)
            start = env.now
            cause = yield from self.spend("training", cfg.checkpoint_interval_s - since_s,
                                          rate, len(members))
            progress += rate.samples_per_s * (env.now - start)
            since_s += env.now - start
            if cause is None:
                cause = yield from self.spend("checkpointing", cfg.checkpoint_write_s, None,
                                              len(members))
                if cause is None:
                    saved, since_s = progress, 0.0
                    continue
            if cause == _END:
                return
            if progress > saved:
                self.losses.append(Loss(env.now, progress - saved, since_s,
                                        ",".join(map(str, cause))))
            progress, since_s = saved, 0.0
            detect = any(e.kind == "fail" for e in cause)
            if (yield from self.restart(detect)) == _END:
                return

    def restart(self, detect: bool):
        """Generator: detection (for a failure), then the restart; a fail or leave during
        the restart starts it over. Returns _END if the run ended meanwhile."""
        cfg = self.config
        while True:
            # whatever happens during detection is absorbed into this restart
            if detect and (yield from self.spend_through("detecting", cfg.detection_s)) == _END:
                return _END
            if len(self.members) < cfg.min_workers:
                return None             # the caller waits for joiners
            self.restarts += 1
            causes = yield from self.spend_through("restarting", cfg.restart_s)
            if causes == _END:
                return _END
            departures = [e for c in causes for e in c if e.kind != "join"]
            if not departures:
                return None
            detect = any(e.kind == "fail" for e in departures)

    def spend_through(self, state: str, duration_s: float):
        """Generator: stay in `state` for `duration_s` whatever happens; returns _END or the
        interrupts' causes. A restart stops at its first departure (the caller starts over)."""
        until, causes = self.env.now + duration_s, []
        while True:
            cause = yield from self.spend(state, max(until - self.env.now, 0.0))
            if cause == _END:
                return _END
            if cause is None:
                return causes
            causes.append(cause)
            if state == "restarting" and any(e.kind != "join" for e in cause):
                return causes

    # -- parameter servers --------------------------------------------------------------------

    def server_based(self):
        """Piecewise-constant progress: the rate changes at events and internal timers
        (joiners ready, detection over, SSP workers blocked)."""
        job, cfg, env = self.job, self.config, self.env
        active = set(self.members)          # contributing
        joining: dict[int, float] = {}      # worker -> when its parameter pull ends
        detected_at = -math.inf             # sync drop and ssp: failure detection ends
        blocked_at = math.inf               # ssp: the others reach the dead worker's bound
        required = len(active)              # sync wait: workers the barrier expects
        def due(t: float) -> bool:      # a timer that has fired, up to float rounding
            return t <= env.now + TIME_EPS_REL * max(1.0, env.now)

        while True:
            rate = self.rate(active)
            stalled = not due(detected_at) and (job.scheduling == "sync" or due(blocked_at))
            if job.scheduling == "sync" and cfg.sync_on_departure == "wait":
                stalled = stalled or len(active) < required
            timers = [t for t in (*joining.values(), detected_at, blocked_at) if not due(t)]
            wake = min(timers, default=math.inf)
            state = "stalled" if stalled or not active else "training"
            cause = yield from self.spend(state, wake - env.now,
                                          None if state == "stalled" else rate, len(active))
            if cause == _END:
                return
            for w in [w for w, t in joining.items() if due(t)]:
                del joining[w]
                active.add(w)
                required = max(required, len(active))
            if due(detected_at):
                blocked_at = math.inf
            for e in cause or ():
                if e.kind == "join":
                    if job.join_s > 0:
                        joining[e.worker] = env.now + job.join_s
                    else:
                        active.add(e.worker)
                        required = max(required, len(active))
                    continue
                joining.pop(e.worker, None)
                if e.worker not in active:
                    continue
                active.discard(e.worker)
                if e.kind == "fail":
                    self.losses.append(Loss(env.now, float(job.batch_size), rate.step_s, str(e)))
                    detected_at = env.now + cfg.detection_s
                    if job.scheduling == "ssp" and active:
                        blocked_at = env.now + job.staleness_bound * self.rate(active).step_s
                if job.scheduling == "sync" and cfg.sync_on_departure == "drop":
                    required = len(active)
