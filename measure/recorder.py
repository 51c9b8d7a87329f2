"""Per-rank JSON-lines records: what a worker process measured, for the store to ingest.

Each rank appends to `<run_dir>/rank<R>.jsonl`; the launcher ingests every rank's file into
the SQLite store in one transaction after the job ends, so a crash leaves no half-run.
Record types and their fields are documented in measure/store.py (the schema).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Recorder:
    def __init__(self, run_dir: Path, rank: int):
        self.path = Path(run_dir) / f"rank{rank}.jsonl"
        self.rank = rank
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def write(self, type: str, **fields: Any) -> None:
        """Append one record {"type": type, "rank": rank, **fields} and flush it to disk."""
        self._file.write(json.dumps({"type": type, "rank": self.rank, **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of every rank in `run_dir`, rank files in rank order; a torn last line
    (a rank killed mid-write) is skipped."""
    records = []
    files = sorted(Path(run_dir).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
