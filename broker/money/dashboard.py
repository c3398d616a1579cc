"""What the dashboard's pages show, assembled in one call per page from the
ledger's reads (views.py), so the page and the costs API agree: the same
functions give the same totals.

A team's page: spend per day by cloud and by GPU, energy (kWh) and
emissions (kg CO2e) per day by cloud, where the budget's period
stands (spent, the even-rate line, the forecast at the running jobs' rate,
as the forecast alert computes it), savings and waste, the top jobs by cost
with each attempt's span, price and end, checkpoint storage, open alerts
(their figures read now, each linking to the job or the budget).
The admin's overview is overview.py's.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from spotbroker.broker import auth
from spotbroker.broker.checkpoints import coldtier
from spotbroker.broker.jobs.states import RECLAIMED
from spotbroker.broker.money import alerts, budgets, ledger, views
from spotbroker.broker.money.alerts import WINDOWS
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.models import Attempt, Job, Team
from spotbroker.broker.store.moneymodels import Alert, Budget

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
    running_rate: float                         # $/h of the attempts running now (price × nodes)
    forecast: float                             # the period's end: spent + the running rate to the end
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
    kwh_by_cloud: dict[str, dict[str, float]]   # day -> cloud -> kWh
    co2e_by_cloud: dict[str, dict[str, float]]  # day -> cloud -> kg CO2e
    jobs: list[JobLine]
    budget: BudgetView | None
    checkpoints: int
    checkpoint_bytes: int
    storage_monthly_cost: float  # at the configured prices per storage class
    alerts: list[AlertLine]
    teams: list[str] = field(default_factory=list)   # the admin's switcher


@dataclass(frozen=True)
class AlertLine:
    """An open alert as the page says it: its figures read now, and for its
    reader a link (the job that spends, or the budget) instead of a command."""

    id: int
    rule: str
    severity: str
    summary: str
    advice: str
    link: str            # an anchor on the page
    link_text: str
    fired_at: datetime
    clear_since: datetime | None


def _days(since: datetime, until: datetime) -> list[str]:
    day, out = since.date(), []
    while datetime.combine(day, datetime.min.time(), since.tzinfo) < until:
        out.append(day.isoformat())
        day += timedelta(days=1)
    return out


def _jobs(session: Session, by_job: dict[str, views.Money], tails: list[views.Unwritten],
          now: datetime) -> list[JobLine]:
    """The top jobs by cost in the range, each with all its attempts (their
    whole cost, as the job's own API answers it)."""
    top = sorted(by_job.items(), key=lambda kv: (-kv[1].cost, kv[0]))[:TOP_JOBS]
    if not top:
        return []
    jobs, spans, attempts = {}, defaultdict(list), []
    for job_id, name, state, a in session.execute(
            select(Job.id, Job.name, Job.state, Attempt)
            .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.started_at.is_not(None)))
            .where(Job.id.in_([int(k) for k, _ in top])).order_by(Attempt.started_at)):
        jobs[job_id] = (name, state)
        if a is not None:
            attempts.append(a)
    costs = views.attempt_costs(session, attempts, now, tails)
    for a in attempts:
        spans[a.job_id].append(AttemptSpan(
            id=a.id, start=a.started_at, end=a.ended_at or now, running=a.ended_at is None,
            reclaimed=a.end_reason in _RECLAIMED, end_reason=a.end_reason, cloud=a.cloud,
            where="/".join(p for p in (a.region, ledger.place(a)) if p) or "local", gpu=a.accelerator or "none",
            spot=a.use_spot, price=a.price_per_hour, nodes=a.num_nodes, cost=costs.get(a.id, 0.0)))
    return [JobLine(id=int(k), name=jobs[int(k)][0], state=str(jobs[int(k)][1]), cost=m.cost,
                    attempts=spans[int(k)]) for k, m in top if int(k) in jobs]


def _alerts(session: Session, team_id: int, tails: list[views.Unwritten], jobs: list[JobLine],
            now: datetime) -> list[AlertLine]:
    """The team's open alerts, read now (no statement more when none is open)."""
    found = list(session.scalars(select(Alert).where(Alert.team_id == team_id, Alert.open_key.is_not(None))
                                 .order_by(Alert.id.desc())))
    if not found:
        return []
    figures = alerts.live(session, found, now)
    running = [t.attempt for t in tails if t.attempt.ended_at is None]
    top = max(running, key=lambda a: (a.price_per_hour or 0) * a.num_nodes, default=None)
    shown = {j.id: j.name for j in jobs}
    out = []
    for a in found:
        c, key = figures.get(a.id), alerts.key_of(a.rule)
        if alerts.LINKS.get(key) == "job" and top is not None and top.job_id in shown:
            link, text = f"#job-{top.job_id}", f"job {shown[top.job_id]} (${top.price_per_hour * top.num_nodes:.2f}/h)"
        elif alerts.LINKS.get(key) == "job":
            link, text = "#attempts", "the running jobs"
        else:
            link, text = "#budget", "the budget"
        severity, summary, _, _ = alerts.as_read(a, c, now)
        out.append(AlertLine(id=a.id, rule=a.rule, severity=severity, summary=summary,
                             advice=alerts.READER_ADVICE.get(key, ""),
                             link=link, link_text=text, fired_at=a.fired_at, clear_since=a.clear_since))
    return out


def _budget(row: Budget, sums: views.Breakdown, now: datetime) -> BudgetView:
    """Where the budget's period stands, from the page's sums by day (read
    from the period's start, marked at the last 6 hours and the last hour)."""
    period = budgets.period_of(row.period, now)
    first = period.start.date().isoformat()
    daily, windows = defaultdict(float), {"6h": 0.0, "1h": 0.0}
    for (day, _, _, (_, in_6h, in_1h)), m in sums.by_day.items():
        if day >= first:
            daily[day] += m.cost
        windows["6h"] += m.cost if in_6h else 0.0
        windows["1h"] += m.cost if in_1h else 0.0
    cumulative, running = [(period.start, 0.0)], 0.0
    for day in _days(period.start, now):
        running += daily.get(day, 0.0)
        end = min(datetime.fromisoformat(day).replace(tzinfo=period.start.tzinfo) + timedelta(days=1), now)
        cumulative.append((end, running))
    even = row.amount / period.hours
    rate = sum((t.attempt.price_per_hour or 0.0) * t.attempt.num_nodes for t in sums.tails
               if t.attempt.ended_at is None and t.attempt.started_at is not None)
    return BudgetView(amount=row.amount, period=row.period, start=period.start, end=period.end,
                      spent=running, cumulative=cumulative, rate_6h=windows["6h"] / 6, running_rate=rate,
                      forecast=running + rate * (period.end - now).total_seconds() / 3600,
                      burn={k: v / (WINDOWS[k].total_seconds() / 3600) / even for k, v in windows.items()})


def team_page(session: Session, name: str, since: datetime, now: datetime, with_teams: bool = False,
              settings: MoneySettings | None = None) -> TeamPage:
    """Everything a team's page shows, from `since` to now (raises
    auth.TeamNotFound). Every chart, total and burn window is a sum of
    one grouped read of the team's entries (views.breakdown) from the
    earliest instant any of them needs; the costs API groups the same
    entries with the same keys, so the page shows what it answers."""
    team_id = auth.team_id(session, name)
    row = budgets.get(session, team_id)
    marks = (since, now - WINDOWS["6h"], now - WINDOWS["1h"])
    first = min(since, marks[1], budgets.period_of(row.period, now).start if row else since)
    sums = views.breakdown(session, team_id, first, now, marks)
    total, by_job = views.Money(), defaultdict(views.Money)
    for (job, (in_range, _, _)), m in sums.by_job.items():
        if in_range:
            total.merge(m)
            by_job[job].merge(m)
    by_cloud, by_gpu, kwh, co2e = (defaultdict(lambda: defaultdict(float)) for _ in range(4))
    for (day, cloud, gpu, (in_range, _, _)), m in sums.by_day.items():
        if in_range:
            by_cloud[day][cloud] += m.cost
            by_gpu[day][gpu] += m.cost
            kwh[day][cloud] += m.kwh
            co2e[day][cloud] += m.co2e_kg
    stored = coldtier.storage_summary(session, team_id, settings)
    jobs = _jobs(session, by_job, sums.tails, now)
    return TeamPage(team=name, since=since, until=now, total=total, days=_days(since, now),
                    by_cloud=by_cloud, by_gpu=by_gpu, kwh_by_cloud=kwh, co2e_by_cloud=co2e, jobs=jobs,
                    budget=_budget(row, sums, now) if row else None, checkpoints=stored.checkpoints,
                    checkpoint_bytes=stored.bytes, storage_monthly_cost=stored.monthly_cost,
                    alerts=_alerts(session, team_id, sums.tails, jobs, now),
                    teams=team_names(session) if with_teams else [])


def team_names(session: Session) -> list[str]:
    return list(session.scalars(select(Team.name).order_by(Team.name)))
