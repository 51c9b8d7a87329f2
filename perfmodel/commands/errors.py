"""How a measuring command ends after a stored run that did not succeed.

Errors themselves take one path: every PerfmodelError becomes one line and its exit code in
`perfmodel.cli.LazyGroup.invoke` (2 for bad input, 1 for a run that failed).
"""

from __future__ import annotations

import click

from measure.session import StoredRun
from perfmodel.errors import RunFailedError


def check_run(stored: StoredRun) -> None:
    """Stop after a stored run that was interrupted (exit 130) or failed (exit 1)."""
    if stored.interrupted:
        raise click.Abort()
    if not stored.ok:
        raise RunFailedError(f"run {stored.run_id} failed: {stored.reason}")
