"""The small interface every strategy implements, and the table that names them.

Adding a strategy: write one module with an Options dataclass and a class with `simulate`
and `memory`, then add one line to STRATEGIES.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from perfmodel.errors import PerfmodelError
from perfmodel.memory import MemoryBreakdown
from perfmodel.sim.records import SimResult
from perfmodel.sim.scenario import Scenario


class Strategy(Protocol):
    name: str
    options: Any                        # the strategy's frozen Options dataclass

    def simulate(self, scenario: Scenario) -> SimResult:
        """Run the discrete-event model of `scenario.steps` steps per worker."""

    def memory(self, scenario: Scenario) -> Mapping[str, MemoryBreakdown]:
        """Peak bytes per device by part; key "worker" always, "server" for PS."""


def strategies() -> dict[str, type]:
    from perfmodel.sim import ddp, fsdp, ps

    return {
        "ddp": ddp.DDP,
        "fsdp": fsdp.FSDP,
        "sync-ps": ps.SyncPS,
        "async-ps": ps.AsyncPS,
        "ssp-ps": ps.SSPPS,
    }


def make_strategy(name: str, **options: Any) -> Strategy:
    """Build a strategy; options that do not belong to it are an error naming who takes them."""
    table = strategies()
    if name not in table:
        raise PerfmodelError(f"unknown strategy '{name}'; choose from: {', '.join(table)}")
    cls = table[name]
    accepted = {f.name for f in dataclasses.fields(cls.Options)}
    for key in options:
        if key not in accepted:
            takers = [n for n, c in table.items()
                      if key in {f.name for f in dataclasses.fields(c.Options)}]
            where = f"it applies to {', '.join(takers)}" if takers else "it is unknown"
            raise PerfmodelError(f"option '{key}' does not apply to {name}; {where}")
    return cls(cls.Options(**options))
