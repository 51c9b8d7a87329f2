"""TOML data files: reading them into plain dicts with errors that name the file and the field,
and the one TOML writer (`to_toml`: profiles, the held-out report's profile, any data file)."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from perfmodel.errors import PerfmodelError

# No quantity in a profile or workload comes near this (bytes of a message, FLOPs per sample
# are < 1e13); a larger number is a typo that would overflow to infinity downstream.
MAX_NUMBER = 1e15
# A rate or size that must be positive and is below this divides something into infinity.
MIN_POSITIVE = 1e-9

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


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
               positive: bool = False, maximum: float | None = None) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PerfmodelError(f"{self._where(key)} is missing or not a number")
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise PerfmodelError(f"{self._where(key)} = {value!r} is not a finite number "
                                 f"of at most {MAX_NUMBER:g}")
        if value < minimum or (positive and value < MIN_POSITIVE):
            bound = f">= {MIN_POSITIVE:g}" if positive else f">= {minimum:g}"
            raise PerfmodelError(f"{self._where(key)} = {value!r} is not {bound}")
        if maximum is not None and value > maximum:
            raise PerfmodelError(f"{self._where(key)} = {value!r} is not <= {maximum:g}")
        return float(value)

    def integer(self, key: str, default: int | None = None, *, minimum: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
                or value > MAX_NUMBER:
            raise PerfmodelError(f"{self._where(key)} must be an integer in [{minimum}, "
                                 f"{MAX_NUMBER:g}]")
        return value

    def str_list(self, key: str, default: list[str] | None = None) -> tuple[str, ...]:
        value = self.data.get(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PerfmodelError(f"{self._where(key)} must be a list of strings")
        return tuple(value)

    def curve(self, key: str, allow_zero: bool = False) -> tuple[tuple[float, float], ...]:
        """A table of [x, y] points with x strictly increasing and y in (0, 1] ([0, 1] with
        `allow_zero`)."""
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
        if not all(math.isfinite(v) and abs(v) <= MAX_NUMBER for v in xs + ys):
            raise PerfmodelError(f"{self._where(key)}: every value must be a finite number")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)) or xs[0] <= 0:
            raise PerfmodelError(f"{self._where(key)}: sizes must be positive and increasing")
        if any(not (y >= 0 if allow_zero else y > 0) or y > 1 for y in ys):
            raise PerfmodelError(f"{self._where(key)}: fractions must lie in "
                                 f"{'[0, 1]' if allow_zero else '(0, 1]'}")
        return tuple(zip(xs, ys, strict=True))


# ---------------------------------------------------------------- writing

def to_toml(data: dict[str, Any], header: str = "") -> str:
    """TOML text for nested dicts of str, int, float, bool and lists of those (or of lists),
    `header` as comment lines first. A float that is not finite is refused, never written."""
    lines = [f"# {line}" for line in header.splitlines()]
    _emit_table(data, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _emit_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines += ["", "[" + ".".join(_key(p) for p in path) + "]"]
    for key, value in scalars.items():
        where = ".".join(path + [key])
        if isinstance(value, (list, tuple)) and len(value) > 2 and \
                all(isinstance(v, (list, tuple, str)) for v in value):
            # a curve or a list of notes: one item per line
            lines.append(f"{_key(key)} = [")
            lines += [f"  {toml_value(v, where)}," for v in value]
            lines.append("]")
        else:
            lines.append(f"{_key(key)} = {toml_value(value, where)}")
    for key, sub in tables.items():
        _emit_table(sub, path + [key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def toml_value(value: Any, where: str = "value") -> str:
    """One TOML value; `where` names it in the error for a value TOML cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PerfmodelError(f"field '{where}' = {value!r} is not a finite number; "
                                 f"the fit that produced it failed")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v, where) for v in value) + "]"
    raise PerfmodelError(f"field '{where}' has a value of type {type(value).__name__} "
                         f"that TOML cannot hold")


def _string(s: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
               "\r": "\\r"}
    out = []
    for ch in s:
        if ch in escapes:
            out.append(escapes[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
