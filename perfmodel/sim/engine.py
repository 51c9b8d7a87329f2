"""Shared SimPy plumbing: an environment that counts events, and links as FIFO resources."""

from __future__ import annotations

import simpy

from perfmodel.sim.records import CommRecord


class CountingEnvironment(simpy.Environment):
    """A simpy.Environment that counts the events it processes (for events/second figures)."""

    def __init__(self):
        super().__init__()
        self.events = 0

    def step(self):
        self.events += 1
        super().step()


class SharedLink:
    """A link (or a collective's communication stream) that carries one transfer at a time.

    Transfers queue first come, first served, so a transfer's completion time depends on what
    else uses the link. For the mean values this project checks (closed queueing networks,
    Reiser & Lavenberg 1980) FIFO and fair sharing give the same throughput.
    """

    def __init__(self, env: simpy.Environment, name: str, records: list[CommRecord]):
        self.env, self.name, self.records = env, name, records
        self.resource = simpy.Resource(env, capacity=1)

    def transfer(self, kind: str, worker: int, nbytes: float, duration_s: float):
        """Generator: wait for the link, hold it for `duration_s`, record the transfer."""
        with self.resource.request() as req:
            yield req
            start = self.env.now
            yield self.env.timeout(duration_s)
            self.records.append(CommRecord(kind, worker, start, self.env.now, nbytes, self.name))
