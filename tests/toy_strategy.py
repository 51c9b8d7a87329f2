"""A toy strategy for tests: DDP's simulation under another name, with one option of its own.

It exists to show that a strategy reaches predict, sweep, recommend, the elasticity model
and the reports through one record in perfmodel/strategies.py and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.sim.ddp import DDP
from perfmodel.strategies import StrategyRecord


class Toy:
    """DDP with every bucket capped at `bucket_cap_MiB` (the only option)."""

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Options:
        bucket_cap_MiB: float = 4.0

    name = "toy"

    def __init__(self, options: Options | None = None):
        self.options = options if options is not None else Toy.Options()
        self._ddp = DDP(DDP.Options(bucket_cap_MiB=self.options.bucket_cap_MiB))

    def simulate(self, scenario):
        return self._ddp.simulate(scenario)

    def memory(self, scenario):
        return self._ddp.memory(scenario)


RECORD = StrategyRecord(name="toy", family="ddp", synchronous=True, scheduling="gang",
                        ps_mode=None, color="tab:brown", simulator="tests.toy_strategy:Toy",
                        candidates=(("toy", {}),))
