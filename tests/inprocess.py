"""Run `perfmodel ARGS` in this process through the real entry point (`perfmodel.cli.main`),
so the error path is the user's: (exit code, stdout, stderr)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys

from perfmodel.cli import main


def run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`perfmodel ARGS` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_env = sys.argv, dict(os.environ)
    sys.argv = ["perfmodel", *args]
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old_argv
        os.environ.clear()
        os.environ.update(old_env)
    return code, out.getvalue(), err.getvalue()


def as_in_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a test suite started as a background job (`cmd &`
    in a non-interactive shell) runs with SIGINT ignored, which its children inherit, and
    Python then never raises KeyboardInterrupt (seen 2026-12-04: both Ctrl-C tests hung
    under `nohup bash .ci/run &` and passed in the foreground)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
