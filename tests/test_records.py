"""records.LazyRecords: the PS simulation's records, made only when read, are exactly the
records a tuple would hold, and predict.summarise reads its rows to the same summary."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from perfmodel.predict import summarise
from perfmodel.sim.ps import SSPPS, AsyncPS, SyncPS
from perfmodel.sim.records import CommRecord, LazyRecords, SimResult, StepRecord, UpdateRecord
from perfmodel.sim.scenario import Scenario
from tests.factories import make_cluster, make_workload


def scenario(workers: int = 6) -> Scenario:
    return Scenario(cluster=make_cluster("a100"), workload=make_workload(), workers=workers,
                    batch_size=32, steps=6, speed=(1.0,) * (workers - 1) + (0.5,))


def eager(result: SimResult) -> SimResult:
    """The same result with every record made by the dataclass's own constructor."""
    def made(records, cls):
        return tuple(cls(*row) for row in records.rows)
    return dataclasses.replace(result, steps=made(result.steps, StepRecord),
                               updates=made(result.updates, UpdateRecord),
                               comms=made(result.comms, CommRecord))


@pytest.mark.parametrize("model", [SyncPS(), AsyncPS(), SSPPS(SSPPS.Options(staleness_bound=1))])
def test_lazy_records_are_the_records_a_tuple_holds(model):
    sc = scenario()
    lazy = model.simulate(sc)
    assert isinstance(lazy.steps, LazyRecords) and len(lazy.steps) > 0
    assert lazy.steps._records is None          # len() made no record
    full = eager(lazy)
    for name in ("steps", "updates", "comms"):
        mine, theirs = getattr(lazy, name), getattr(full, name)
        assert mine == theirs and theirs == mine and len(mine) == len(theirs)
        assert list(mine) == list(theirs) and mine[-1] == theirs[-1] and mine[:2] == theirs[:2]
        assert pickle.loads(pickle.dumps(mine)) == theirs
        assert type(pickle.loads(pickle.dumps(mine))) is tuple
    assert lazy == full and hash(lazy) == hash(full)


@pytest.mark.parametrize("model", [SyncPS(), AsyncPS(), SSPPS(SSPPS.Options(staleness_bound=1))])
def test_summary_from_rows_is_the_summary_from_records(model):
    """summarise reads LazyRecords' rows directly and a tuple of records field by field: the
    two paths must agree to the bit (staleness from versions, as UpdateRecord.staleness)."""
    sc = scenario()
    lazy = model.simulate(sc)
    assert summarise(lazy, sc) == summarise(eager(lazy), sc)


def test_lazy_records_compare_unequal_when_a_record_differs():
    rows = [(0, 0, 0.0, 1.0, 5.0, 6)]
    a = LazyRecords(lambda *r: r, rows)
    assert a == ((0, 0, 0.0, 1.0, 5.0, 6),)
    assert a != ((0, 0, 0.0, 1.0, 5.0, 7),)
    assert a != [(0, 0, 0.0, 1.0, 5.0, 6)]       # a list is not a tuple of records


def test_throughput_is_every_workers_own_rate_summed():
    # Synchronous steps end at slightly different times on each worker (jitter): each worker
    # moves batch / (its mean step) samples per second, and the run the sum of them. A common
    # window from the last first start to the first last end left out every worker's last
    # step but one: 16 workers of 8 counted steps came out ~1/8 low.
    from perfmodel.sim.ddp import DDP

    sc = Scenario(cluster=make_cluster("a100"), workload=make_workload(), workers=16,
                  batch_size=32, steps=10, warmup_steps=2, jitter="lognormal", jitter_cv=0.05)
    result = DDP().simulate(sc)
    counted = [r for r in result.steps if r.step >= sc.warmup_steps]
    rates = []
    for w in range(16):
        mine = [r.end_s - r.start_s for r in counted if r.worker == w]
        rates.append(sc.batch_size / (sum(mine) / len(mine)))     # steps run back to back
    assert summarise(result, sc).throughput_samples_per_s == pytest.approx(sum(rates),
                                                                         rel=1e-9)

