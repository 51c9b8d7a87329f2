"""A parameter-server run whose membership changes mid-run: a worker leaves, another joins.

gloo cannot grow or shrink a process group, so the membership changes inside one fixed
torchrun world, at the application level as parameter servers do it (Li et al., "Scaling
distributed machine learning with the parameter server", OSDI 2014, sec. 4.3: workers are
added and removed while the servers keep serving). Rank 0 serves, ranks 1..N are workers;
the last `standby` workers start idle. On top of measure/runs/ps.py's messages (its Channel,
[version read, step, loss, gradient] pushes and [version, parameters] replies, its Server's
apply, pack and records), asynchronous mode:

- after `leave_after_steps` steps the leaving worker pushes a LEAVE message (step = -2)
  instead of a gradient and exits; the server stops expecting it and keeps applying the
  other workers' gradients;
- once the server has applied `join_after_updates` updates after the leave, it sends its
  current parameters to the next standby worker: that is the joiner's pull, after which it
  trains like the others;
- the run has a budget of `steps` x (initially active workers) updates; the reply to a
  gradient that spends it has version -1 (STOP), as does the reply to a standby never needed.

Records: ps.py's "update" per gradient and "step" per worker step; "elastic" with event =
"left" (server: when and at which version), "join_sent" (server), "joined" (joiner: how long
it waited, when its pull ended), and "membership" (server: update rates before the leave,
while the worker is gone, and after the joiner's first update, and the joiner's join_s from
the server sending the parameters to the joiner's first gradient arriving).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from measure.context import RunContext
from measure.data import DataSource, digits_split, uses_digits
from measure.runs.ps import (
    PUSH_HEADER,
    REPLY_HEADER,
    SERVER,
    Channel,
    Server,
    flat_size,
    parse_options,
    unflatten,
)
from measure.settings import Settings, parse_settings
from measure.training import build_model
from perfmodel.errors import PerfmodelError

LEAVE = -2          # push step field: this worker leaves
STOP = -1           # reply version field: stop training


@dataclass(frozen=True, kw_only=True)
class Plan:
    leave_worker: int           # worker index (rank - 1) that leaves
    leave_after_steps: int
    standby: int                # the last `standby` workers start idle
    join_after_updates: int     # updates applied after the leave before a standby joins

    def standby_workers(self, workers: int) -> list[int]:
        return list(range(workers - self.standby, workers))


def parse_plan(options: dict[str, Any], workers: int) -> Plan:
    def whole(key: str, default: int, minimum: int) -> int:
        value = options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PerfmodelError(f"elastic_ps option {key} must be a whole number >= "
                                 f"{minimum}, got {value!r}")
        return value

    plan = Plan(leave_worker=whole("leave_worker", 0, 0),
                leave_after_steps=whole("leave_after_steps", 10, 1),
                standby=whole("standby", 1, 0),
                join_after_updates=whole("join_after_updates", 10, 0))
    if plan.standby >= workers:
        raise PerfmodelError(f"{plan.standby} standby workers leave none of the {workers} "
                             "workers to start training")
    if plan.leave_worker in plan.standby_workers(workers) or plan.leave_worker >= workers:
        raise PerfmodelError(f"the leaving worker {plan.leave_worker} must be one of the "
                             f"{workers - plan.standby} workers that start training")
    return plan


def run(ctx: RunContext) -> None:
    settings = parse_settings({**ctx.config, "kind": "ps"}, ctx.world_size)
    options = parse_options(settings.options)
    if options.mode != "async":
        raise PerfmodelError("elastic_ps runs the asynchronous parameter server only "
                             f"(ps mode 'async'), got '{options.mode}'")
    plan = parse_plan(dict((ctx.config.get("options") or {}).get("elastic_ps", {})),
                      settings.workers)
    timeout_s = float(ctx.config.get("timeout_s", 120))
    who = "PS server" if ctx.rank == SERVER else f"PS worker {ctx.rank - 1} (rank {ctx.rank})"
    group = None                # NCCL cannot receive from any source: messages go over gloo
    if ctx.backend != "gloo":
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    channel = Channel(group, timeout_s, who)
    if ctx.rank == SERVER:
        MembershipServer(ctx, settings, options, channel).serve_membership(plan)
    else:
        work(ctx, settings, channel, plan)


def work(ctx: RunContext, settings: Settings, channel: Channel, plan: Plan) -> None:
    """Wait for parameters (a standby waits until it is needed), then pull-compute-push until
    told to stop, or until this worker's time to leave."""
    spec, worker = settings.spec, ctx.rank - 1
    model = build_model(spec, settings.seed, ctx.device)
    params = list(model.parameters())
    reply = torch.empty(REPLY_HEADER + flat_size(model))
    push = torch.empty(PUSH_HEADER + flat_size(model))
    data = DataSource(spec, settings.batch_size, settings.seed, ctx.rank, ctx.device)
    if uses_digits(spec):
        digits_split()              # load the data before the pull: a joiner is ready to train
    waited = time.time()
    channel.recv(reply, SERVER)
    if worker in plan.standby_workers(settings.workers):
        ctx.recorder.write("elastic", event="joined", worker=worker, needed=bool(reply[0] != STOP),
                           waited_s=time.time() - waited, time=time.time())
    step = 0
    while int(reply[0]) != STOP:
        if worker == plan.leave_worker and step == plan.leave_after_steps:
            push[1] = LEAVE
            channel.send(push, [SERVER])
            ctx.recorder.write("elastic", event="leaving", worker=worker, time=time.time())
            return
        t0 = time.perf_counter()
        unflatten(reply[REPLY_HEADER:], params)
        for p in params:
            p.grad = None
        x, y = data.next_batch()
        loss = spec.loss(model(x), y)
        loss.backward()
        torch.cat([p.grad.reshape(-1).cpu() for p in params], out=push[PUSH_HEADER:])
        push[0], push[1], push[2] = reply[0], step, float(loss)
        t_send = time.perf_counter()
        channel.send(push, [SERVER])
        channel.recv(reply, SERVER)
        t1 = time.perf_counter()
        ctx.recorder.write("step", step=step, wall_s=t1 - t0, compute_s=t_send - t0,
                           comm_wait_s=t1 - t_send, loss=float(loss),
                           samples=settings.batch_size)
        step += 1


class MembershipServer(Server):
    """ps.py's server with a changing set of workers (asynchronous applies)."""

    def serve_membership(self, plan: Plan) -> None:
        n = self.settings.workers
        standby = [w + 1 for w in plan.standby_workers(n)]          # ranks
        active = {w for w in range(1, n + 1) if w not in standby}
        budget = self.settings.total_steps * len(active)
        events: dict[str, float] = {}
        left_version: int | None = None
        joiner_rank: int | None = None
        inbox = self.inbox[0]
        self.pack()
        self.start = time.perf_counter()
        self.reply_to(sorted(active))
        while active:
            rank = self.channel.recv(inbox, None)
            now = time.perf_counter() - self.start
            if int(inbox[1]) == LEAVE:
                active.discard(rank)
                left_version, events["left_s"] = self.version, now
                self.ctx.recorder.write("elastic", event="left", worker=rank - 1,
                                        version=self.version, time_s=now, time=time.time())
                continue
            self.apply(inbox[PUSH_HEADER:], self.lr)
            self.record_update(rank - 1, inbox, now, self.version)
            if rank == joiner_rank and "joiner_first_update_s" not in events:
                events["joiner_first_update_s"] = now
            self.version += 1
            self.pack()
            budget -= 1
            if budget > 0:
                self.reply_to([rank])
            else:
                self.stop([rank])
                active.discard(rank)
            if standby and left_version is not None and budget > 0 \
                    and self.version - left_version >= plan.join_after_updates:
                joiner_rank = standby.pop(0)
                events["join_sent_s"] = time.perf_counter() - self.start
                self.reply_to([joiner_rank])
                active.add(joiner_rank)
                self.ctx.recorder.write("elastic", event="join_sent", worker=joiner_rank - 1,
                                        version=self.version, time_s=events["join_sent_s"],
                                        time=time.time())
            self.maybe_evaluate()
        self.stop(standby)
        self.evaluate()
        self.ctx.recorder.write("elastic", event="membership", **self.membership(events))

    def stop(self, ranks: list[int]) -> None:
        if ranks:
            self.reply[0] = STOP
            self.channel.send(self.reply, ranks)
            self.reply[0] = self.version

    def membership(self, events: dict[str, float]) -> dict[str, Any]:
        """Update rates in the windows before the leave (from the first update), while a
        worker is gone (leave -> joiner's first update) and after; the joiner's join_s."""
        times = np.array([u[3] for u in self.updates])
        out: dict[str, Any] = {k: v for k, v in events.items()}
        out["updates"] = len(times)
        left = events.get("left_s")
        back = events.get("joiner_first_update_s")
        # "before" starts at the first update, not at the server's start: process start-up
        # and the first pulls are no part of the two-worker rate
        edges = [float(times[0]) if len(times) else 0.0, left, back,
                 float(times[-1]) if len(times) else None]
        for name, a, b in (("before", edges[0], edges[1]), ("gone", edges[1], edges[2]),
                           ("after", edges[2], edges[3])):
            if a is None or b is None or b <= a:
                continue
            count = int(((times > a) & (times <= b)).sum())
            out[f"updates_{name}"] = count
            out[f"update_rate_{name}_per_s"] = count / (b - a)
        if back is not None and "join_sent_s" in events:
            out["join_s"] = back - events["join_sent_s"]
        out["batch_size"] = self.settings.batch_size
        return out
