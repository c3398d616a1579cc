"""What runs cost, as the ledger says (broker/money/): the entries written
so far plus what the next accrual will write, so a job's cost is exact to
now and equals what the team's view and budgets count."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session, object_session

from spotbroker.broker.money import views
from spotbroker.broker.store.models import Job


def job_costs(job: Job, now: datetime, session: Session | None = None) -> dict[int, float]:
    """attempt id -> dollars to now, for the job's attempts (read through the
    session the job was loaded in, unless one is given)."""
    return {i: m.cost for i, m in job_money(job, now, session).items()}


def job_money(job: Job, now: datetime, session: Session | None = None) -> dict[int, views.Money]:
    """attempt id -> its dollars, kWh and CO2e to now (as `job_costs`)."""
    started = [a for a in job.attempts if a.started_at is not None]
    if not started:
        return {}
    session = session or object_session(job)
    if session is None:
        raise RuntimeError(f"job {job.id}: its cost is read from the ledger, which needs a session")
    return views.attempt_money(session, started, now)
