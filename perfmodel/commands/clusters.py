"""`perfmodel clusters`: the available cluster profiles; `clusters add`: a spec-derived one."""

from __future__ import annotations

import json

import click

from perfmodel.cluster import load_cluster, profile_paths
from perfmodel.commands.options import Finite
from perfmodel.errors import PerfmodelError


@click.group("clusters", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def command(ctx, as_json: bool) -> None:
    """List the cluster profiles: device, node, links and provenance.

    A profile with source "spec" comes from datasheets (citations inside the file);
    "measured" ones are written by `perfmodel calibrate`; `perfmodel clusters add` makes a
    spec-derived one of any listed GPU on the node and network you state.

    \b
    Examples:
      perfmodel clusters
      perfmodel clusters add mycluster --gpu a100-80gb --gpus-per-node 8 --nic-Gbps 400
    """
    if ctx.invoked_subcommand is not None:
        return
    rows, broken = [], []
    for name, path in profile_paths().items():
        try:
            c = load_cluster(name)
        except PerfmodelError as e:         # one broken file hides no other profile
            broken.append({"name": name, "path": str(path), "error": str(e)})
            continue
        rows.append({
            "name": c.name, "description": c.description, "source": c.provenance.source,
            "device": c.device.name, "memory_GiB": c.device.memory_GiB,
            "devices_per_node": c.devices_per_node,
            "intra_node_GBps": c.intra_node.bandwidth_GBps,
            "inter_node_GBps": c.inter_node.bandwidth_GBps, "path": str(path),
        })
    for b in broken:
        click.echo(f"perfmodel: warning: profile '{b['name']}' skipped: {b['error']}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'name':<8} {'source':<9} {'device':<24} {'GiB':>5} {'per node':>8} "
               f"{'intra GB/s':>10} {'inter GB/s':>10}")
    for r in rows:
        click.echo(f"{r['name']:<8} {r['source']:<9} {r['device']:<24} {r['memory_GiB']:>5.0f} "
                   f"{r['devices_per_node']:>8} {r['intra_node_GBps']:>10.1f} "
                   f"{r['inter_node_GBps']:>10.1f}")
    click.echo("")
    for r in rows:
        click.echo(f"{r['name']}: {r['description']} ({r['path']})")


@command.command("add")
@click.argument("name")
@click.option("--gpu", required=True, help="The GPU: a shipped GPU profile's name (a100, "
              "a100-80gb, a10g, a10g-8, h100, h200); its device and compute are copied.")
@click.option("--gpus-per-node", type=click.IntRange(1), required=True, help="GPUs per node.")
@click.option("--nic-Gbps", "nic_Gbps", type=Finite(0, min_open=True), required=True,
              help="Network between nodes, Gbit/s per node each way (all NICs together).")
@click.option("--intra-GBps", "intra_GBps", type=Finite(0, min_open=True),
              default=None, help="Per-GPU link inside a node, GB/s each way [the GPU's "
              "profile's: NVLink or PCIe].")
@click.option("--intra-latency-us", type=Finite(0, min_open=True), default=None,
              help="Per-step latency inside a node [the GPU's profile's].")
@click.option("--inter-latency-us", type=Finite(0, min_open=True), default=None,
              help="Per-step latency between nodes [the GPU's profile's].")
@click.option("--description", default=None, help="One line saying what the cluster is.")
@click.option("--force", is_flag=True, help="Replace a profile of that name you added before.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def add(name, gpu, gpus_per_node, nic_Gbps, intra_GBps, intra_latency_us, inter_latency_us,
        description, force, as_json):
    """Write a spec-derived profile of a listed GPU on the node and network you state.

    Device, compute and link shapes come from the GPU's shipped profile (not repeated in
    code); your numbers replace the node size and links; the new profile's citations say
    where each number comes from. Written to your profile folder ($PERFMODEL_PROFILES), where
    --cluster NAME finds it. Later, `perfmodel calibrate --cluster NAME --from-nccl-tests
    LOG...` replaces the links with measured ones.

    \b
    Examples:
      perfmodel clusters add mycluster --gpu a100-80gb --gpus-per-node 8 --nic-Gbps 400
      perfmodel clusters add pcie-box --gpu a10g --gpus-per-node 4 --nic-Gbps 25 \\
          --intra-GBps 16
      perfmodel predict --cluster mycluster --workload gpt2-xl --strategy fsdp --workers 32
    """
    from calibration.profile_writer import write_profile
    from perfmodel.cluster import user_profile_dir
    from perfmodel.cluster_spec import NodeSpec, spec_profile

    data = spec_profile(name, gpu, NodeSpec(
        gpus_per_node=gpus_per_node, nic_Gbps=nic_Gbps, intra_GBps=intra_GBps,
        intra_latency_us=intra_latency_us, inter_latency_us=inter_latency_us,
        description=description))
    existing = profile_paths().get(name)
    if existing is not None and not (force and existing.parent == user_profile_dir()):
        raise PerfmodelError(f"a profile '{name}' exists ({existing}); choose another name"
                             + ("" if existing.parent != user_profile_dir()
                                else " or pass --force to replace it"))
    written = write_profile(data, header=f"Spec-derived profile written by perfmodel clusters "
                                         f"add from the shipped '{gpu}' profile.")
    c = load_cluster(name)
    out = {"name": name, "path": str(written.path), "gpu": c.device.name,
           "devices_per_node": c.devices_per_node,
           "intra_node_GBps": c.intra_node.bandwidth_GBps,
           "inter_node_GBps": c.inter_node.bandwidth_GBps,
           "citations": list(c.provenance.citations)}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"wrote profile '{name}': {written.path}\n"
               f"  {c.devices_per_node}x {c.device.name} per node; inside a node "
               f"{c.intra_node.bandwidth_GBps:g} GB/s per GPU, between nodes "
               f"{c.inter_node.bandwidth_GBps:g} GB/s per node\n"
               f"  where each number comes from:")
    for line in out["citations"]:
        click.echo(f"    - {line}")
    click.echo(f"  use it: perfmodel predict --cluster {name} --workload resnet50 "
               f"--strategy ddp --workers {2 * c.devices_per_node}")
