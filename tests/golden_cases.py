"""The golden prediction set: every strategy x {1, 8, 64} workers x every shipped cluster x
every workload with default options, plus one sweep and one recommend, run through the CLI
in-process. `python -m tests.golden_cases` rewrites tests/golden/; test_golden.py diffs.

Host timings (the simulation's wall time and event rate) are removed: they are the machine's,
not the model's. A refused configuration (out of memory) is recorded as its exit code and
its one-line message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

GOLDEN = Path(__file__).parent / "golden"
STRATEGIES = ["ddp", "fsdp", "sync-ps", "async-ps", "ssp-ps"]
WORKERS = [1, 8, 64]
CLUSTERS = ["a100", "a10g", "local"]
WORKLOADS = ["bert-large", "cnn-small", "gpt2-xl", "mlp", "resnet50", "transformer-small"]
HOST_KEYS = {"wall_s", "events_per_s"}


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in HOST_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def run(args: list[str]) -> dict:
    from perfmodel.cli import cli

    result = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=True)
    if result.exception is None:
        return {"exit": 0, "json": _strip(json.loads(result.stdout))}
    return {"exit": 2, "error": str(result.exception)}


def predict_cases() -> dict[str, list[str]]:
    cases = {}
    for cluster in CLUSTERS:
        for workload in WORKLOADS:
            for strategy in STRATEGIES:
                for n in WORKERS:
                    key = f"predict-{cluster}-{workload}-{strategy}-{n}"
                    cases[key] = ["predict", "--strategy", strategy, "--workers", str(n),
                                  "--cluster", cluster, "--workload", workload, "--json"]
    return cases


OTHER_CASES = {
    "sweep-a100-resnet50": ["sweep", "--strategies", "ddp,fsdp,sync-ps,async-ps,ssp-ps",
                            "--workers", "1,8,64", "--json", "--out", "{tmp}"],
    "recommend-a100-resnet50-16": ["recommend", "--workers", "16", "--json"],
    "recommend-straggler-4": ["recommend", "--workers", "4", "--stragglers", "1",
                              "--straggler-speed", "0.1", "--json"],
}


def all_cases(tmp: str) -> dict[str, list[str]]:
    cases = predict_cases()
    for key, args in OTHER_CASES.items():
        cases[key] = [a.replace("{tmp}", tmp) for a in args]
    return cases


def write(tmp: str) -> None:
    out = {key: run(args) for key, args in all_cases(tmp).items()}
    GOLDEN.mkdir(exist_ok=True)
    (GOLDEN / "predictions.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(out)} cases to {GOLDEN / 'predictions.json'}", file=sys.stderr)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write(d)
