"""The small interface every strategy implements, and how one is built by name.

Adding a strategy: write one module with an Options dataclass and a class with `simulate`
and `memory`, then add one record to `perfmodel/strategies.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from perfmodel import strategies as strategy_records
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


def make_strategy(name: str, **options: Any) -> Strategy:
    """Build a strategy; options that do not belong to it are an error naming who takes them."""
    cls = strategy_records.get(name).simulator_class()
    accepted = {f.name for f in dataclasses.fields(cls.Options)}
    for key in options:
        if key not in accepted:
            takers = [r.name for r in strategy_records.REGISTRY.values()
                      if key in r.option_names()]
            where = f"it applies to {', '.join(takers)}" if takers else "it is unknown"
            raise PerfmodelError(f"option '{key}' does not apply to {name}; {where}")
    return cls(cls.Options(**options))
