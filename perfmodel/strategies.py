"""One record per training strategy: everything the rest of perfmodel needs to know about it.

predict, sweep, recommend, the elasticity model, the measurement layer (which torch run
measures it) and the reports (its colour) all look a strategy up here; nothing else keeps a
table of strategies. Adding a strategy is one simulation module (a class with `Options`,
`simulate` and `memory`; the protocol is in `perfmodel/sim/strategy.py`) plus one record in
RECORDS.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from perfmodel.errors import PerfmodelError

Family = Literal["ddp", "fsdp", "ps"]
Scheduling = Literal["gang", "sync", "async", "ssp"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyRecord:
    name: str                   # what users type: --strategy NAME
    family: Family              # the torch run that measures it (measure/runs/<family>.py)
    synchronous: bool           # every update averages one step of every worker: no staleness
    scheduling: Scheduling      # what a failure does (perfmodel/goodput.py): gang restart,
    #                             synchronous PS, asynchronous PS or bounded staleness
    ps_mode: str | None         # measure/runs/ps.py's --mode; None outside the PS family
    color: str                  # its colour in every figure (matplotlib name)
    simulator: str              # "module:Class" implementing perfmodel.sim.strategy.Strategy
    # (label, options) of each variant recommend weighs, simplest first (a tie goes to it)
    candidates: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=())

    def simulator_class(self) -> type:
        module, _, cls = self.simulator.partition(":")
        return getattr(importlib.import_module(module), cls)

    def option_names(self) -> frozenset[str]:
        """The strategy options (fields of its simulator's Options) it takes."""
        return frozenset(f.name for f in dataclasses.fields(self.simulator_class().Options))

    @property
    def is_ps(self) -> bool:
        return self.family == "ps"


RECORDS: tuple[StrategyRecord, ...] = (
    StrategyRecord(name="ddp", family="ddp", synchronous=True, scheduling="gang", ps_mode=None,
                   color="tab:blue", simulator="perfmodel.sim.ddp:DDP",
                   candidates=(("ddp", {}),)),
    StrategyRecord(name="fsdp", family="fsdp", synchronous=True, scheduling="gang",
                   ps_mode=None, color="tab:orange", simulator="perfmodel.sim.fsdp:FSDP",
                   candidates=(("fsdp", {}), ("fsdp grad-op", {"variant": "grad-op"}))),
    StrategyRecord(name="sync-ps", family="ps", synchronous=True, scheduling="sync",
                   ps_mode="sync", color="tab:green", simulator="perfmodel.sim.ps:SyncPS",
                   candidates=(("sync-ps", {}),)),
    StrategyRecord(name="async-ps", family="ps", synchronous=False, scheduling="async",
                   ps_mode="async", color="tab:red", simulator="perfmodel.sim.ps:AsyncPS",
                   candidates=(("async-ps", {}),
                               ("async-ps staleness-aware", {"staleness_aware_lr": True}),
                               ("async-ps dc", {"delay_compensation": True}))),
    StrategyRecord(name="ssp-ps", family="ps", synchronous=False, scheduling="ssp",
                   ps_mode="ssp", color="tab:purple", simulator="perfmodel.sim.ps:SSPPS",
                   candidates=(("ssp-ps", {}),)),
)

# name -> record, in RECORDS' order (the order tables and figures list strategies in).
REGISTRY: dict[str, StrategyRecord] = {r.name: r for r in RECORDS}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> StrategyRecord:
    """The record of `name`; an unknown name is a one-line error listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise PerfmodelError(f"unknown strategy '{name}'; choose from: "
                             f"{', '.join(REGISTRY)}") from None


def all_option_names() -> tuple[str, ...]:
    """Every strategy option any strategy takes, in first-seen order."""
    seen: dict[str, None] = {}
    for record in REGISTRY.values():
        for f in dataclasses.fields(record.simulator_class().Options):
            seen.setdefault(f.name, None)
    return tuple(seen)
