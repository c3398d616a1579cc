"""The dashboard's login session: a signed random id in a cookie.

The session itself is stored server-side (broker/auth/sessions.py: only
the id's digest, who logged in, when it ends); the cookie carries the
random id and an HMAC of it under a key derived from the broker's signing
key for this use only, so a forged or altered cookie is refused before the
database is asked. It never holds a token. Logging out deletes the session,
so a copied cookie stops working everywhere at once; so do the idle and the
absolute lifetime, a revoked team token and a changed admin token.

The cookie is HTTP-only, SameSite=Strict, limited to /dashboard and Secure
over HTTPS; /v1 never reads it (its routes take the bearer header only),
so no cross-site request can act with it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import timedelta

from fastapi import Request, Response

from spotbroker.broker.auth import Principal, sessions
from spotbroker.broker.money.settings import MoneySettings, get_money_settings
from spotbroker.broker.store.db import transaction

COOKIE = "spotbroker_dashboard"
PATH = "/dashboard"


def _key(request: Request) -> bytes:
    state = request.app.state
    key = getattr(state, "dashboard_key", None)
    if key is None:  # per use: a dashboard cookie is never an agent token, nor the reverse
        key = hmac.new(state.settings.signing_key(), b"spotbroker dashboard session", hashlib.sha256).digest()
        state.dashboard_key = key
    return key


def money_settings(request: Request) -> MoneySettings:
    """The money settings, read once per app."""
    state = request.app.state
    settings = getattr(state, "dashboard_settings", None)
    if settings is None:
        settings = state.dashboard_settings = get_money_settings()
    return settings


def _admin_token(request: Request) -> str | None:
    admin = request.app.state.settings.admin_token
    return admin.get_secret_value() if admin else None


def _sign(request: Request, session_id: str) -> str:
    mac = hmac.new(_key(request), session_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _session_id(request: Request) -> str | None:
    """The cookie's id, if its signature is this broker's."""
    value = request.cookies.get(COOKIE)
    if not value or value.count(".") != 1:
        return None
    session_id, signature = value.split(".")
    return session_id if hmac.compare_digest(signature, _sign(request, session_id)) else None


def issue(request: Request, response: Response, token: str) -> Principal | None:
    """Log in with a token: open a session, set the cookie and return who it
    is, or None (unknown or revoked token; nothing is set)."""
    settings, state = money_settings(request), request.app.state
    lifetime = timedelta(seconds=settings.dashboard_lifetime_seconds)
    with transaction(state.session_factory) as s:
        opened = sessions.open_session(s, token, _admin_token(request), state.clock.now(), lifetime)
    if opened is None:
        return None
    session_id, principal = opened
    response.set_cookie(COOKIE, f"{session_id}.{_sign(request, session_id)}",
                        max_age=int(lifetime.total_seconds()), path=PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return principal


def clear(request: Request, response: Response) -> None:
    """Log out: the session ends server-side, and the cookie goes."""
    session_id = _session_id(request)
    if session_id is not None:
        with transaction(request.app.state.session_factory) as s:
            sessions.close(s, session_id)
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def read(request: Request) -> Principal | None:
    """Who the cookie's session is, if the cookie is genuine and its session
    still stands."""
    session_id = _session_id(request)
    if session_id is None:
        return None
    state = request.app.state
    idle = timedelta(seconds=money_settings(request).dashboard_idle_seconds)
    with transaction(state.session_factory) as s:
        return sessions.resolve(s, session_id, _admin_token(request), state.clock.now(), idle)
