"""The one exception users see: its message is printed as a single line, exit code 2."""


class PerfmodelError(Exception):
    """Bad input or a broken data file, explained in one sentence a user understands."""
