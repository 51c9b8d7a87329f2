"""Shared SimPy plumbing: an environment that counts events, and links as FIFO resources."""

from __future__ import annotations

import gc
import itertools
from contextlib import contextmanager

import simpy

from perfmodel.sim.records import CommRecord


class CountingEnvironment(simpy.Environment):
    """A simpy.Environment that says how many steps a run to the end took (for events/second
    figures): every scheduled event is processed, plus the last step that finds the queue
    empty, which is how the counter this replaces (an overridden `step()`, one more Python
    call per event) counted, so DDP's and FSDP's reported counts are unchanged. It reads
    SimPy's event-id counter (one id per scheduled event)."""

    @property
    def events(self) -> int:
        n = next(self._eid)
        self._eid = itertools.count(n)
        return n + 1


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


@contextmanager
def quiet_gc():
    """Freeze and disable Python's cyclic garbage collector around a simulation.

    A simulation allocates no reference cycles worth collecting while it runs, but its
    growing record lists make every generation-2 scan longer (run time N^1.1-1.24 with the
    collector on). Output is identical; collection resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()
