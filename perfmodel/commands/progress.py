"""The one progress bar of the CLI, on stderr, over one run or a series of runs.

It is the `Progress` callback of measure/session.py: `perfmodel measure` (one run),
`perfmodel calibrate` (calibration/driver.py) and `perfmodel compare` hand it to the library,
which says how many progress records all runs take (`begin`), when each run starts and ends;
each run advances the bar by its own records. Where no bar is drawn (stderr is no terminal,
or --json), a line per finished run instead, unless told to be silent. For a loop that is no
series of runs (a sweep), `begin(total)` then `advance()` per item.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click


class RunsProgress:
    def __init__(self, *, command: str, label: str, bar: bool, lines: bool,
                 announce: bool = False, total: int | None = None):
        """`bar`: draw a bar; `lines`: else print a line per run (and, with `announce`, one
        as each run starts). `total`: progress records of all runs, if known now."""
        self.command, self.label = command, label
        self.want_bar, self.lines, self.announce = bar, lines, announce
        self.bar, self.offset, self.shown, self.size = None, 0, 0, 0
        self.total = None if total is None else max(total, 1)

    def __enter__(self) -> RunsProgress:
        if self.total is not None:
            self._draw()
        return self

    def begin(self, total: int) -> None:
        """All runs to come take `total` progress records."""
        self.total = max(total, 1)
        if self.bar is None:
            self._draw()

    def _draw(self) -> None:
        if self.want_bar:
            self.bar = click.progressbar(length=self.total, label=self.label, file=sys.stderr,
                                         show_pos=True)
            self.bar.__enter__()

    def start(self, label: str, size: int) -> Callable[[int], None]:
        """A run of `size` steps starts; returns its step callback."""
        self.size = size
        if self.bar is not None:
            self.bar.label = label
            self.bar.render_progress()
        elif self.lines and self.announce:
            click.echo(f"{self.command}: {label} ...", err=True)
        return self.update

    def update(self, done: int) -> None:
        target = self.offset + min(done, self.size)
        if self.bar is not None and target > self.shown:
            self.bar.update(target - self.shown)
            self.shown = target

    def advance(self, steps: int = 1) -> None:
        """Move the bar on by `steps` (a loop of items that are no runs)."""
        self.size = self.size + steps
        self.update(self.size)

    def finish(self, line: str) -> None:
        self.update(self.size)          # the run's share in full, then the next run's starts
        self.offset += self.size
        self.size = 0
        if self.bar is None and self.lines:
            click.echo(f"{self.command}: {'  ' if self.announce else ''}{line}", err=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
