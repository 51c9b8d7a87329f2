"""The drift anchor: one set-A run measured again in every round of set B.

Set A (the calibration) runs first, set B (the held-out runs) for the next 15-20 minutes. A
shared 2-core machine does not keep one speed over that time: reports 28-30 had every real
DDP row 3-18 % slower than predicted while the same profile predicted set A's own DDP runs
to about 1 %, and from the rows alone no one could tell a model that misses the held-out
configurations from a machine that slowed down after set A. The anchor tells them apart:
one measurement of set A (perfmodel/data/heldout/local.toml `[anchor]`, the suite's item
key) is launched again with the very same config at the start of every repeat round, and
the report gives its step time against set A's run of it. A ratio near 1 (inside the
re-runs' own spread) says the machine held its set-A speed and the held-out errors are the
model's; a ratio of 1.10 says set B's runs ran ~10 % slower than set A's for reasons no
held-out configuration caused.

It is a diagnostic, never an input: nothing is fitted on it and no prediction moves with
it. Its runs are marked `compare.item = "anchor:<item>"` instead of set A's `calibration`
marker, so no calibration ever takes one for set A (calibration/suite.py `comparable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.compare.matching import measured_run
from perfmodel.compare.protocol import HeldOut
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import Fields, load_toml

MARKER = "anchor:"
# Below this difference between the re-runs and their reference the anchor says nothing
# about drift: about the model's own in-sample step residual on set A (r_step 7.3 % RMS in
# report 31, 5-9 % in reports 28-32).
DRIFT_QUIET = 0.05


@dataclass(frozen=True, kw_only=True)
class Anchor:
    """Which set-A measurement is run again, and why (the data file's `[anchor]`)."""

    item: str           # calibration/suite.py Measurement key without its repeat, "ddp-mlp"
    why: str


def load_anchor(path: Path) -> Anchor | None:
    """The `[anchor]` table of a held-out file, or None where it has none."""
    table = load_toml(path).get("anchor")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise PerfmodelError(f"{path}: [anchor] must be a table with 'item' and 'why'")
    f = Fields(table, path, "anchor.")
    return Anchor(item=f.str("item"), why=f.str("why"))


def suite_measurement(anchor: Anchor, suite: Sequence[Any]):
    """The set-A measurement (calibration/suite.py Measurement) the anchor repeats: the first
    of the suite whose key is the anchor's item (its first repeat); a one-line error if the
    suite has none."""
    for m in suite:
        if m.key.rsplit("-", 1)[0] == anchor.item:
            return m
    keys = sorted({m.key.rsplit("-", 1)[0] for m in suite})
    raise PerfmodelError(f"[anchor] item '{anchor.item}' is not a measurement of the "
                         f"calibration suite; its items: {', '.join(keys)}")


def anchor_config(measurement, repeat: int) -> dict[str, Any]:
    """The set-A measurement's own config, its calibration marker replaced by the anchor's."""
    config = {k: v for k, v in measurement.config.items() if k != "calibration"}
    item = measurement.key.rsplit("-", 1)[0]
    config["compare"] = {"item": MARKER + item, "repeat": repeat}
    return config


def is_set_a_run(config: dict[str, Any], item: str) -> bool:
    """Whether a stored run's config is set A's run of `item` (its calibration marker)."""
    return (config.get("calibration") or {}).get("item") == item


@dataclass(frozen=True, kw_only=True)
class AnchorResult:
    """Set A's step time of the anchor measurement beside its re-runs in set B's rounds."""

    label: str
    set_a_run_ids: tuple[int, ...]
    set_a_step_s: tuple[float, ...]
    run_ids: tuple[int, ...]            # the re-runs, round by round
    step_s: tuple[float, ...]
    predicted_step_s: float | None = None   # the model's, fitted on set A (in-sample)

    @property
    def ratios(self) -> tuple[float, ...]:
        """Each re-run's step time over set A's (the median of set A's runs of it)."""
        if not self.set_a_step_s:
            return ()
        base = float(np.median(self.set_a_step_s))
        return tuple(s / base for s in self.step_s)

    @property
    def ratio(self) -> float | None:
        """The median ratio: > 1 when set B's rounds ran slower than set A."""
        return float(np.median(self.ratios)) if self.ratios else None

    def drift_line(self) -> str | None:
        """One line for the report's "what the measurements say" where the re-runs differ
        from their reference (the model's prediction for the anchor, else set A's run) by
        more than both their own spread and DRIFT_QUIET; None otherwise."""
        if not self.step_s:
            return None
        ref = self.predicted_step_s or (float(np.median(self.set_a_step_s))
                                        if self.set_a_step_s else None)
        if not ref:
            return None
        median = float(np.median(self.step_s))
        ratio, spread = median / ref, (max(self.step_s) - min(self.step_s)) / median
        if abs(ratio - 1.0) <= max(spread, DRIFT_QUIET):
            return None
        what = ("the model's prediction for it" if self.predicted_step_s
                else "set A's run of it")
        slower = ratio > 1.0
        return (f"drift: the anchor ({self.label}) ran x{ratio:.2f} of {what} during set B "
                f"(its re-runs spread {100 * spread:.0f} %): the machine ran "
                f"{'slower' if slower else 'faster'} than when set A was measured, which "
                f"moves every measured step {'up' if slower else 'down'}; rows predicted too "
                f"{'fast' if slower else 'slow'} are partly that, not the model.")

    def line(self) -> str:
        """One line for the report and the command's output."""
        if not self.step_s:
            return f"drift anchor ({self.label}): no re-run finished"
        if self.ratio is None:
            return (f"drift anchor ({self.label}): re-runs {_ms(self.step_s)} ms; set A has "
                    f"no run of it in this store")
        low, high = min(self.ratios), max(self.ratios)
        model = ("" if self.predicted_step_s is None else
                 f"; the model, fitted on set A, {1e3 * self.predicted_step_s:.1f} ms "
                 f"(re-runs x{float(np.median(self.step_s)) / self.predicted_step_s:.2f} of it)")
        return (f"drift anchor ({self.label}): set A {_ms(self.set_a_step_s)} ms, again in "
                f"set B's rounds {_ms(self.step_s)} ms: x{self.ratio:.2f} "
                f"(x{low:.2f}-{high:.2f}; above 1, set B ran slower than set A){model}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AnchorResult:
        return cls(label=d["label"], set_a_run_ids=tuple(d["set_a_run_ids"]),
                   set_a_step_s=tuple(d["set_a_step_s"]), run_ids=tuple(d["run_ids"]),
                   step_s=tuple(d["step_s"]), predicted_step_s=d.get("predicted_step_s"))

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "set_a_run_ids": list(self.set_a_run_ids),
                "set_a_step_s": list(self.set_a_step_s), "run_ids": list(self.run_ids),
                "step_s": list(self.step_s), "ratios": list(self.ratios),
                "ratio": self.ratio, "predicted_step_s": self.predicted_step_s}


def as_held_out(measurement) -> HeldOut | None:
    """The anchor's configuration as a set-B item, for the model's prediction of it (DDP and
    FSDP measurements; None for others)."""
    config = measurement.config
    kind = config.get("kind")
    if kind not in ("ddp", "fsdp"):
        return None
    return HeldOut(key=MARKER + measurement.key.rsplit("-", 1)[0], what="the drift anchor",
                   strategy=kind, workload=config["workload"], workers=int(config["workers"]),
                   batch_size=config.get("batch_size"),
                   options=dict((config.get("options") or {}).get(kind) or {}))


def result(store, measurement, set_a_ids: Sequence[int], run_ids: Sequence[int],
           predicted_step_s: float | None = None) -> AnchorResult:
    """The anchor's step times (the mean of every rank's timed steps, as for set B's rows,
    perfmodel/compare/matching.py) in set A (this store's runs among `set_a_ids` that
    measured it) and in its re-runs `run_ids`, beside the model's `predicted_step_s`."""
    item = measurement.key.rsplit("-", 1)[0]
    wanted = set(set_a_ids)
    set_a = [r.id for r in store.list_runs()
             if r.id in wanted and r.status == "ok" and is_set_a_run(r.config, item)]

    def step_s(run_id: int) -> float:
        run = store.get_run(run_id)
        return measured_run(run, ps=False, timed_wait=False, warmup_steps=0).step_time_s

    return AnchorResult(label=measurement.label.split(" (")[0], set_a_run_ids=tuple(set_a),
                        set_a_step_s=tuple(step_s(i) for i in set_a),
                        run_ids=tuple(run_ids), step_s=tuple(step_s(i) for i in run_ids),
                        predicted_step_s=predicted_step_s)


def drift_lines(meta: dict[str, Any]) -> list[str]:
    """The drift anchor's line for a report's "what the measurements say", from its
    comparisons.json meta, where the anchor ran and has something to say."""
    if not meta.get("anchor"):
        return []
    line = AnchorResult.from_dict(meta["anchor"]).drift_line()
    return [line] if line else []


def _ms(values: Sequence[float]) -> str:
    return ", ".join(f"{1e3 * v:.1f}" for v in values)


def round_errors(predicted: dict[str, float], modes: dict[str, str],
                 measured: dict[str, dict[int, float]],
                 anchor_ratios: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """Set B round by round: for each round r, every configuration's run of that round
    against its predicted step time (`predicted[key]`, seconds; `measured[key][r]`, that
    run's step time), the median signed and absolute error of the real and of the
    timed-wait rows (`modes[key]`), beside the drift anchor's ratio in that round. A report's
    medians over three runs hide a host that changed speed between rounds; this shows it
    (report 52: timed-wait median |error| 4.8 % in round 1, next to set A, 16.0 and 12.4 %
    after)."""
    rounds = sorted({r for by in measured.values() for r in by})
    out = []
    for r in rounds:
        row: dict[str, Any] = {"round": r, "anchor_ratio": (anchor_ratios or {}).get(r)}
        for mode in ("real", "timed-wait"):
            errors = np.array([predicted[k] / by[r] - 1.0 for k, by in measured.items()
                               if r in by and by[r] > 0 and modes.get(k) == mode])
            row[mode] = None if not errors.size else {
                "rows": int(errors.size), "median": float(np.median(errors)),
                "median_abs": float(np.median(np.abs(errors)))}
        out.append(row)
    return out


def round_lines(by_round: Sequence[dict[str, Any]]) -> list[str]:
    """One line a round for the report's drift anchor section (`round_errors`)."""
    def part(mode: str, d: dict[str, Any] | None) -> str:
        return (f"{mode} rows: none" if d is None else
                f"{mode} rows {100 * d['median']:+.1f} % median, |error| "
                f"{100 * d['median_abs']:.1f} % ({d['rows']})")
    lines = []
    for row in by_round:
        ratio = row.get("anchor_ratio")
        anchor = f"anchor x{ratio:.2f}" if ratio is not None else "anchor: no run"
        lines.append(f"round {row['round']}: {anchor}; {part('real', row.get('real'))}; "
                     f"{part('timed-wait', row.get('timed-wait'))}")
    return lines
