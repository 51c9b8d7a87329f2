"""One progress bar on stderr over several runs (`perfmodel calibrate`, `perfmodel compare`):
each run advances it by its steps; where no bar is drawn (stderr is no terminal, or --json),
a line per finished run instead, unless told to be silent."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click


class RunsProgress:
    def __init__(self, total: int, *, command: str, label: str, bar: bool, lines: bool,
                 announce: bool = False):
        """`bar`: draw a bar; `lines`: else print a line per run (and, with `announce`, one
        as each run starts)."""
        self.total, self.command, self.label = max(total, 1), command, label
        self.want_bar, self.lines, self.announce = bar, lines, announce
        self.bar, self.offset, self.shown, self.size = None, 0, 0, 0

    def __enter__(self) -> RunsProgress:
        if self.want_bar:
            self.bar = click.progressbar(length=self.total, label=self.label, file=sys.stderr,
                                         show_pos=True)
            self.bar.__enter__()
        return self

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

    def finish(self, line: str) -> None:
        self.offset += self.size
        self.update(self.size)
        if self.bar is None and self.lines:
            click.echo(f"{self.command}: {'  ' if self.announce else ''}{line}", err=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
