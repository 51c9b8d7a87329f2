"""`perfmodel clusters`: the available cluster profiles."""

from __future__ import annotations

import json

import click

from perfmodel.cluster import load_cluster, profile_paths
from perfmodel.errors import PerfmodelError


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(as_json: bool) -> None:
    """List the cluster profiles: device, node, links and provenance.

    A profile with source "spec" comes from datasheets (citations inside the file);
    "measured" ones are written by `perfmodel calibrate`.

    \b
    Example:
      perfmodel clusters
    """
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
