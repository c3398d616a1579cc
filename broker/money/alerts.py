"""Burn-rate alerts on every team's budget, evaluated in the background.

The even rate is the budget spread over its period ($/h). Burn = spend in a
window ÷ the window's hours ÷ the even rate. Rules (each can be turned off
per budget, see budgets.Rules):

- fast_burn: the 1 h and the 5 min windows both burn ≥ 14.4× (2 % of a
  month's budget in an hour, and still now);
- slow_burn: the 6 h and the 30 min windows both burn ≥ 6×;
- forecast: at the last 6 h's rate the period ends over budget;
- spend_N: N % of the budget actually spent (50/80/100 by default);
- committed: the running attempts' prices (known in advance) would spend
  what is left in under `committed_hours` (24 by default);
- hard_cap: the budget is spent; new jobs are held (always on).

An alert is opened once per (team, rule) while its condition holds and
resolved when it stops; opening and resolving each queue one notification
per target in the same transaction (the outbox, notify.py), unless the rule
is silenced. Spend is the ledger's written entries (accrual writes whole
intervals, so they stop at most two intervals back) plus the unwritten
rest of each open attempt at its price, so a window counts to now and a
crossing is seen by the first evaluation after it, whether or not an
accrual ran in between. The rest is priced at the launch price: a spot
price change is counted from the next accrual on, at most two intervals
late, with no per-attempt query for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.money import budgets
from spotbroker.broker.money.models import Alert, AlertSilence, Budget, LedgerCursor, LedgerEntry, Notification
from spotbroker.broker.store.models import Attempt, Job, Team

WINDOWS = {"5m": timedelta(minutes=5), "30m": timedelta(minutes=30), "1h": timedelta(hours=1),
           "6h": timedelta(hours=6)}
FAST, SLOW = 14.4, 6.0
RULES = ("fast_burn", "slow_burn", "forecast", "committed", "hard_cap", "spend_N")


@dataclass(frozen=True)
class Condition:
    rule: str
    severity: str
    summary: str
    advice: str
    value: float
    threshold: float


@dataclass
class Spend:
    """A team's spend in its current period and in each burn window."""

    period: float = 0.0
    windows: dict[str, float] | None = None
    committed_rate: float = 0.0   # $/h of its running attempts


def gather(session: Session, now: datetime) -> dict[int, Spend]:
    """Every budgeted team's spend, in three statements whatever their number."""
    starts = {p: budgets.period_of(p, now).start for p in ("day", "week", "month")}
    since = min([*starts.values(), now - WINDOWS["6h"]])
    cols = [func.sum(case((LedgerEntry.start_at >= s, LedgerEntry.amount), else_=0.0)) for s in starts.values()]
    cols += [func.sum(case((LedgerEntry.start_at >= now - w, LedgerEntry.amount), else_=0.0))
             for w in WINDOWS.values()]
    kinds = {r.team_id: r.period for r in session.execute(select(Budget.team_id, Budget.period))}
    out = {team_id: Spend(windows=dict.fromkeys(WINDOWS, 0.0)) for team_id in kinds}
    rows = session.execute(select(LedgerEntry.team_id, *cols).join(Budget, Budget.team_id == LedgerEntry.team_id)
                           .where(LedgerEntry.start_at >= since, LedgerEntry.start_at < now)
                           .group_by(LedgerEntry.team_id))
    for team_id, day, week, month, *windows in rows:
        if team_id not in out:  # its budget was set after `kinds` was read: the next pass sees it
            continue
        s = out[team_id]
        s.period = {"day": day, "week": week, "month": month}[kinds[team_id]] or 0.0
        s.windows = {k: v or 0.0 for k, v in zip(WINDOWS, windows, strict=True)}
    for team_id, started, ended, accrued_to, rate in session.execute(
            select(Job.team_id, Attempt.started_at, Attempt.ended_at, LedgerCursor.accrued_to,
                   Attempt.price_per_hour * Attempt.num_nodes)
            .join(Job, Job.id == Attempt.job_id).join(Budget, Budget.team_id == Job.team_id)
            .outerjoin(LedgerCursor, LedgerCursor.attempt_id == Attempt.id)
            .where(Attempt.started_at.is_not(None),
                   or_(Attempt.ended_at.is_(None), Attempt.ended_at > since),
                   or_(LedgerCursor.closed.is_(False), LedgerCursor.attempt_id.is_(None)))):
        if team_id in out:   # the unwritten rest of an open attempt, in each window it falls in
            _add_tail(out[team_id], kinds[team_id], starts, now, accrued_to or started,
                      min(ended, now) if ended else now, rate or 0.0)
    for team_id, rate in session.execute(
            select(Job.team_id, func.sum(Attempt.price_per_hour * Attempt.num_nodes))
            .join(Job, Job.id == Attempt.job_id).join(Budget, Budget.team_id == Job.team_id)
            .where(Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES])).group_by(Job.team_id)):
        if team_id in out:
            out[team_id].committed_rate = rate or 0.0
    return out


def _add_tail(spend: Spend, period: str, starts: dict[str, datetime], now: datetime, start: datetime,
              end: datetime, rate: float) -> None:
    def dollars(since: datetime) -> float:
        return rate * max((end - max(start, since)).total_seconds(), 0.0) / 3600

    spend.period += dollars(starts[period])
    for k, w in WINDOWS.items():
        spend.windows[k] += dollars(now - w)


def conditions(budget: Budget, spend: Spend, now: datetime) -> list[Condition]:
    """The rules of one budget that hold now. Functions of this size read
    better whole: each rule is three lines of arithmetic and its words."""
    rules = budgets.Rules.model_validate(budget.rules or {})
    period = budgets.period_of(budget.period, now)
    even = budget.amount / period.hours
    burn = {k: spend.windows[k] / (w.total_seconds() / 3600) / even for k, w in WINDOWS.items()}
    left = budget.amount - spend.period
    hours_left = (period.end - now).total_seconds() / 3600
    look = "see `spotbroker costs --group-by job` for where it goes"
    out = []
    if rules.fast_burn and burn["1h"] >= FAST and burn["5m"] >= FAST:
        out.append(Condition("fast_burn", "critical", f"spending {burn['1h']:.1f}x the budget's even rate over "
                             f"the last hour (${spend.windows['1h']:.2f}); the {budget.period}'s budget lasts "
                             f"{_hours(left, spend.windows['1h'])} more at this pace",
                             f"{look}; cancel what should not run, or raise the budget", burn["1h"], FAST))
    if rules.slow_burn and burn["6h"] >= SLOW and burn["30m"] >= SLOW:
        out.append(Condition("slow_burn", "warning", f"spending {burn['6h']:.1f}x the budget's even rate over "
                             f"the last 6 hours (${spend.windows['6h']:.2f})",
                             f"{look}; check the jobs started today", burn["6h"], SLOW))
    rate = spend.windows["6h"] / 6
    forecast = spend.period + rate * hours_left
    if rules.forecast and rate > 0 and forecast > budget.amount:
        out_at = now + timedelta(hours=max(left, 0) / rate)
        out.append(Condition("forecast", "warning", f"at the last 6 hours' rate (${rate:.2f}/h) the "
                             f"{budget.period} ends at ${forecast:.2f} of ${budget.amount:.2f}; the budget runs "
                             f"out about {out_at:%Y-%m-%d %H:%M} UTC",
                             f"{look}; slow down, or raise the budget before then", forecast, budget.amount))
    for t in sorted(set(rules.thresholds)):
        if spend.period >= budget.amount * t / 100:
            out.append(Condition(f"spend_{t:g}", "critical" if t >= 100 else "warning",
                                 f"{spend.period / budget.amount * 100:.0f}% of the {budget.period}'s budget "
                                 f"spent (${spend.period:.2f} of ${budget.amount:.2f})",
                                 look, spend.period, budget.amount * t / 100))
    if spend.committed_rate > 0 and 0 < left < spend.committed_rate * rules.committed_hours:
        out.append(Condition("committed", "warning", f"the running jobs cost ${spend.committed_rate:.2f}/h, "
                             f"which spends the ${left:.2f} left in {_hours(left, spend.committed_rate)}",
                             f"{look}; stop what can wait, or raise the budget",
                             left / spend.committed_rate, rules.committed_hours))
    if spend.period >= budget.amount:
        action = ("running jobs are stopped (checkpoints kept) and new ones held"
                  if budget.hard_cap_action == "stop_running" else "new jobs are held")
        out.append(Condition("hard_cap", "critical", f"the {budget.period}'s budget of ${budget.amount:.2f} is "
                             f"spent (${spend.period:.2f}): {action}",
                             "raise the budget (PUT /v1/teams/{team}/budget) to release the held jobs, or wait "
                             f"for the next {budget.period}", spend.period, budget.amount))
    return out


def _hours(left: float, rate: float) -> str:
    return "no time" if left <= 0 else f"{left / rate:.1f} h" if rate > 0 else "indefinitely"


def evaluate(session: Session, now: datetime) -> tuple[int, int]:
    """Open and resolve alerts for every budget; (opened, resolved)."""
    spend = gather(session, now)
    names = {r.id: r.name for r in session.execute(select(Team.id, Team.name).join(Budget, Budget.team_id == Team.id))}
    open_ = {}
    for alert in session.scalars(select(Alert).where(Alert.open_key.is_not(None))):
        open_[(alert.team_id, alert.rule)] = alert
    silenced = {(s.team_id, s.rule) for s in session.scalars(select(AlertSilence).where(AlertSilence.until > now))}
    opened = resolved = 0
    for budget in session.scalars(select(Budget)):
        holding = {c.rule: c for c in conditions(budget, spend[budget.team_id], now)}
        quiet = {rule for (team, rule) in silenced if team == budget.team_id}
        for rule, c in holding.items():
            if (budget.team_id, rule) in open_:
                continue
            alert = Alert(team_id=budget.team_id, rule=rule, open_key=f"{budget.team_id}:{rule}",
                          severity=c.severity, summary=c.summary, advice=c.advice, value=c.value,
                          threshold=c.threshold, fired_at=now)
            session.add(alert)
            session.flush()
            _queue(session, budget, alert, names[budget.team_id], "fire", quiet, now)
            opened += 1
        for (team, rule), alert in open_.items():
            if team == budget.team_id and rule not in holding:
                alert.open_key, alert.resolved_at = None, now
                _queue(session, budget, alert, names[team], "resolve", quiet, now)
                resolved += 1
    return opened, resolved


def _queue(session: Session, budget: Budget, alert: Alert, team: str, kind: str, quiet: set[str],
           now: datetime) -> None:
    if alert.rule in quiet or "*" in quiet or (alert.rule.startswith("spend_") and "spend_N" in quiet):
        return
    if kind == "fire":
        title = f"[spotbroker] {alert.severity}: team {team}: {alert.rule.replace('_', ' ')}"
        body = f"{alert.summary}.\nWhat to do: {alert.advice}."
    else:
        title = f"[spotbroker] resolved: team {team}: {alert.rule.replace('_', ' ')}"
        body = f"Resolved at {now:%Y-%m-%d %H:%M} UTC (fired {alert.fired_at:%Y-%m-%d %H:%M} UTC): {alert.summary}."
    for target in budgets.targets(budget):
        session.add(Notification(alert_id=alert.id, team_id=budget.team_id, target=target.name, kind=kind,
                                 title=title, body=body, tries=0, next_try_at=now, created_at=now))
