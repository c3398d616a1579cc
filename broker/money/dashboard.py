"""What the dashboard's pages show, assembled in one call per page from the
ledger's reads (views.py), so the page and the costs API agree: the same
functions give the same totals.

A team's page: spend per day by cloud and by GPU, where the budget's period
stands (spent, the even-rate line, the forecast at the last 6 hours' rate,
as the forecast alert computes it), savings and waste, the top jobs by cost
with each attempt's span, price and end, checkpoint storage, open alerts.
The admin's overview: every team's spend over the same range.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import RECLAIMED
from spotbroker.broker.money import budgets, ledger, service, storage, views
from spotbroker.broker.money.alerts import WINDOWS
from spotbroker.broker.money.models import Alert, LedgerEntry
from spotbroker.broker.store.models import Attempt, Job, Team

TOP_JOBS = 8
_RECLAIMED = frozenset(str(r) for r in RECLAIMED)


@dataclass(frozen=True)
class AttemptSpan:
    id: int
    start: datetime
    end: datetime            # its end, or now while it runs
    running: bool
    reclaimed: bool          # preempted or vanished: the cloud took it
    end_reason: str | None
    cloud: str
    where: str               # region/zone
    gpu: str
    spot: bool
    price: float             # per node-hour, at launch
    nodes: int
    cost: float


@dataclass(frozen=True)
class JobLine:
    id: int
    name: str
    state: str
    cost: float
    attempts: list[AttemptSpan]


@dataclass(frozen=True)
class BudgetView:
    amount: float
    period: str
    start: datetime
    end: datetime
    spent: float
    cumulative: list[tuple[datetime, float]]   # spend to the end of each day of the period, then to now
    rate_6h: float                              # $/h over the last 6 hours
    forecast: float                             # the period's end at that rate
    burn: dict[str, float]                      # window -> multiple of the even rate

    @property
    def even_rate(self) -> float:
        return self.amount / ((self.end - self.start).total_seconds() / 3600)


@dataclass
class TeamPage:
    team: str
    since: datetime
    until: datetime
    total: views.Money
    days: list[str]
    by_cloud: dict[str, dict[str, float]]       # day -> cloud -> dollars
    by_gpu: dict[str, dict[str, float]]         # day -> GPU -> dollars
    jobs: list[JobLine]
    budget: BudgetView | None
    checkpoints: int
    checkpoint_bytes: int
    storage_monthly_cost: float  # at the configured prices per storage class
    alerts: list[Alert]
    teams: list[str] = field(default_factory=list)   # the admin's switcher


@dataclass(frozen=True)
class TeamSpend:
    team: str
    total: views.Money


def _days(since: datetime, until: datetime) -> list[str]:
    day, out = since.date(), []
    while datetime.combine(day, datetime.min.time(), since.tzinfo) < until:
        out.append(day.isoformat())
        day += timedelta(days=1)
    return out


def _grid(session: Session, team_id: int, since: datetime, until: datetime,
          now: datetime) -> tuple[dict, dict]:
    """Dollars per (day, cloud) and per (day, GPU) with `start_at` in the
    range, written entries plus the open attempts' tail, keyed as the costs
    API keys its groups (views' own key functions)."""
    day_cols = views._key_columns(session, "day")
    query = (select(*day_cols, LedgerEntry.cloud, LedgerEntry.accelerator, func.sum(LedgerEntry.amount))
             .where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since, LedgerEntry.start_at < until)
             .group_by(*day_cols, LedgerEntry.cloud, LedgerEntry.accelerator))
    by_cloud, by_gpu = defaultdict(lambda: defaultdict(float)), defaultdict(lambda: defaultdict(float))

    def add(day: str, cloud: str, gpu: str, amount: float) -> None:
        by_cloud[day][cloud] += amount
        by_gpu[day][gpu] += amount

    for day, cloud, gpu, amount in session.execute(query):
        add(views._key("day", (day,)), views._key("cloud", (cloud,)), views._key("gpu", (gpu,)), amount or 0.0)
    for attempt, accrued_to in views.open_attempts(session, team_id):
        drafts, _, _ = ledger.pending(session, attempt, accrued_to, min(now, until))
        for d in drafts:
            if since <= d.start_at < until:
                add(*(views._draft_key(k, d, attempt) for k in ("day", "cloud", "gpu")), d.amount)
    return by_cloud, by_gpu


def _jobs(session: Session, report: views.Report, now: datetime) -> list[JobLine]:
    top = sorted(report.groups.items(), key=lambda kv: -kv[1].cost)[:TOP_JOBS]
    if not top:
        return []
    ids = [int(k) for k, _ in top]
    jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids)))}
    attempts = list(session.scalars(select(Attempt).where(Attempt.job_id.in_(ids), Attempt.started_at.is_not(None))
                                    .order_by(Attempt.started_at)))
    costs = views.attempt_costs(session, attempts, now)
    spans = defaultdict(list)
    for a in attempts:
        spans[a.job_id].append(AttemptSpan(
            id=a.id, start=a.started_at, end=a.ended_at or now, running=a.ended_at is None,
            reclaimed=a.end_reason in _RECLAIMED, end_reason=a.end_reason, cloud=a.cloud,
            where="/".join(p for p in (a.region, ledger.place(a)) if p) or "local", gpu=a.accelerator or "none",
            spot=a.use_spot, price=a.price_per_hour, nodes=a.num_nodes, cost=costs.get(a.id, 0.0)))
    return [JobLine(id=int(k), name=jobs[int(k)].name, state=str(jobs[int(k)].state), cost=m.cost,
                    attempts=spans[int(k)]) for k, m in top if int(k) in jobs]


def _budget(session: Session, team_id: int, now: datetime) -> BudgetView | None:
    row = budgets.get(session, team_id)
    if row is None:
        return None
    period = budgets.period_of(row.period, now)
    daily = views.team_costs(session, team_id, period.start, now, "day", now)
    cumulative, running = [(period.start, 0.0)], 0.0
    for day in _days(period.start, now):
        running += daily.groups.get(day, views.Money()).cost
        end = min(datetime.fromisoformat(day).replace(tzinfo=period.start.tzinfo) + timedelta(days=1), now)
        cumulative.append((end, running))
    windows = {k: views.spend(session, team_id, now - WINDOWS[k], now) for k in ("1h", "6h")}
    even = row.amount / period.hours
    rate = windows["6h"] / 6
    return BudgetView(amount=row.amount, period=row.period, start=period.start, end=period.end,
                      spent=daily.total.cost, cumulative=cumulative, rate_6h=rate,
                      forecast=daily.total.cost + rate * (period.end - now).total_seconds() / 3600,
                      burn={k: v / (WINDOWS[k].total_seconds() / 3600) / even for k, v in windows.items()})


def team_page(session: Session, name: str, since: datetime, until: datetime, now: datetime,
              with_teams: bool = False) -> TeamPage:
    """Everything a team's page shows (raises service.TeamNotFound). The
    total and the per-job figures are the costs API's own (views.team_costs)."""
    team_id = service.team_id(session, name)
    report = views.team_costs(session, team_id, since, until, "job", now)
    by_cloud, by_gpu = _grid(session, team_id, since, until, now)
    stored = storage.storage_summary(session, team_id)
    alerts = list(session.scalars(select(Alert).where(Alert.team_id == team_id, Alert.open_key.is_not(None))
                                  .order_by(Alert.id.desc())))
    return TeamPage(team=name, since=since, until=until, total=report.total, days=_days(since, until),
                    by_cloud=by_cloud, by_gpu=by_gpu, jobs=_jobs(session, report, now),
                    budget=_budget(session, team_id, now), checkpoints=stored.checkpoints,
                    checkpoint_bytes=stored.bytes, storage_monthly_cost=stored.monthly_cost,
                    alerts=alerts, teams=team_names(session) if with_teams else [])


def team_names(session: Session) -> list[str]:
    return list(session.scalars(select(Team.name).order_by(Team.name)))


def overview(session: Session, since: datetime, until: datetime, now: datetime) -> list[TeamSpend]:
    """Every team's spend over the range (the admin's first page), most first."""
    teams = session.execute(select(Team.id, Team.name).order_by(Team.name)).all()
    totals = views.every_team(session, since, until, now)
    out = [TeamSpend(n, totals.get(i, views.Money())) for i, n in teams]
    return sorted(out, key=lambda t: (-t.total.cost, t.team))
