"""How a measuring command ends when something went wrong, as `perfmodel.cli.main` does.

A PerfmodelError is one line `perfmodel: error: ...` and exit code 2 (bad input); a run that
happened and failed (measure.session.RunFailedError) the same line and exit code 1; an
interrupted run (stored first) exits as click's Abort does. The decorator gives commands
run through click directly (tests, `CliRunner`) the same ending as `perfmodel.cli.main`.
"""

from __future__ import annotations

import functools

import click

from measure.session import RunFailedError, StoredRun
from perfmodel.errors import PerfmodelError


class OneLineError(click.ClickException):
    """A PerfmodelError shown as `perfmodel: error: ...`, exit code 2, as perfmodel.cli does."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"perfmodel: error: {self.message}", err=True)


class FailedRunError(OneLineError):
    """The run happened and failed: exit code 1, not a usage error."""

    exit_code = 1


def one_line_errors(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except RunFailedError as e:
            raise FailedRunError(str(e)) from e
        except PerfmodelError as e:
            raise OneLineError(str(e)) from e
    return wrapper


def check_run(stored: StoredRun) -> None:
    """Stop after a stored run that was interrupted (exit 130) or failed (exit 1)."""
    if stored.interrupted:
        raise click.Abort()
    if not stored.ok:
        raise RunFailedError(f"run {stored.run_id} failed: {stored.reason}")
