"""What runs cost. An attempt's price is the one stored at launch, so a later
catalog change never rewrites history; a running attempt accrues to now."""
from __future__ import annotations

from datetime import datetime

from spotbroker.broker.store.models import Attempt, Job


def attempt_hours(attempt: Attempt, now: datetime) -> float:
    if attempt.started_at is None:
        return 0.0
    end = attempt.ended_at or now
    return max((end - attempt.started_at).total_seconds(), 0.0) / 3600


def attempt_cost(attempt: Attempt, now: datetime) -> float:
    return attempt.price_per_hour * attempt.num_nodes * attempt_hours(attempt, now)


def job_cost(job: Job, now: datetime) -> float:
    return sum(attempt_cost(a, now) for a in job.attempts)
