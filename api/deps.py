"""Request dependencies, as short aliases so a route reads like a sentence."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from spotbroker.api.errors import Problem
from spotbroker.broker.auth import Principal
from spotbroker.broker.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="A team token, or the admin token")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


MAX_ID = 2**63 - 1  # ids are BIGINT: a larger number is refused, not sent to the database

SessionDep = Annotated[Session, Depends(get_session)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
CheckpointId = Annotated[int, Path(ge=1, le=MAX_ID)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_principal(request: Request,
                        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Problem(401, "Unauthorized", "send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    tokens = request.app.state.tokens
    known, principal = tokens.cached(creds.credentials)
    if not known:  # a database look-up blocks: off the event loop
        def look_up() -> Principal | None:
            with request.app.state.session_factory() as session:
                return tokens.resolve(session, creds.credentials)

        principal = await run_in_threadpool(look_up)
    if principal is None:
        raise Problem(401, "Unauthorized", "unknown or revoked token", headers=_CHALLENGE)
    return principal


def get_team(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.is_admin:
        raise Problem(403, "Forbidden", "the admin token has no team; use a team's token for jobs")
    return principal


def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise Problem(403, "Forbidden", "this needs the admin token (SPOTBROKER_ADMIN_TOKEN)")
    return principal


CurrentTeam = Annotated[Principal, Depends(get_team)]
Admin = Annotated[Principal, Depends(get_admin)]
