"""The admin's first page: every team with its spend over the range, its
budget and what it spent of it this period, its open alerts, and its spend
per day over the range (the trend). A fixed number of statements whatever
the number of teams or running attempts: the open attempts' tails, then
one scan of the entries that every sum is made of, and the teams, the
budgets and the open alerts."""
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


def _sums(session: Session, first: datetime, since: datetime, now: datetime, tails: list[views.Unwritten],
          ) -> tuple[dict[int, views.Money], dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """Per team: its money over [since, now), its dollars per day over
    [since, now) (the trend), and per day over [first, now) (the budgets'
    periods, which begin at a midnight and may begin before the range). One
    scan of the entries from `first`, grouped by team, day and whether
    within the range (on PostgreSQL, of the start_at index)."""
    day, inside = views.day_column(session), LedgerEntry.start_at >= since
    totals: dict[int, views.Money] = defaultdict(views.Money)
    trend: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    daily: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(team_id: int, when: str, within: bool, values) -> None:
        daily[team_id][when] += values[0]
        if within:
            totals[team_id].add(*values)
            trend[team_id][when] += values[0]

    for team_id, when, within, *values in session.execute(
            select(LedgerEntry.team_id, day, inside, *views._sums())
            .where(LedgerEntry.start_at >= first, LedgerEntry.start_at < now)
            .group_by(LedgerEntry.team_id, day, inside)):
        add(team_id, views.key("day", (when,)), bool(within), [v or 0.0 for v in values])
    for tail in tails:
        for d in tail.drafts:
            if first <= d.start_at < now:
                add(tail.team_id, d.start_at.date().isoformat(), d.start_at >= since, views._values(d))
    return totals, trend, daily


def teams(session: Session, since: datetime, now: datetime) -> tuple[list[str], list[TeamLine]]:
    """The range's days (the trend's points, as a team's page has them) and
    every team over [since, now), most spent first."""
    days = _days(since, now)
    names = session.execute(select(Team.id, Team.name)).all()
    rows = list(session.scalars(select(Budget)))
    starts = {r.team_id: budgets.period_of(r.period, now).start for r in rows}
    tails = views.unwritten(session, None, now)
    totals, trend, daily = _sums(session, min([since, *starts.values()]), since, now, tails)
    budget_of = {r.team_id: BudgetLine(r.amount, r.period, sum(
        v for when, v in daily.get(r.team_id, {}).items() if when >= starts[r.team_id].date().isoformat()))
        for r in rows}
    alerts = dict(session.execute(select(Alert.team_id, func.count()).where(Alert.open_key.is_not(None))
                                  .group_by(Alert.team_id)).all())
    out = [TeamLine(name, totals.get(i, views.Money()), budget_of.get(i), alerts.get(i, 0),
                    [trend.get(i, {}).get(d, 0.0) for d in days]) for i, name in names]
    return days, sorted(out, key=lambda t: (-t.total.cost, t.team))
