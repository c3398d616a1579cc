"""What Prometheus scrapes from /metrics, read from the database at scrape
time (a custom collector), so that every broker process of several answers
the same, and a restarted one forgets nothing.

Each scrape runs seven aggregate statements (and one for the team names), whatever the number of teams:

- money (the ledger's written entries; accrual keeps them at most two
  intervals behind): each team's spend this calendar month (UTC), in the
  last hour (its burn), and, for a budgeted team, what is left of the
  budget's period. The statement reads only entries since the earliest of
  those starts (at most ~31 days; the same range a budget's alerts read);
- jobs by team and state; preemptions and recoveries by team;
- checkpoint flush seconds: the `seconds` that the agent's
  `checkpoint_committed` event reports for each checkpoint written on a
  notice or a drain (reason `flush`; stored on `checkpoints.seconds`), as a
  histogram per team;
- placement decisions: one attempt per launch decision, by cloud and
  spot/on-demand, and the jobs waiting now (the policy chose to wait).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs.states import EndReason
from spotbroker.broker.money import budgets
from spotbroker.broker.money.models import Budget, LedgerEntry
from spotbroker.broker.store.models import Attempt, Checkpoint, Job, Team

# Seconds a flush may take: a notice gives 120 s (AWS) or 30 s (GCP, Azure).
FLUSH_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0)
RECLAIMS = (str(EndReason.PREEMPTED), str(EndReason.VANISHED))


def money(session: Session, names: dict[int, str], now: datetime) -> Iterator[Metric]:
    """Spend this month and in the last hour per team; the budget's standing."""
    starts = {p: budgets.period_of(p, now).start for p in ("day", "week", "month")}
    hour = now - timedelta(hours=1)
    since = min([*starts.values(), hour])
    cols = [func.sum(case((LedgerEntry.start_at >= s, LedgerEntry.amount), else_=0.0)) for s in starts.values()]
    cols.append(func.sum(case((LedgerEntry.start_at >= hour, LedgerEntry.amount), else_=0.0)))
    spent: dict[int, dict[str, float]] = {}
    for team_id, day, week, month, last_hour in session.execute(
            select(LedgerEntry.team_id, *cols).where(LedgerEntry.start_at >= since, LedgerEntry.start_at < now)
            .group_by(LedgerEntry.team_id)):
        spent[team_id] = {"day": day or 0.0, "week": week or 0.0, "month": month or 0.0, "1h": last_hour or 0.0}
    cost = GaugeMetricFamily("spotbroker_team_cost_month_dollars",
                             "Dollars a team spent this calendar month (UTC), from the ledger", labels=["team"])
    rate = GaugeMetricFamily("spotbroker_team_spend_rate_dollars_per_hour",
                             "A team's spend over the last hour, in dollars per hour", labels=["team"])
    for team_id, name in names.items():
        s = spent.get(team_id, {})
        cost.add_metric([name], s.get("month", 0.0))
        rate.add_metric([name], s.get("1h", 0.0))
    burn = GaugeMetricFamily("spotbroker_team_burn_rate",
                             "A budgeted team's last hour of spend over its budget's even rate (1 = on pace)",
                             labels=["team", "period"])
    remaining = GaugeMetricFamily("spotbroker_team_budget_remaining_dollars",
                                  "What is left of a team's budget this period (negative: over)",
                                  labels=["team", "period"])
    amount = GaugeMetricFamily("spotbroker_team_budget_dollars", "A team's budget per period",
                               labels=["team", "period"])
    for team_id, budget, period in session.execute(select(Budget.team_id, Budget.amount, Budget.period)):
        if team_id not in names:
            continue
        s, labels = spent.get(team_id, {}), [names[team_id], period]
        even = budget / budgets.period_of(period, now).hours
        # a budget of a few 1e-324 dollars spread over a month is 0 $/h: any spend is an infinite burn
        last = s.get("1h", 0.0)
        burn.add_metric(labels, last / even if even > 0 else math.inf if last > 0 else 0.0)
        remaining.add_metric(labels, budget - s.get(period, 0.0))
        amount.add_metric(labels, budget)
    yield from (cost, rate, burn, remaining, amount)


def jobs(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """Jobs by team and state; preemptions and recoveries by team."""
    by_state = GaugeMetricFamily("spotbroker_jobs", "Jobs by team and state", labels=["team", "state"])
    recoveries = CounterMetricFamily("spotbroker_recoveries", "Preempted jobs recovered on a new attempt",
                                     labels=["team"])
    totals: dict[int, int] = {}
    for team_id, state, count, recovered in session.execute(
            select(Job.team_id, Job.state, func.count(), func.sum(Job.recoveries)).group_by(Job.team_id, Job.state)):
        if team_id in names:
            by_state.add_metric([names[team_id], state], count)
            totals[team_id] = totals.get(team_id, 0) + int(recovered or 0)
    preempted = CounterMetricFamily("spotbroker_preemptions", "Attempts the cloud reclaimed (a notice, or the "
                                    "node vanished)", labels=["team", "cloud"])
    for team_id, cloud, count in session.execute(
            select(Job.team_id, Attempt.cloud, func.count()).join(Job, Job.id == Attempt.job_id)
            .where(Attempt.end_reason.in_(RECLAIMS)).group_by(Job.team_id, Attempt.cloud)):
        if team_id in names:
            preempted.add_metric([names[team_id], cloud], count)
    for team_id, name in names.items():
        recoveries.add_metric([name], totals.get(team_id, 0))
    yield from (by_state, preempted, recoveries)


def flushes(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """Seconds each flush on a notice or a drain took, as the agent reported it."""
    cols = [func.sum(case((Checkpoint.seconds <= b, 1), else_=0)) for b in FLUSH_BUCKETS]
    family = HistogramMetricFamily("spotbroker_checkpoint_flush_seconds",
                                   "Seconds from a flush request to its committed checkpoint (agent-reported)",
                                   labels=["team"])
    for team_id, count, total, *below in session.execute(
            select(Job.team_id, func.count(), func.sum(Checkpoint.seconds), *cols)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.reason == "flush", Checkpoint.seconds.is_not(None)).group_by(Job.team_id)):
        if team_id in names:
            buckets = [(str(b), int(n or 0)) for b, n in zip(FLUSH_BUCKETS, below, strict=True)]
            family.add_metric([names[team_id]], [*buckets, ("+Inf", int(count))], float(total or 0.0))
    yield family


def placements(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """Launch decisions (one attempt each) and the jobs the policy keeps waiting."""
    launched = CounterMetricFamily("spotbroker_placement_decisions", "Launch decisions (attempts) by cloud and "
                                   "market", labels=["team", "cloud", "market"])
    for team_id, cloud, spot, count in session.execute(
            select(Job.team_id, Attempt.cloud, Attempt.use_spot, func.count()).join(Job, Job.id == Attempt.job_id)
            .group_by(Job.team_id, Attempt.cloud, Attempt.use_spot)):
        if team_id in names:
            launched.add_metric([names[team_id], cloud, "spot" if spot else "on_demand"], count)
    waiting = GaugeMetricFamily("spotbroker_jobs_waiting_for_placement", "Pending jobs the placement policy "
                                "chose to wait with (for spot capacity or a better price)", labels=["team"])
    for team_id, count in session.execute(
            select(Job.team_id, func.count()).where(Job.state == "PENDING", Job.reason.like("waiting:%"))
            .group_by(Job.team_id)):
        if team_id in names:
            waiting.add_metric([names[team_id]], count)
    yield from (launched, waiting)


class MoneyCollector(Collector):
    """The broker's metrics, read from the database on each scrape."""

    def __init__(self, factory: sessionmaker[Session], clock: Clock = SYSTEM_CLOCK) -> None:
        self.factory, self.clock = factory, clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        with self.factory() as session:
            names = dict(session.execute(select(Team.id, Team.name)).all())
            out = [*money(session, names, now), *jobs(session, names), *flushes(session, names),
                   *placements(session, names)]
        yield from out
