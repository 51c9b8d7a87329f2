"""Run the elastic part of a comparison: measure the calibration run, predict the held-out
runs from its costs (written to elastic_predictions.json before they run), measure them,
and pair both. See perfmodel/compare/elastic.py for what is predicted and how.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from measure import session
from measure.protocol import RunProtocol
from measure.recorder import read_records
from measure.session import Progress, StoredRun
from perfmodel.cluster import ClusterProfile
from perfmodel.compare import elastic
from perfmodel.compare.elastic import CALIBRATION, HELD_OUT, ElasticItem
from perfmodel.compare.protocol import WARMUP_STEPS
from perfmodel.compare.run import step_interval
from perfmodel.errors import PerfmodelError
from perfmodel.predict import predict
from perfmodel.sim.scenario import Scenario
from perfmodel.uncertainty import CalibrationErrors
from perfmodel.workload import load_workload

TIMEOUT_S = 120.0               # process-group timeout of each elastic run


def measure_one(item: ElasticItem, store, *, seed: int, max_time_s: float | None,
                progress, protocol: RunProtocol | None = None
                ) -> tuple[StoredRun, list[dict]]:
    """(the stored run, its records) of one real run of `item` (measure/session.py)."""
    from measure.elastic_launch import Kill

    config = item.config(seed, TIMEOUT_S)
    config["compare"] = {"item": item.key}
    if item.kind == "elastic_ddp":
        stored = session.run_elastic_ddp(config, item.workers,
                                         [Kill(r, s) for r, s in item.kills], store,
                                         timeout_s=max_time_s, progress=progress,
                                         protocol=protocol)
    else:
        stored = session.run_membership_ps(config, item.workers, store, timeout_s=max_time_s,
                                           progress=progress, protocol=protocol)
    return stored, read_records(stored.run_dir)


def step_prediction(profile: ClusterProfile, item: ElasticItem, errors: CalibrationErrors |
                    None, *, seed: int) -> tuple[float, float, float]:
    """The model's DDP step time for the item's job and its prediction interval."""
    scenario = Scenario(cluster=profile, workload=load_workload(item.workload),
                        workers=item.workers, batch_size=item.batch,
                        steps=WARMUP_STEPS + item.steps, warmup_steps=WARMUP_STEPS, seed=seed)
    p = predict("ddp", scenario)
    point, iv = p.summary.step_time_s.mean, step_interval(p, errors)
    return (point, point, point) if iv is None else (point, iv.low_s, iv.high_s)


def ps_scenario(profile: ClusterProfile, item: ElasticItem, seed: int) -> Scenario:
    return Scenario(cluster=profile, workload=load_workload(item.workload),
                    workers=item.active, batch_size=item.batch,
                    steps=WARMUP_STEPS + item.steps, warmup_steps=WARMUP_STEPS,
                    jitter="lognormal", seed=seed)


def predict_held_out(profile: ClusterProfile, errors: CalibrationErrors | None,
                     costs: dict[str, float], *, seed: int) -> dict[str, dict[str, Any]]:
    out = {}
    for item in HELD_OUT:
        if item.kind == "elastic_ddp":
            step, low, high = step_prediction(profile, item, errors, seed=seed)
            pred = elastic.predict_gang(item, step_s=step, costs=costs)
            pred["goodput_interval"] = list(elastic.goodput_interval(pred, item, low, high))
        else:
            pred = elastic.predict_ps(item, ps_scenario(profile, item, seed))
        out[item.key] = {"label": item.label, "what": item.what, **pred}
    return out


def run_all(profile: ClusterProfile, errors: CalibrationErrors | None, store, out: Path, *,
            seed: int, repeats: int, max_time_s: float | None,
            progress: Progress, protocol: RunProtocol | None = None) -> dict[str, Any]:
    """The calibration run, the predictions, the held-out runs (`repeats` times each,
    interleaved) and the report rows. A failed run is listed, not used."""
    failed: list[dict[str, Any]] = []

    def one(item: ElasticItem, label: str):
        text = f"{item.key} {label}"
        stored, records = measure_one(item, store, seed=seed, max_time_s=max_time_s,
                                      progress=progress.start(text, item.steps),
                                      protocol=protocol)
        progress.finish(stored.outcome(text))
        if stored.interrupted:
            raise KeyboardInterrupt
        if not stored.ok:
            failed.append({"key": item.key, "run_id": stored.run_id, "reason": stored.reason})
            return None
        return stored.run_id, records, list(stored.recoveries)

    from measure.elastic_launch import measured_costs

    cal = one(CALIBRATION, "(calibration)")
    if cal is None:
        raise PerfmodelError(f"the elastic calibration run failed ({failed[-1]['reason']}); "
                             f"its records are in the store as run {failed[-1]['run_id']}")
    costs = elastic.check_costs(measured_costs(cal[1]))
    predictions = predict_held_out(profile, errors, costs, seed=seed)
    (out / "elastic_predictions.json").write_text(json.dumps(
        {"calibration_run": cal[0], "costs": costs,
         "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "predictions": predictions},
        indent=1) + "\n")
    measured: dict[str, list[dict[str, Any]]] = {i.key: [] for i in HELD_OUT}
    run_ids: dict[str, list[int]] = {i.key: [] for i in HELD_OUT}
    for repeat in range(1, repeats + 1):
        for item in HELD_OUT:
            got = one(item, f"({repeat}/{repeats})")
            if got is None:
                continue
            run_id, records, found = got
            try:
                m = (elastic.measured_gang(item, records, found)
                     if item.kind == "elastic_ddp" else elastic.measured_ps(records))
            except PerfmodelError as e:
                failed.append({"key": item.key, "run_id": run_id, "reason": str(e)})
                continue
            measured[item.key].append(m)
            run_ids[item.key].append(run_id)
    rows = [r for item in HELD_OUT
            for r in elastic.rows_for(item, predictions[item.key], measured[item.key])]
    return {"calibration": {"key": CALIBRATION.key, "label": CALIBRATION.label,
                            "run_id": cal[0], "costs": costs},
            "predictions": predictions, "measured": measured, "run_ids": run_ids,
            "failed": failed, "rows": rows}
