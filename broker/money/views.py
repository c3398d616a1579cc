"""Reads of the ledger: a job's and its attempts' cost, a team's spend over
a time range grouped by day, job, cloud, GPU or zone, and spend over a
window (for budgets and alerts). Each is the written entries plus the tail
the next accrual will write for attempts still open (`ledger.pending`), so
every total is exact to now and all of them agree."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Date, cast, func, or_, select
from sqlalchemy.orm import Session

from spotbroker.broker.money import ledger
from spotbroker.broker.money.models import LedgerCursor, LedgerEntry
from spotbroker.broker.store.models import Attempt, Job

GROUPS = ("day", "job", "cloud", "gpu", "zone")


@dataclass
class Money:
    cost: float = 0.0
    on_demand_cost: float = 0.0
    wasted: float = 0.0
    node_hours: float = 0.0

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost

    def add(self, cost: float, on_demand: float, wasted: float, node_hours: float) -> None:
        self.cost += cost
        self.on_demand_cost += on_demand
        self.wasted += wasted
        self.node_hours += node_hours


@dataclass
class Report:
    total: Money
    groups: dict[str, Money] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)   # job groups: id -> name


# --- one job ---------------------------------------------------------------------------


# The grain of the unwritten cost a reader adds (accrual writes at most a
# minute apart, so the finest window, 5 minutes, is right to the minute).
PENDING_STEP_S = 60.0


def attempt_costs(session: Session, attempts: Iterable[Attempt], now: datetime) -> dict[int, float]:
    """attempt id -> dollars to now."""
    attempts = [a for a in attempts if a.started_at is not None]
    if not attempts:
        return {}
    ids = [a.id for a in attempts]
    out: dict[int, float] = dict.fromkeys(ids, 0.0)
    for attempt_id, amount in session.execute(
            select(LedgerEntry.attempt_id, func.sum(LedgerEntry.amount))
            .where(LedgerEntry.attempt_id.in_(ids)).group_by(LedgerEntry.attempt_id)):
        out[attempt_id] = amount or 0.0
    cursors = {r.attempt_id: r for r in session.execute(
        select(LedgerCursor.attempt_id, LedgerCursor.accrued_to, LedgerCursor.closed)
        .where(LedgerCursor.attempt_id.in_(ids)))}
    for a in attempts:
        cursor = cursors.get(a.id)
        if cursor is None or not cursor.closed:
            drafts, _, _ = ledger.pending(session, a, cursor.accrued_to if cursor else None, now)
            out[a.id] += sum(d.amount for d in drafts)
    return out


# --- a team ----------------------------------------------------------------------------


def _key_columns(session: Session, group_by: str) -> list:
    if group_by == "day":
        if session.get_bind().dialect.name == "postgresql":
            return [cast(func.timezone("UTC", LedgerEntry.start_at), Date)]
        return [func.date(LedgerEntry.start_at)]
    return {"job": [LedgerEntry.job_id], "cloud": [LedgerEntry.cloud], "gpu": [LedgerEntry.accelerator],
            "zone": [LedgerEntry.cloud, LedgerEntry.region, LedgerEntry.place]}[group_by]


def _key(group_by: str, parts: tuple) -> str:
    if group_by == "day":
        return str(parts[0])[:10]
    if group_by == "gpu":
        return parts[0] or "none"
    if group_by == "zone":
        return "/".join(p for p in parts if p) or "local"
    return str(parts[0])


def _draft_key(group_by: str, d: ledger.Draft, a: Attempt) -> str:
    parts = {"day": (d.start_at.date().isoformat(),), "job": (a.job_id,), "cloud": (a.cloud,),
             "gpu": (a.accelerator,), "zone": (a.cloud, a.region, ledger.place(a))}[group_by]
    return _key(group_by, parts)


def open_attempts(session: Session, team_id: int | None) -> list[tuple[Attempt, datetime | None]]:
    """A team's (or, with None, every team's) attempts whose cost is not all
    written yet, each with how far it is written."""
    query = (select(Attempt, LedgerCursor.accrued_to)
             .outerjoin(LedgerCursor, LedgerCursor.attempt_id == Attempt.id)
             .where(Attempt.started_at.is_not(None),
                    or_(LedgerCursor.closed.is_(False), LedgerCursor.attempt_id.is_(None))))
    if team_id is not None:
        query = query.join(Job, Job.id == Attempt.job_id).where(Job.team_id == team_id)
    return [tuple(r) for r in session.execute(query)]


def team_costs(session: Session, team_id: int, since: datetime, until: datetime, group_by: str | None,
               now: datetime) -> Report:
    """A team's spend with `start_at` in [since, until), optionally grouped."""
    total, groups = Money(), defaultdict(Money)
    keys = _key_columns(session, group_by) if group_by else []
    sums = [func.sum(LedgerEntry.amount), func.sum(LedgerEntry.ondemand_amount), func.sum(LedgerEntry.wasted),
            func.sum(LedgerEntry.node_hours)]
    query = select(*keys, *sums).where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since,
                                       LedgerEntry.start_at < until)
    if keys:
        query = query.group_by(*keys)
    for row in session.execute(query):
        values = [v or 0.0 for v in row[len(keys):]]
        total.add(*values)
        if group_by:
            groups[_key(group_by, tuple(row[:len(keys)]))].add(*values)
    for attempt, accrued_to in open_attempts(session, team_id):
        # Cut as accrual will write it, so each piece falls in the window it was spent in.
        drafts, _, _ = ledger.pending(session, attempt, accrued_to, min(now, until), step_s=PENDING_STEP_S)
        for d in drafts:
            if since <= d.start_at < until:
                total.add(d.amount, d.ondemand_amount, d.wasted, d.node_hours)
                if group_by:
                    groups[_draft_key(group_by, d, attempt)].add(d.amount, d.ondemand_amount, d.wasted,
                                                                 d.node_hours)
    report = Report(total, dict(sorted(groups.items())))
    if group_by == "job" and groups:
        report.names = {str(i): n for i, n in session.execute(
            select(Job.id, Job.name).where(Job.id.in_([int(k) for k in groups])))}
    return report


def every_team(session: Session, since: datetime, until: datetime, now: datetime) -> dict[int, Money]:
    """Every team's totals with `start_at` in [since, until), as `team_costs`
    gives each, in one statement (and the open attempts' tail)."""
    out: dict[int, Money] = defaultdict(Money)
    for team_id, *values in session.execute(
            select(LedgerEntry.team_id, func.sum(LedgerEntry.amount), func.sum(LedgerEntry.ondemand_amount),
                   func.sum(LedgerEntry.wasted), func.sum(LedgerEntry.node_hours))
            .where(LedgerEntry.start_at >= since, LedgerEntry.start_at < until).group_by(LedgerEntry.team_id)):
        out[team_id].add(*(v or 0.0 for v in values))
    unwritten = (select(Attempt, LedgerCursor.accrued_to, Job.team_id).join(Job, Job.id == Attempt.job_id)
                 .outerjoin(LedgerCursor, LedgerCursor.attempt_id == Attempt.id)
                 .where(Attempt.started_at.is_not(None),
                        or_(LedgerCursor.closed.is_(False), LedgerCursor.attempt_id.is_(None))))
    for attempt, accrued_to, team_id in session.execute(unwritten):
        drafts, _, _ = ledger.pending(session, attempt, accrued_to, min(now, until), step_s=PENDING_STEP_S)
        for d in drafts:
            if since <= d.start_at < until:
                out[team_id].add(d.amount, d.ondemand_amount, d.wasted, d.node_hours)
    return out


def spend(session: Session, team_id: int, since: datetime, now: datetime) -> float:
    """A team's dollars from `since` to now (budgets and alerts)."""
    return team_costs(session, team_id, since, now, None, now).total.cost
