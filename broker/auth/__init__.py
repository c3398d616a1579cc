"""Teams and API tokens. A token is shown once, at creation; only its
SHA-256 digest is stored, and tokens never reach a log. The dashboard's
logins, which stand for a token, are `sessions` in this package."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.store.models import ApiToken, Team

TOKEN_PREFIX = "sbt_"
TEAM_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # also a path pattern (no \Z there): use fullmatch


class TeamExists(ValueError):
    pass


class TeamNotFound(LookupError):
    pass


def team_id(session: Session, name: str) -> int:
    """The team's id by its name (raises TeamNotFound)."""
    found = session.scalar(select(Team.id).where(Team.name == name))
    if found is None:
        raise TeamNotFound(f"no team {name!r}")
    return found


@dataclass(frozen=True)
class Principal:
    """Who is calling: a team, or the admin (team None)."""

    team_id: int | None
    team_name: str | None

    @property
    def is_admin(self) -> bool:
        return self.team_id is None


ADMIN = Principal(team_id=None, team_name=None)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_team(session: Session, name: str, clock: Clock = SYSTEM_CLOCK) -> tuple[Team, str]:
    """Create a team and its first token; returns the token in the clear (once)."""
    if not TEAM_NAME_RE.fullmatch(name):
        raise ValueError(f"team name {name!r}: use lower-case letters, digits, '-' and '_' (at most 64)")
    if session.scalar(select(Team.id).where(Team.name == name)) is not None:
        raise TeamExists(f"team {name!r} already exists")
    team = Team(name=name, created_at=clock.now())
    session.add(team)
    try:
        session.flush()
    except IntegrityError:
        raise TeamExists(f"team {name!r} already exists") from None
    return team, create_token(session, team, clock=clock)


def create_token(session: Session, team: Team, name: str = "default", clock: Clock = SYSTEM_CLOCK) -> str:
    token = new_token()
    session.add(ApiToken(team_id=team.id, digest=digest(token), name=name, created_at=clock.now()))
    session.flush()
    return token


# Revoked token rows a team keeps (the newest, marked): older ones are deleted, since a
# team can rotate its own token at will (rotations added a row each, kept for ever).
KEPT_REVOKED = 20


def revoke_tokens(session: Session, team: Team, clock: Clock = SYSTEM_CLOCK) -> int:
    """Revoke every working token of a team; how many. Their dashboard logins
    end with them (each token kept 50 open, and a rotation made a fresh 50);
    the rows stay, marked, but for the team's oldest revoked ones."""
    from spotbroker.broker.store.moneymodels import DashboardSession

    working = select(ApiToken.id).where(ApiToken.team_id == team.id, ApiToken.revoked_at.is_(None))
    session.execute(delete(DashboardSession).where(DashboardSession.api_token_id.in_(working)))
    done = session.execute(update(ApiToken).where(ApiToken.team_id == team.id, ApiToken.revoked_at.is_(None))
                           .values(revoked_at=clock.now()))
    older = select(ApiToken.id).where(ApiToken.team_id == team.id, ApiToken.revoked_at.is_not(None)).order_by(
        ApiToken.revoked_at.desc(), ApiToken.id.desc()).offset(KEPT_REVOKED)
    stale = list(session.scalars(older))
    if stale:
        session.execute(delete(DashboardSession).where(DashboardSession.api_token_id.in_(stale)))
        session.execute(delete(ApiToken).where(ApiToken.id.in_(stale)))
    return done.rowcount


def rotate_tokens(session: Session, team: Team, clock: Clock = SYSTEM_CLOCK) -> str:
    """Replace a team's tokens by one new one (returned in the clear, once),
    in one transaction: there is never a moment with both or neither."""
    revoke_tokens(session, team, clock)
    return create_token(session, team, name="rotated", clock=clock)


class TokenResolver:
    """Maps a bearer token to its principal, caching lookups briefly so a
    busy API does not hit the database twice per request. A token revoked
    through this process stops working at once (`forget_team`); other
    broker processes sharing the database drop it within `ttl` seconds."""

    def __init__(self, admin_token: str | None, ttl: float = 30.0) -> None:
        self._admin_digest = digest(admin_token) if admin_token else None
        self._ttl = ttl
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(known, principal) without touching the database."""
        key = digest(token)
        if self._admin_digest and hmac.compare_digest(key, self._admin_digest):
            return True, ADMIN
        with self._lock:
            hit = self._cache.get(key)
        if hit and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def forget_team(self, team_id: int) -> None:
        """Drop a team's cached tokens (after a rotation or revocation), so
        that this process stops taking the old ones at once."""
        with self._lock:
            for key in [k for k, (_, p) in self._cache.items() if p is not None and p.team_id == team_id]:
                del self._cache[key]

    def resolve(self, session: Session, token: str) -> Principal | None:
        known, principal = self.cached(token)
        if known:
            return principal
        key = digest(token)
        now = time.monotonic()
        row = session.execute(
            select(Team.id, Team.name).join(ApiToken, ApiToken.team_id == Team.id)
            .where(ApiToken.digest == key, ApiToken.revoked_at.is_(None))
        ).first()
        principal = Principal(team_id=row.id, team_name=row.name) if row else None
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + self._ttl, principal)
        return principal
