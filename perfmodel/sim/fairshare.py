"""A processor-sharing (fair-share) link for SimPy: concurrent transfers split the bandwidth.

Model (fluid processor sharing, Kleinrock 1967): while n transfers are active on the link each
receives bandwidth / n bytes per second, which is what TCP or NCCL flows through one NIC do on
average. A processor-sharing station keeps the product form of a closed queueing network for any
transfer-size distribution (BCMP theorem: Baskett, Chandy, Muntz & Palacios, JACM 1975), so
exact mean-value analysis (perfmodel/sim/mva.py) predicts its mean throughput.

Implementation: instead of recomputing every active transfer's remaining bytes on each arrival
and departure, the link keeps a *virtual time* V(t) = bytes served to each active transfer so
far, with dV/dt = bandwidth / n(t) (the GPS virtual clock of Demers, Keshav & Shenker 1989 and
Parekh & Gallager 1993). A transfer of w bytes joining at V₀ finishes when V reaches V₀ + w,
so active transfers sit in a heap keyed by that finish tag: O(log n) per arrival or departure,
cheap with thousands of concurrent transfers, and exactly the fluid model's timing.

Each transfer first pays the link's per-message latency (a pure delay, not shared), then joins
the shared pool. A message that reaches only a fraction e(size) of the bandwidth (the link's
efficiency curve) is charged size / e(size) bytes of link capacity.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import simpy

from perfmodel.cluster import Link
from perfmodel.errors import PerfmodelError
from perfmodel.sim.records import CommRecord

# Finish tags within this relative distance of the virtual clock complete together (float noise).
_TAG_RTOL = 1e-12


class FairShareLink:
    """One link whose bandwidth is shared equally by the transfers active on it."""

    def __init__(self, env: simpy.Environment, name: str, records: list[CommRecord],
                 bandwidth_Bps: float, latency_s: float = 0.0,
                 efficiency: Callable[[float], float] | None = None):
        if not bandwidth_Bps > 0:
            raise PerfmodelError(f"link '{name}' needs a positive bandwidth, got {bandwidth_Bps}")
        if latency_s < 0:
            raise PerfmodelError(f"link '{name}' latency must be >= 0 s, got {latency_s}")
        self.env, self.name, self.records = env, name, records
        self.bandwidth_Bps, self.latency_s, self.efficiency = bandwidth_Bps, latency_s, efficiency
        self.busy_s = 0.0              # time with at least one transfer in the shared pool
        self.bytes_done = 0.0          # payload bytes of completed transfers
        self._virtual = 0.0            # bytes served to every active transfer since creation
        self._updated_s = env.now      # env time at which _virtual was last brought up to date
        self._active: list[tuple[float, int, float, simpy.Event]] = []  # (tag, seq, bytes, done)
        self._seq = itertools.count()
        self._token = 0                # identifies the one wake-up that is still valid
        self._work: dict[float, float] = {}   # message bytes -> link capacity it uses

    @classmethod
    def from_link(cls, env: simpy.Environment, name: str, records: list[CommRecord],
                  link: Link) -> FairShareLink:
        """A fair-share link with a cluster Link's bandwidth, latency and efficiency curve."""
        bandwidth = link.bandwidth_GBps * 1e9

        def efficiency(nbytes: float) -> float:
            return 1.0 / (link.seconds_per_byte(nbytes) * bandwidth)

        return cls(env, name, records, bandwidth, link.latency_s, efficiency)

    @property
    def active(self) -> int:
        """Transfers currently sharing the bandwidth (not counting those still in latency)."""
        return len(self._active)

    def transfer(self, kind: str, worker: int, nbytes: float):
        """Generator: carry `nbytes` for `worker`; returns its CommRecord when it completes."""
        env = self.env
        start = env.now
        if self.latency_s > 0:
            yield env.timeout(self.latency_s)
        if nbytes > 0:
            work = self._work.get(nbytes)
            if work is None:
                work = nbytes / self.efficiency(nbytes) if self.efficiency else nbytes
                self._work[nbytes] = work
            done = env.event()
            self._advance()
            heapq.heappush(self._active, (self._virtual + work, next(self._seq), nbytes, done))
            self._schedule_wakeup()
            yield done
        record = CommRecord(kind, worker, start, env.now, nbytes, self.name)
        self.records.append(record)
        return record

    def _advance(self) -> None:
        """Bring the virtual clock up to env.now at the current share bandwidth / n."""
        now = self.env.now
        n = len(self._active)
        if n:
            self._virtual += (now - self._updated_s) * self.bandwidth_Bps / n
            self.busy_s += now - self._updated_s
        self._updated_s = now

    def _schedule_wakeup(self) -> None:
        """Wake at the earliest finish; any wake-up scheduled before is now out of date."""
        self._token += 1
        if not self._active:
            return
        ahead = self._active[0][0] - self._virtual
        delay = max(ahead, 0.0) * len(self._active) / self.bandwidth_Bps
        self.env.timeout(delay, self._token).callbacks.append(self._wake)

    def _wake(self, event: simpy.Event) -> None:
        if event.value != self._token:      # superseded by a later arrival or departure
            return
        self._advance()
        tag, _, nbytes, done = heapq.heappop(self._active)
        self._virtual = max(self._virtual, tag)
        self.bytes_done += nbytes
        done.succeed()
        limit = self._virtual * (1 + _TAG_RTOL)
        while self._active and self._active[0][0] <= limit:   # equal transfers finish together
            _, _, nbytes, done = heapq.heappop(self._active)
            self.bytes_done += nbytes
            done.succeed()
        self._schedule_wakeup()
