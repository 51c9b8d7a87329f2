"""Read nccl-tests logs (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`,
`broadcast_perf`, `sendrecv_perf`) into the samples the network fit takes.

nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) is how GPU clusters are
characterised, so a user's existing logs calibrate a profile without running anything. A log
holds a header naming every rank and its host (`#  Rank  3 Group  0 Pid 123 on node-a device
3 [0x..] NVIDIA A100-SXM4-40GB`), the column header (`size count type redop root time algbw
busbw #wrong time algbw busbw #wrong`; older versions lack `root` and write a relative
`error` instead of `#wrong`) and one row per message size, out-of-place first. MPI launchers
may prefix every line (`[1,0]<stdout>:`).

What is read: ranks = the `Rank` lines (any `-g`/`-t`: one per GPU), nodes = the distinct
hosts among them, and per row the out-of-place time. A row whose `#wrong` is not 0 is refused
(the collective returned wrong data; its time means nothing). The collective is named by the
file name or a command line in the log (`all_reduce_perf ...`); failing that it is inferred
from busbw/algbw (2(n−1)/n all-reduce, (n−1)/n reduce-scatter or all-gather, told apart by the
reduction column, 1 broadcast).

`perfmodel measure collectives` prints the same layout with several collectives in one output,
each under a `# all-reduce` (etc.) heading after the shared Rank lines; `read_logs` splits
such a file into one log per collective.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from calibration.fit_network import CollectiveSample
from perfmodel.errors import PerfmodelError
from perfmodel.sim.collectives import busbw_factor

BINARIES = {"all_reduce_perf": "all-reduce", "all_gather_perf": "all-gather",
            "reduce_scatter_perf": "reduce-scatter", "broadcast_perf": "broadcast",
            "sendrecv_perf": "send-recv"}
_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S")
_SECTION = re.compile(r"^#\s*(" + "|".join(BINARIES.values()) + r")\s*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTestsLog:
    """One log: the collective, who ran it and its samples."""

    path: Path
    op: str
    ranks: int
    nodes: int
    device: str                 # as the Rank lines name it, e.g. "NVIDIA A100-SXM4-40GB"
    samples: tuple[CollectiveSample, ...]


def read_log(path: Path) -> NcclTestsLog:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise PerfmodelError(f"{path}: cannot read: {e.strerror}") from None
    return parse_log(text, Path(path))


def read_logs(path: Path) -> tuple[NcclTestsLog, ...]:
    """Every collective of one file: one log, or one per `# <op>` section."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise PerfmodelError(f"{path}: cannot read: {e.strerror}") from None
    return parse_logs(text, Path(path))


def parse_logs(text: str, path: Path) -> tuple[NcclTestsLog, ...]:
    lines = [_PREFIX.sub("", line) for line in text.splitlines()]
    starts = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _SECTION.match(line))]
    if not starts:
        return (parse_log(text, path),)
    logs = []
    ends = [i for i, _ in starts[1:]] + [len(lines)]
    for (start, op), end in zip(starts, ends, strict=True):
        # other sections' lines become blank, so error messages keep the file's line numbers
        kept = [line if i < starts[0][0] or start <= i < end else ""
                for i, line in enumerate(lines)]
        logs.append(parse_log("\n".join(kept), path, op=op))
    return tuple(logs)


def parse_log(text: str, path: Path, op: str | None = None) -> NcclTestsLog:
    lines = [_PREFIX.sub("", line.rstrip("\n")) for line in text.splitlines()]
    hosts: dict[int, str] = {}
    devices: set[str] = set()
    columns: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(lines, start=1):
        if m := _RANK.match(line):
            hosts[int(m.group(1))] = m.group(2)
            devices.add(line.split("]", 1)[-1].strip() if "]" in line else "")
        elif line.startswith("#") and "size" in line.split() and "time" in line.split():
            columns = line.lstrip("#").split()
        elif columns is not None and _ROW.match(line):
            values = line.split()
            if len(values) < len(columns):
                raise PerfmodelError(f"{path}:{number}: a row with {len(values)} columns "
                                     f"where the header has {len(columns)}: {line.strip()!r}")
            row: dict[str, str] = {}
            for name, value in zip(columns, values, strict=False):
                row.setdefault(name, value)      # the first time, algbw, ...: out-of-place
            rows.append((number, row))
    if not hosts:
        raise PerfmodelError(f"{path}: no '#  Rank N ... on HOST device' lines: not an "
                             "nccl-tests log, or its header was cut")
    if columns is None or not rows:
        raise PerfmodelError(f"{path}: no result rows under a 'size count type ... time' "
                             "header")
    ranks, nodes = len(hosts), len(set(hosts.values()))
    op = op or _op(text, path, rows, ranks)
    samples = tuple(_sample(path, number, row, op, ranks, nodes) for number, row in rows)
    return NcclTestsLog(path=path, op=op, ranks=ranks, nodes=nodes,
                        device=", ".join(sorted(d for d in devices if d)), samples=samples)


def _sample(path: Path, number: int, row: dict[str, str], op: str, ranks: int,
            nodes: int) -> CollectiveSample:
    wrong = row.get("#wrong")
    if wrong is not None and wrong not in ("0", "N/A"):
        raise PerfmodelError(f"{path}:{number}: #wrong = {wrong}: the collective returned "
                             "wrong data, so its time is not a measurement; rerun nccl-tests")
    try:
        size, time_us = float(row["size"]), float(row["time"])
    except (KeyError, ValueError):
        raise PerfmodelError(f"{path}:{number}: size {row.get('size')!r} or time "
                             f"{row.get('time')!r} is not a number") from None
    if not (size >= 0 and time_us > 0):
        raise PerfmodelError(f"{path}:{number}: size {size:g} B and time {time_us:g} us must "
                             "be >= 0 and > 0")
    return CollectiveSample(op=op, ranks=ranks, bytes=size, time_s=time_us * 1e-6,
                            nodes=nodes)


def _op(text: str, path: Path, rows, ranks: int) -> str:
    named = {op for binary, op in BINARIES.items() if binary in path.name or binary in text}
    if len(named) == 1:
        return named.pop()
    ratios = []
    for _, row in rows:
        try:
            algbw, busbw = float(row["algbw"]), float(row["busbw"])
        except (KeyError, ValueError):
            continue
        if algbw >= 0.1:                    # two decimals: small rows say nothing
            ratios.append(busbw / algbw)
    if not ratios:
        raise PerfmodelError(f"{path}: cannot tell which collective it holds; name the file "
                             f"after the binary (e.g. all_reduce_perf.log)")
    ratio = sorted(ratios)[len(ratios) // 2]
    reduces = rows[0][1].get("redop", "sum") != "none"
    candidates = ["all-reduce", "reduce-scatter" if reduces else "all-gather", "broadcast"]
    best = min(candidates, key=lambda op: abs(busbw_factor(op, ranks) - ratio))
    if abs(busbw_factor(best, ranks) - ratio) > 0.05 * busbw_factor(best, ranks):
        raise PerfmodelError(f"{path}: busbw/algbw = {ratio:.3f} fits no collective on "
                             f"{ranks} ranks; name the file after the binary")
    return best
