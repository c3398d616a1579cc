"""What Prometheus scrapes from /metrics about the whole deployment, read
from the shared database at scrape time (a custom collector), so that a
restarted broker forgets nothing.

Several replicas share one database: were each to export these, `sum()` over
pods would count every dollar once per replica. So one replica at a time
exports them: the holder of the `metrics` lease (a `money_leases` row, taken
on a scrape when free or expired, renewed by the holder's own scrapes, given
up when it shuts down). Every replica says whether it is that one
(`spotbroker_metrics_exporter`, 1 or 0). Scrape every pod, not the Service:
a pod scraped less often than the lease's hold loses it to the next.

Each scrape of the holder runs twelve aggregate statements (and one for the
team names), whatever the number of teams:

- money (the ledger's written entries; accrual keeps them at most two
  intervals behind): each team's cost since the start as counters (usage,
  corrections, the on-demand equivalent, waste: the ledger is append-only and
  these only grow, so `rate()` works; and the same for kWh and kg CO2e; a scrape reads only the entries written
  since the previous ones settled, `LedgerTotals`), this calendar month's (UTC), the last
  hour's (its burn), and, for a budgeted team, what is left of the budget's
  period;
- jobs by team and state; preemptions and recoveries by team;
- checkpoint flush seconds: the `seconds` that the agent's
  `checkpoint_committed` event reports for each checkpoint written on a
  notice or a drain (reason `flush`; stored on `checkpoints.seconds`), as a
  histogram per team;
- placement decisions: one attempt per launch decision, by cloud and
  spot/on-demand, and the jobs waiting now (the policy chose to wait);
- the alert outbox: notifications not delivered yet, and those a target
  refused at least once;
- the reconciler's lag and each price source's freshness
  (broker/metrics/ops.py).

Every team has every series, with 0 where nothing happened yet: a series that
appears only with its first event breaks `rate()` and `absent()` alerts.
"""
from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, or_, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs import reasons
from spotbroker.broker.jobs.resources import CLOUDS
from spotbroker.broker.jobs.states import EndReason, JobState
from spotbroker.broker.metrics import ops
from spotbroker.broker.money import budgets, leases
from spotbroker.broker.store.models import Attempt, Checkpoint, Job, Team
from spotbroker.broker.store.moneymodels import Budget, LedgerEntry, Notification

# Seconds a flush may take: a notice gives 120 s (AWS) or 30 s (GCP, Azure).
FLUSH_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0)
RECLAIMS = (str(EndReason.PREEMPTED), str(EndReason.VANISHED))
LEASE = "metrics"
DATABASE_UP = "1 while this broker reaches its database (the deployment's totals are read from it), else 0"

log = logging.getLogger("spotbroker")
SUMS = 8  # what LedgerTotals keeps per team: four sums of dollars, two of kWh, two of kg CO2e


class LedgerTotals:
    """Each team's sums since its first ledger entry, kept up to date by
    reading only the entries added since the last scrape: the ledger is
    append-only, and its ids grow in the order entries are written. Entries
    older than `settle` (by `created_at`) are folded into running sums up to
    the newest such id; the rest are summed again on each scrape, so a
    transaction still open when a newer entry was read is not skipped (an
    accrual pass lasts seconds, not minutes). A new holder of the metrics
    lease reads the whole ledger once."""

    SETTLE = timedelta(minutes=10)

    def __init__(self) -> None:
        self.upto, self.folded = 0, {}

    @staticmethod
    def _sums(session: Session, *where) -> dict[int, tuple[float, ...]]:
        # By sign rather than by kind: a usage entry is never negative and a correction never
        # positive (it reverses usage); waste entries carry only `wasted`.
        amount, ondemand = LedgerEntry.amount, LedgerEntry.ondemand_amount
        kwh, co2e = LedgerEntry.kwh, LedgerEntry.co2e_kg
        return {team_id: tuple(float(v or 0.0) for v in values) for team_id, *values in session.execute(select(
            LedgerEntry.team_id, func.sum(case((amount > 0, amount), else_=0.0)),
            func.sum(case((amount < 0, -amount), else_=0.0)),
            func.sum(case((ondemand > 0, ondemand), else_=0.0)),
            func.sum(LedgerEntry.wasted),
            func.sum(case((kwh > 0, kwh), else_=0.0)), func.sum(case((kwh < 0, -kwh), else_=0.0)),
            func.sum(case((co2e > 0, co2e), else_=0.0)), func.sum(case((co2e < 0, -co2e), else_=0.0)),
        ).where(*where).group_by(LedgerEntry.team_id))}

    @staticmethod
    def _add(into: dict[int, tuple[float, ...]], more: dict[int, tuple[float, ...]]) -> dict:
        for team_id, values in more.items():
            into[team_id] = tuple(a + b for a, b in zip(into.get(team_id, (0.0,) * SUMS), values, strict=True))
        return into

    def read(self, session: Session, now: datetime) -> dict[int, tuple[float, ...]]:
        settled = session.scalar(select(func.max(LedgerEntry.id)).where(
            LedgerEntry.id > self.upto, LedgerEntry.created_at < now - self.SETTLE))
        if settled is not None:
            self._add(self.folded, self._sums(session, LedgerEntry.id > self.upto, LedgerEntry.id <= settled))
            self.upto = settled
        return self._add(dict(self.folded), self._sums(session, LedgerEntry.id > self.upto))


def totals(sums: dict[int, tuple[float, ...]], names: dict[int, str]) -> Iterator[Metric]:
    """Each team's dollars since its first entry, as counters."""
    families = [
        CounterMetricFamily("spotbroker_team_cost_dollars", "Dollars a team was charged (usage entries of the "
                            "ledger); net spend is this less the corrections", labels=["team"]),
        CounterMetricFamily("spotbroker_team_cost_corrections_dollars", "Dollars taken back from a team's cost "
                            "by correction entries", labels=["team"]),
        CounterMetricFamily("spotbroker_team_ondemand_cost_dollars", "What a team's usage would have cost on "
                            "demand (savings: this less the cost)", labels=["team"]),
        CounterMetricFamily("spotbroker_team_wasted_dollars", "Dollars of work lost since the last committed "
                            "checkpoint of reclaimed attempts", labels=["team"]),
        CounterMetricFamily("spotbroker_team_energy_kwh", "Energy a team's nodes used at the wall (PUE included; "
                            "measured GPU energy where the agent reads NVML, else rated); net is this less the "
                            "corrections", labels=["team"]),
        CounterMetricFamily("spotbroker_team_energy_corrections_kwh", "Energy taken back by correction entries",
                            labels=["team"]),
        CounterMetricFamily("spotbroker_team_emissions_kg_co2e", "Emissions of a team's energy at each place's "
                            "grid intensity; net is this less the corrections", labels=["team"]),
        CounterMetricFamily("spotbroker_team_emissions_corrections_kg_co2e", "Emissions taken back by "
                            "correction entries", labels=["team"]),
    ]
    for team_id, name in names.items():
        for family, value in zip(families, sums.get(team_id, (0.0,) * SUMS), strict=True):
            family.add_metric([name], value)
    yield from families


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
    burn = GaugeMetricFamily("spotbroker_team_burn_rate_ratio",
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
    counts: dict[tuple[int, str], int] = {}
    totals_: dict[int, int] = {}
    for team_id, state, count, recovered in session.execute(
            select(Job.team_id, Job.state, func.count(), func.sum(Job.recoveries)).group_by(Job.team_id, Job.state)):
        counts[team_id, state] = count
        totals_[team_id] = totals_.get(team_id, 0) + int(recovered or 0)
    by_state = GaugeMetricFamily("spotbroker_jobs", "Jobs by team and state", labels=["team", "state"])
    for team_id, name in names.items():
        for state in JobState:
            by_state.add_metric([name, str(state)], counts.get((team_id, str(state)), 0))
    reclaimed = {(team_id, cloud): count for team_id, cloud, count in session.execute(
        select(Job.team_id, Attempt.cloud, func.count()).join(Job, Job.id == Attempt.job_id)
        .where(Attempt.end_reason.in_(RECLAIMS)).group_by(Job.team_id, Attempt.cloud))}
    preempted = CounterMetricFamily("spotbroker_preemptions", "Attempts the cloud reclaimed (a notice, or the "
                                    "node vanished)", labels=["team", "cloud"])
    recoveries = CounterMetricFamily("spotbroker_recoveries", "Preempted jobs recovered on a new attempt",
                                     labels=["team"])
    clouds = sorted({*CLOUDS, *(cloud for _, cloud in reclaimed)})
    for team_id, name in names.items():
        for cloud in clouds:
            preempted.add_metric([name, cloud], reclaimed.get((team_id, cloud), 0))
        recoveries.add_metric([name], totals_.get(team_id, 0))
    yield from (by_state, preempted, recoveries)


def flushes(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """Seconds each flush on a notice or a drain took, as the agent reported it."""
    cols = [func.sum(case((Checkpoint.seconds <= b, 1), else_=0)) for b in FLUSH_BUCKETS]
    family = HistogramMetricFamily("spotbroker_checkpoint_flush_seconds",
                                   "Seconds from a flush request to its committed checkpoint (agent-reported)",
                                   labels=["team"])
    seen = {}
    for team_id, count, total, *below in session.execute(
            select(Job.team_id, func.count(), func.sum(Checkpoint.seconds), *cols)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.reason == "flush", Checkpoint.seconds.is_not(None)).group_by(Job.team_id)):
        seen[team_id] = (int(count), float(total or 0.0), [int(n or 0) for n in below])
    for team_id, name in names.items():
        count, total, below = seen.get(team_id, (0, 0.0, [0] * len(FLUSH_BUCKETS)))
        buckets = [(str(b), n) for b, n in zip(FLUSH_BUCKETS, below, strict=True)]
        family.add_metric([name], [*buckets, ("+Inf", count)], total)
    yield family


def placements(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """Launch decisions (one attempt each) and the jobs the policy keeps waiting."""
    decided = {(team_id, cloud, bool(spot)): count for team_id, cloud, spot, count in session.execute(
        select(Job.team_id, Attempt.cloud, Attempt.use_spot, func.count()).join(Job, Job.id == Attempt.job_id)
        .group_by(Job.team_id, Attempt.cloud, Attempt.use_spot))}
    waiting = dict(session.execute(
        select(Job.team_id, func.count())
        .where(Job.state == "PENDING", or_(*(Job.reason.startswith(w) for w in reasons.PLACEMENT_WAITS)))
        .group_by(Job.team_id)).all())
    launched = CounterMetricFamily("spotbroker_placement_decisions", "Launch decisions (attempts) by cloud and "
                                   "market", labels=["team", "cloud", "market"])
    held = GaugeMetricFamily("spotbroker_jobs_waiting_for_placement", "Pending jobs the placement policy "
                             "chose to wait with (for spot capacity or a better price)", labels=["team"])
    clouds = sorted({*CLOUDS, *(cloud for _, cloud, _ in decided)})
    for team_id, name in names.items():
        for cloud in clouds:
            for spot in (True, False):
                launched.add_metric([name, cloud, "spot" if spot else "on_demand"],
                                    decided.get((team_id, cloud, spot), 0))
        held.add_metric([name], waiting.get(team_id, 0))
    yield from (launched, held)


def notifications(session: Session, names: dict[int, str]) -> Iterator[Metric]:
    """The alert outbox: what is not delivered yet, and of it what a target
    refused at least once (retried with doubling delays; `last_error` says
    why): without these a failing target showed only in the server's log."""
    rows = {team_id: (unsent, failing) for team_id, unsent, failing in session.execute(
        select(Notification.team_id, func.count(), func.count(case((Notification.tries > 0, 1))))
        .where(Notification.sent_at.is_(None)).group_by(Notification.team_id))}
    unsent = GaugeMetricFamily("spotbroker_notifications_unsent", "Alert notifications not delivered yet",
                               labels=["team"])
    failing = GaugeMetricFamily("spotbroker_notifications_failing", "Undelivered alert notifications whose "
                                "target refused them at least once (retried)", labels=["team"])
    for team_id, name in names.items():
        waiting, refused = rows.get(team_id, (0, 0))
        unsent.add_metric([name], waiting)
        failing.add_metric([name], refused)
    yield from (unsent, failing)


class MoneyCollector(Collector):
    """The deployment's metrics, read from the database on each scrape by the
    replica that holds the `metrics` lease (`hold_s`: how long it keeps it
    without a scrape)."""

    def __init__(self, factory: sessionmaker[Session], clock: Clock = SYSTEM_CLOCK, *, hold_s: float = 120.0,
                 owner: str | None = None) -> None:
        self.factory, self.clock, self.hold_s = factory, clock, hold_s
        self.owner = owner or f"metrics-{uuid.uuid4().hex[:16]}"
        self.ledger = LedgerTotals()

    def collect(self) -> Iterator[Metric]:
        """The deployment's totals, read now; with the database out of reach,
        `spotbroker_database_up 0` and none of them (the process's own
        metrics still come: a scrape then failed whole, with a 500)."""
        now = self.clock.now()
        try:
            held, _ = leases.claim(self.factory, LEASE, self.owner, now, every_s=0, hold_s=self.hold_s)
            out: list[Metric] = []
            if held:
                with self.factory() as session:
                    names = dict(session.execute(select(Team.id, Team.name)).all())
                    out = [*totals(self.ledger.read(session, now), names), *money(session, names, now),
                           *jobs(session, names), *flushes(session, names), *placements(session, names),
                           *notifications(session, names), *ops.collect(session, now)]
        except SQLAlchemyError as exc:
            log.warning("metrics: the database is out of reach (%s): only this process's own are exported",
                        type(exc).__name__)
            yield GaugeMetricFamily("spotbroker_database_up", DATABASE_UP, value=0)
            return
        yield GaugeMetricFamily("spotbroker_database_up", DATABASE_UP, value=1)
        yield GaugeMetricFamily("spotbroker_metrics_exporter", "1 on the one broker that exports the deployment's "
                                "totals (it holds the metrics lease), 0 on the others", value=1 if held else 0)
        yield from out

    def release(self) -> None:
        """Give the lease up (at shutdown), so that another broker exports at its next scrape."""
        leases.release(self.factory, LEASE, self.owner)
