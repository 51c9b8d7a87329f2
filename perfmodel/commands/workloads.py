"""`perfmodel workloads`: the available workloads; `workloads add`: a user's model as one."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from perfmodel.errors import PerfmodelError
from perfmodel.workload import load_workload, workload_paths, write_user_workload


@click.group("workloads", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def command(ctx, as_json: bool) -> None:
    """List the workloads: parameters, FLOPs per sample, precision and optimizer.

    Shipped workload files are generated from the PyTorch modules of measure/models.py by
    `python -m measure.make_workloads`; `perfmodel workloads add` makes one from your own
    nn.Module or a Hugging Face-style config.json, into your workload folder.

    \b
    Examples:
      perfmodel workloads
      perfmodel workloads add mynet --module mypkg.nets:make_net --input-shape 3,32,32
      perfmodel workloads add llama-7b --config llama-2-7b/config.json
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = []
    for name in workload_paths():
        w = load_workload(name)
        rows.append({
            "name": w.name, "params": w.params, "units": len(w.units),
            "forward_GFLOP_per_sample": w.forward_flops_per_sample / 1e9,
            "precision": w.precision, "optimizer": w.optimizer,
            "batch_size": w.batch_size, "description": w.description,
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'name':<18} {'params':>10} {'units':>5} {'GFLOP/sample':>12} "
               f"{'precision':<11} {'optimizer':<9} {'batch':>5}")
    for r in rows:
        click.echo(f"{r['name']:<18} {r['params'] / 1e6:>9.1f}M {r['units']:>5} "
                   f"{r['forward_GFLOP_per_sample']:>12.3f} {r['precision']:<11} "
                   f"{r['optimizer']:<9} {r['batch_size']:>5}")


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise PerfmodelError(f"--input-shape '{text}': whole numbers > 0 per sample, e.g. "
                             f"3,224,224")
    return shape


@command.command("add")
@click.argument("name")
@click.option("--module", "target", default=None, metavar="PKG.MOD:FACTORY",
              help="A callable returning your nn.Module (an nn.Sequential's children become "
                   "the units); importable from the current folder.")
@click.option("--config", "config", default=None, metavar="CONFIG.JSON",
              type=click.Path(dir_okay=False, path_type=Path),
              help="A Hugging Face-style config.json (llama, mistral, qwen2, gpt2, bert).")
@click.option("--input-shape", default=None, metavar="C,H,W",
              help="With --module: one sample's float input shape.")
@click.option("--seq-len", type=click.IntRange(1), default=None,
              help="Tokens per sample (--module: token ids in; --config: [its positions]).")
@click.option("--precision", default="bf16-mixed", show_default=True,
              type=click.Choice(["fp32", "bf16-mixed"]), help="Training precision.")
@click.option("--optimizer", default="adam", show_default=True,
              type=click.Choice(["sgd", "momentum", "adam"]), help="Optimizer.")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="Default per-worker batch of the workload.")
@click.option("--force", is_flag=True, help="Write over (or shadow) a workload of that name.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def add(name, target, config, input_shape, seq_len, precision, optimizer, batch_size, force,
        as_json):
    """Make a workload from your nn.Module or a config.json (on fake tensors: no weights,
    no GPU, no download) and write it to your workload folder ($PERFMODEL_WORKLOADS, default
    ~/.local/share/perfmodel/workloads); `--workload NAME` then finds it. Counted as the
    shipped workloads are (measure/make_workloads.py): units, parameters, FLOPs and bytes
    per op class, kernels, activation bytes. Needs torch.

    \b
    Examples:
      perfmodel workloads add mynet --module mypkg.nets:make_net --input-shape 3,32,32 \\
          --precision fp32 --batch-size 32
      perfmodel workloads add mylm --module mypkg.lm:build --seq-len 512
      perfmodel workloads add llama-7b --config llama-2-7b/config.json --seq-len 4096
      perfmodel predict --workload llama-7b --cluster h100 --strategy fsdp --workers 64
    """
    if (target is None) == (config is None):
        raise PerfmodelError("give one source: --module PKG.MOD:FACTORY or --config "
                             "CONFIG.JSON")
    try:
        from measure.make_workloads import workload_text
        from measure.user_models import config_spec, module_spec
    except ImportError as e:
        raise PerfmodelError(f"perfmodel workloads add counts FLOPs with torch, which is not "
                             f"importable here ({e}); install perfmodel's measure extra") from None
    common = {"precision": precision, "optimizer": optimizer, "batch_size": batch_size}
    if target is not None:
        spec = module_spec(name, target, input_shape=_shape(input_shape), seq_len=seq_len,
                           **common)
    else:
        if input_shape is not None:
            raise PerfmodelError("--input-shape goes with --module; a config.json takes "
                                 "token ids (--seq-len)")
        spec = config_spec(name, config, seq_len=seq_len, **common)
    command_line = "perfmodel workloads " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if sys.argv[1:2] == ["workloads"] else f"perfmodel workloads add {name}"
    path = write_user_workload(name, workload_text(spec, command_line), force=force)
    w = load_workload(name)
    out = {"name": w.name, "path": str(path), "params": w.params, "units": len(w.units),
           "forward_GFLOP_per_sample": w.forward_flops_per_sample / 1e9,
           "activation_MiB_per_sample": sum(u.activation_bytes_per_sample
                                            for u in w.units) / 2**20,
           "precision": w.precision, "optimizer": w.optimizer, "batch_size": w.batch_size,
           "description": w.description}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"wrote workload '{w.name}': {path}\n"
               f"  {w.description}\n"
               f"  {w.params:,} params in {len(w.units)} units; "
               f"{_num(out['forward_GFLOP_per_sample'])} GFLOP forward and "
               f"{_num(out['activation_MiB_per_sample'])} MiB saved activations per sample; "
               f"{w.precision}, {w.optimizer}, batch {w.batch_size}\n"
               f"  use it: perfmodel predict --workload {w.name} --cluster a100 "
               f"--strategy {'fsdp' if w.params > 1e9 else 'ddp'} --workers 8")


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"
