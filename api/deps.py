"""Request dependencies, as short aliases so a route reads like a sentence."""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator
from sqlalchemy.orm import Session
from starlette.types import Scope

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


def decimal_digits(value: object) -> object:
    """An id in a path is written in ASCII digits: int() also reads `1_0`
    (job 10), `+10`, ` 10` and other scripts' digits."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError(f"a whole number from 1 to {MAX_ID}, in decimal digits")
    return value


# (the validator after Path: before it, the schema shows `ge`/`le` instead of minimum/maximum)
IdInPath = Annotated[int, Path(ge=1, le=MAX_ID), BeforeValidator(decimal_digits)]
JobId = IdInPath
CheckpointId = IdInPath
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


def body_holder(app) -> Callable[[Scope], Awaitable[str | None]]:
    """Who holds a request's body in api/guard.py's accounts, asked before a
    byte of it is read: the token's team (the admin's: one holder), or on the
    agent channel the token's attempt; None for a token that names no one."""
    from spotbroker.api.guard import bearer_token
    from spotbroker.broker.recovery import agent_channel

    async def identify(scope: Scope) -> str | None:
        state, token = app.state, bearer_token(scope) or ""
        if scope["path"].startswith(AGENT_PATHS):
            def attempt() -> int | None:
                with state.session_factory() as session:
                    found = agent_channel.attempt_for_token(session, token)
                    return found.id if found is not None else None

            attempt_id = await run_in_threadpool(attempt) if token.startswith(agent_channel.AGENT_TOKEN_PREFIX) \
                else None
            return None if attempt_id is None else f"attempt:{attempt_id}"
        known, principal = state.tokens.cached(token)
        if not known:
            def team() -> Principal | None:
                with state.session_factory() as session:
                    return state.tokens.resolve(session, token)

            principal = await run_in_threadpool(team)
        if principal is None:
            return None
        return "admin" if principal.is_admin else f"team:{principal.team_id}"

    return identify


AGENT_PATHS = "/v1/agent/"
ADMIN_TURNS = -1  # the admin's requests share one team's number of turns


class TeamTurns:
    """How many of one team's requests this process works on at once
    (SPOTBROKER_MAX_REQUESTS_PER_TEAM). The others wait on the event loop,
    holding no thread and no database connection: a team sending hundreds of
    costly reads at once took every thread and pooled connection, and the
    other teams' requests and the agents' heartbeats timed out behind them."""

    def __init__(self, per_team: int) -> None:
        self.per_team = per_team
        self._turns: dict[int, asyncio.Semaphore] = {}
        self._waiting: Counter[int] = Counter()

    def of(self, principal: Principal):
        """A turn of the principal's team (the admin's requests share one pool)."""
        return self.turn(ADMIN_TURNS if principal.is_admin else principal.team_id)

    @asynccontextmanager
    async def turn(self, team_id: int) -> AsyncIterator[None]:
        turns = self._turns.get(team_id) or self._turns.setdefault(team_id, asyncio.Semaphore(self.per_team))
        self._waiting[team_id] += 1
        try:
            async with turns:
                yield
        finally:
            self._waiting[team_id] -= 1
            if not self._waiting[team_id]:  # no one holds or awaits a turn: forget the team
                del self._waiting[team_id], self._turns[team_id]


async def get_caller(request: Request, principal: Annotated[Principal, Depends(get_principal)]
                     ) -> AsyncIterator[Principal]:
    """Whoever calls, within one of its team's turns (the admin's: one pool):
    held while the route works and builds its answer, not while the answer
    is sent (a log's stream is bounded by the followers' places instead).
    Every authenticated route takes one: `GET /v1/prices?limit=1000` from
    64 connections of one team once held the others' reads for 9 s."""
    async with request.app.state.team_turns.of(principal):
        yield principal


Caller = Annotated[Principal, Depends(get_caller, scope="function")]


def get_team(principal: Caller) -> Principal:
    if principal.is_admin:
        raise Problem(403, "Forbidden", "the admin token has no team; use a team's token for jobs")
    return principal


def get_admin(principal: Caller) -> Principal:
    if not principal.is_admin:
        raise Problem(403, "Forbidden", "this needs the admin token (SPOTBROKER_ADMIN_TOKEN)")
    return principal


CurrentTeam = Annotated[Principal, Depends(get_team)]
Admin = Annotated[Principal, Depends(get_admin)]
