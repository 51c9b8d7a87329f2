"""The `perfmodel` command: one click group; each subcommand is thin and lives in commands/."""

from __future__ import annotations

import importlib
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
        return module.command

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
