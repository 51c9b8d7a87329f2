"""Reading TOML data files into plain dicts with errors that name the file and the field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from perfmodel.errors import PerfmodelError


def load_toml(path: Path) -> dict[str, Any]:
    """Parse `path`, turning a missing, unreadable or malformed file into a PerfmodelError."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise PerfmodelError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PerfmodelError(f"{path}: cannot read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise PerfmodelError(f"{path}: malformed TOML ({e}); fix or delete the file") from None


class Fields:
    """Typed access to one TOML table; every error names the file and the dotted key."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def _where(self, key: str) -> str:
        return f"{self.path}: field '{self.prefix}{key}'"

    def table(self, key: str) -> Fields:
        value = self.data.get(key)
        if not isinstance(value, dict):
            raise PerfmodelError(f"{self._where(key)} is missing or not a table")
        return Fields(value, self.path, f"{self.prefix}{key}.")

    def has(self, key: str) -> bool:
        return key in self.data

    def str(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value:
            raise PerfmodelError(f"{self._where(key)} is missing or not a non-empty string")
        return value

    def number(self, key: str, default: float | None = None, *, minimum: float = 0.0,
               positive: bool = False) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PerfmodelError(f"{self._where(key)} is missing or not a number")
        if value < minimum or (positive and value <= 0):
            bound = "> 0" if positive else f">= {minimum:g}"
            raise PerfmodelError(f"{self._where(key)} = {value!r} is not {bound}")
        return float(value)

    def integer(self, key: str, default: int | None = None, *, minimum: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PerfmodelError(f"{self._where(key)} must be an integer >= {minimum}")
        return value

    def str_list(self, key: str, default: list[str] | None = None) -> tuple[str, ...]:
        value = self.data.get(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PerfmodelError(f"{self._where(key)} must be a list of strings")
        return tuple(value)

    def curve(self, key: str) -> tuple[tuple[float, float], ...]:
        """A table of [x, y] points with x strictly increasing and y in (0, 1]."""
        value = self.data.get(key)
        ok = isinstance(value, list) and len(value) >= 1 and all(
            isinstance(p, list) and len(p) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
            for p in value
        )
        if not ok:
            raise PerfmodelError(f"{self._where(key)} must be a list of [size, fraction] pairs")
        xs = [float(p[0]) for p in value]
        ys = [float(p[1]) for p in value]
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)) or xs[0] <= 0:
            raise PerfmodelError(f"{self._where(key)}: sizes must be positive and increasing")
        if any(not 0 < y <= 1 for y in ys):
            raise PerfmodelError(f"{self._where(key)}: fractions must lie in (0, 1]")
        return tuple(zip(xs, ys, strict=True))
