"""The house's layers point one way, and no module imports itself round a circle.

    core         perfmodel/* (simulation, scenario, clusters, workloads, memory, intervals,
                 predict, sweep, goodput, recommend, accuracy): imports only itself
    measure      measure/*: the core and torch
    calibration  calibration/*: the core and measure
    validation   perfmodel/compare/*, perfmodel/findings/*: core, measure, calibration
    cli          perfmodel/cli.py, perfmodel/__main__.py, perfmodel/commands/*: anything

Every import counts, at module top or inside a function (a lazy import is still an arrow).
docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("perfmodel", "measure", "calibration")
ALLOWED = {
    "core": {"core"},
    "measure": {"core", "measure"},
    "calibration": {"core", "measure", "calibration"},
    "validation": {"core", "measure", "calibration", "validation"},
    "cli": {"core", "measure", "calibration", "validation", "cli"},
}
TORCH_ALLOWED = {"measure", "calibration"}


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("measure", "calibration"):
        return parts[0]
    if parts[0] != "perfmodel":
        return None
    if len(parts) > 1 and parts[1] in ("cli", "__main__", "commands"):
        return "cli"
    if len(parts) > 1 and parts[1] in ("compare", "findings"):
        return "validation"
    return "core"


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules `name` imports (resolved against `known`), plus 'torch' if it imports torch."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] == "torch":
                out.add("torch")
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


MODULES = modules()
GRAPH = {name: imports(name, path, set(MODULES)) for name, path in MODULES.items()}


def test_the_walk_sees_the_whole_house():
    assert {"perfmodel.predict", "perfmodel.sim.ps", "measure.store", "calibration.fit",
            "perfmodel.compare.protocol", "perfmodel.commands.predict"} <= set(MODULES)
    assert "perfmodel.sim.scenario" in GRAPH["perfmodel.predict"]
    assert {layer(m) for m in MODULES} == set(ALLOWED)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down_the_layers(name):
    mine = layer(name)
    wrong = sorted(t for t in GRAPH[name] - {"torch"} if layer(t) not in ALLOWED[mine])
    assert not wrong, f"{name} ({mine}) imports {', '.join(wrong)} against the layers"
    if "torch" in GRAPH[name]:
        assert mine in TORCH_ALLOWED, f"{name} ({mine}) imports torch"


def test_no_import_cycles():
    """Depth-first search over module imports (lazy ones included); any back edge is a cycle."""
    state: dict[str, int] = {}          # 1 = on the current path, 2 = done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node] - {"torch"}):
            if nxt not in GRAPH:
                continue
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(GRAPH):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_a_wrong_arrow_is_caught(tmp_path):
    """The walk finds an upward import (the test can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from calibration.fit import fit\n    import torch\n")
    found = imports("perfmodel.bad", bad, set(MODULES))
    assert "calibration.fit" in found and "torch" in found
    assert layer("calibration.fit") not in ALLOWED[layer("perfmodel.bad")]
