"""Dashboard logins, stored server-side.

A login opens a row in `dashboard_sessions` and hands the browser a random
id (in a cookie, signed by api/dashboard/session.py); the table keeps only
the id's SHA-256 digest. A session is who logged in (the API token's row,
or the admin with a fingerprint of the admin token then in force) and it
stands while all of these hold:

- the row exists (logging out deletes it: a copied cookie is worth nothing
  after that, in every browser and every broker process);
- now is before `expires_at` (the absolute lifetime, from the login);
- it was used within the idle lifetime (`last_seen_at`, refreshed at most
  once a minute so that reading pages does not write on every request);
- its token still stands: not revoked (a deleted token deletes its rows),
  or, for the admin, the admin token has not changed since.

A session found ended is deleted when it is read; logins sweep the rows
whose absolute lifetime is over, and a token keeps at most MAX_PER_TOKEN
open (its oldest ends).
"""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from spotbroker.broker import auth
from spotbroker.broker.auth import ADMIN, Principal
from spotbroker.broker.store.models import ApiToken, Team
from spotbroker.broker.store.moneymodels import DashboardSession

# last_seen_at is written when it is older than this, or than half the idle
# time where that is shorter (a 30 s idle ended sessions in use: a touch a minute).
TOUCH = timedelta(seconds=60)
# The logins one token keeps open: the oldest ends when one more opens (a token's holder
# opened 3,000 in 23 s, each a row kept for the sessions' whole lifetime).
MAX_PER_TOKEN = 50


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def admin_print(admin_token: str | None) -> str | None:
    """A short fingerprint of the admin token (never the token): a changed
    admin token ends the admin's sessions."""
    return auth.digest(admin_token)[:16] if admin_token else None


def open_session(session: Session, token: str, admin_token: str | None, now: datetime,
                 lifetime: timedelta) -> tuple[str, Principal] | None:
    """Log in with `token`: a new session's id (to give the browser, once)
    and who it is; None for an unknown or revoked token (nothing written)."""
    admin = admin_print(admin_token)
    if admin is not None and secrets.compare_digest(auth.digest(token), auth.digest(admin_token)):
        token_id, principal = None, ADMIN
    else:
        row = session.execute(select(ApiToken.id, Team.id, Team.name).join(Team, Team.id == ApiToken.team_id)
                              .where(ApiToken.digest == auth.digest(token), ApiToken.revoked_at.is_(None))).first()
        if row is None:
            return None
        token_id, principal, admin = row[0], Principal(team_id=row[1], team_name=row[2]), None
    session.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
    owner = DashboardSession.api_token_id == token_id if token_id is not None \
        else DashboardSession.admin_print == admin
    oldest = select(DashboardSession.id).where(owner).order_by(
        DashboardSession.created_at.desc(), DashboardSession.id.desc()).offset(MAX_PER_TOKEN - 1)
    session.execute(delete(DashboardSession).where(DashboardSession.id.in_(oldest)))
    session_id = secrets.token_urlsafe(32)
    session.add(DashboardSession(digest=_digest(session_id), api_token_id=token_id, admin_print=admin,
                                 created_at=now, last_seen_at=now, expires_at=now + lifetime))
    session.flush()
    return session_id, principal


def resolve(session: Session, session_id: str, admin_token: str | None, now: datetime,
            idle: timedelta) -> Principal | None:
    """Who the session `session_id` is, if it still stands (see the module's
    doc); an ended one is deleted."""
    row = session.scalar(select(DashboardSession).where(DashboardSession.digest == _digest(session_id)))
    if row is None:
        return None
    principal = None
    if now < row.expires_at and now - row.last_seen_at < idle:
        if row.api_token_id is None:
            current = admin_print(admin_token)
            if current is not None and row.admin_print is not None and \
                    secrets.compare_digest(row.admin_print, current):
                principal = ADMIN
        else:
            found = session.execute(select(Team.id, Team.name).join(ApiToken, ApiToken.team_id == Team.id)
                                    .where(ApiToken.id == row.api_token_id, ApiToken.revoked_at.is_(None))).first()
            principal = Principal(team_id=found[0], team_name=found[1]) if found else None
    if principal is None:
        session.delete(row)
    elif now - row.last_seen_at >= min(TOUCH, idle / 2):
        row.last_seen_at = now
    return principal


def close(session: Session, session_id: str) -> bool:
    """Log out: the session ends everywhere at once."""
    gone = session.execute(delete(DashboardSession).where(DashboardSession.digest == _digest(session_id)))
    return bool(gone.rowcount)
