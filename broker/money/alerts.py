"""Burn-rate alerts on every team's budget, evaluated in the background.

The even rate is the budget spread over its period ($/h). Burn = spend in a
window ÷ the window's hours ÷ the even rate. Rules (each can be turned off
per budget, see budgets.Rules):

- fast_burn: the 1 h and the 5 min windows both burn ≥ 14.4× (2 % of a
  month's budget in an hour, and still now);
- slow_burn: the 6 h and the 30 min windows both burn ≥ 6×;
- forecast: what is spent plus the running attempts' rate (price × nodes,
  now) to the period's end is over budget (an average over past hours
  would dilute a job that just started);
- spend_N: N % of the budget actually spent (50/80/100 by default): one
  alert per period, which escalates to the next threshold crossed;
- committed: the running attempts' rate would spend what is left in under
  `committed_hours` (24 by default), when the forecast does not already say so;
- hard_cap: the budget is spent; new jobs are held (always on).

An alert is opened once per (team, condition) while it holds; a rate's
alert (burn, forecast, committed) resolves once it has been clear for
`hold` (a preemption's few minutes between attempts do not resolve and
refire it), a spend's or the cap's as soon as it clears (a new period).
Opening, escalating and resolving each queue one notification per target
in the same transaction (the outbox, notify.py), unless the rule is
silenced; a spend threshold of 100 % or more reached while the hard cap
holds sends nothing of its own (the cap's message says it). Spend is the ledger's written entries (accrual writes whole
intervals, so they stop at most two intervals back) plus the unwritten
rest of each open attempt at its price, so a window counts to now and a
crossing is seen by the first evaluation after it, whether or not an
accrual ran in between. The rest is priced at the launch price: a spot
price change is counted from the next accrual on, at most two intervals
late, with no per-attempt query for it.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, func, or_, select, true
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.money import budgets
from spotbroker.broker.store.db import driver_said
from spotbroker.broker.store.models import Attempt, Job, Team
from spotbroker.broker.store.moneymodels import Alert, AlertSilence, Budget, LedgerCursor, LedgerEntry, Notification

log = logging.getLogger("spotbroker.money")
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


def gather(session: Session, now: datetime, teams: set[int] | None = None) -> dict[int, Spend]:
    """Every budgeted team's spend (or those of `teams`), in four statements
    whatever their number."""
    budgeted = Budget.team_id.in_(teams) if teams is not None else true()
    starts = {p: budgets.period_of(p, now).start for p in ("day", "week", "month")}
    since = min([*starts.values(), now - WINDOWS["6h"]])
    cols = [func.sum(case((LedgerEntry.start_at >= s, LedgerEntry.amount), else_=0.0)) for s in starts.values()]
    cols += [func.sum(case((LedgerEntry.start_at >= now - w, LedgerEntry.amount), else_=0.0))
             for w in WINDOWS.values()]
    kinds = {r.team_id: r.period for r in session.execute(select(Budget.team_id, Budget.period).where(budgeted))}
    out = {team_id: Spend(windows=dict.fromkeys(WINDOWS, 0.0)) for team_id in kinds}
    rows = session.execute(select(LedgerEntry.team_id, *cols).join(Budget, Budget.team_id == LedgerEntry.team_id)
                           .where(budgeted, LedgerEntry.start_at >= since, LedgerEntry.start_at < now)
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
            .where(budgeted, Attempt.started_at.is_not(None),
                   or_(Attempt.ended_at.is_(None), Attempt.ended_at > since),
                   or_(LedgerCursor.closed.is_(False), LedgerCursor.attempt_id.is_(None)))):
        if team_id in out:   # the unwritten rest of an open attempt, in each window it falls in
            _add_tail(out[team_id], kinds[team_id], starts, now, accrued_to or started,
                      min(ended, now) if ended else now, rate or 0.0)
    for team_id, rate in session.execute(
            select(Job.team_id, func.sum(Attempt.price_per_hour * Attempt.num_nodes))
            .join(Job, Job.id == Attempt.job_id).join(Budget, Budget.team_id == Job.team_id)
            .where(budgeted, Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES])).group_by(Job.team_id)):
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


def key_of(rule: str) -> str:
    """The condition an alert stands for: every spend threshold is one."""
    return "spend" if rule.startswith("spend_") else rule


# Rates come and go with attempts: these resolve only once clear for a while.
RATE_RULES = frozenset({"fast_burn", "slow_burn", "forecast", "committed"})
# Where the dashboard sends its reader instead of a command: the job that spends, or the budget.
LINKS = {"fast_burn": "job", "slow_burn": "job", "forecast": "job", "committed": "job", "spend": "budget",
         "hard_cap": "budget"}
READER_ADVICE = {
    "fast_burn": "Look at the job spending it, and stop what should not run",
    "slow_burn": "Look at the jobs started today",
    "forecast": "Look at the running jobs: slow down, or ask the admin to raise the budget before then",
    "committed": "Look at the running jobs: stop what can wait, or ask the admin to raise the budget",
    "spend": "See where the budget went",
    "hard_cap": "New jobs wait until the admin raises the budget or the next period starts",
}


def conditions(budget: Budget, spend: Spend, now: datetime, team: str = "TEAM") -> list[Condition]:
    """The rules of one budget that hold now. Functions of this size read
    better whole: each rule is three lines of arithmetic and its words."""
    rules = budgets.Rules.model_validate(budget.rules or {})
    period = budgets.period_of(budget.period, now)
    even = budget.amount / period.hours
    burn = {k: spend.windows[k] / (w.total_seconds() / 3600) / even for k, w in WINDOWS.items()}
    left = budget.amount - spend.period
    hours_left = (period.end - now).total_seconds() / 3600
    look = f"`spotbroker costs --team {team} --group-by job` shows where it goes"
    raise_it = f"`spotbroker budget set {team} AMOUNT --period {budget.period}` (admin) raises the budget"
    out = []
    if rules.fast_burn and burn["1h"] >= FAST and burn["5m"] >= FAST:
        # The pace is the last five minutes': the hour's dollars as a rate counted the minutes
        # before a job started (a job 4 minutes old: "0.6 h more" when 3 minutes were left).
        pace = spend.windows["5m"] / (WINDOWS["5m"].total_seconds() / 3600)
        out.append(Condition("fast_burn", "critical", f"spending {burn['1h']:.1f}x the budget's even rate over "
                             f"the last hour (${spend.windows['1h']:.2f}); the {budget.period}'s budget lasts "
                             f"{_hours(left, pace)} more at the last 5 minutes' pace (${pace:.2f}/h)",
                             f"{look}; `spotbroker cancel JOB` stops what should not run, or {raise_it}",
                             burn["1h"], FAST))
    if rules.slow_burn and burn["6h"] >= SLOW and burn["30m"] >= SLOW:
        out.append(Condition("slow_burn", "warning", f"spending {burn['6h']:.1f}x the budget's even rate over "
                             f"the last 6 hours (${spend.windows['6h']:.2f})",
                             f"{look}; check the jobs started today", burn["6h"], SLOW))
    rate = spend.committed_rate
    forecast = spend.period + rate * hours_left
    if rules.forecast and rate > 0 and left > 0 and forecast > budget.amount:
        out_at = now + timedelta(hours=left / rate)
        out.append(Condition("forecast", "warning", f"the running jobs cost ${rate:.2f}/h; with the "
                             f"${spend.period:.2f} spent, the {budget.period} ends at ${forecast:.2f} of "
                             f"${budget.amount:.2f}: the budget runs out about {out_at:%Y-%m-%d %H:%M} UTC",
                             f"{look}; slow down, or {raise_it} before then", forecast, budget.amount))
    crossed = [t for t in sorted(set(rules.thresholds)) if spend.period >= budget.amount * t / 100]
    if crossed:
        t = crossed[-1]
        out.append(Condition(f"spend_{t:g}", "critical" if t >= 100 else "warning",
                             f"{spend.period / budget.amount * 100:.0f}% of the {budget.period}'s budget "
                             f"spent (${spend.period:.2f} of ${budget.amount:.2f}; threshold {t:g}%)",
                             look, spend.period, budget.amount * t / 100))
    forecasting = any(c.rule == "forecast" for c in out)
    if not forecasting and rate > 0 and 0 < left < rate * rules.committed_hours:
        out.append(Condition("committed", "warning", f"the running jobs cost ${rate:.2f}/h, "
                             f"which spends the ${left:.2f} left in {_hours(left, rate)}",
                             f"{look}; `spotbroker cancel JOB` stops what can wait, or {raise_it}",
                             left / rate, rules.committed_hours))
    if spend.period >= budget.amount:
        action = ("running jobs are stopped (checkpoints kept) and new ones held"
                  if budget.hard_cap_action == "stop_running" else "new jobs are held")
        out.append(Condition("hard_cap", "critical", f"the {budget.period}'s budget of ${budget.amount:.2f} is "
                             f"spent (${spend.period:.2f}): {action}",
                             f"{raise_it} and releases the held jobs; or wait for the next {budget.period}",
                             spend.period, budget.amount))
    return out


def _hours(left: float, rate: float) -> str:
    if left <= 0:
        return "no time"
    if rate <= 0:
        return "indefinitely"
    hours = left / rate
    return f"{hours:.1f} h" if hours >= 1 else f"{max(1, round(hours * 60))} min"


def live(session: Session, open_alerts: list[Alert], now: datetime) -> dict[int, Condition | None]:
    """Each open alert's condition read now (None: it no longer holds, the
    alert waits out its hold), so what a reader sees is not the figure of
    the minute it fired; a few statements for all of them."""
    teams = {a.team_id for a in open_alerts}
    if not teams:
        return {}
    spend = gather(session, now, teams)
    names = {r.id: r.name for r in session.execute(select(Team.id, Team.name).where(Team.id.in_(teams)))}
    holding = {}
    for budget in session.scalars(select(Budget).where(Budget.team_id.in_(teams))):
        for c in conditions(budget, spend[budget.team_id], now, names.get(budget.team_id, "TEAM")):
            holding[(budget.team_id, key_of(c.rule))] = c
    return {a.id: holding.get((a.team_id, key_of(a.rule))) for a in open_alerts}


def as_read(alert: Alert, live: Condition | None, now: datetime) -> tuple[str, str, float | None, datetime]:
    """(severity, summary, value, when read) of an alert as a reader sees it:
    an open one's condition read now; one open that no longer holds (it
    waits out its hold, or the money loop has not looked since) says so,
    with the figures it last had and their time, not as if read now."""
    if live is not None:
        return live.severity, live.summary, live.value, now
    if alert.open_key is None:
        return alert.severity, alert.summary, alert.value, now
    last = (alert.history or [{}])[-1].get("at")
    when = datetime.fromisoformat(last) if last else alert.fired_at
    return (alert.severity, f"no longer holds; at {when:%H:%M} UTC it read: {alert.summary}", alert.value, when)


def _event(kind: str, c: Condition | Alert, now: datetime) -> dict:
    return {"at": now.isoformat(), "kind": kind, "rule": c.rule, "severity": c.severity, "summary": c.summary,
            "value": c.value}


def evaluate(session: Session, now: datetime, hold: timedelta = timedelta(minutes=15)) -> tuple[int, int]:
    """Open, escalate and resolve alerts for every budget; (opened, resolved).
    Each budget in a savepoint of its own: one that fails (a database error
    while queuing its notifications) is told and left for the next pass,
    and never stops the other teams' alerts (it stopped them all, with the
    hard cap's stops and every delivery, pass after pass)."""
    spend = gather(session, now)
    names = {r.id: r.name for r in session.execute(select(Team.id, Team.name).join(Budget, Budget.team_id == Team.id))}
    open_ = {}
    for alert in session.scalars(select(Alert).where(Alert.open_key.is_not(None)).order_by(Alert.id)):
        earlier = open_.get((alert.team_id, key_of(alert.rule)))
        if earlier is not None:   # spend_50/80/100 opened apart before they were one alert: keep the newest
            earlier.open_key, earlier.resolved_at = None, now
        open_[(alert.team_id, key_of(alert.rule))] = alert
    silenced = {(s.team_id, s.rule) for s in session.scalars(select(AlertSilence).where(AlertSilence.until > now))}
    opened = resolved = 0
    for budget in session.scalars(select(Budget)).all():
        team = names[budget.team_id]
        mine = {key: alert for (t, key), alert in open_.items() if t == budget.team_id}
        quiet = {rule for (t, rule) in silenced if t == budget.team_id}
        try:
            with session.begin_nested():
                o, r = _evaluate_budget(session, budget, team, spend[budget.team_id], mine, quiet, now, hold)
        except SQLAlchemyError as exc:
            log.error("money: team %s's alerts were not evaluated this pass (the other teams' were): %s",
                      team, driver_said(exc))
            continue
        opened, resolved = opened + o, resolved + r
    return opened, resolved


def _evaluate_budget(session: Session, budget: Budget, team: str, spend: Spend, open_: dict[str, Alert],
                     quiet: set[str], now: datetime, hold: timedelta) -> tuple[int, int]:
    """One budget's alerts: `open_` by key_of(rule). A spend alert opened
    under another amount is resolved first, so that each threshold of the
    budget in force is told once (a raised budget compared its thresholds
    with the old one's dollars: a lower step told as an escalation, a
    crossing of the new 80 % never told, or told twice)."""
    holding = {key_of(c.rule): c for c in conditions(budget, spend, now, team)}
    capped = "hard_cap" in holding   # the cap's own message says the budget is spent
    opened = resolved = 0
    spent = open_.get("spend")
    if spent is not None and not math.isclose(spent.threshold or 0.0, budget.amount * _percent(spent.rule) / 100):
        changed = (f"the {budget.period}'s budget is now ${budget.amount:.2f}, with ${spend.period:.2f} spent "
                   f"({spend.period / budget.amount * 100:.0f}%)")
        _resolve(session, budget, spent, team, quiet, now, changed)
        del open_["spend"]
        resolved += 1
    for key, c in holding.items():
        alert = open_.get(key)
        if alert is None:
            alert = Alert(team_id=budget.team_id, rule=c.rule, open_key=f"{budget.team_id}:{key}",
                          severity=c.severity, summary=c.summary, advice=c.advice, value=c.value,
                          threshold=c.threshold, fired_at=now, history=[_event("fire", c, now)])
            session.add(alert)
            session.flush()
            if not (capped and key == "spend" and c.threshold >= budget.amount):
                _queue(session, budget, alert, team, "fire", quiet, now)
            opened += 1
            continue
        if alert.clear_since is not None:
            alert.clear_since = None
        if key == "spend" and _percent(c.rule) > _percent(alert.rule):
            alert.rule, alert.severity, alert.threshold = c.rule, c.severity, c.threshold
            alert.summary, alert.value = c.summary, c.value
            alert.history = [*(alert.history or []), _event("escalate", c, now)]
            if not (capped and c.threshold >= budget.amount):
                _queue(session, budget, alert, team, f"escalate_{c.rule[6:]}"[:16], quiet, now)
    for key, alert in open_.items():
        if key in holding:
            continue
        if key in RATE_RULES and hold > timedelta(0):
            if alert.clear_since is None:
                alert.clear_since = now
            if now - alert.clear_since < hold:
                continue
        _resolve(session, budget, alert, team, quiet, now)
        resolved += 1
    return opened, resolved


def _percent(rule: str) -> float:
    """A spend rule's threshold, in percent of the budget (`spend_80`: 80)."""
    return float(rule.removeprefix("spend_"))


def _resolve(session: Session, budget: Budget, alert: Alert, team: str, quiet: set[str], now: datetime,
             why: str | None = None) -> None:
    """`why`: what ended it, when not the condition itself (the budget changed)."""
    alert.open_key, alert.resolved_at, alert.clear_since = None, now, None
    alert.history = [*(alert.history or []), {"at": now.isoformat(), "kind": "resolve"}]
    _queue(session, budget, alert, team, "resolve", quiet, now, why)


def _queue(session: Session, budget: Budget, alert: Alert, team: str, kind: str, quiet: set[str],
           now: datetime, why: str | None = None) -> None:
    if alert.rule in quiet or "*" in quiet or (alert.rule.startswith("spend_") and "spend_N" in quiet):
        return
    # Each says when: a message delivered after a receiver's outage is read as of its time.
    if kind == "fire":
        title = f"[spotbroker] {alert.severity}: team {team}: {alert.rule.replace('_', ' ')}"
        body = f"Fired at {now:%Y-%m-%d %H:%M} UTC: {alert.summary}.\nWhat to do: {alert.advice}."
    elif kind.startswith("escalate"):
        title = f"[spotbroker] {alert.severity}: team {team}: {alert.rule.replace('_', ' ')}% (escalated)"
        body = f"Escalated at {now:%Y-%m-%d %H:%M} UTC: {alert.summary}.\nWhat to do: {alert.advice}."
    else:  # (a spend alert by its name alone: the step it reached may be one the hard cap told instead)
        rule = "spend" if alert.rule.startswith("spend_") else alert.rule.replace("_", " ")
        title = f"[spotbroker] resolved: team {team}: {rule}"
        when = f"Resolved at {now:%Y-%m-%d %H:%M} UTC (fired {alert.fired_at:%Y-%m-%d %H:%M} UTC)"
        body = f"{when}: {why}. It said: {alert.summary}." if why else f"{when}: {alert.summary}."
    for target in budgets.targets(budget):
        session.add(Notification(alert_id=alert.id, team_id=budget.team_id, target=target.name, kind=kind,
                                 title=title, body=body, tries=0, next_try_at=now, created_at=now))
