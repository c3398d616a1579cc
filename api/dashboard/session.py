"""The dashboard's login session: a signed id in a cookie.

The cookie holds which token logged in (the API token's row id, or "admin"
with a fingerprint of the admin token) and when the session ends, signed
with a key derived from the broker's signing key for this use only. It
never holds the token itself. Each page checks the signature, the expiry,
and that the token still stands (a revoked team token, or a changed admin
token, ends its sessions at once). The cookie is HTTP-only, SameSite=Strict,
limited to /dashboard and Secure over HTTPS; /v1 never reads it (its
routes take the bearer header only), so no cross-site request can act
with it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from fastapi import Request, Response
from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.auth import ADMIN, Principal
from spotbroker.broker.store.models import ApiToken, Team

COOKIE = "spotbroker_dashboard"
PATH = "/dashboard"
LIFETIME_S = 8 * 3600


def _key(request: Request) -> bytes:
    state = request.app.state
    key = getattr(state, "dashboard_key", None)
    if key is None:  # per use: a dashboard cookie is never an agent token, nor the reverse
        key = hmac.new(state.settings.signing_key(), b"spotbroker dashboard session", hashlib.sha256).digest()
        state.dashboard_key = key
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _admin_print(request: Request) -> str | None:
    admin = request.app.state.settings.admin_token
    return auth.digest(admin.get_secret_value())[:16] if admin else None


def issue(request: Request, response: Response, token: str) -> Principal | None:
    """Log in with a token: set the cookie and return who it is, or None
    (unknown or revoked token; nothing is set)."""
    digest = auth.digest(token)
    admin = _admin_print(request)
    if admin is not None and hmac.compare_digest(digest[:16], admin) and \
            request.app.state.tokens.cached(token) == (True, ADMIN):
        claim, principal = {"a": admin}, ADMIN
    else:
        with request.app.state.session_factory() as session:
            row = session.execute(select(ApiToken.id, Team.id, Team.name).join(Team, Team.id == ApiToken.team_id)
                                  .where(ApiToken.digest == digest, ApiToken.revoked_at.is_(None))).first()
        if row is None:
            return None
        claim, principal = {"t": row[0]}, Principal(team_id=row[1], team_name=row[2])
    claim["exp"] = int(time.time()) + LIFETIME_S
    body = _b64(json.dumps(claim, separators=(",", ":")).encode())
    signature = _b64(hmac.new(_key(request), body.encode(), hashlib.sha256).digest())
    response.set_cookie(COOKIE, f"{body}.{signature}", max_age=LIFETIME_S, path=PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return principal


def clear(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def read(request: Request) -> Principal | None:
    """Who the cookie says is logged in, if it is genuine, current, and its
    token still stands."""
    value = request.cookies.get(COOKIE)
    if not value or value.count(".") != 1:
        return None
    body, signature = value.split(".")
    expected = _b64(hmac.new(_key(request), body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(signature, expected):
        return None
    try:
        claim = json.loads(_unb64(body))
    except ValueError:
        return None
    if not isinstance(claim, dict) or not isinstance(claim.get("exp"), int) or claim["exp"] < time.time():
        return None
    if "a" in claim:
        admin = _admin_print(request)
        return ADMIN if admin is not None and hmac.compare_digest(str(claim["a"]), admin) else None
    if not isinstance(claim.get("t"), int):
        return None
    with request.app.state.session_factory() as session:
        row = session.execute(select(Team.id, Team.name).join(ApiToken, ApiToken.team_id == Team.id)
                              .where(ApiToken.id == claim["t"], ApiToken.revoked_at.is_(None))).first()
    return Principal(team_id=row[0], team_name=row[1]) if row else None
