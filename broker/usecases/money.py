"""What the API's money routes do, as plain functions taking a session.
Who may see a team's money is the router's to decide; here a team is found
by name or is not found (`auth.TeamNotFound`)."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.money import alerts, budgets, hardcap, views
from spotbroker.broker.store.models import Team
from spotbroker.broker.store.moneymodels import Alert, AlertSilence, Budget
from spotbroker.broker.store.sealing import Keyring


def costs(session: Session, name: str, since: datetime, until: datetime, group_by: str | None,
          now: datetime) -> views.Report:
    """A team's spend with entries starting in [since, until), grouped."""
    return views.team_costs(session, auth.team_id(session, name), since, until, group_by, now)


# --- budgets ---------------------------------------------------------------------------


class NoBudget(LookupError):
    pass


def read_budget(session: Session, name: str, now: datetime) -> tuple[Budget, budgets.Standing]:
    row = budgets.get(session, auth.team_id(session, name))
    if row is None:
        raise NoBudget(f"team {name!r} has no budget")
    return row, budgets.standing(session, row, now)


def set_budget(session: Session, name: str, body: budgets.BudgetIn, clock: Clock,
               keyring: Keyring) -> tuple[Budget, budgets.Standing]:
    """Set a team's budget (its targets sealed with `keyring`); its HELD jobs
    are looked at again at once (a raised budget releases them)."""
    team = auth.team_id(session, name)
    row = budgets.put(session, team, body, clock, keyring)
    hardcap.release_held(session, team, clock.now())
    return row, budgets.standing(session, row, clock.now())


# --- alerts ----------------------------------------------------------------------------


def list_alerts(session: Session, team: int | None, state: str, now: datetime,
                limit: int) -> list[tuple[Alert, str, datetime, alerts.Condition | None]]:
    """Alerts newest first, each with its team's name, when its figures were
    read and, open, its condition read now (None: no longer holding);
    `state` open, resolved or all."""
    query = select(Alert, Team.name).join(Team, Team.id == Alert.team_id)
    if team is not None:
        query = query.where(Alert.team_id == team)
    if state == "open":
        query = query.where(Alert.open_key.is_not(None))
    elif state == "resolved":
        query = query.where(Alert.open_key.is_(None))
    found = [tuple(r) for r in session.execute(query.order_by(Alert.id.desc()).limit(limit))]
    figures = alerts.live(session, [a for a, _ in found if a.open_key], now)
    return [(a, name, now if a.open_key else a.resolved_at, figures.get(a.id)) for a, name in found]


def silence(session: Session, name: str, rule: str, minutes: float, now: datetime) -> AlertSilence:
    row = AlertSilence(team_id=auth.team_id(session, name), rule=rule, until=now + timedelta(minutes=minutes),
                       created_at=now)
    session.add(row)
    session.flush()
    return row


def list_silences(session: Session, team: int | None, now: datetime,
                  active_only: bool = True) -> list[tuple[AlertSilence, str]]:
    """Silences newest first, each with its team's name (only those still
    in force, unless `active_only` is False)."""
    query = select(AlertSilence, Team.name).join(Team, Team.id == AlertSilence.team_id)
    if team is not None:
        query = query.where(AlertSilence.team_id == team)
    if active_only:
        query = query.where(AlertSilence.until > now)
    return [tuple(r) for r in session.execute(query.order_by(AlertSilence.id.desc()).limit(1000))]


class SilenceNotFound(LookupError):
    pass


def expire_silence(session: Session, silence_id: int, now: datetime) -> AlertSilence:
    """End a silence now (it stays listed with `until` = now, as Alertmanager
    expires one)."""
    row = session.get(AlertSilence, silence_id)
    if row is None:
        raise SilenceNotFound(f"no silence {silence_id}")
    row.until = min(row.until, now)
    return row
