"""Reads of a team's spend by label for the dashboard: which labels its
jobs carry, and its spend per day by the values of one of them (the
costs API's `group_by=label:KEY`, split by day). Like every read of the
ledger, written entries plus the open attempts' unwritten tails."""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from spotbroker.broker.money import views
from spotbroker.broker.store.models import JobLabel
from spotbroker.broker.store.moneymodels import LedgerEntry

MAX_KEYS = 50


def keys(session: Session, team_id: int) -> list[str]:
    """The label names the team's jobs carry, in order (an index-only read)."""
    return list(session.scalars(select(JobLabel.key).where(JobLabel.team_id == team_id).distinct()
                                .order_by(JobLabel.key).limit(MAX_KEYS)))


def by_day(session: Session, team_id: int, label: str, since: datetime,
           now: datetime) -> dict[str, dict[str, float]]:
    """day -> the label's value (views.NO_LABEL: jobs without it) -> dollars,
    for entries starting in [since, now): summed per day and job first (the
    team's entries read once), then the job rows joined to their label."""
    day = views.day_column(session)
    cells = (select(day.label("day"), LedgerEntry.job_id.label("job_id"), func.sum(LedgerEntry.amount).label("cost"))
             .where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since, LedgerEntry.start_at < now)
             .group_by(day, LedgerEntry.job_id).subquery())
    c = cells.c
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for when, value, cost in session.execute(
            select(c.day, JobLabel.value, func.sum(c.cost)).select_from(cells)
            .outerjoin(JobLabel, and_(JobLabel.job_id == c.job_id, JobLabel.key == label))
            .group_by(c.day, JobLabel.value)):
        out[views.key("day", (when,))][value if value is not None else views.NO_LABEL] += cost or 0.0
    tails = views.unwritten(session, team_id, now)
    values = views.label_values(session, label, (t.attempt.job_id for t in tails))
    for tail in tails:
        for d in tail.drafts:
            if since <= d.start_at < now:
                out[d.start_at.date().isoformat()][values.get(tail.attempt.job_id, views.NO_LABEL)] += d.amount
    return out


def team_chart(session: Session, team: str, label: str | None, since: datetime,
               now: datetime) -> tuple[list[str], str | None, dict[str, dict[str, float]]]:
    """For a team's page: the labels its jobs carry, the one charted (`label`,
    else the first), and that one's spend per day by value (raises
    auth.TeamNotFound)."""
    from spotbroker.broker import auth

    team_id = auth.team_id(session, team)
    found = keys(session, team_id)
    chosen = label if label is not None else (found[0] if found else None)
    return found, chosen, by_day(session, team_id, chosen, since, now) if chosen is not None else {}
