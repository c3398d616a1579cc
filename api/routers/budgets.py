"""A team's budget (the admin sets it; the team reads it, its notification
targets redacted) and the alerts it raises (a team reads its own). The
admin may silence a rule for a while: budgets, their rules and the targets
they notify are the admin's, so a team's token may list the silences on
its own budget but neither add nor end one (403)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm.exc import StaleDataError

from spotbroker.api.deps import Admin, IdInPath, SessionDep
from spotbroker.api.errors import Problem, invalid, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.routers.costs import Caller, TeamName, may_read
from spotbroker.broker import auth
from spotbroker.broker.money import budgets
from spotbroker.broker.money.alerts import RULES, Condition, as_read
from spotbroker.broker.store.db import retrying, transaction
from spotbroker.broker.store.models import Team
from spotbroker.broker.store.moneymodels import Alert
from spotbroker.broker.store.sealing import Keyring, SealError
from spotbroker.broker.usecases import money as money_cases

router = APIRouter(prefix="/v1", tags=["budgets"], route_class=JSONBodyRoute)


class TargetOut(BaseModel):
    name: str
    kind: str
    hint: str | None = Field(None, description="admin only: where it goes (the secret itself is never shown)")


class BudgetOut(BaseModel):
    team: str
    amount: float
    period: str
    hard_cap_action: str
    recoveries: str
    rules: budgets.Rules
    targets: list[TargetOut]
    period_start: datetime
    period_end: datetime
    spent: float = Field(description="dollars spent this period, from the ledger")
    remaining: float
    over: bool = Field(description="the hard cap is in effect")


def _hint(target: budgets.StoredTarget, keyring: Keyring) -> str:
    try:
        return target.open(keyring).hint()
    except SealError as exc:
        return f"unreadable: {exc}"


def _out(name: str, row, standing: budgets.Standing, keyring: Keyring | None) -> BudgetOut:
    """`keyring`: the admin's view, with each target's hint; None: a team's, names and kinds only."""
    targets = [TargetOut(name=t.name, kind=t.kind, hint=_hint(t, keyring) if keyring else None)
               for t in budgets.targets(row)]
    return BudgetOut(team=name, amount=row.amount, period=row.period, hard_cap_action=row.hard_cap_action,
                     recoveries=row.recoveries, rules=budgets.Rules.model_validate(row.rules), targets=targets,
                     period_start=standing.period.start, period_end=standing.period.end,
                     spent=round(standing.spent, 6), remaining=round(standing.remaining, 6), over=standing.over)


@router.get("/teams/{name}/budget", response_model=BudgetOut, responses=responses(
    401, 403, 404, 422, s403="A team's token asking for another team", s404="No such team, or no budget"))
def get_budget(request: Request, session: SessionDep, principal: Caller, name: TeamName) -> BudgetOut:
    """The team's budget and where it stands this period."""
    may_read(principal, name)
    try:
        row, standing = money_cases.read_budget(session, name, request.app.state.clock.now())
    except (auth.TeamNotFound, money_cases.NoBudget) as exc:
        raise Problem(404, "Not found", str(exc)) from None
    return _out(name, row, standing, request.app.state.keyring if principal.is_admin else None)


@router.put("/teams/{name}/budget", response_model=BudgetOut, responses=responses(
    401, 403, 404, 422, s403="Only the admin sets budgets"))
def put_budget(request: Request, body: budgets.BudgetIn, name: TeamName, _: Admin) -> BudgetOut:
    """Set a team's budget (replacing the previous one). Targets' URLs are
    secrets: stored, never answered back. Raising it releases held jobs."""
    for i, target in enumerate(body.targets or []):
        problem = target.problem(request.app.state.settings.notify_allowed_networks)
        if problem:
            raise invalid([{"field": f"targets.{i}.{problem[0]}", "message": problem[1]}])
    state = request.app.state

    def put(session) -> BudgetOut:  # taken again if the reconciler moved a held job meanwhile
        try:
            row, standing = money_cases.set_budget(session, name, body, state.clock, state.keyring)
        except auth.TeamNotFound as exc:
            raise Problem(404, "Not found", str(exc)) from None
        return _out(name, row, standing, state.keyring)
    try:
        out = retrying(state.session_factory, put)
    except StaleDataError:
        raise Problem(503, "Unavailable", "the team's jobs changed under every try: set it again",
                      headers={"Retry-After": "1"}) from None
    state.reconciler.hint()
    return out


class AlertEvent(BaseModel):
    at: datetime
    kind: Literal["fire", "escalate", "resolve"]
    rule: str | None = None
    severity: str | None = None
    summary: str | None = None
    value: float | None = None


class AlertOut(BaseModel):
    id: int
    team: str
    rule: str
    state: Literal["open", "resolved"]
    severity: str
    summary: str = Field(description="an open alert: its figures read now (as_of); resolved: the last ones sent")
    advice: str = Field(description="what to do (the commands)")
    value: float | None
    threshold: float | None
    fired_at: datetime
    resolved_at: datetime | None
    as_of: datetime = Field(description="when summary and value were read")
    clear_since: datetime | None = Field(None, description=(
        "open, but its condition has not held since then (a rate's alert resolves once clear for a while)"))
    fired_summary: str = Field(description="the figures it fired with")
    history: list[AlertEvent] = Field(default_factory=list, description="fired, escalated, resolved, oldest first")


class AlertList(BaseModel):
    alerts: list[AlertOut]


@router.get("/alerts", response_model=AlertList, responses=responses(401, 403, 404, 422))
def list_alerts(session: SessionDep, principal: Caller, request: Request,
                team: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
                                                  description="default: the token's team (admin: all)")] = None,
                state: Literal["open", "resolved", "all"] = "all",
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> AlertList:
    """Budget alerts, newest first."""
    team_id = _readable_team(session, principal, team)
    found = money_cases.list_alerts(session, team_id, state, request.app.state.clock.now(), limit)
    return AlertList(alerts=[_alert_out(a, n, now, c) for a, n, now, c in found])


def _alert_out(a: Alert, team: str, now: datetime, live: Condition | None) -> AlertOut:
    history = a.history or []
    out = AlertOut(
        id=a.id, team=team, rule=a.rule, state="open" if a.open_key else "resolved", severity=a.severity,
        summary=a.summary, advice=a.advice, value=a.value, threshold=a.threshold, fired_at=a.fired_at,
        resolved_at=a.resolved_at, as_of=now, clear_since=a.clear_since,
        fired_summary=history[0].get("summary", a.summary) if history else a.summary,
        history=[AlertEvent.model_validate(e) for e in history])
    out.severity, out.summary, out.value, out.as_of = as_read(a, live, now)
    return out


class SilenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    rule: str = Field(description=f"one of {', '.join(RULES)} (spend_N: every threshold), spend_50 etc., or *",
                      pattern=r"^(\*|fast_burn|slow_burn|forecast|committed|hard_cap|spend_N|spend_[0-9]{1,4}(\.[0-9]{1,3})?)$")
    minutes: float = Field(gt=0, le=60 * 24 * 90)


class SilenceOut(BaseModel):
    id: int
    team: str
    rule: str
    until: datetime
    created_at: datetime


class SilenceList(BaseModel):
    silences: list[SilenceOut]


def _readable_team(session, principal, team: str | None) -> int | None:
    """The id of the team a list is filtered to (default: the caller's; an
    admin with none: every team, None), once the caller may read it."""
    team = team or principal.team_name
    if team is None:
        return None
    may_read(principal, team)
    try:
        return auth.team_id(session, team)
    except auth.TeamNotFound as exc:
        raise Problem(404, "Not found", str(exc)) from None


def _silence_out(row, team: str) -> SilenceOut:
    return SilenceOut(id=row.id, team=team, rule=row.rule, until=row.until, created_at=row.created_at)


@router.post("/alerts/silences", status_code=201, response_model=SilenceOut, responses=responses(
    401, 403, 404, 422, s403="Only the admin silences a budget's alerts"))
def silence(request: Request, body: SilenceIn, _: Admin) -> SilenceOut:
    """Send nothing for a rule of a team's budget for a while (alerts still
    open and show). Admin only: the budget and the targets it notifies are
    the admin's."""
    state = request.app.state
    with transaction(state.session_factory) as session:
        try:
            row = money_cases.silence(session, body.team, body.rule, body.minutes, state.clock.now())
        except auth.TeamNotFound as exc:
            raise Problem(404, "Not found", str(exc)) from None
        return _silence_out(row, body.team)


@router.get("/alerts/silences", response_model=SilenceList, responses=responses(401, 403, 404, 422))
def list_silences(request: Request, session: SessionDep, principal: Caller,
                  team: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
                                                    description="default: the token's team (admin: all)")] = None,
                  expired: Annotated[bool, Query(description="also those whose time is over")] = False
                  ) -> SilenceList:
    """The silences on a team's budget (a team reads its own), newest first."""
    team_id = _readable_team(session, principal, team)
    found = money_cases.list_silences(session, team_id, request.app.state.clock.now(), active_only=not expired)
    return SilenceList(silences=[_silence_out(row, name) for row, name in found])


@router.delete("/alerts/silences/{silence_id}", response_model=SilenceOut, responses=responses(
    401, 403, 404, 422, s403="Only the admin ends a silence", s404="No such silence"))
def expire_silence(request: Request, silence_id: IdInPath,
                   _: Admin) -> SilenceOut:
    """End a silence now (it stays listed, with `until` now)."""
    state = request.app.state
    with transaction(state.session_factory) as session:
        try:
            row = money_cases.expire_silence(session, silence_id, state.clock.now())
        except money_cases.SilenceNotFound as exc:
            raise Problem(404, "Not found", str(exc)) from None
        return _silence_out(row, session.get(Team, row.team_id).name)
