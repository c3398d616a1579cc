"""Following an attempt's log (`GET /v1/jobs/{id}/logs?follow=true`).

Followers are coroutines on the event loop: none holds a thread, a timer or
a database connection while it waits. One ticker serves them all: every
POLL_S it looks at the size of each followed log once (however many follow
it) and wakes that log's followers when it grew; every CHECK_S it asks the
database, in one query, which followed attempts have ended. A follower stops
when its attempt has ended and its log is read to the end, when its client
goes (Starlette cancels the stream on the disconnect), or when the server
shuts down: uvicorn's graceful shutdown waits for open responses before the
application's own shutdown runs, so `close()` is called from the signal
itself (see `on_shutdown_signal`).
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs import logs
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.store.models import Attempt

POLL_S = 0.25          # how often each followed log's size is looked at
CHECK_S = 1.0          # how often the database is asked which attempts still run
CHUNK = 256 * 1024     # the most read (and sent) at once: a read from the page cache, on the loop


class TooManyFollowers(Exception):
    pass


class _Log:
    """One followed log: its size at the last look, whether its attempt has
    ended, and the event its followers wait on (replaced at each wake-up,
    so that a follower that looked before a wake-up never misses it)."""

    def __init__(self, attempt_id: int, path: Path) -> None:
        self.attempt_id, self.path = attempt_id, path
        self.size, self.ended, self.followers = _size(path), False, 0
        self.changed = asyncio.Event()
        self._last: tuple[int, bytes] = (-1, b"")

    def read(self, offset: int, fresh: bool = False) -> bytes:
        """The log from `offset`: read once for all the followers that are
        there (after a wake-up, most are at the same offset); `fresh` reads
        the file whatever was read before."""
        at, chunk = self._last
        if fresh or at != offset or len(chunk) < min(CHUNK, self.size - offset):
            chunk = logs.read_from(self.path, offset, CHUNK)
            self._last = (offset, chunk)
        return chunk

    def wake(self) -> None:
        woken, self.changed = self.changed, asyncio.Event()
        woken.set()


class Followers:
    def __init__(self, factory: sessionmaker[Session], per_team: int,
                 poll_s: float = POLL_S, check_s: float = CHECK_S) -> None:
        self.factory, self.per_team, self.poll_s, self.check_s = factory, per_team, poll_s, check_s
        self._per_team: Counter[int] = Counter()
        self._logs: dict[Path, _Log] = {}
        self._closing = False
        self._ticker: asyncio.Task[None] | None = None

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
        self._closing = True
        for log in self._logs.values():
            log.wake()

    async def stream(self, attempt_id: int, path: Path, head: bytes, offset: int) -> AsyncIterator[bytes]:
        """`head`, then the log from `offset` as it grows, until the attempt
        has ended and all of it is sent."""
        log = self._logs.get(path) or self._logs.setdefault(path, _Log(attempt_id, path))
        log.followers += 1
        self._ensure_ticker()
        try:
            if head:
                yield head
            while not self._closing:
                changed, ended = log.changed, log.ended  # both before the size: no last bytes missed
                if log.size > offset or ended:
                    chunk = log.read(offset, fresh=ended)
                    if chunk:
                        offset += len(chunk)
                        yield chunk
                        continue
                    if ended:
                        return
                await changed.wait()
        finally:
            log.followers -= 1
            if log.followers <= 0:
                self._logs.pop(path, None)

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """While anyone follows: wake the followers of each log that grew,
        and of each attempt that ended."""
        checked = 0.0
        while self._logs and not self._closing:
            for log in list(self._logs.values()):
                size = _size(log.path)
                if size != log.size:
                    log.size = size
                    log.wake()
            if time.monotonic() - checked >= self.check_s:
                checked = time.monotonic()
                live = [log for log in self._logs.values() if not log.ended]
                if live:
                    ended = await run_in_threadpool(self._ended_of, [log.attempt_id for log in live])
                    for log in live:
                        if log.attempt_id in ended:
                            log.ended = True
                            log.wake()
            await asyncio.sleep(self.poll_s)

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
