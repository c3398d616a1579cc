"""The admin's first page: every team with its spend over the range, its
budget and what it spent of it this period, its open alerts, and its spend
per day over the range (the trend). A fixed number of statements whatever
the number of teams or running attempts: the open attempts' tails read
once, then one sum per kind of budget period, and one each for the range,
the teams, the budgets, the alerts and the per-day sums."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.money import budgets, views
from spotbroker.broker.money.dashboard import _days
from spotbroker.broker.money.models import Alert, Budget, LedgerEntry
from spotbroker.broker.store.models import Team


@dataclass(frozen=True)
class BudgetLine:
    amount: float
    period: str
    spent: float             # in the budget's period so far

    @property
    def share(self) -> float:
        return self.spent / self.amount if self.amount > 0 else 0.0


@dataclass(frozen=True)
class TeamLine:
    team: str
    total: views.Money                  # over the page's range
    budget: BudgetLine | None
    open_alerts: int
    trend: list[float]                  # dollars per day over the range, oldest first


def _per_day(session: Session, since: datetime, now: datetime,
             tails: list[views.Unwritten]) -> dict[int, dict[str, float]]:
    """team id -> day -> dollars (on PostgreSQL an index-only scan of the start_at index)."""
    day = views.day_column(session)
    out: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for team_id, when, cost in session.execute(
            select(LedgerEntry.team_id, day, func.sum(LedgerEntry.amount))
            .where(LedgerEntry.start_at >= since, LedgerEntry.start_at < now).group_by(LedgerEntry.team_id, day)):
        out[team_id][views.key("day", (when,))] += cost or 0.0
    for tail in tails:
        for d in tail.drafts:
            if since <= d.start_at < now:
                out[tail.team_id][d.start_at.date().isoformat()] += d.amount
    return out


def _in_period(session: Session, rows: list[Budget], now: datetime,
               tails: list[views.Unwritten]) -> dict[int, float]:
    """team id -> what it spent in its budget's current period."""
    out: dict[int, float] = {}
    for kind in sorted({r.period for r in rows}):
        spent = views.every_team(session, budgets.period_of(kind, now).start, now, now, tails)
        out.update({r.team_id: spent[r.team_id].cost if r.team_id in spent else 0.0
                    for r in rows if r.period == kind})
    return out


def teams(session: Session, since: datetime, now: datetime) -> tuple[list[str], list[TeamLine]]:
    """The range's days (the trend's points, as a team's page has them) and
    every team over [since, now), most spent first."""
    days = _days(since, now)
    names = session.execute(select(Team.id, Team.name)).all()
    tails = views.unwritten(session, None, now)     # read once for every sum below
    totals = views.every_team(session, since, now, now, tails)
    rows = list(session.scalars(select(Budget)))
    spent = _in_period(session, rows, now, tails)
    budget_of = {r.team_id: BudgetLine(r.amount, r.period, spent.get(r.team_id, 0.0)) for r in rows}
    alerts = dict(session.execute(select(Alert.team_id, func.count()).where(Alert.open_key.is_not(None))
                                  .group_by(Alert.team_id)).all())
    per_day = _per_day(session, since, now, tails)
    out = [TeamLine(name, totals.get(i, views.Money()), budget_of.get(i), alerts.get(i, 0),
                    [per_day.get(i, {}).get(d, 0.0) for d in days]) for i, name in names]
    return days, sorted(out, key=lambda t: (-t.total.cost, t.team))
