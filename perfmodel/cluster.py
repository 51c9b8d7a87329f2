"""Cluster profiles: devices, links and achieved efficiency, loaded from TOML data files.

Shipped profiles live in `perfmodel/data/profiles/`; `perfmodel calibrate` writes measured ones
to the user profile folder (`$PERFMODEL_PROFILES`, default `~/.local/share/perfmodel/profiles`),
which takes precedence over a shipped profile of the same name.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import Fields, load_toml
from perfmodel.uncertainty import CalibrationErrors, calibration_errors

SHIPPED_PROFILES = Path(__file__).resolve().parent / "data" / "profiles"
PRECISION_KEYS = ("fp32", "tf32", "bf16", "fp16")
MAX_SHARING_DELAY_CV = 0.99     # compute.sharing_delay_cv: 2·Beta(α, α) has a CV below 1


def user_profile_dir() -> Path:
    env = os.environ.get("PERFMODEL_PROFILES")
    if env:
        return Path(env)
    return data_home() / "profiles"


def data_home() -> Path:
    """Where perfmodel keeps per-user data: measured profiles, the measurement store."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(base) / "perfmodel"


def interpolate_log(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear in log10(x) through `curve`, flat beyond its ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x <= x1:
            t = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
            return y0 + t * (y1 - y0)
    return curve[-1][1]


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    source: str                 # "spec" (datasheets, citations) or "measured" (calibrated)
    note: str
    citations: tuple[str, ...] = ()
    date: str = ""              # measured profiles: when, where and with what
    host: str = ""
    versions: str = ""
    runs: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    name: str
    memory_GiB: float
    memory_bandwidth_GBps: float
    peak_TFLOPS: dict[str, float]       # per precision key: fp32, tf32, bf16, fp16
    framework_overhead_GiB: float       # CUDA context and library workspaces (cuBLAS, NCCL)
    memory_overhead_fraction: float = 0.0   # measured excess over the analytic memory parts
    # Share of capacity the caching allocator cannot hand out (fragmentation, rounding of
    # blocks); 0 where a measured overhead fraction already carries it.
    allocator_reserve_fraction: float = 0.0

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * 2**30

    @property
    def allocatable_bytes(self) -> float:
        """Capacity less the allocator reserve: what the context and tensors share."""
        return self.memory_bytes * (1.0 - self.allocator_reserve_fraction)

    @property
    def usable_memory_bytes(self) -> float:
        """What tensors may use: capacity - CUDA context - allocator reserve (one convention
        in every profile; memory_GiB is always the card's capacity)."""
        return (self.memory_GiB * (1.0 - self.allocator_reserve_fraction)
                - self.framework_overhead_GiB) * 2**30


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadCompute:
    """A CPU host's whole-step factor and core contention fitted for one workload
    (calibration/fit_cores.py): they differ by workload, as its working set does. Seen on
    2 cores (2026-12-03, one thread per process): the mlp (52 MB of weights, gradients and
    momentum) ran 1.21-1.29x slower beside a second copy of itself, thread CPU time up as
    much (shared L3 and memory bandwidth), cnn-small 0.94-1.08x. A calibration the same day
    fitted mlp 1.26 / 0.00, cnn-small 1.54 / 0.06, transformer-small 1.17 / 0.04 (whole step
    / κ): the mlp's contention did not show in its concurrent runs."""

    workload: str
    whole_step_factor: float
    core_contention: float


# The training precisions (perfmodel/workload.py PRECISIONS holds their byte rules; it
# imports this module, so the names live here and a test keeps the two the same).
PRECISION_NAMES = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16")


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionCompute:
    """A GPU's matmul efficiency curve and per-kernel cost fitted for one training precision
    (`perfmodel gpu-check`, calibration/gpu_check.py): they differ by precision. Seen on one
    H200 (2026-12-04, reports/gpu-check-2026-12-04): big matmul units reached about 0.6 of
    the fp32 peak but 0.2-0.4 of the TF32 and BF16 peaks, and eager PyTorch spent 21 us per
    small Linear call, 67 us under bf16 autocast (its casts are kernels and dispatches too).
    Keyed by the workload's precision name (fp32, tf32, bf16-mixed, ...): autocast's cost
    belongs to bf16-mixed, not to pure bf16."""

    precision: str
    efficiency_by_flops: tuple[tuple[float, float], ...]
    launch_us_per_kernel: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Compute:
    """Achieved compute, a roofline per unit pass and op class (perfmodel/sim/compute.py):
    overhead + kernels x launch + matmul FLOPs / (peak x efficiency(FLOPs))
    + memory-bound bytes / (HBM bandwidth x memory_efficiency)."""

    efficiency_by_flops: tuple[tuple[float, float], ...]   # [FLOPs of one unit pass, fraction]
    overhead_us_per_unit: float          # launch/dispatch cost per unit per pass
    backward_flops_ratio: float          # backward FLOPs / forward FLOPs (2 for dense layers)
    optimizer_GBps: float                # bytes of optimizer state+params touched per second
    jitter_cv: float                     # coefficient of variation of a step's compute time
    overlap_slowdown: float = 1.0        # compute stretch while communication overlaps it
    # Memory-bound op class (norms, activations, elementwise, softmax, embedding, loss):
    # achieved fraction of HBM bandwidth; 0 = not modelled (profiles fitted before #12).
    memory_efficiency: float = 0.0
    launch_us_per_kernel: float = 0.0    # per kernel a workload unit launches
    backward_bytes_ratio: float = 2.0    # backward bytes moved / forward (read grad + saved)
    # CPU hosts only (topology.compute_cpu_cores_per_node > 0): the slowdown each further
    # busy core adds to a process's compute (shared memory bandwidth and caches), fitted from
    # compute timings with 1, 2 and 3 busy processes (calibration/fit_cores.py).
    core_contention: float = 0.0
    # A whole training step's forward and backward passes over their sum timed unit by unit
    # (the loss, autograd across units, the Python between them, caches shared by the whole
    # model); fitted on a CPU host from whole steps of one process alone (calibration/
    # fit_cores.py), 1 where not measured.
    whole_step_factor: float = 1.0
    # The two above fitted per workload where calibration timed that workload's whole steps
    # (profile [compute.by_workload.<name>]); the fields above hold for every other workload.
    by_workload: tuple[WorkloadCompute, ...] = ()
    # A CPU host's parameter-server worker's compute beyond its passes and two copies, per
    # workload, in ms (profile [compute.ps_worker_extra_ms]; perfmodel/sim/compute.py
    # ps_worker_seconds): measured from the calibration's 1-worker PS runs, whose worker
    # computed 4.9-6.2 ms a step longer than that model for the mlp on 2026-12-05 and within
    # 0.3 ms for cnn-small - not a byte rate (calibration/from_store.py `_ps_worker_extra`).
    ps_worker_extra_ms: tuple[tuple[str, float], ...] = ()
    # The matmul curve and kernel cost fitted per precision where a GPU check measured that
    # precision (profile [compute.by_precision.<precision>]); the fields above hold for
    # every other precision.
    by_precision: tuple[PrecisionCompute, ...] = ()
    # The host's copies of gradients and parameters in and out of communication buffers:
    # FSDP2's around its collectives (perfmodel/sim/fsdp.py copy_seconds) and DDP's reducer
    # copying gradients into its buckets and back (perfmodel/sim/ddp.py host_passes), GB a
    # second: fitted on a CPU host from the calibration's FSDP runs (calibration/
    # from_store.py `_copy_rate`), whose copies ran at 4-5 GB/s where the optimizer streams
    # 13 GB/s (torch.profiler, mlp on 2 gloo ranks, 2026-12-05: copies into buffers FSDP2
    # allocates afresh every step, from buffers another thread just received; a timed-wait
    # DDP rank's own thread burnt 5.8-6.2 ms a step on 2 ranks for 25.8 MB of bucket copies
    # and 12.9 MB of zero gradients: 6.3 GB/s). 0 = not measured: optimizer_GBps. Profiles
    # written before 2026-12-05 call it fsdp_copy_GBps.
    copy_GBps: float = 0.0
    # CPU hosts only: how far a timed-wait worker's step strays from its length when the
    # host's processes outnumber its cores, in ms (a sleep ends when the scheduler gives the
    # core back; measure/timed_wait.py pays oversleep back later, so the mean holds): fitted
    # from the calibration's crowded timed-wait PS run (calibration/fit_cores.py
    # `fit_timed_wait_spread`); `perfmodel compare` draws its timed-wait PS workers' steps
    # with it, since their order of arrival at the serial server decides SSP's staleness.
    # 0 = not measured: a timed wait takes exactly its time.
    timed_wait_spread_ms: float = 0.0
    # CPU hosts only: the SD of the time a step loses to core sharing over its mean
    # (calibration/fit_cores.py `fit_sharing_delay_cv`, from the concurrent compute runs with
    # more busy processes than cores). A PS worker's compute stretch x (perfmodel/sim/ps.py)
    # is a mean; each step's delay t·(x − 1) is drawn with this spread (as 2·Beta(α, α), mean
    # 1, so below 1), and a fast worker beside a straggler does not keep an exact rhythm
    # with it. 0 = the delay is its mean.
    sharing_delay_cv: float = 0.0
    # CPU hosts only: the CPU work a DDP timed wait's node does per step with more ranks
    # than cores (every rank's gloo threads and training thread, as measure/cpu_meter.py
    # counts it) over what perfmodel/sim/cores.py `node_cpu_work_s` counts for it (the
    # crowded sweeps' all-reduces and the reducer's passes): fitted from the calibration's
    # crowded DDP timed waits (calibration/fit_cores.py `fit_ddp_cpu_work_factor`), it
    # scales the CPU floor of a crowded DDP step. 1 = the counted work is all there is.
    ddp_cpu_work_factor: float = 1.0
    # CPU hosts calibrated from unit timings only: the rate at which a whole step moves
    # each unit's weights through memory (forward reads them, backward reads them and
    # writes their gradients), which units timed apart, cache-warm, never pay
    # (perfmodel/sim/compute.py weights_streamed_s). Calibration writes optimizer_GBps
    # here, the same memory-bound traffic. 0 = nothing added (GPUs, profiler-trace fits,
    # profiles written before 2026-12-05).
    weight_stream_GBps: float = 0.0

    def copy_Bps(self) -> float:
        """The host's copy rate in bytes a second (copy_GBps, else optimizer_GBps)."""
        return (self.copy_GBps or self.optimizer_GBps) * 1e9

    def _precision(self, precision: str | None) -> PrecisionCompute | None:
        return next((p for p in self.by_precision if p.precision == precision), None)

    def ps_worker_extra_s(self, workload: str) -> float:
        """`ps_worker_extra_ms` of `workload` in seconds; 0 where not measured."""
        return dict(self.ps_worker_extra_ms).get(workload, 0.0) * 1e-3

    def efficiency(self, flops: float, precision: str | None = None) -> float:
        """Achieved fraction of the peak for a pass of `flops` matmul FLOPs (the curve of
        `precision` where fitted, else the profile's)."""
        own = self._precision(precision)
        curve = self.efficiency_by_flops if own is None else own.efficiency_by_flops
        return interpolate_log(curve, max(flops, 1.0))

    def launch_us(self, precision: str | None = None) -> float:
        """Microseconds per kernel a unit launches (`precision`'s own where fitted)."""
        own = self._precision(precision)
        return self.launch_us_per_kernel if own is None else own.launch_us_per_kernel

    def _own(self, workload: str | None) -> WorkloadCompute | None:
        return next((w for w in self.by_workload if w.workload == workload), None)

    def whole_step(self, workload: str | None = None) -> float:
        """The whole-step factor of `workload` (its own where fitted, else the default)."""
        own = self._own(workload)
        return self.whole_step_factor if own is None else own.whole_step_factor

    def contention(self, workload: str | None = None) -> float:
        """The core contention κ of `workload` (its own where fitted, else the default)."""
        own = self._own(workload)
        return self.core_contention if own is None else own.core_contention


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One link class: bandwidth per direction, per-message latency, size-dependent efficiency."""

    bandwidth_GBps: float
    latency_us: float
    efficiency_by_bytes: tuple[tuple[float, float], ...]   # [message bytes, fraction of bw]
    # Measured time of a collective over the α–β ring model fitted on all-reduce, per kind
    # (e.g. gloo's reduce-scatter is no ring); () = 1 for every kind.
    time_factor_by_op: tuple[tuple[str, float], ...] = ()
    # One-way point-to-point messages (a parameter server's pushes and pulls) where they were
    # timed apart from the collectives (a ping-pong sweep): their own α, bandwidth and curve.
    # gloo over loopback: ~0.2 ms and ~1.8 GB/s one way against the all-reduce fit's 0.7 ms
    # and 1.2 GB/s, whose α is a ring step's wake-up. None = the collective fit's.
    p2p: Link | None = None

    def point_to_point(self) -> Link:
        """The link as one message sees it: the ping-pong fit where there is one."""
        return self.p2p or self

    def time_factor(self, op: str) -> float:
        return dict(self.time_factor_by_op).get(op, 1.0)

    def seconds_per_byte(self, message_bytes: float) -> float:
        """β for a message of this size: 1 / (bandwidth x efficiency(size))."""
        eff = interpolate_log(self.efficiency_by_bytes, max(message_bytes, 1.0))
        return 1.0 / (self.bandwidth_GBps * 1e9 * eff)

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class Server:
    """Parameter-server processes: how fast they apply an update, which link they sit on."""

    apply_GBps: float                    # gradient bytes applied per second (memory-bound)
    link: str                            # "intra_node" or "inter_node": the link a push crosses
    # A serial CPU-host server's own time per update, apply + pack (measured by `perfmodel
    # calibrate` at the server, calibration/fit_ps.py): latency + gradient bytes / rate.
    # None where not measured: the workload's optimizer step and the pack stand for it.
    update_latency_us: float | None = None
    update_GBps: float | None = None
    # The same server's one message each way, as measured on the 1-worker PS runs
    # (calibration/from_store.py `_server_messages`): a push the server receives from any
    # worker and a reply it sends, each latency + bytes / rate. On this host a push took
    # 1.5x the ping-pong sweep's one-way time for its size (benchmarks/ps_receive.py: not
    # the receive from any source), so the p2p fit does not stand for them. None where not
    # measured: the server's link carries them.
    push_latency_us: float | None = None
    push_GBps: float | None = None
    reply_latency_us: float | None = None
    reply_GBps: float | None = None
    # The same server's messages where its node runs more processes than it has cores, over
    # those 1-worker ones: the calibration's crowded PS run's median receive + reply per
    # update over the fitted push + reply of its sizes (calibration/from_store.py
    # `_crowded_messages`). There a message waits for the scheduler's wake-ups as well as
    # for a core (the crowded server's receive and reply took 1.3-1.9x the 1-worker ones
    # while the host kept 1.5 of its 2 cores busy, docs/model.md), which processor sharing
    # of the copies (x1.2 there) does not see. None where not measured: sharing alone.
    crowded_message_factor: float | None = None
    # ... and its apply + pack there over the fitted server.update (the same crowded runs'
    # median apply + pack per update): 0.6-1.1 in the reports' set As, where the crowded
    # run's tracked the held-out crowded servers' better than the pinned 1-worker fit did.
    # None where not measured: server.update alone.
    crowded_update_factor: float | None = None

    def update_s(self, grad_bytes: float) -> float | None:
        """Seconds this serial server's apply + pack of a gradient of `grad_bytes` takes alone
        where measured ([server.update]); None where not."""
        if self.update_GBps is None:
            return None
        return (self.update_latency_us or 0.0) * 1e-6 + grad_bytes / (self.update_GBps * 1e9)

    def message_s(self, kind: str, nbytes: float) -> float | None:
        """Seconds one `kind` ("push" or "pull") message of `nbytes` holds the server where
        measured; None where not (the link's fit decides)."""
        latency_us, rate = ((self.push_latency_us, self.push_GBps) if kind == "push"
                            else (self.reply_latency_us, self.reply_GBps))
        if rate is None:
            return None
        return (latency_us or 0.0) * 1e-6 + nbytes / (rate * 1e9)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterProfile:
    name: str
    description: str
    provenance: Provenance
    device: Device
    devices_per_node: int
    intra_node: Link                     # per device, inside a node (NVLink, PCIe, loopback)
    inter_node: Link                     # per node NIC, shared by the node's devices
    compute: Compute
    server: Server
    path: Path
    # Cores that drive communication on a node (a CPU backend such as gloo copies and
    # reduces on the host's cores); 0 = the links move data themselves (NVLink, NIC DMA).
    comm_cpu_cores_per_node: int = 0
    # The part u of a CPU-driven collective's byte term (n·β: copying and reducing bytes)
    # that is CPU work and shares the cores when ranks outnumber them; the rest, and the
    # per-step latency (waiting on wake-ups and peers), does not. 1 = all of it (the default
    # where not measured); `perfmodel calibrate` fits it on a CPU host from a collective
    # sweep with twice as many ranks as cores, by message size where it can
    # (comm_cpu_bound_by_bytes, [[bytes, u], ...], log-interpolated, flat beyond its ends;
    # empty = this one value at every size).
    comm_cpu_bound_fraction: float = 1.0
    comm_cpu_bound_by_bytes: tuple[tuple[float, float], ...] = ()
    # Measured instead where calibration swept collectives at several crowding levels: per
    # kind of collective, [[p/c, bytes, stretch], ...], the whole collective's time (latency
    # steps included) over the unshared model's with p ranks on c cores, by level and size.
    # Where present it replaces u (comm_cpu_share is then 1): see comm_cpu_stretch.
    comm_cpu_stretch_by_level: tuple[tuple[str, tuple[tuple[float, float, float], ...]],
                                     ...] = ()
    # The share of the node's cores a crowded collective keeps busy, [[p/c > 1, share], ...]
    # (linear in p/c between levels, flat beyond): each rank's CPU time over its wall time,
    # summed over the p ranks and divided by the c cores, as calibration's crowded sweeps
    # measured it (calibration/fit_comm_sharing.py `fit_busy_by_level`). () = 1: every core
    # busy. See `comm_cpu_busy`.
    comm_cpu_busy_by_level: tuple[tuple[float, float], ...] = ()
    # Cores the node's compute runs on when its "devices" are CPU cores (a CPU host: every
    # busy process, workers and parameter servers alike, shares them); 0 = each device
    # computes on its own (GPUs), and compute is never stretched by core sharing.
    compute_cpu_cores_per_node: int = 0
    # False where the workers' compute is a sleep standing in for a GPU (timed-wait runs):
    # it occupies no core, while the servers' applies and CPU-driven copies still do.
    # Not a profile field: `perfmodel compare` sets it for timed-wait runs.
    compute_occupies_cores: bool = True
    # A measured profile's [calibration] residuals and run spread (perfmodel/uncertainty.py);
    # None for spec-derived profiles and calibrations that skipped compute or the network.
    calibration_errors: CalibrationErrors | None = None

    def comm_cpu_bound(self, nbytes: float | None = None) -> float:
        """u at a collective of `nbytes` (the curve where measured, else the one value)."""
        if self.comm_cpu_bound_by_bytes and nbytes is not None:
            return interpolate_log(self.comm_cpu_bound_by_bytes, max(nbytes, 1.0))
        return self.comm_cpu_bound_fraction

    def comm_cpu_busy(self, workers: int) -> float:
        """The share of a node's cores that a CPU-driven collective over `workers` ranks
        keeps busy while its ranks outnumber the cores (comm_cpu_busy_by_level at p/c;
        1 without the table, and where the ranks fit the cores). What is left idle is where
        other work of the ranks, such as DDP's reducer copies beside its all-reduce, runs
        without slowing the collective (perfmodel/sim/cores.py `node_cpu_floor_s`)."""
        per_node = min(workers, self.devices_per_node)
        cores = self.comm_cpu_cores_per_node
        if not self.comm_cpu_busy_by_level or not cores or per_node <= cores:
            return 1.0
        return interpolate_linear(self.comm_cpu_busy_by_level, per_node / cores)

    def comm_cpu_share(self, workers: int, nbytes: float | None = None) -> float:
        """How much slower a collective's byte term (n·β) runs because its ranks share the
        node's cores; the latency steps are waits and do not share.

        A ring step waits for every rank's copy and reduction, and the ranks of a ring work
        in lock step, so their CPU bursts coincide: during the CPU-bound part u of the
        unshared byte time, p busy ranks on c < p cores each get c/p of a core (processor
        sharing); the rest overlaps. So n·β x (1 − u + u·p/c), p/c when u = 1; 1 when
        p <= c or the links move data themselves. u depends on the message size where
        calibration measured it (`comm_cpu_bound`)."""
        per_node = min(workers, self.devices_per_node)
        cores = self.comm_cpu_cores_per_node
        if not cores or per_node <= cores or self.comm_cpu_stretch_by_level:
            return 1.0
        u = self.comm_cpu_bound(nbytes)
        return 1.0 - u + u * per_node / cores

    def comm_cpu_stretch(self, workers: int, nbytes: float, op: str = "all-reduce") -> float:
        """How much longer a whole CPU-driven collective `op` of `nbytes` over `workers` ranks
        takes than the unshared model, from the measured table (comm_cpu_stretch_by_level;
        the kind's own, else all-reduce's): at each measured level p/c its curve by size
        (log-interpolated, flat beyond its ends); between levels, and from 1 at p/c = 1,
        linear in p/c; flat beyond the largest level measured. 1 without the table or when
        the ranks fit the cores.

        Why measured by level and kind: on a 2-core host the stretch did not follow one
        u·(p/c − 1) law (an all-reduce took ~2x the unshared model at 1 MiB and 4 ranks,
        ~5x at 8), and gloo's all-gather and reduce-scatter, already 2.5x and 5.8x the ring
        model at 2 ranks, stretched far less (calibration/fit_comm_sharing.py)."""
        per_node = min(workers, self.devices_per_node)
        cores = self.comm_cpu_cores_per_node
        if not self.comm_cpu_stretch_by_level or not cores or per_node <= cores:
            return 1.0
        kinds = dict(self.comm_cpu_stretch_by_level)
        rows = kinds.get(op) or kinds.get("all-reduce")
        if not rows:
            return 1.0
        return _stretch_at(rows, per_node / cores, max(nbytes, 1.0))

    def compute_share(self, busy: float, workload: str | None = None) -> float:
        """How much slower a process computes while `busy` processes (itself included;
        fractional for a server busy part of the time) share the node's compute cores.

        Processor sharing: b busy processes on c cores each get min(1, c/b) of a core, so
        time x max(1, b/c). Contention: each further core in use slows every process by
        `compute.core_contention` (κ; `workload`'s own where fitted), so
        x (1 + κ·(min(b, c) − 1)). Together (1 + κ·(min(b, c) − 1)) · max(1, b/c); 1 on a
        device that computes on its own (compute_cpu_cores_per_node = 0: GPUs) or for one
        process alone."""
        cores = self.compute_cpu_cores_per_node
        if not cores or busy <= 1.0:
            return 1.0
        return (1.0 + self.compute.contention(workload) * (min(busy, cores) - 1.0)) \
            * max(1.0, busy / cores)

    @property
    def timed_wait(self) -> bool:
        """A CPU host whose workers' compute is a sleep (`perfmodel compare`'s timed-wait runs,
        measure/timed_wait.py): their own CPU work is paid back from the sleeps."""
        return bool(self.compute_cpu_cores_per_node) and not self.compute_occupies_cores

    def as_timed_wait(self) -> ClusterProfile:
        """This host as a timed-wait run sees it (measure/timed_wait.py): its workers' compute
        is a sleep, so communication cannot slow it (compute.overlap_slowdown = 1) and it
        holds no core (`timed_wait`)."""
        return dataclasses.replace(
            self, compute=dataclasses.replace(self.compute, overlap_slowdown=1.0),
            compute_occupies_cores=False)

    def ranks_busy(self, ranks_per_node: int) -> int:
        """Busy processes a DDP/FSDP rank computes beside: its node's ranks, or 1 where the
        compute occupies no core (a timed wait)."""
        return ranks_per_node if self.compute_occupies_cores else 1

    def nodes_for(self, workers: int) -> int:
        return -(-workers // self.devices_per_node)


COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")


def _stretch_table(f: Fields) -> tuple[tuple[str, tuple[tuple[float, float, float], ...]],
                                         ...]:
    """[topology.comm_cpu_stretch_by_level]: per collective kind, [[p/c > 1, bytes > 0,
    stretch > 0], ...], each level's sizes increasing; () where absent."""
    key = "comm_cpu_stretch_by_level"
    if not f.has(key):
        return ()
    table = f.data[key]
    where = f"{f.path}: field '{f.prefix}{key}'"
    if not isinstance(table, dict) or not table:
        raise PerfmodelError(f"{where} must be a table of collective kinds")
    out = []
    for op, value in table.items():
        at = f"{f.path}: field '{f.prefix}{key}.{op}'"
        ok = isinstance(value, list) and value and all(
            isinstance(r, list) and len(r) == 3 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in r) for r in value)
        if not ok:
            raise PerfmodelError(f"{at} must be a list of [ranks per core, bytes, stretch] "
                                 f"rows of finite numbers")
        rows = tuple((float(a), float(b), float(c)) for a, b, c in value)
        if any(a <= 1 or b <= 0 or c <= 0 for a, b, c in rows):
            raise PerfmodelError(f"{at}: ranks per core must exceed 1, bytes and stretch be "
                                 f"positive")
        for level in {a for a, _, _ in rows}:
            sizes = [b for a, b, _ in rows if a == level]
            if any(y <= x for x, y in zip(sizes, sizes[1:], strict=False)):
                raise PerfmodelError(f"{at}: sizes must increase within level {level:g}")
        out.append((str(op), rows))
    return tuple(out)


def _link(f: Fields, nested: bool = False) -> Link:
    """A [intra_node] or [inter_node] table; its optional [<table>.p2p] (nested) has no
    time factors and no p2p of its own."""
    extra = [k for k in ("time_factor_by_op", "p2p") if nested and f.has(k)]
    if extra:
        raise PerfmodelError(f"{f.path}: field '{f.prefix}{extra[0]}' is not allowed: a p2p "
                             f"table describes one message, no collective")
    factors = ()
    if f.has("time_factor_by_op"):
        t = f.table("time_factor_by_op")
        unknown = sorted(set(t.data) - set(COLLECTIVE_KINDS))
        if unknown:
            raise PerfmodelError(f"{f.path}: unknown collective(s) {', '.join(unknown)} in "
                                 f"time_factor_by_op; choose from {', '.join(COLLECTIVE_KINDS)}")
        factors = tuple((op, t.number(op, positive=True)) for op in COLLECTIVE_KINDS
                        if t.has(op))
    return Link(
        bandwidth_GBps=f.number("bandwidth_GBps", positive=True),
        latency_us=f.number("latency_us"),
        efficiency_by_bytes=f.curve("efficiency_by_bytes"),
        time_factor_by_op=factors,
        p2p=None if nested or not f.has("p2p") else _link(f.table("p2p"), nested=True),
    )


def _server_update(srv: Fields) -> dict[str, float]:
    """[server.update], [server.push] and [server.reply] (each optional): latency_us >= 0 and
    bandwidth_GBps > 0, both or neither; and the crowded factors (optional, > 0)."""
    out = {}
    for name in ("crowded_message_factor", "crowded_update_factor"):
        if srv.has(name):
            out[name] = srv.number(name, positive=True)
    for name in ("update", "push", "reply"):
        if srv.has(name):
            u = srv.table(name)
            out |= {f"{name}_latency_us": u.number("latency_us", minimum=0.0),
                    f"{name}_GBps": u.number("bandwidth_GBps", positive=True)}
    return out


def parse_profile(data: dict, path: Path) -> ClusterProfile:
    f = Fields(data, path)
    prov, dev, comp, srv = f.table("provenance"), f.table("device"), f.table("compute"), \
        f.table("server")
    source = prov.str("source")
    if source not in ("spec", "measured"):
        raise PerfmodelError(f"{path}: field 'provenance.source' must be 'spec' or 'measured'")
    peaks = dev.table("peak_TFLOPS")
    peak = {k: peaks.number(k, positive=True) for k in PRECISION_KEYS if peaks.has(k)}
    if "fp32" not in peak:
        raise PerfmodelError(f"{path}: field 'device.peak_TFLOPS.fp32' is required")
    link = srv.str("link")
    if link not in ("intra_node", "inter_node"):
        raise PerfmodelError(f"{path}: field 'server.link' must be 'intra_node' or 'inter_node'")
    return ClusterProfile(
        name=f.str("name"),
        description=f.str("description"),
        provenance=Provenance(
            source=source,
            note=prov.str("note"),
            citations=prov.str_list("citations", []),
            date=prov.data.get("date", ""),
            host=prov.data.get("host", ""),
            versions=prov.data.get("versions", ""),
            runs=prov.integer("runs", 0),
        ),
        device=Device(
            name=dev.str("name"),
            memory_GiB=dev.number("memory_GiB", positive=True),
            memory_bandwidth_GBps=dev.number("memory_bandwidth_GBps", positive=True),
            peak_TFLOPS=peak,
            framework_overhead_GiB=dev.number("framework_overhead_GiB"),
            memory_overhead_fraction=dev.number("memory_overhead_fraction", 0.0, minimum=-0.9),
            allocator_reserve_fraction=dev.number("allocator_reserve_fraction", 0.0),
        ),
        devices_per_node=f.table("topology").integer("devices_per_node", minimum=1),
        comm_cpu_cores_per_node=f.table("topology").integer("comm_cpu_cores_per_node", 0),
        comm_cpu_bound_fraction=f.table("topology").number("comm_cpu_bound_fraction", 1.0,
                                                            maximum=1.0),
        comm_cpu_bound_by_bytes=(f.table("topology").curve("comm_cpu_bound_by_bytes",
                                                           allow_zero=True)
                                 if f.table("topology").has("comm_cpu_bound_by_bytes") else ()),
        comm_cpu_stretch_by_level=_stretch_table(f.table("topology")),
        comm_cpu_busy_by_level=(f.table("topology").curve("comm_cpu_busy_by_level")
                                if f.table("topology").has("comm_cpu_busy_by_level") else ()),
        compute_cpu_cores_per_node=f.table("topology").integer("compute_cpu_cores_per_node", 0),
        intra_node=_link(f.table("intra_node")),
        inter_node=_link(f.table("inter_node")),
        compute=Compute(
            efficiency_by_flops=comp.curve("efficiency_by_flops"),
            overhead_us_per_unit=comp.number("overhead_us_per_unit"),
            backward_flops_ratio=comp.number("backward_flops_ratio", positive=True),
            optimizer_GBps=comp.number("optimizer_GBps", positive=True),
            jitter_cv=comp.number("jitter_cv"),
            overlap_slowdown=comp.number("overlap_slowdown", 1.0, positive=True),
            memory_efficiency=comp.number("memory_efficiency", 0.0),
            launch_us_per_kernel=comp.number("launch_us_per_kernel", 0.0),
            backward_bytes_ratio=comp.number("backward_bytes_ratio", 2.0, positive=True),
            core_contention=comp.number("core_contention", 0.0),
            whole_step_factor=comp.number("whole_step_factor", 1.0, positive=True),
            by_workload=_by_workload(comp),
            ps_worker_extra_ms=_ps_worker_extra(comp),
            by_precision=_by_precision(comp),
            copy_GBps=comp.number("copy_GBps", comp.number("fsdp_copy_GBps", 0.0)),
            timed_wait_spread_ms=comp.number("timed_wait_spread_ms", 0.0),
            sharing_delay_cv=comp.number("sharing_delay_cv", 0.0, maximum=MAX_SHARING_DELAY_CV),
            ddp_cpu_work_factor=comp.number("ddp_cpu_work_factor", 1.0, positive=True),
            weight_stream_GBps=comp.number("weight_stream_GBps", 0.0),
        ),
        server=Server(apply_GBps=srv.number("apply_GBps", positive=True), link=link,
                      **_server_update(srv)),
        path=path,
        calibration_errors=_calibration_errors(data, path),
    )


def _by_workload(comp: Fields) -> tuple[WorkloadCompute, ...]:
    """[compute.by_workload.<name>] tables: each workload's fitted factors."""
    if not comp.has("by_workload"):
        return ()
    table = comp.table("by_workload")
    return tuple(WorkloadCompute(workload=name,
                                 whole_step_factor=table.table(name).number(
                                     "whole_step_factor", positive=True),
                                 core_contention=table.table(name).number("core_contention"))
                 for name in sorted(table.data))


def _ps_worker_extra(comp: Fields) -> tuple[tuple[str, float], ...]:
    """[compute.ps_worker_extra_ms]: workload name -> ms >= 0."""
    if not comp.has("ps_worker_extra_ms"):
        return ()
    table = comp.table("ps_worker_extra_ms")
    out = []
    for name in sorted(table.data):
        ms = table.number(name)
        if ms < 0:
            raise PerfmodelError(f"field 'compute.ps_worker_extra_ms.{name}' must be >= 0, "
                                 f"got {ms}")
        out.append((name, ms))
    return tuple(out)


def _by_precision(comp: Fields) -> tuple[PrecisionCompute, ...]:
    """[compute.by_precision.<precision>] tables: each measured precision's own matmul
    curve and kernel cost."""
    if not comp.has("by_precision"):
        return ()
    table = comp.table("by_precision")
    for name in table.data:
        if name not in PRECISION_NAMES:
            raise PerfmodelError(f"{table._where(name)}: unknown precision '{name}'; choose "
                                 f"from {', '.join(PRECISION_NAMES)}")
    return tuple(PrecisionCompute(precision=name,
                                  efficiency_by_flops=table.table(name).curve(
                                      "efficiency_by_flops"),
                                  launch_us_per_kernel=table.table(name).number(
                                      "launch_us_per_kernel"))
                 for name in sorted(table.data))


def _calibration_errors(data: dict, path: Path) -> CalibrationErrors | None:
    try:
        return calibration_errors(data)
    except PerfmodelError as e:
        raise PerfmodelError(f"{path}: {e}") from None


def interpolate_linear(points: tuple[tuple[float, float], ...], x: float) -> float:
    """y at `x` on [(x, y), ...] (x increasing): linear between points, flat beyond."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[-1][1]


@lru_cache(maxsize=4096)
def _stretch_at(rows: tuple[tuple[float, float, float], ...], x: float, nbytes: float) -> float:
    """`ClusterProfile.comm_cpu_stretch` at crowding p/c = x from one kind's rows
    ((level, bytes, stretch), ...); cached: a simulation asks for the same few sizes at one
    level once per collective."""
    levels = sorted({row[0] for row in rows})
    points = ((1.0, 1.0), *(
        (lv, interpolate_log(tuple((n, st) for level, n, st in rows if level == lv), nbytes))
        for lv in levels))
    return interpolate_linear(points, x)


def profile_paths() -> dict[str, Path]:
    """Every available profile by name; user (measured) profiles shadow shipped ones."""
    found = {p.stem: p for p in sorted(SHIPPED_PROFILES.glob("*.toml"))}
    user = user_profile_dir()
    if user.is_dir():
        found.update({p.stem: p for p in sorted(user.glob("*.toml"))})
    return found


def load_cluster(name: str) -> ClusterProfile:
    """A profile by name (user profiles shadow shipped ones), or any profile file by path."""
    paths = profile_paths()
    if name not in paths and name.endswith(".toml"):
        path = Path(name)
        return parse_profile(load_toml(path), path)
    if name not in paths:
        raise PerfmodelError(
            f"unknown cluster '{name}'; choose from: {', '.join(sorted(paths))} (or give a "
            f"path to a .toml profile file)")
    profile = parse_profile(load_toml(paths[name]), paths[name])
    if profile.name != name:
        raise PerfmodelError(f"{paths[name]}: field 'name' is '{profile.name}', expected '{name}'")
    return profile
