"""Budgets: how much a team may spend per period, the alert rules, where
alerts go, and what happens over it (the hard cap).

Notification targets hold secrets (a webhook URL is a credential; so is an
SMTP password): they are stored to be used, sealed (each target's name and
kind in clear, the rest under the broker's keyring, broker/store/sealing.py),
and never answered back; a reader sees each target's name, kind and, the
admin, a hint (the host, the last four characters). Periods are calendar
periods in UTC.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator
from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.money import views
from spotbroker.broker.money.addresses import host_problem
from spotbroker.broker.store.moneymodels import Budget
from spotbroker.broker.store.sealing import Keyring, SealError

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]


class Rules(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fast_burn: bool = Field(True, description="1 h and 5 min windows both over 14.4x the even rate")
    slow_burn: bool = Field(True, description="6 h and 30 min windows both over 6x the even rate")
    forecast: bool = Field(True, description="the period's spend, at the last 6 h's rate, exceeds the budget")
    thresholds: list[Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=lambda: [50.0, 80.0, 100.0], max_length=10,
        description="percent of the budget actually spent")
    committed_hours: float = Field(24.0, gt=0, le=24 * 366, description=(
        "alert when the running attempts' prices would spend what is left in under this many hours"))


class Target(BaseModel):
    """Where alerts go: a Slack-compatible webhook (POST {"text": ...}), or
    email through an SMTP server."""

    model_config = ConfigDict(extra="forbid")
    name: Name
    kind: Literal["webhook", "email"]
    url: str | None = Field(None, max_length=2000, description="webhook: http(s) URL (a secret)")
    smtp_url: str | None = Field(None, max_length=2000, description=(
        "email: smtp://[user:password@]host[:port] or smtps://... (a secret)"))
    to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)]] = Field(
        default_factory=list, max_length=20)
    sender: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+$", max_length=254, alias="from")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and (urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).hostname):
            raise ValueError("an http:// or https:// URL")
        return v

    @field_validator("smtp_url")
    @classmethod
    def _smtp(cls, v: str | None) -> str | None:
        if v is not None and (urlsplit(v).scheme not in ("smtp", "smtps") or not urlsplit(v).hostname):
            raise ValueError("smtp://host[:port] or smtps://host[:port]")
        return v

    def problem(self, allowed_networks: Iterable[str] = ()) -> tuple[str, str] | None:
        """(field, message) of what is missing or may not be reached, or None."""
        if self.kind == "webhook" and not self.url:
            return "url", "a webhook target needs its url"
        if self.kind == "email" and not (self.smtp_url and self.to):
            return ("smtp_url" if not self.smtp_url else "to"), "an email target needs smtp_url and to"
        field_name = "url" if self.kind == "webhook" else "smtp_url"
        problem = host_problem(self.host, allowed_networks)
        return (field_name, problem) if problem else None

    @property
    def host(self) -> str:
        return urlsplit(self.url if self.kind == "webhook" else self.smtp_url).hostname or ""

    def hint(self) -> str:
        secret = self.url or self.smtp_url or ""
        where = urlsplit(secret).hostname or ""
        return f"{where} …{secret[-4:]}" if self.kind == "webhook" else f"{where} to {', '.join(self.to)}"


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: StrictFloat = Field(ge=0.01, le=1e9, allow_inf_nan=False,
                                description="dollars per period (at least a cent)")  # (`true` was $1)
    period: Literal["day", "week", "month"] = "month"
    hard_cap_action: Literal["hold_new", "stop_running"] = Field("hold_new", description=(
        "over budget: hold new jobs, or also stop running ones (checkpoints kept)"))
    recoveries: Literal["allow", "hold"] = Field("allow", description="over budget: recover preempted jobs, or hold")
    rules: Rules = Field(default_factory=Rules)
    targets: list[Target] | None = Field(None, max_length=10, description=(
        "notification targets (write-only), each with a name of its own; omitted: the ones already set are "
        "kept, [] clears them"))

    @field_validator("targets")
    @classmethod
    def _names_once(cls, targets: list[Target] | None) -> list[Target] | None:
        """A notification is kept per target name: two of one name broke every team's alert pass."""
        seen: set[str] = set()
        for i, target in enumerate(targets or []):
            if target.name in seen:
                raise ValueError(f"targets.{i}.name: {target.name!r} is given twice: each target needs a name "
                                 "of its own")
            seen.add(target.name)
        return targets


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


def period_of(kind: str, now: datetime) -> Period:
    """The calendar period (UTC) that holds `now`."""
    now = now.astimezone(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "day":
        return Period(day, day + timedelta(days=1))
    if kind == "week":
        start = day - timedelta(days=day.weekday())
        return Period(start, start + timedelta(days=7))
    start = day.replace(day=1)
    end = (start + timedelta(days=32)).replace(day=1)
    return Period(start, end)


def get(session: Session, team_id: int) -> Budget | None:
    return session.get(Budget, team_id)


def put(session: Session, team_id: int, body: BudgetIn, clock: Clock = SYSTEM_CLOCK,
        keyring: Keyring | None = None) -> Budget:
    """Set (or replace) a team's budget; its targets are sealed with `keyring`
    (required when the body sets any)."""
    if body.targets and keyring is None:
        raise ValueError("notification targets are stored sealed: set them with the broker's keyring")
    now = clock.now()
    row = session.get(Budget, team_id)
    values: dict[str, Any] = dict(
        amount=body.amount, period=body.period, hard_cap_action=body.hard_cap_action,
        recoveries=body.recoveries, rules=body.rules.model_dump(),
        updated_at=now)
    if body.targets is not None:
        values["targets"] = [seal_target(t, team_id, keyring) for t in body.targets]
    elif row is None:
        values["targets"] = []
    if row is None:
        row = Budget(team_id=team_id, created_at=now, **values)
        session.add(row)
    else:
        for k, v in values.items():
            setattr(row, k, v)
    session.flush()
    return row


def _context(team_id: int, name: str) -> str:
    return f"budget target|team {team_id}|{name}"


def seal_target(target: Target, team_id: int, keyring: Keyring) -> dict[str, str]:
    """A target as the budget row keeps it: its name and kind, the rest sealed."""
    secret = target.model_dump_json(by_alias=True, exclude_none=True)
    return {"name": target.name, "kind": target.kind, "sealed": keyring.seal(secret, _context(team_id, target.name))}


@dataclass(frozen=True)
class StoredTarget:
    """A target as read back from its budget row; `open` gives the whole target."""

    team_id: int
    name: str
    kind: str
    sealed: str

    def open(self, keyring: Keyring) -> Target:
        """The target, or SealError saying why it cannot be read (never the secret)."""
        return Target.model_validate_json(keyring.open(self.sealed, _context(self.team_id, self.name)))

    def problem(self, keyring: Keyring) -> str | None:
        try:
            self.open(keyring)
        except SealError as exc:
            return f"target {self.name} cannot be read: {exc}"
        return None


def targets(row: Budget) -> list[StoredTarget]:
    """The budget's targets, sealed; their names and kinds need no key."""
    return [StoredTarget(row.team_id, t["name"], t["kind"], t["sealed"]) for t in row.targets or []]


def resealed_targets(row: Budget, keyring: Keyring) -> list[dict[str, str]] | None:
    """The row's targets all under the current key, or None when they are
    already (key rotation: `spotbroker db reseal`); SealError if one does not open."""
    if all(keyring.is_current(t.sealed) for t in targets(row)):
        return None
    return [seal_target(t.open(keyring), row.team_id, keyring) for t in targets(row)]


@dataclass(frozen=True)
class Standing:
    """Where a team stands against its budget now."""

    amount: float
    period: Period
    spent: float

    @property
    def remaining(self) -> float:
        return self.amount - self.spent

    @property
    def over(self) -> bool:
        return self.spent >= self.amount


def standing(session: Session, row: Budget, now: datetime) -> Standing:
    period = period_of(row.period, now)
    return Standing(row.amount, period, views.spend(session, row.team_id, period.start, now))


def hold_reason(session: Session, team_id: int, recovering: bool, now: datetime) -> str | None:
    """Why the budget holds a job of the team now (None: it may launch). A
    recovery is held only when the budget says so."""
    row = session.get(Budget, team_id)
    if row is None or (recovering and row.recoveries == "allow"):
        return None
    s = standing(session, row, now)
    if not s.over:
        return None
    return (f"over budget: ${s.spent:.2f} spent of ${s.amount:.2f} this {row.period} "
            f"(until {s.period.end:%Y-%m-%d %H:%M} UTC); raise the budget to release it")
