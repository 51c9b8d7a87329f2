"""A real parameter server on torch.distributed point-to-point messages (not torch RPC).

Rank 0 serves; ranks 1..N train (worker i = rank i + 1). All parameters travel as one flat
fp32 tensor: a worker pushes [version it read, step, loss, gradient...] and waits for the
reply [server version, parameters...]. Messages go over gloo with CPU tensors (a separate
gloo group when the job runs NCCL: NCCL cannot receive from "any source").

Modes (option ps.mode):
- "sync": the server takes one gradient from every worker, in the order they arrive
  (`dist.recv(src=None)`), adding each to a running sum as it arrives (as MXNet's kvstore
  merges pushes, and as perfmodel/sim/ps.py models it), then applies their mean and replies
  to all. Every gradient was computed on the current version: staleness 0.
- "async": the server takes whichever worker's gradient arrives first (`dist.recv(src=None)`
  returns the sender), applies it and replies to that worker alone. Staleness τ = server
  version when applied − version the worker read; for N equal workers mean τ ≈ N − 1.
- "ssp": async, but the server holds its reply to a worker more than `staleness_bound`
  clocks (pushes) ahead of the slowest worker until the slowest catches up (stale synchronous
  parallel, Ho et al. 2013).
Async options: `staleness_aware_lr` applies a gradient of staleness τ ≥ 1 at lr/τ (Zhang et
al. 2016); `delay_compensation` applies g + λ·g⊙g⊙(w_now − w_read) (DC-ASGD, Zheng et al.
2017; λ = `dc_lambda`, default 0.04), with w_read the parameters last sent to that worker.

Records: the server writes one "update" per gradient applied, "eval" records (accuracy and
loss of its model on held-out data: the digits test split for `mlp`, else a synthetic set,
named in the record's `data` field) at version 0, every `eval_every` versions and at the
end, and a summary. Workers write "step" records: compute_s = forward + backward (+ straggler
sleep), comm_wait_s = from sending the gradient to holding the new parameters. Every send
completes before the sender moves on; a peer that dies or stays silent for the job's
timeout_s ends the run with an error that says so.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from measure import cpu_meter
from measure.context import RunContext
from measure.data import DataSource, evaluate, held_out_set
from measure.memtrack import live_memory, measure_memory
from measure.settings import Settings, parse_settings
from measure.timing import Straggler
from measure.training import build_model, make_optimizer
from perfmodel.errors import PerfmodelError

SERVER = 0
PUSH_HEADER = 3         # version read, step, loss
REPLY_HEADER = 1        # server version
MODES = ("sync", "async", "ssp")
EVALS_PER_RUN = 8       # evaluations spread over the run when eval_every is not given


@dataclass(frozen=True, kw_only=True)
class PSOptions:
    mode: str
    staleness_bound: int            # ssp: clocks a worker may run ahead of the slowest
    staleness_aware_lr: bool
    delay_compensation: bool
    dc_lambda: float
    lr: float | None                # None: the workload's learning rate
    eval_every: int                 # server versions between evaluations; 0: automatic


def parse_options(options: dict[str, Any]) -> PSOptions:
    mode = options.get("mode", "async")
    if mode not in MODES:
        raise PerfmodelError(f"ps mode '{mode}' is not one of {', '.join(MODES)}")
    bound = options.get("staleness_bound", 1)
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        raise PerfmodelError(f"ps staleness_bound must be a whole number >= 0, got {bound!r}")
    lr = options.get("lr")
    if lr is not None and not (isinstance(lr, int | float) and lr > 0):
        raise PerfmodelError(f"ps lr must be a positive number, got {lr!r}")
    return PSOptions(
        mode=mode, staleness_bound=bound,
        staleness_aware_lr=bool(options.get("staleness_aware_lr", False)),
        delay_compensation=bool(options.get("delay_compensation", False)),
        dc_lambda=float(options.get("dc_lambda", 0.04)),
        lr=None if lr is None else float(lr),
        eval_every=int(options.get("eval_every", 0)))


class Channel:
    """Blocking point-to-point messages that turn a dead or silent peer into a clear error."""

    def __init__(self, group: Any, timeout_s: float, who: str):
        self.group, self.timeout_s, self.who = group, timeout_s, who

    def send(self, tensor: torch.Tensor, dsts: list[int]) -> None:
        try:
            works = [dist.isend(tensor, dst=d, group=self.group) for d in dsts]
            for work in works:
                work.wait()
        except RuntimeError as e:
            raise self._lost(f"rank(s) {dsts}", e) from e

    def recv(self, tensor: torch.Tensor, src: int | None) -> int:
        try:
            return dist.recv(tensor, src=src, group=self.group)
        except RuntimeError as e:
            raise self._lost("any worker" if src is None else f"rank {src}", e) from e

    def _lost(self, peer: str, e: Exception) -> PerfmodelError:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return PerfmodelError(f"{self.who}: lost contact with {peer} (it died "
                              f"or sent nothing within {self.timeout_s:g} s): {first_line}")


def run(ctx: RunContext) -> None:
    settings = parse_settings(ctx.config, ctx.world_size)
    options = parse_options(settings.options)
    timeout_s = float(ctx.config.get("timeout_s", 120))
    group = None
    if ctx.backend != "gloo":
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    who = "PS server" if ctx.rank == SERVER else f"PS worker {ctx.rank - 1} (rank {ctx.rank})"
    channel = Channel(group, timeout_s, who)
    if ctx.rank == SERVER:
        Server(ctx, settings, options, channel).serve()
    else:
        work(ctx, settings, channel)


def flat_size(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def unflatten(flat: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Copy a flat parameter vector into the model's parameters (no aliasing)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


# ---------------------------------------------------------------- worker


def work(ctx: RunContext, settings: Settings, channel: Channel) -> None:
    """Pull parameters, compute a gradient on an own batch, push it; `total_steps` times."""
    spec, worker = settings.spec, ctx.rank - 1
    model = build_model(spec, settings.seed, ctx.device)
    params = list(model.parameters())
    reply = torch.empty(REPLY_HEADER + flat_size(model))
    push = torch.empty(PUSH_HEADER + flat_size(model))
    data = DataSource(spec, settings.batch_size, settings.seed, ctx.rank, ctx.device)
    straggler = Straggler(settings.worker_speed(worker))

    def gradient() -> torch.Tensor:
        for p in params:
            p.grad = None
        x, y = data.next_batch()
        loss = spec.loss(model(x), y)
        loss.backward()
        return loss

    # Memory: one local step on the initial weights, before training (no weight changes).
    memory = measure_memory(model, None, gradient, device=ctx.device, steps=1,
                            extra=[reply, push])
    channel.recv(reply, SERVER)
    walls, computes, waits, slept = [], [], [], []
    start = time.perf_counter()
    cpu_start = cpu_meter.mark()
    for step in range(settings.total_steps):
        if step == settings.warmup_steps:
            start = time.perf_counter()
            cpu_start = cpu_meter.mark()
        t0 = time.perf_counter()
        unflatten(reply[REPLY_HEADER:], params)
        loss = gradient()
        torch.cat([p.grad.reshape(-1).cpu() for p in params], out=push[PUSH_HEADER:])
        push[0], push[1], push[2] = reply[0], step, float(loss)   # fp32: exact to 2**24
        slept_s = straggler.delay(time.perf_counter() - t0)
        t_send = time.perf_counter()
        channel.send(push, [SERVER])
        channel.recv(reply, SERVER)
        t1 = time.perf_counter()
        if step >= settings.warmup_steps:
            walls.append(t1 - t0)
            computes.append(t_send - t0)
            waits.append(t1 - t_send)
            slept.append(slept_s)
            ctx.recorder.write("step", step=step, wall_s=t1 - t0, compute_s=t_send - t0,
                               comm_wait_s=t1 - t_send, loss=float(loss),
                               samples=settings.batch_size)
    elapsed_s = time.perf_counter() - start
    cpu = cpu_meter.usage(cpu_start)
    ctx.recorder.write("memory", **memory)
    ctx.recorder.write(
        # This worker's own rate; the run's throughput is in the server's summary.
        "summary", worker_throughput_samples_per_s=settings.batch_size * settings.steps
        / elapsed_s,
        elapsed_s=elapsed_s, steps=settings.steps, warmup_steps=settings.warmup_steps,
        batch_size=settings.batch_size, worker=worker, speed=straggler.speed,
        mean_step_s=float(np.mean(walls)), median_step_s=float(np.median(walls)),
        mean_compute_s=float(np.mean(computes)), mean_comm_wait_s=float(np.mean(waits)),
        mean_slept_s=float(np.mean(slept)), **cpu)


# ---------------------------------------------------------------- server


class Server:
    def __init__(self, ctx: RunContext, settings: Settings, options: PSOptions,
                 channel: Channel):
        self.ctx, self.settings, self.options, self.channel = ctx, settings, options, channel
        self.spec = settings.spec
        self.model = build_model(self.spec, settings.seed, ctx.device)
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(self.spec, self.params, lr=options.lr)
        self.lr = float(self.optimizer.param_groups[0]["lr"])
        size = flat_size(self.model)
        self.reply = torch.empty(REPLY_HEADER + size)          # [version, parameters]
        n = settings.workers
        # sync: the first gradient of a step lands in inbox[0], which then holds the running
        # sum; later ones land in inbox[1] and are added (one buffer more with >= 2 workers)
        self.inbox = [torch.empty(PUSH_HEADER + size)
                      for _ in range(2 if options.mode == "sync" and n > 1 else 1)]
        self.sent = ([torch.empty(size) for _ in range(n)]
                     if options.delay_compensation else [])     # w_read per worker (DC-ASGD)
        self.x_test, self.y_test, self.test_data = held_out_set(self.spec, settings.seed,
                                                                ctx.device)
        self.version = 0
        self.updates: list[tuple[int, int, int, float]] = []    # (step, τ, worker, time)
        self.eval_s = 0.0
        self.accuracy, self.test_loss = float("nan"), float("nan")
        total_updates = settings.total_steps * (1 if options.mode == "sync" else n)
        self.eval_every = options.eval_every or max(1, total_updates // EVALS_PER_RUN)
        self.start = 0.0
        # CPU use over the timed updates: from the last warm-up gradient's record to the last
        # update (cpu_meter); the evaluations around the updates are outside it
        self.warm_updates = settings.warmup_steps * n
        self.cpu_start = cpu_meter.mark()
        self.cpu: dict[str, float] = {}

    def serve(self) -> None:
        workers = list(range(1, self.settings.workers + 1))
        self.pack()
        self.start = time.perf_counter()
        self.reply_to(workers)
        self.evaluate()
        self.cpu_start = cpu_meter.mark()
        if self.options.mode == "sync":
            self.serve_sync(workers)
        else:
            self.serve_async()
        self.cpu = cpu_meter.usage(self.cpu_start)
        if self.version % self.eval_every:
            self.evaluate()
        self.write_summary()

    def serve_sync(self, workers: list[int]) -> None:
        total = self.inbox[0][PUSH_HEADER:]
        for _ in range(self.settings.total_steps):
            headers: dict[int, torch.Tensor] = {}
            received: dict[int, float] = {}
            for i in range(len(workers)):           # each worker pushes once, then waits
                inbox = self.inbox[min(i, 1)]
                t0 = time.perf_counter()
                rank = self.channel.recv(inbox, None)
                received[rank] = time.perf_counter() - t0
                if rank in headers:
                    raise PerfmodelError(f"PS server: rank {rank} pushed twice in one step")
                headers[rank] = inbox[:PUSH_HEADER].clone()
                if i:
                    total.add_(inbox[PUSH_HEADER:])
            t1 = time.perf_counter()
            self.apply(total.div_(len(workers)), self.lr)
            t2 = time.perf_counter()
            version = self.version
            self.version += 1
            self.pack()
            t3 = time.perf_counter()
            self.reply_to(workers)
            t4 = time.perf_counter()
            for rank in workers:
                self.record_update(rank - 1, headers[rank], t2 - self.start, version,
                                   recv_s=received[rank], apply_s=t2 - t1, pack_s=t3 - t2,
                                   reply_s=t4 - t3)
            self.maybe_evaluate()

    def serve_async(self) -> None:
        n, total = self.settings.workers, self.settings.total_steps
        clocks = [0] * n                    # gradients received per worker
        held: set[int] = set()              # ssp: workers whose reply waits
        inbox = self.inbox[0]
        for _ in range(n * total):
            t0 = time.perf_counter()
            worker = self.channel.recv(inbox, None) - 1
            t1 = time.perf_counter()
            tau = self.version - int(inbox[0])
            grad = inbox[PUSH_HEADER:]
            if self.options.delay_compensation:
                w_now = self.reply[REPLY_HEADER:]
                grad = grad + self.options.dc_lambda * grad * grad * (w_now - self.sent[worker])
            lr = self.lr / tau if self.options.staleness_aware_lr and tau >= 1 else self.lr
            self.apply(grad, lr)
            t2 = time.perf_counter()
            version = self.version
            self.version += 1
            self.pack()
            t3 = time.perf_counter()
            clocks[worker] += 1
            held.add(worker)
            bound = self.options.staleness_bound if self.options.mode == "ssp" else None
            slowest = min(clocks)
            ready = sorted(w for w in held if bound is None or clocks[w] - slowest <= bound)
            held.difference_update(ready)
            self.reply_to([w + 1 for w in ready])
            t4 = time.perf_counter()
            self.record_update(worker, inbox[:PUSH_HEADER], t2 - self.start, version,
                               recv_s=t1 - t0, apply_s=t2 - t1, pack_s=t3 - t2,
                               reply_s=t4 - t3)
            self.maybe_evaluate()

    def apply(self, flat_grad: torch.Tensor, lr: float) -> None:
        """One optimizer step of the workload's optimizer with `flat_grad` as the gradient."""
        flat_grad = flat_grad.to(self.ctx.device)
        offset = 0
        for p in self.params:
            p.grad = flat_grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for p in self.params:
            p.grad = None

    def pack(self) -> None:
        self.reply[0] = self.version
        torch.cat([p.detach().reshape(-1).cpu() for p in self.params],
                  out=self.reply[REPLY_HEADER:])

    def reply_to(self, ranks: list[int]) -> None:
        for rank in ranks:
            if self.sent:
                self.sent[rank - 1].copy_(self.reply[REPLY_HEADER:])
        if ranks:
            self.channel.send(self.reply, ranks)

    def record_update(self, worker: int, header: torch.Tensor, time_s: float, version: int,
                      **phases: float) -> None:
        """One update record: which gradient, the version it was applied to, when, and the
        server's phases around it (seconds): recv_s waiting for and receiving the push,
        apply_s the optimizer step (sync: over the summed gradient, the same for every
        update of a version), pack_s copying the parameters into the reply, reply_s sending
        the replies it released (none, one or, sync and ssp, several)."""
        version_read, step = int(header[0]), int(header[1])
        self.updates.append((step, version - version_read, worker, time_s))
        self.ctx.recorder.write("update", worker=worker, step=step, version_read=version_read,
                                version_applied=version, time_s=time_s, **phases)
        if len(self.updates) == self.warm_updates:
            self.cpu_start = cpu_meter.mark()

    def maybe_evaluate(self) -> None:
        if self.version % self.eval_every == 0:
            self.evaluate()

    def evaluate(self) -> None:
        t0 = time.perf_counter()
        self.accuracy, self.test_loss = evaluate(self.model, self.spec, self.x_test,
                                                 self.y_test)
        self.eval_s += time.perf_counter() - t0
        self.ctx.recorder.write("eval", step=self.version, time_s=t0 - self.start,
                                accuracy=self.accuracy, loss=self.test_loss,
                                data=self.test_data)

    def write_summary(self) -> None:
        s = self.settings
        warm = s.warmup_steps * s.workers          # update records of warm-up gradients
        timed = [u for u in self.updates if u[0] >= s.warmup_steps]
        taus = np.array([u[1] for u in timed] or [0])
        # Steady state: after the warm-up and before the first worker sends its last
        # gradient; at the end fewer workers remain and staleness falls (DESIGN.md: mean
        # τ = N − 1 holds for the N-worker system).
        end = min({u[2]: i for i, u in enumerate(self.updates)}.values())
        steady = [u[1] for u in self.updates[:end] if u[0] >= s.warmup_steps]
        # Throughput: the samples of the gradients applied after the warm-up ones, over the
        # time from the last warm-up update (or the start) to the last update.
        times = sorted(u[3] for u in self.updates)
        warm_end = times[warm - 1] if warm else 0.0
        elapsed_s = times[-1] - warm_end
        samples = len(timed) * s.batch_size
        self.ctx.recorder.write("memory", **live_memory(
            self.model, self.optimizer, [self.reply, *self.inbox, *self.sent]))
        self.ctx.recorder.write(
            "summary", throughput_samples_per_s=samples / elapsed_s if elapsed_s > 0 else 0.0,
            elapsed_s=elapsed_s, updates=len(self.updates), steps=s.steps,
            warmup_steps=s.warmup_steps, batch_size=s.batch_size,
            mean_staleness=float(taus.mean()), max_staleness=int(taus.max()),
            steady_mean_staleness=float(np.mean(steady)) if steady else float("nan"),
            final_accuracy=self.accuracy, final_loss=self.test_loss, eval_s=self.eval_s,
            learning_rate=self.lr, staleness_bound=self.options.staleness_bound, **self.cpu)
