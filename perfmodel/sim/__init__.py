"""The SimPy discrete-event model: one module per strategy behind `Strategy` (strategy.py)."""

from __future__ import annotations

import sys


def _import_simpy() -> None:
    """Import simpy without importlib.metadata.

    simpy/__init__.py sets `__version__` from importlib.metadata.version("simpy"), and
    importing importlib.metadata (email, zipfile, csv, socket...) costs 25-35 ms of CPU: ~10 %
    of a 16-worker `perfmodel predict`, which nothing else on its path needs. So simpy is
    imported once here, before any strategy module, with a stand-in importlib.metadata that
    reports the package as not installed (simpy then leaves `__version__` unset; nothing here
    reads it), and the stand-in is taken away at once, so a later `import importlib.metadata`
    anywhere gets the real module. Where importlib.metadata is already loaded (tests,
    calibration) simpy is imported as usual.
    """
    if "simpy" in sys.modules or "importlib.metadata" in sys.modules:
        return
    import importlib
    import types

    class PackageNotFoundError(Exception):
        pass

    def version(name: str) -> str:
        raise PackageNotFoundError(name)

    stand_in = types.ModuleType("importlib.metadata")
    stand_in.PackageNotFoundError, stand_in.version = PackageNotFoundError, version
    sys.modules["importlib.metadata"] = stand_in
    importlib.metadata = stand_in
    try:
        import simpy  # noqa: F401
    finally:
        if sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
        if getattr(importlib, "metadata", None) is stand_in:
            del importlib.metadata


_import_simpy()
