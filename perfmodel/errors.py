"""The exceptions users see: the message is printed as one line, `perfmodel: error: ...`.

The CLI turns every PerfmodelError into that line and its `exit_code` in one place
(`perfmodel.cli.LazyGroup.invoke`), whichever command raised it.
"""


class PerfmodelError(Exception):
    """Bad input or a broken data file, explained in one sentence a user understands."""

    exit_code = 2


class RunFailedError(PerfmodelError):
    """A real run happened and failed (stored, with its reason): exit code 1, not 2."""

    exit_code = 1
