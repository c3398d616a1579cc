"""Following an attempt's log (`GET /v1/jobs/{id}/logs?follow=true`).

Followers are coroutines on the event loop: none holds a thread or a
database connection while it waits. Whether the attempts being followed
still run is asked by one watcher for all of them (one query a second,
however many followers), and each follower stops when its attempt has ended
and its log is read to the end, when its client goes (Starlette cancels the
stream on the disconnect), or when the server shuts down: uvicorn's graceful
shutdown waits for open responses before the application's own shutdown
runs, so `close()` is called from the signal itself (see `on_shutdown_signal`).
"""
from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker import logs
from spotbroker.broker.models import Attempt
from spotbroker.broker.states import LIVE_ATTEMPT_STATES

POLL_S = 0.25          # how often a follower looks at its log's size
CHECK_S = 1.0          # how often the watcher asks which attempts still run
CHUNK = 256 * 1024     # the most read (and sent) at once


class TooManyFollowers(Exception):
    pass


class Followers:
    def __init__(self, factory: sessionmaker[Session], per_team: int,
                 poll_s: float = POLL_S, check_s: float = CHECK_S) -> None:
        self.factory, self.per_team, self.poll_s, self.check_s = factory, per_team, poll_s, check_s
        self._per_team: Counter[int] = Counter()
        self._watched: Counter[int] = Counter()   # attempt id -> followers of it
        self._ended: set[int] = set()
        self._closing = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    @property
    def count(self) -> int:
        return sum(self._per_team.values())

    def admit(self, team_id: int) -> None:
        """Take one of the team's places, or raise TooManyFollowers."""
        if self._per_team[team_id] >= self.per_team:
            raise TooManyFollowers
        self._per_team[team_id] += 1

    def release(self, team_id: int) -> None:
        self._per_team[team_id] -= 1
        if self._per_team[team_id] <= 0:
            del self._per_team[team_id]

    def close(self) -> None:
        """End every stream now (the server is shutting down)."""
        self._closing.set()

    async def stream(self, attempt_id: int, path: Path, head: bytes, offset: int) -> AsyncIterator[bytes]:
        """`head`, then the log from `offset` as it grows, until the attempt
        has ended and all of it is sent."""
        self._watched[attempt_id] += 1
        self._ensure_watcher()
        try:
            if head:
                yield head
            while not self._closing.is_set():
                ended = attempt_id in self._ended  # read before the size: no last bytes missed
                if _size(path) > offset:
                    chunk = await run_in_threadpool(logs.read_from, path, offset, CHUNK)
                    offset += len(chunk)
                    yield chunk
                    continue
                if ended:
                    return
                await self._wait(self.poll_s)
        finally:
            self._watched[attempt_id] -= 1
            if self._watched[attempt_id] <= 0:
                del self._watched[attempt_id]
                self._ended.discard(attempt_id)

    async def _wait(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """While anyone follows: which of the followed attempts have ended."""
        while self._watched and not self._closing.is_set():
            ids = [i for i in self._watched if i not in self._ended]
            if ids:
                self._ended.update(await run_in_threadpool(self._ended_of, ids))
            await self._wait(self.check_s)

    def _ended_of(self, ids: list[int]) -> set[int]:
        with self.factory() as session:
            live = set(session.scalars(select(Attempt.id).where(
                Attempt.id.in_(ids), Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES]))))
        return set(ids) - live


class FollowResponse(StreamingResponse):
    """The stream of `Followers.stream`, which gives the team's place (taken
    by `admit`) back however it ends, even if the stream never started."""

    def __init__(self, followers: Followers, team_id: int, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/plain; charset=utf-8")
        self._release = lambda: followers.release(team_id)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            await self.body_iterator.aclose()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def on_shutdown_signal(followers: Followers) -> Callable[[], None]:
    """Chain `followers.close` in front of the SIGINT/SIGTERM handlers the
    server installed (uvicorn's, which start its graceful shutdown); returns
    what puts them back. Only the main thread can; elsewhere (a server run
    in a thread by tests) there are no signals to chain."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(sig, frame) -> None:
        loop.call_soon_threadsafe(followers.close)
        before = previous[sig]
        if callable(before):
            before(sig, frame)
        else:  # no server's handler to run: the signal's own meaning
            signal.signal(sig, before)
            signal.raise_signal(sig)

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, before in previous.items():
            signal.signal(sig, before)

    return restore
