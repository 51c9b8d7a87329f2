"""How much work a prediction will be, estimated before it starts, and refused above a limit.

One typo (`--workers 10000000`, `--run-hours 1e9`) must not take the machine: the simulation
keeps a record per worker step and the elasticity model one per stretch of training between
checkpoints or membership changes, so both grow without bound with their inputs. The estimates
are upper bounds on simulated events and records, from counts on the shipped profiles
(tests/golden/predictions.json): the PS strategies take at most 3.2 events per worker step;
DDP and FSDP model a collective once per ring, so their events stop growing with workers
(16,000 for FSDP GPT-2 XL at 4096 workers) while their per-worker step records do not. A
worker step is therefore charged EVENTS_PER_WORKER_STEP, records and events together:

    step-level model:  workers x steps x EVENTS_PER_WORKER_STEP
    elasticity model:  (run / checkpoint interval + membership events) x EVENTS_PER_SEGMENT

Seen here (2 cores): DDP on 1024 workers over 25,000 h at 0.001 failures per worker-hour is
estimated at 1.6 million events and takes 14 s and 104 MB whole process, so DEFAULT_MAX_EVENTS
(10 million) bounds a run at about a minute and a half and well under 1 GB; `--max-events`
raises it.
"""

from __future__ import annotations

import math

from perfmodel.errors import PerfmodelError

DEFAULT_MAX_EVENTS = 10_000_000
EVENTS_PER_WORKER_STEP = 15         # events and records of one worker step, generously
EVENTS_PER_SEGMENT = 8              # a segment's events and records, and the step-level
#                                     predictions of the memberships it passes through


def step_events(workers: int, steps: int) -> float:
    return float(workers) * steps * EVENTS_PER_WORKER_STEP


def elastic_events(*, run_s: float, checkpoint_interval_s: float, membership_events: int,
                   failure_rate_per_hour: float, workers: int) -> float:
    """Segments the elasticity model will record: a checkpoint per interval, and per change
    (listed, or expected failures plus their replacements) a few more."""
    expected_failures = 2 * failure_rate_per_hour * workers * run_s / 3600.0
    segments = run_s / checkpoint_interval_s + 3 * (membership_events + expected_failures)
    return segments * EVENTS_PER_SEGMENT


def check(estimate: float, limit: float, what: str) -> None:
    """Refuse work estimated above `limit` events, saying what to change."""
    if not math.isfinite(estimate) or estimate > limit:
        raise PerfmodelError(
            f"{what} would take about {estimate:,.0f} simulated events, over the limit of "
            f"{limit:,.0f} (minutes of work and gigabytes of records); make it smaller or "
            f"raise the limit with --max-events")
