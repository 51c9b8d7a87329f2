"""The `perfmodel` command: one click group; each subcommand is thin and lives in commands/."""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys

import click

from perfmodel.errors import PerfmodelError

# name -> module in perfmodel.commands defining a click command called `command`.
# Modules are imported only when their command runs, so `predict` never pays for the others.
COMMANDS = {
    "predict": "Predict throughput, step time, memory and staleness of one configuration.",
    "sweep": "Predict a grid of strategies x worker counts; write a table and a plot.",
    "clusters": "List the cluster profiles and where each comes from.",
    "workloads": "List the workloads and their size.",
    "measure": "Run real torch.distributed measurements and store them (needs torch).",
    "runs": "List stored measurement runs, or export them to CSV.",
    "compare": "Predict held-out configurations, measure them, and report the errors.",
    "validate": "Compare predictions with published GPU training throughput (--published).",
    "recommend": "Rank DDP, FSDP and the PS modes by predicted time to accuracy, and say why.",
    "calibrate": "Measure this machine or cluster and write a calibrated profile (needs torch).",
    "findings": "Reproduce the study's findings: report.md, figures and findings.csv.",
    "staleness": "Fit the accuracy cost of staleness on your own model (needs torch).",
    "gpu-check": "Measure this GPU, calibrate its compute, report predicted vs measured.",
}


class OneLineError(click.ClickException):
    """A PerfmodelError as the user sees it: `perfmodel: error: ...` and its exit code."""

    def __init__(self, error: PerfmodelError):
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.echo(f"perfmodel: error: {self.message}", err=True)


class LazyGroup(click.Group):
    # main() pauses Python's cyclic garbage collector while the command's modules import
    # (numpy, simpy, the model): they make no garbage worth collecting, and the collector's
    # scans of the growing heap cost ~5 % of a small prediction. On again once imported.
    gc_paused = False
    # Environment variables main() sets for the imports only (STARTUP_ENV), removed again
    # once the command is imported so that no child process inherits them.
    startup_env: tuple[str, ...] = ()

    def invoke(self, ctx):
        """Every command's errors end here: one line and the error's exit code."""
        try:
            return super().invoke(ctx)
        except PerfmodelError as e:
            raise OneLineError(e) from e

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"perfmodel.commands.{name.replace('-', '_')}")
        self.end_startup()
        return module.command

    def end_startup(self) -> None:
        """The command is imported: the collector back on, the startup variables gone."""
        if self.gc_paused:
            self.gc_paused = False
            gc.enable()
        for key in self.startup_env:
            os.environ.pop(key, None)
        self.startup_env = ()

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, help_ in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="perfmodel")
def cli():
    """Which distributed training strategy, and what will it cost?

    perfmodel predicts throughput, step-time breakdown, peak memory per GPU and gradient
    staleness of DDP, FSDP and parameter-server training on a cluster profile, from a SimPy
    discrete-event model calibrated on real measurements.

    \b
    Examples:
      perfmodel predict --strategy async-ps --workers 16
      perfmodel predict --strategy fsdp --workers 64 --workload gpt2-xl --cluster a100 --json
      perfmodel sweep --strategies ddp,fsdp --workers 1,8,64,512
    """


def main() -> None:
    """The `perfmodel` process: the command, and its errors as one line and an exit code.

    Python's garbage collector is paused while the command's modules import
    (LazyGroup.gc_paused) and, at exit, everything is frozen so that the interpreter's last
    collection has nothing to scan (~10 % of a small prediction's process time together);
    numpy's BLAS loads with one thread (STARTUP_ENV). None of it changes any output, and
    main() called in a process that goes on (the tests) leaves the collector and the
    environment as it found them."""
    if gc.isenabled():
        gc.disable()
        cli.gc_paused = True
    cli.startup_env = tuple(k for k in STARTUP_ENV if k not in os.environ)
    os.environ.update({k: STARTUP_ENV[k] for k in cli.startup_env})
    try:
        _run()
    finally:
        cli.end_startup()


# Set while the command's modules import, unless the user set them: numpy's OpenBLAS starts
# a thread per core when numpy loads, which spins waiting for work nothing on perfmodel's
# paths gives it (no matrix products): `import numpy` 194 -> 128 ms of CPU (medians of 15
# on this 2-core machine), a 16-worker predict ~10-20 ms. The loaded library keeps its one
# thread; the variable is removed again before the command runs (LazyGroup.end_startup).
STARTUP_ENV = {"OPENBLAS_NUM_THREADS": "1"}


# The last collection at exit would scan every object the command made: 20-40 ms after a
# small prediction, more after a large one. Frozen objects are skipped; memory goes anyway.
atexit.register(gc.freeze)


def _run() -> None:
    try:
        cli.main(standalone_mode=False)
    except PerfmodelError as e:           # raised before a command ran (LazyGroup.invoke)
        click.echo(f"perfmodel: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("perfmodel: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:     # bare `perfmodel`: the help, exit 0
        click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
        sys.exit(0)
    except click.UsageError as e:         # one line, as every other error: what and where
        where = e.ctx.command_path if e.ctx is not None else "perfmodel"
        click.echo(f"perfmodel: error: {e.format_message()} (see '{where} --help')", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"perfmodel: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("perfmodel: interrupted", err=True)
        sys.exit(130)
