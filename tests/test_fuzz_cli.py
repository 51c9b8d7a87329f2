"""Fuzz: whatever a user types, perfmodel answers with exit 0 and valid output, or exit 2 and
one line on stderr. Never a traceback, never NaN in JSON, never unbounded work.

Hypothesis draws option values from hostile pools (NaN, ±inf, huge, tiny, negative, empty,
wrong type, binary) mixed with valid ones, for predict, sweep and recommend, and for the
numbers of cluster profile and workload files. The command runs in-process through the real
entry point (`perfmodel.cli.main`), so the error path is the user's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.inprocess import run_cli

HOSTILE = ["nan", "NaN", "inf", "-inf", "1e308", "1e-308", "-1", "0", "", "abc", "\x00\x01",
           "1,2", "9" * 40, "0x10", "1_000", " 3", "-0"]
NUMBERS = st.sampled_from(HOSTILE) | st.floats(allow_nan=True).map(repr) | st.integers().map(str)
WORKERS = st.sampled_from(["1", "3", "8", "0", "-5", "nan", "10000000", "1e3", "", "two"])
SPEEDS = st.sampled_from(["1,0.5", "1,nan", "1,inf", "1,1e-12", "1,-1", ",", "1", "a,b",
                          "0.25,1", "1e308,1"])
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])




def check(args: list[str]) -> tuple[int, str]:
    code, out, err = run_cli(args)
    assert code in (0, 2), f"{args}: exit {code}\n{err}"
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("perfmodel: error: "), (args, err)
        assert "Traceback" not in err
    elif "--json" in args:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{args}: {c} in JSON"))
    return code, out


PREDICT_OPTIONS = {
    "--workers": WORKERS, "--batch-size": NUMBERS, "--steps": NUMBERS, "--seed": NUMBERS,
    "--speed": SPEEDS, "--straggler-speed": NUMBERS, "--jitter-cv": NUMBERS,
    "--bucket-cap-MiB": NUMBERS, "--first-bucket-MiB": NUMBERS, "--servers": NUMBERS,
    "--staleness-bound": NUMBERS, "--run-hours": NUMBERS, "--failure-rate-per-hour": NUMBERS,
    "--checkpoint-interval-s": NUMBERS, "--max-events": NUMBERS,
    "--events": st.sampled_from(["fail:1@10", "fail:1@1e12", "join:0@5", "fail:9@10", "x",
                                 "fail:1@nan", "fail:1@-3", "leave:1@inf"]),
}


@st.composite
def option_sets(draw, options: dict, required: dict) -> list[str]:
    args = []
    for name, values in required.items():
        args += [name, draw(values)]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=3, unique=True))
    for name in chosen:
        args += [name, draw(options[name])]
    return args


@SETTINGS
@given(option_sets(PREDICT_OPTIONS, {"--strategy": st.sampled_from(
    ["ddp", "fsdp", "sync-ps", "async-ps", "ssp-ps", "nope", ""]), "--workers": WORKERS}))
def test_predict_answers_every_input_with_0_or_one_line(args):
    check(["predict", *args, "--json"])


@SETTINGS
@given(option_sets({"--workers": st.sampled_from(["1,2", "1,nan", "0,4", "", "1,,2", "4,1e9"]),
                    "--seed": NUMBERS, "--jitter-cv": NUMBERS, "--stragglers": NUMBERS},
                   {"--strategies": st.sampled_from(["ddp", "ddp,async-ps", "zz", ",", ""])}))
def test_sweep_answers_every_input_with_0_or_one_line(tmp_path_factory, args):
    out = tmp_path_factory.mktemp("sweep")
    check(["sweep", *args, "--json", "--out", str(out)])


@SETTINGS
@given(option_sets({"--memory-budget-GiB": NUMBERS, "--target-accuracy": NUMBERS,
                    "--lr": NUMBERS, "--stragglers": NUMBERS, "--straggler-speed": NUMBERS},
                   {"--workers": st.sampled_from(["1", "4", "0", "nan", "10000000"])}))
def test_recommend_answers_every_input_with_0_or_one_line(args):
    check(["recommend", *args, "--json"])


PROFILE = Path(__file__).resolve().parent.parent / "perfmodel" / "data" / "profiles" / "a100.toml"
WORKLOAD = (Path(__file__).resolve().parent.parent / "perfmodel" / "data" / "workloads"
            / "mlp.toml")
TOML_VALUES = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e308", '"text"', "[]",
                               "true", "{}", "1e-308"])


def numeric_lines(path: Path) -> list[int]:
    lines = path.read_text().splitlines()
    return [i for i, line in enumerate(lines)
            if " = " in line and line.split(" = ", 1)[1][:1] in "-0123456789"]


@SETTINGS
@given(st.sampled_from(numeric_lines(PROFILE)), TOML_VALUES)
def test_a_profile_with_any_bad_number_is_one_line(tmp_path_factory, index, value):
    folder = tmp_path_factory.mktemp("profiles")
    lines = PROFILE.read_text().splitlines()
    key = lines[index].split(" = ", 1)[0]
    lines[index] = f"{key} = {value}"
    (folder / "a100.toml").write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFMODEL_PROFILES", str(folder))
        check(["predict", "--strategy", "ddp", "--workers", "2", "--json"])


@SETTINGS
@given(st.sampled_from(numeric_lines(WORKLOAD)), TOML_VALUES)
def test_a_workload_with_any_bad_number_is_one_line(tmp_path_factory, index, value):
    lines = WORKLOAD.read_text().splitlines()
    key = lines[index].split(" = ", 1)[0]
    lines[index] = f"{key} = {value}"
    path = tmp_path_factory.mktemp("workloads") / "w.toml"
    path.write_text("\n".join(lines) + "\n")
    check(["predict", "--strategy", "ddp", "--workers", "2", "--workload", str(path), "--json"])


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfe binary", b"name = 'a100'\n[device",
                                     b"[[[", b"name = \"a100\"\n"])
def test_a_truncated_or_binary_profile_is_one_line(tmp_path, monkeypatch, content):
    (tmp_path / "a100.toml").write_bytes(content)
    monkeypatch.setenv("PERFMODEL_PROFILES", str(tmp_path))
    code, _ = check(["predict", "--strategy", "ddp", "--workers", "2", "--json"])
    assert code == 2


def test_same_seed_same_json_bytes():
    args = ["predict", "--strategy", "async-ps", "--workers", "8", "--seed", "3", "--json"]
    assert run_cli(args)[1] == run_cli(args)[1]
