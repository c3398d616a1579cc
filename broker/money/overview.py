"""The admin's first page: every team with its spend over the range, its
budget and what it spent of it this period, its open alerts, and its spend
per day over the last 30 days (the trend). A fixed number of statements whatever
the number of teams or running attempts: the open attempts' tails, then
one scan of the entries that every sum is made of, and the teams, the
budgets and the open alerts."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.money import budgets, views
from spotbroker.broker.money.dashboard import _days
from spotbroker.broker.store.models import Team
from spotbroker.broker.store.moneymodels import Alert, Budget, LedgerEntry

TREND_DAYS = 30   # whatever the page's range: a glance, and 100 teams' bars stay cheap to draw


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
    trend: list[float]                  # dollars per UTC day over the last TREND_DAYS, oldest first


def _sums(session: Session, first: datetime, since: datetime, now: datetime, tails: list[views.Unwritten],
          ) -> tuple[dict[int, views.Money], dict[int, dict[str, float]]]:
    """Per team: its money over [since, now), and its dollars per UTC day
    over [first, now) (the trend's days and the budgets' periods, which
    begin at a midnight). One scan of the entries from `first`, grouped by
    team, day and whether within the range (on PostgreSQL, of the start_at
    index)."""
    day, inside = views.day_column(session), LedgerEntry.start_at >= since
    totals: dict[int, views.Money] = defaultdict(views.Money)
    daily: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(team_id: int, when: str, within: bool, values) -> None:
        daily[team_id][when] += values[0]
        if within:
            totals[team_id].add(*values)

    for team_id, when, within, *values in session.execute(
            select(LedgerEntry.team_id, day, inside, *views._sums())
            .where(LedgerEntry.start_at >= first, LedgerEntry.start_at < now)
            .group_by(LedgerEntry.team_id, day, inside)):
        add(team_id, views.key("day", (when,)), bool(within), [v or 0.0 for v in values])
    for tail in tails:
        for d in tail.drafts:
            if first <= d.start_at < now:
                add(tail.team_id, d.start_at.date().isoformat(), d.start_at >= since, views._values(d))
    return totals, daily


def trend_start(now: datetime) -> datetime:
    """The trend's first instant: the midnight (UTC) TREND_DAYS - 1 days before today's."""
    return datetime.combine((now - timedelta(days=TREND_DAYS - 1)).date(), time.min, tzinfo=UTC)


def teams(session: Session, since: datetime, now: datetime) -> tuple[list[str], list[TeamLine]]:
    """The trend's days (the last TREND_DAYS, today's included) and every
    team over [since, now), most spent first."""
    start = trend_start(now)
    days = _days(start, now)
    names = session.execute(select(Team.id, Team.name)).all()
    rows = list(session.scalars(select(Budget)))
    starts = {r.team_id: budgets.period_of(r.period, now).start for r in rows}
    tails = views.unwritten(session, None, now)
    totals, daily = _sums(session, min([since, start, *starts.values()]), since, now, tails)
    budget_of = {r.team_id: BudgetLine(r.amount, r.period, sum(
        v for when, v in daily.get(r.team_id, {}).items() if when >= starts[r.team_id].date().isoformat()))
        for r in rows}
    alerts = dict(session.execute(select(Alert.team_id, func.count()).where(Alert.open_key.is_not(None))
                                  .group_by(Alert.team_id)).all())
    out = [TeamLine(name, totals.get(i, views.Money()), budget_of.get(i), alerts.get(i, 0),
                    [daily.get(i, {}).get(d, 0.0) for d in days]) for i, name in names]
    return days, sorted(out, key=lambda t: (-t.total.cost, t.team))
