"""Click options of the measurement protocol for a shared machine (measure/protocol.py),
shared by `perfmodel measure`, `perfmodel calibrate` and `perfmodel compare`."""

from __future__ import annotations

import click

from perfmodel.commands.options import Finite


def protocol_options(f):
    """--settle-load, --settle-max-s, --no-pin."""
    for opt in reversed([
        click.option("--settle-load", type=Finite(0), default=0.5, show_default=True,
                     metavar="PER_CORE",
                     help="Before each run wait until the 1-minute load average is below "
                          "PER_CORE x cores (0.5 on 2 cores: load < 1), so other work and "
                          "the previous run's tail are gone; recorded with the run."),
        click.option("--settle-max-s", type=Finite(0), default=30, show_default=True,
                     envvar="PERFMODEL_SETTLE_MAX_S", show_envvar=True,
                     help="...but wait at most this many seconds per run (0: do not wait; a "
                          "quick CI run). The load decays with a 60 s time constant, so a "
                          "quiet machine settles within about a minute of the last run."),
        click.option("--no-pin", "no_pin", is_flag=True,
                     help="Do not pin ranks to cores. By default, when there are at least as "
                          "many cores as busy processes, rank i runs on its own core(s) "
                          "(os.sched_setaffinity); whether a run was pinned is recorded."),
    ]):
        f = opt(f)
    return f


def make_protocol(settle_load: float, settle_max_s: float, no_pin: bool):
    """The measure.protocol.RunProtocol these options describe."""
    from measure.protocol import RunProtocol, Settle

    settle = (Settle(max_load_per_core=settle_load, max_wait_s=settle_max_s)
              if settle_max_s > 0 else None)
    return RunProtocol(settle=settle, pin=not no_pin)
