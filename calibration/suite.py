"""Which measurements a calibration needs, per kind of machine, and which are already stored.

Each `Measurement` is one real run (measure/configs.py builds its config.json) and says what
it feeds (calibration/from_store.py):

- collectives: an nccl-tests-style sweep of all-reduce, all-gather, reduce-scatter and
  ping-pong (one-way messages: a parameter server's pushes and pulls, fitted apart) at the
  node's ranks (2 on a CPU host, every GPU on a GPU host), sizes spanning what the workloads
  communicate (CPU: 1 KiB to 16 MiB — mlp's 12.9 MB of gradients, cnn-small's 2.5 MB, FSDP
  units down to kilobytes; GPU: to 256 MiB, nccl-tests' default end), in
  `COLLECTIVE_LAUNCHES` launches of one sweep each, spread over the suite (before the compute
  measurements, between them and after them). One launch of three sweeps, as the suite had
  until 2026-12-03, sees one state of the machine: two quiet calibrations of this 2-core
  host, an hour apart, fitted loopback bandwidths of 1.35 and 0.94 GB/s from it and every
  held-out prediction moved 15-45 % with them, while the held-out measurements moved 5-10 %.
  `--quick` keeps one launch of two sweeps (the op list repeated: A, B, C, A, B, C).
  With several nodes, one more such run over all of them (it feeds inter_node).
- collectives-shared (CPU hosts): one sweep of the ring collectives with twice as many ranks
  as cores (4 on 2 cores) and one with four times (8), after each 2-rank launch, oversubscribed
  on purpose (--quick: the 4-rank one only): they fit the part of a collective that shares the cores
  (`topology.comm_cpu_bound_fraction`; with both levels the measured stretch by level and
  size, `topology.comm_cpu_stretch_by_level`, and the share of the cores they keep busy,
  `topology.comm_cpu_busy_by_level`, calibration/fit_comm_sharing.py), which the 4- and
  8-rank held-out runs need; the links are fitted on the other launches.
- compute: each workload's per-unit forward/backward times at a quarter, half and all of its
  batch size (>= 3 FLOP counts per unit, as the compute fit needs; the training runs use the
  whole batch, the top of the range), and its optimizer step.
- ddp: the first workload `DDP_REPEATS` times (overlap slowdown, jitter, memory, and the
  run-to-run spread of a repeated configuration), the second once (a second model size, so
  the memory fit can tell a constant from a fraction).
- ps: the first two workloads with one worker each (no queue at the server), `PS_REPEATS`
  times each (once with --quick): the server's own time per update at two gradient sizes
  (`[server.update]`, calibration/fit_ps.py), and checks of the round trip and of the PS
  memory model; the server does not evaluate while it runs. The round trip is what the
  calibration checks itself on (calibration/selfcheck.py).
- ps-crowded (CPU hosts, full suite): an asynchronous PS run of the workload whose bytes
  weigh most (mlp) with three times as many processes as cores (5 workers and the server on
  2: the server is the bottleneck and the workers queue at it), its workers' compute a timed
  wait of the shipped CPU profile's unit times, `TIMED_WAIT_STEPS` steps,
  `CROWDED_PS_REPEATS` runs spread through the training runs: how far a timed wait strays
  on a crowded host (`compute.timed_wait_spread_ms`), which decides who reaches a serial
  server first, and how the server's messages and apply there compare with its 1-worker
  fits (`server.crowded_message_factor`, `server.crowded_update_factor`,
  calibration/fit_ps.py). Nothing else is fitted on it.
- ddp-crowded (CPU hosts, full suite): DDP of the same workload with three times as many
  ranks as cores (6 on 2), its compute a timed wait, `CROWDED_DDP_REPEATS` runs spread
  through the training runs: the CPU work the node does per step (every rank's process CPU,
  measure/cpu_meter.py) over what the model's crowded-node floor counts
  (perfmodel/sim/cores.py `node_cpu_work_s`), `compute.ddp_cpu_work_factor`
  (calibration/fit_cores.py). Nothing else is fitted on it.
- cores (CPU hosts): the first workload's whole steps timed in 1, 2 and 3 processes at once,
  interleaved 1, 2, 3, 1, 2, 3 (`CORES_REPEATS` rounds), for compute under core sharing
  (calibration/fit_cores.py); 3 processes on 2 cores oversubscribe on purpose. Each is
  timed `CORES_TIMED_REPEATS` blocks of >= 50 ms: long enough to span the host's speed
  phases (since session 29; 8 blocks before, about 0.3-0.7 s, caught one phase). The
  1-process timings run once more at the very end of set A (`cores_late_round`, full suite):
  the phases also last minutes, and those timings set one process's speed for every row.

The training runs are interleaved (measure/protocol.py `interleave`): the DDP repeats and
the crowded DDP repeats alternate with the other training runs (ddp 1, crowded 1, ddp mlp,
ddp 2, crowded 2, ps, ...) instead of running back to back, so that a change in the
machine's load during the calibration does not sit in one configuration's repeats.

On this 2-core host a launch spends most of its time importing torch (3-8 s per process,
more when the host is busy), so the suite is a few launches doing several things each.

Reuse (resuming an interrupted calibration): a stored run counts if it succeeded, ran on
this host with this torch version less than `REUSE_MAX_AGE` ago, and its config equals the
measurement's. Each config carries a `calibration` marker (suite, item, repeat), so repeats
are told apart and runs from `perfmodel measure` are never mistaken for them. Multi-node
measurements are never reused: every node must run them together.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from calibration.hardware import CPU_PROFILE, shipped_profile
from measure.configs import (
    check_workload,
    collectives_config,
    compute_config,
    processes,
    progress_total,
    training_config,
)
from measure.protocol import interleave
from perfmodel.errors import PerfmodelError
from perfmodel.sim.compute import unit_times
from perfmodel.workload import load_workload

REUSE_MAX_AGE = dt.timedelta(hours=24)
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "ping-pong")
# The first runs DDP repeatedly and the PS check: cnn-small trains on synthetic batches, so
# its runs skip the scikit-learn import that mlp's digits data costs (~5 s on a busy host).
DEFAULT_WORKLOADS = {"cpu": ("cnn-small", "mlp", "transformer-small"),
                     "cuda": ("resnet50", "bert-large")}
COLLECTIVE_LAUNCHES = 3             # full suite: launches of one sweep each, spread out
# CPU hosts: more sweeps with twice and four times as many ranks as cores, for the part of a
# collective that shares the cores (calibration/fit_comm_sharing.py); ping-pong has no ring
# to share. Two levels because the stretch did not grow as one law in p/c (2026-12-04: an
# 8-rank all-reduce on 2 cores took 2.5x the unshared model at 1 MiB where 4 ranks took 2x,
# 1.75x at 16 MiB where 4 ranks took 2.2x); the held-out runs reach 8 workers and 9 processes.
SHARED_RANKS_PER_RANK = (2, 4)
SHARED_OPS = ("all-reduce", "all-gather", "reduce-scatter")
WARMUP_STEPS = 2                    # of every training run of the suite
CORES_BUSY = (1, 2, 3)              # busy processes of the core-sharing measurements
CORES_REPEATS = 2
# Timed blocks (>= 50 ms each, measure/runs/compute.py) per core-sharing run: >= 2.4 s of
# timing. This VM's speed switches between phases every second or two (2026-12-06, one
# process alone, blocks of 25 steps: transformer-small 38-40 or 50-54 ms a step, mlp 13-19,
# cnn-small 20-28), and 8 blocks (0.3-0.7 s) caught one phase: report 44's set A timed the
# transformer at 35-42 ms where set B's runs computed 57-66 (docs/model.md). Report 45: the
# rounds still differ (37 vs 51 ms at 1 busy): phases also last minutes, which this does not fix.
CORES_TIMED_REPEATS = 48
# The 1-process timings once more after the training runs, the last of set A: the rounds above
# lie within a few minutes near set A's start, and the whole-step factor (one process's speed,
# which every real row's compute scales with) is fitted on them alone. This host's phases
# also last minutes: in the set A's of reports 31-45 the mean 1-process mlp step (11.6-21.5
# ms) tracked the mean error of that report's real mlp rows (correlation 0.70; -10 % to +10 %),
# set B's medians spanning ~50 minutes. A third sample, ~10 minutes after the first two and
# next to set B in time, spreads the factor's samples over all of set A (docs/model.md
# "Set A's one-process timings spread over its time (report 46)"). Full suite only.
DDP_REPEATS = 3
PS_REPEATS = 2                      # full suite: 1-worker PS runs of each of two workloads
FSDP_REPEATS = 2                    # CPU hosts: FSDP runs of the workload copies weigh most in
FSDP_VARIANT = "grad-op"
TIMED_WAIT_STEPS = 40               # CPU hosts: the crowded timed-wait PS run (a spread wants
                                    # many steps; its steps take ~20 ms)
# CPU hosts, full suite: DDP timed waits with this many ranks per core (6 on 2 cores), for
# compute.ddp_cpu_work_factor. 2026-12-06, a DDP mlp timed wait at 3-10 ranks on this host
# (two runs each, interleaved): each rank's gloo CPU a step grew as a ring's bytes, 2(p-1)/p,
# and its training thread's stayed 7.4-8.2 ms, so one level stands for 4 and 8 ranks.
CROWDED_DDP_RANKS_PER_RANK = 3
# Four since session 36 (two until then), spread through the training runs (they ran back to
# back at the end). The node's CPU a step moves with the host's phase: report 54's set A
# timed 142 and 164 core-ms in its two runs (factor 1.10 and 1.27, fitted 1.19) where its
# held-out 4- and 8-rank runs burned 0.91-1.16x the model's count, and the crowded rows,
# whose step is this floor, came out 15-20 % slow; report 52's two gave 1.13 and 1.02. The
# factor is a median of runs: with two, one phase moves it by half its swing.
CROWDED_DDP_REPEATS = 4
# Three since session 37 (one until then): its server's phases now give
# server.crowded_message_factor and server.crowded_update_factor, medians of runs minutes
# apart, as the crowded DDP runs' factor is.
CROWDED_PS_REPEATS = 3
TIMEOUT_S = 300.0                   # process-group timeout of every run


@dataclass(frozen=True, kw_only=True, slots=True)
class SuiteSize:
    """How big each measurement is: the full suite, or `--quick` (tests, a first look)."""

    max_bytes: dict[str, int]       # per device kind
    factor: int
    iters: int | None               # None: the device default (measure/runs/collectives.py)
    collective_repeats: int         # sweeps of every op in one launch
    collective_launches: int        # launches of the single-node sweep, spread over the suite
    compute_repeats: int
    compute_workloads: int          # how many of the workloads get a compute profile
    steps: int
    ddp_repeats: int
    second_ddp: bool
    cores_repeats: int              # rounds of the 1, 2, 3-process compute timings (CPU)
    cores_workloads: int            # how many workloads get them (compute.by_workload)
    cores_timed_repeats: int        # timed blocks per core-sharing run
    cores_late_round: bool          # the 1-process timings once more at set A's end (CPU)
    fsdp_repeats: int               # FSDP runs for compute.copy_GBps (CPU, >= 2 ranks)


FULL = SuiteSize(max_bytes={"cpu": 16 * 2**20, "cuda": 256 * 2**20}, factor=2, iters=None,
                 collective_repeats=1, collective_launches=COLLECTIVE_LAUNCHES,
                 compute_repeats=8,
                 compute_workloads=3, steps=15, ddp_repeats=DDP_REPEATS, second_ddp=True,
                 cores_repeats=CORES_REPEATS, cores_workloads=3,
                 cores_timed_repeats=CORES_TIMED_REPEATS, cores_late_round=True,
                 fsdp_repeats=FSDP_REPEATS)
QUICK = SuiteSize(max_bytes={"cpu": 16 * 2**20, "cuda": 64 * 2**20}, factor=4, iters=5,
                  collective_repeats=2, collective_launches=1, compute_repeats=5,
                  compute_workloads=2, steps=8,
                  ddp_repeats=2, second_ddp=False, cores_repeats=1, cores_workloads=1,
                  cores_timed_repeats=5, cores_late_round=False, fsdp_repeats=0)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    key: str                        # unique in the suite, e.g. "ddp-mlp-2"
    label: str                      # for people: "ddp mlp, 2 workers (2 of 3)"
    config: dict[str, Any]          # config.json, with its calibration marker
    nproc: int                      # processes on this node
    multinode: bool = False         # launched with the torchrun multi-node flags
    oversubscribe: bool = False     # more processes than cores, on purpose (core sharing)
    # Set A may lack it (stores calibrated before it joined the suite): `perfmodel compare`
    # then fits without it, keeping the base profile's value; `calibrate` still measures it.
    optional: bool = False

    @property
    def progress_total(self) -> int:
        return progress_total(self.config)


def build_suite(kind: str, *, suite: str, workloads: tuple[str, ...] | None = None,
                quick: bool = False, ranks: int = 2, nnodes: int = 1,
                seed: int = 0) -> tuple[Measurement, ...]:
    """The measurements for a machine of device `kind` ("cpu" or "cuda").

    `suite` names the calibration (the cluster name) in each config's marker; `ranks` are
    the processes per node of the collectives and DDP runs.
    """
    if kind not in DEFAULT_WORKLOADS:
        raise PerfmodelError(f"unknown device kind '{kind}'; choose from: cpu, cuda")
    names = tuple(check_workload(w) for w in (workloads or DEFAULT_WORKLOADS[kind]))
    if not names:
        raise PerfmodelError("--workloads needs at least one workload")
    size = QUICK if quick else FULL
    common = {"seed": seed, "timeout_s": TIMEOUT_S, "threads_per_worker": 1}
    out: list[Measurement] = []

    def add(key: str, label: str, config: dict, repeat: int = 1, multinode: bool = False,
            nproc: int | None = None, oversubscribe: bool = False,
            optional: bool = False) -> None:
        config = {**config, "calibration": {"suite": suite, "item": key, "repeat": repeat}}
        out.append(Measurement(key=f"{key}-{repeat}", label=label, config=config,
                               nproc=nproc or processes(config), multinode=multinode,
                               oversubscribe=oversubscribe, optional=optional))

    sweeps = (f"{size.collective_repeats} sweep{'s' if size.collective_repeats > 1 else ''} "
              f"of {', '.join(COLLECTIVE_OPS)}")
    if nnodes > 1:       # first, so that every node starts it at once
        config = {**_sweep(kind, size, ranks * nnodes, common), "nodes": nnodes}
        add("collectives-nodes", f"collectives, {nnodes} nodes x {ranks} ranks, {sweeps}",
            config, multinode=True, nproc=ranks)
    if ranks >= 2:
        n = size.collective_launches
        # A store calibrated before the launches were spread holds one launch of three
        # sweeps: it stands for launch 1 (`comparable`), and the later launches are optional.
        for r in range(1, n + 1):
            add("collectives", f"collectives, {ranks} ranks, {sweeps}"
                + (f" ({r} of {n})" if n > 1 else ""), _sweep(kind, size, ranks, common), r,
                optional=r > 1)
    if kind == "cpu" and ranks >= 2:
        # As many crowded sweeps as 2-rank launches, each right after one of them: one sweep
        # fitted comm_cpu_bound_fraction anywhere from 0.08 to 0.29 (± 0.04-0.08 each) in five
        # calibrations of 2026-12-03/04; the fit pools every crowded timing.
        n = size.collective_launches
        for r in range(1, n + 1):
            for times in SHARED_RANKS_PER_RANK[:1] if quick else SHARED_RANKS_PER_RANK:
                shared = ranks * times
                add("collectives-shared" + (f"-x{times}" if times != 2 else ""),
                    f"collectives, {shared} ranks on {ranks} cores, 1 sweep of "
                    f"{', '.join(SHARED_OPS)}" + (f" ({r} of {n})" if n > 1 else ""),
                    {**_sweep(kind, size, shared, common), "ops": list(SHARED_OPS)}, r,
                    oversubscribe=True, optional=True)
    for w in names[:size.compute_workloads]:
        b = load_workload(w).batch_size
        batches = sorted({max(1, b // 4), max(1, b // 2), b})
        add(f"compute-{w}", f"compute {w}, batch {','.join(map(str, batches))}",
            compute_config(workload=w, batch_sizes=batches, repeats=size.compute_repeats,
                           warmup=3, **common))
    if ranks >= 2:
        ddp = [(names[0], r) for r in range(1, size.ddp_repeats + 1)]
        if size.second_ddp and len(names) > 1:
            ddp.append((names[1], 1))
        for w, r in ddp:
            n = sum(1 for x, _ in ddp if x == w)
            add(f"ddp-{w}", f"ddp {w}, {ranks} workers" + (f" ({r} of {n})" if n > 1 else ""),
                _training("ddp", w, ranks, size.steps, {}, common), r)
    # No evaluation while it runs: measure/runs/ps.py's server evaluates its model every
    # eval_every versions, by default 8 times a run (every update in a --quick run), and with
    # one worker each evaluation sits in the round trip the check compares (cnn-small: ~270
    # ms an evaluation against a ~10 ms round trip: the "-95 %" of issue 14). eval_every
    # beyond the run's updates leaves only the evaluations before the first and after the
    # last update, outside every timed round trip.
    # Two workloads' servers, for the server's own time per update at two gradient sizes
    # (calibration/fit_ps.py `fit_server_update`); the second is optional, as a store from
    # before it still calibrates everything else.
    # Each twice in the full suite: one run of each left server.update anywhere from 4.2 to
    # 5.1 ms an mlp update in two calibrations of 2026-12-04 (held-out servers: 3.8-4.6 ms).
    repeats = 1 if quick else PS_REPEATS
    for i, w in enumerate(names[:2]):
        for r in range(1, repeats + 1):
            add(f"ps-{w}", f"ps {w}, 1 worker + server"
                + (f" ({r} of {repeats})" if repeats > 1 else ""),
                _training("ps", w, 1, size.steps,
                          {"mode": "sync", "eval_every": size.steps + WARMUP_STEPS + 1}, common),
                r, optional=i > 0 or r > 1)
    # CPU hosts: FSDP2's copies around its gloo collectives (compute.copy_GBps,
    # calibration/from_store.py `_copy_rate`), on the workload whose parameter bytes weigh
    # most against its FLOPs (mlp: its copies take longer than its passes; cnn-small's would
    # be a few % of its step, under the noise).
    if kind == "cpu" and ranks >= 2:
        w = max(names, key=_copy_weight)
        for r in range(1, size.fsdp_repeats + 1):
            add(f"fsdp-{w}", f"fsdp {FSDP_VARIANT} {w}, {ranks} workers"
                + (f" ({r} of {size.fsdp_repeats})" if size.fsdp_repeats > 1 else ""),
                _training("fsdp", w, ranks, size.steps, {"variant": FSDP_VARIANT}, common),
                r, optional=True)
    # CPU hosts: one PS run with three times as many processes as cores, its workers'
    # compute a timed wait (measure/timed_wait.py), for how far a crowded timed wait strays
    # (compute.timed_wait_spread_ms, calibration/fit_cores.py): with more processes than
    # cores a sleep ends when the scheduler hands the core back, and the order in which
    # workers then reach a serial server decides an SSP run's staleness (docs/model.md).
    # 5 workers on 2 cores queue at the server, as crowded PS runs do (with 3, its server
    # idled half the time and the waits strayed by half as much: 2026-12-05). Equal speeds
    # and asynchronous: a configuration no held-out set runs.
    crowded_ps = f"ps-crowded-{max(names, key=_copy_weight)}"
    if kind == "cpu" and ranks >= 2 and not quick:
        w = max(names, key=_copy_weight)
        workers = 2 * ranks + 1
        config = _training("ps", w, workers, TIMED_WAIT_STEPS,
                           {"mode": "async",
                            "eval_every": (TIMED_WAIT_STEPS + WARMUP_STEPS) * workers + 1},
                           common)
        for r in range(1, CROWDED_PS_REPEATS + 1):
            add(crowded_ps, f"ps async {w}, {workers} timed-wait workers + server on "
                f"{ranks} cores ({r} of {CROWDED_PS_REPEATS})",
                config | timed_wait_config(w, int(config["batch_size"])), r,
                oversubscribe=True, optional=True)
    # CPU hosts: DDP of the same workload with three times as many ranks as cores, its
    # compute a timed wait, four times: the CPU work such a node really does per step (gloo's
    # threads and every training thread, measure/cpu_meter.py) over what the model counts
    # for it, compute.ddp_cpu_work_factor (calibration/fit_cores.py). The held-out DDP timed
    # waits run 4 and 8 ranks; this runs 6.
    crowded_ddp = f"ddp-crowded-{max(names, key=_copy_weight)}"
    if kind == "cpu" and ranks >= 2 and not quick:
        w = max(names, key=_copy_weight)
        workers = CROWDED_DDP_RANKS_PER_RANK * ranks
        for r in range(1, CROWDED_DDP_REPEATS + 1):
            config = _training("ddp", w, workers, TIMED_WAIT_STEPS, {}, common)
            add(crowded_ddp, f"ddp {w}, {workers} timed-wait workers on {ranks} cores "
                f"({r} of {CROWDED_DDP_REPEATS})",
                config | timed_wait_config(w, int(config["batch_size"]),
                                           optimizer_param_fraction=1.0),
                r, oversubscribe=True, optional=True)
    cores_names = names[:min(size.cores_workloads, size.compute_workloads)]

    def cores(w: str, busy: int) -> dict:
        return compute_config(workload=w, batch_sizes=[load_workload(w).batch_size],
                              repeats=size.cores_timed_repeats, warmup=3, concurrent=busy,
                              **common)
    if kind == "cpu":       # every compute workload's own: their working sets differ
        for r in range(1, size.cores_repeats + 1):
            for w in cores_names:
                for busy in CORES_BUSY:
                    add(f"cores-{w}-{busy}",
                        f"compute {w} in {busy} processes at once ({r} of {size.cores_repeats})",
                        cores(w, busy), r, oversubscribe=True, optional=True)
    ordered = _interleave_training(out, (f"ddp-{names[0]}", crowded_ddp, crowded_ps))
    if kind == "cpu" and size.cores_late_round:     # last: after every training run
        out.clear()
        for w in cores_names:
            add(f"cores-{w}-1", f"compute {w} in 1 process alone, after the training runs",
                cores(w, 1), size.cores_repeats + 1, oversubscribe=True, optional=True)
        ordered += tuple(out)
    return ordered


def timed_wait_config(workload: str, batch_size: int, *,
                      optimizer_param_fraction: float = 0.0) -> dict[str, Any]:
    """compute_mode and compute_wait_s of a suite's timed-wait run: the shipped CPU
    profile's unit times of `workload` (nothing is fitted yet when the suite is built; the
    runs measure how their waits spread, and the CPU work beside them, whatever they are),
    the optimizer's over that share of the parameters (0: a PS worker's, whose server
    steps; 1: a DDP rank's)."""
    t = unit_times(shipped_profile(CPU_PROFILE), load_workload(workload), batch_size,
                   optimizer_param_fraction=optimizer_param_fraction)
    return {"compute_mode": "timed-wait",
            "compute_wait_s": {"forward": [float(x) for x in t.forward_s],
                               "backward": [float(x) for x in t.backward_s],
                               "optimizer": float(t.optimizer_s)}}


def _copy_weight(name: str) -> float:
    """Parameter bytes per forward FLOP of one sample: how much FSDP's copies weigh."""
    w = load_workload(name)
    return w.param_bytes / max(w.forward_flops_per_sample, 1.0)


def _spread_collectives(rest: list[Measurement]) -> list[Measurement]:
    """The single-node collective launches spread over the other measurements: the first
    before them, the others after equal shares of them, each followed by its crowded sweep
    (more ranks than cores) where there is one (the multi-node launch stays first)."""
    def kind(m: Measurement) -> str:
        return m.key.rsplit("-", 1)[0]
    launches = [m for m in rest if kind(m) == "collectives"]
    crowded = [m for m in rest if kind(m).startswith("collectives-shared")]
    if len(launches) < 2:
        return rest
    first = [m for m in rest if m.key.startswith("collectives-nodes")]
    others = [m for m in rest if m not in launches and m not in crowded and m not in first]
    share = -(-len(others) // len(launches))        # ceil: every launch but the first follows
    chunks = [others[i * share:(i + 1) * share] for i in range(len(launches))]

    def after(i: int) -> list[Measurement]:        # the crowded sweeps of launch i + 1
        return [m for m in crowded if m.config["calibration"]["repeat"] == i + 1]
    placed = [m for i in range(len(launches)) for m in after(i)]
    return first + [m for i, (launch, chunk) in enumerate(zip(launches, chunks, strict=True))
                    for m in (launch, *after(i), *chunk)] + [m for m in crowded
                                                             if m not in placed]


def _interleave_training(out: list[Measurement], repeated: tuple[str, ...]
                         ) -> tuple[Measurement, ...]:
    """The suite with the repeats of each item of `repeated` (a key without its repeat)
    alternating with each other's and with the other training runs."""
    training = [m for m in out if m.config["kind"] in ("ddp", "fsdp", "ps")]
    rest = _spread_collectives([m for m in out if m not in training])
    groups = [[m for m in training if m.key.rsplit("-", 1)[0] == item] for item in repeated]
    others = [m for m in training if not any(m in g for g in groups)]
    return tuple(rest + interleave([*groups, others]))


def _sweep(kind: str, size: SuiteSize, ranks: int, common: dict) -> dict:
    return collectives_config(workers=ranks, ops=list(COLLECTIVE_OPS) * size.collective_repeats,
                              min_bytes=1024,
                              max_bytes=size.max_bytes[kind], factor=size.factor,
                              iters=size.iters, warmup_iters=None, dtype="float32", **common)


def _training(kind: str, workload: str, workers: int, steps: int, options: dict,
              common: dict) -> dict:
    return training_config(kind, workers=workers, workload=workload, batch_size=None,
                           steps=steps, warmup_steps=WARMUP_STEPS, speed=None, options=options,
                           **common)


# ---------------------------------------------------------------- what is stored already


def comparable(config: dict[str, Any]) -> str:
    """A config as JSON, without what the launcher adds, for comparing stored runs; a PS
    server's evaluation schedule left out too, so a run stored before the PS check stopped
    evaluating inside its round trips still stands for it (its check then says loudly that
    the round trip is off); and a collectives launch of several sweeps stands for one of a
    single sweep (stores from before the launches were spread over the suite); and ping-pong
    left out of the op list, so a launch stored before it joined the sweep still stands for
    one (the calibration then has no p2p fit, and messages use the collective fit); and a
    core-sharing run's count of timed blocks left out, so one timed shorter (set A before
    session 29: 8 blocks) stands for one timed longer (`CORES_TIMED_REPEATS`)."""
    clean = json.loads(json.dumps(config))
    if clean.get("kind") == "collectives" and isinstance(clean.get("ops"), list):
        # several sweeps in one launch stand for one (the op list repeated: A, B, A, B)
        clean["ops"] = [op for op in dict.fromkeys(clean["ops"]) if op != "ping-pong"]
    clean.pop("oversubscribed", None)
    clean.pop("protocol", None)         # the load and pinning a run saw (measure/protocol.py)
    ((clean.get("options") or {}).get("ps") or {}).pop("eval_every", None)
    compute = (clean.get("options") or {}).get("compute") or {}
    if compute.get("concurrent"):               # compute_config also keeps it as "steps"
        compute.pop("repeats", None)
        clean.pop("steps", None)
    return json.dumps(clean, sort_keys=True)


def matching_runs(stored, m: Measurement) -> list:
    """The successful stored runs (store.list_runs rows, oldest first) that measured `m`."""
    want = comparable(m.config)
    return [r for r in stored if r.status == "ok" and r.kind == m.config["kind"]
            and comparable(r.config) == want]


@dataclass(frozen=True)
class NewestRuns:
    """The newest stored run of every measurement of a suite (`newest_runs`)."""

    ids: tuple[int, ...]                # one per measurement found, in suite order
    labels: tuple[str, ...]             # their labels
    missing: tuple[str, ...]            # labels of required measurements with no run
    elsewhere: tuple[str, ...]          # hosts that hold runs of the missing ones


def newest_runs(stored, suite, *, host: str, any_host: bool = False) -> NewestRuns:
    """The newest successful stored run (store.list_runs rows) of every measurement of
    `suite`, from `host` (with `any_host`, from any host when `host` has none); an optional
    measurement with no run is left out, a required one is `missing`. Set A of `perfmodel
    compare` and the stores `--pool` adds to a calibration are both found this way."""
    ids, labels, missing, elsewhere = [], [], [], set()
    for m in suite:
        match = matching_runs(stored, m)
        here = [r for r in match if r.host == host] or (match if any_host else [])
        if here:
            ids.append(here[-1].id)
            labels.append(m.label)
        elif not getattr(m, "optional", False):
            missing.append(m.label)
            elsewhere |= {r.host for r in match if r.host}
    return NewestRuns(ids=tuple(ids), labels=tuple(labels), missing=tuple(missing),
                      elsewhere=tuple(sorted(elsewhere)))


def reusable_run(runs, m: Measurement, *, host: str, torch_version: str | None,
                 now: dt.datetime) -> int | None:
    """Id of the newest stored run (store.list_runs rows) that can stand for `m`, or None."""
    if m.multinode:
        return None
    want = comparable(m.config)
    for row in reversed(runs):
        if (row.status != "ok" or row.kind != m.config["kind"] or row.host != host
                or (torch_version and row.torch_version != torch_version)
                or not _recent(row.started_at, now) or comparable(row.config) != want):
            continue
        return row.id
    return None


def _recent(started_at: str | None, now: dt.datetime) -> bool:
    try:
        when = dt.datetime.fromisoformat(started_at or "")
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return dt.timedelta(0) <= now - when <= REUSE_MAX_AGE
