"""Following an attempt's log (`GET /v1/jobs/{id}/logs?follow=true&attempt=N`,
and each attempt in turn of a followed job: api/jobfollow.py).

Followers are coroutines on the event loop: none holds a thread, a timer or
a database connection while it waits. One ticker serves them all: every
POLL_S it asks the database, in one query, for the newest row of each
followed log (however many follow it; whichever replica stored it) and wakes
that log's followers when it changed; every CHECK_S it asks which followed
logs are finished (logs.finished: the attempt has ended and its node will
ship nothing more), and which followed jobs changed (their state, reason or
newest attempt: api/jobfollow.py follows a job across its attempts).
Followers at the same offset share one read of at most logs.PAGE_BYTES. A
follower stops when its log is finished and read to the end, when its client goes (Starlette
cancels the stream on the disconnect), or when the server shuts down:
uvicorn's graceful shutdown waits for open responses before the
application's own shutdown runs, so `close()` is called from the signal
itself (see `on_shutdown_signal`).
"""
from __future__ import annotations

import asyncio
import codecs
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs import logs
from spotbroker.broker.store.models import Attempt, Job

POLL_S = 0.25          # how often the followed logs' newest rows are looked at
CHECK_S = 1.0          # how often the database is asked which followed logs are finished
LOG_READS = 2          # log pages read at once per process (reads and followers together)

LogKey = tuple[int, int]  # (attempt id, node rank)


class TooManyFollowers(Exception):
    pass


class _Log:
    """One followed log: its newest row at the last look, whether it is
    finished (`ended`), and the event its followers wait on (replaced at each
    wake-up, so that a follower that looked before a wake-up never misses it)."""

    def __init__(self, key: LogKey, factory: sessionmaker[Session], limiter: anyio.CapacityLimiter) -> None:
        self.key, self.factory, self.limiter = key, factory, limiter
        self.mark: int | None = None
        self.ended, self.followers = False, 0
        self.changed = asyncio.Event()
        self._last: tuple[int, int | None, bool, bytes] | None = None
        self._reading = asyncio.Lock()

    async def read(self, offset: int) -> bytes:
        """The log from `offset`: read once for all the followers that are
        there (after a wake-up, most are at the same offset) until the log
        changes or its attempt ends."""
        async with self._reading:
            seen = (offset, self.mark, self.ended)
            if self._last is None or self._last[:3] != seen:
                chunk = await anyio.to_thread.run_sync(self._read, offset, limiter=self.limiter)
                self._last = (*seen, chunk)
            return self._last[3]

    def _read(self, offset: int) -> bytes:
        with self.factory() as session:
            return logs.read_from(session, *self.key, offset)

    def wake(self) -> None:
        woken, self.changed = self.changed, asyncio.Event()
        woken.set()


class _Job:
    """One followed job: its (state, reason, newest attempt) at the last look,
    and the event its followers wait on (replaced at each wake-up)."""

    def __init__(self) -> None:
        self.mark: tuple[str, str | None, int | None] | None = None
        self.followers = 0
        self.changed = asyncio.Event()

    def wake(self) -> None:
        woken, self.changed = self.changed, asyncio.Event()
        woken.set()


class Followers:
    def __init__(self, factory: sessionmaker[Session], per_team: int,
                 poll_s: float = POLL_S, check_s: float = CHECK_S, clock: Clock = SYSTEM_CLOCK) -> None:
        self.factory, self.per_team, self.poll_s, self.check_s = factory, per_team, poll_s, check_s
        self.clock = clock
        self._per_team: Counter[int] = Counter()
        self._logs: dict[LogKey, _Log] = {}
        self._jobs: dict[int, _Job] = {}
        self._closing = False
        self._ticker: asyncio.Task[None] | None = None
        self._reads: anyio.CapacityLimiter | None = None

    @property
    def reads(self) -> anyio.CapacityLimiter:
        """The log pages this process reads at once, for followers and whole
        reads together: a team reading big logs takes turns, and leaves the
        threads and the interpreter to everyone else's requests (issue #24)."""
        if self._reads is None:  # made in the app's own event loop, which it belongs to
            self._reads = anyio.CapacityLimiter(LOG_READS)
        return self._reads

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
        for watched in (*self._logs.values(), *self._jobs.values()):
            watched.wake()

    @property
    def closing(self) -> bool:
        return self._closing

    def watch_job(self, job_id: int) -> _Job:
        """The job's watch, woken when it changes; `unwatch_job` when done."""
        job = self._jobs.get(job_id) or self._jobs.setdefault(job_id, _Job())
        job.followers += 1
        self._ensure_ticker()
        return job

    def unwatch_job(self, job_id: int) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.followers -= 1
            if job.followers <= 0:
                del self._jobs[job_id]

    async def stream(self, key: LogKey, offset: int) -> AsyncIterator[bytes]:
        """The log from `offset` as it grows, until it is finished and all of
        it is sent."""
        log = self._logs.get(key) or self._logs.setdefault(key, _Log(key, self.factory, self.reads))
        log.followers += 1
        self._ensure_ticker()
        try:
            while not self._closing:
                changed, ended = log.changed, log.ended  # both before the read: no last bytes missed
                chunk = await log.read(offset)
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
                self._logs.pop(key, None)

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """While anyone follows: wake the followers of each log that grew or
        finished, and of each job that changed."""
        checked = 0.0
        while (self._logs or self._jobs) and not self._closing:
            if self._logs:
                marks = await run_in_threadpool(self._marks_of, list(self._logs))
                for key, log in list(self._logs.items()):
                    if marks.get(key) != log.mark:
                        log.mark = marks.get(key)
                        log.wake()
            if time.monotonic() - checked >= self.check_s:
                checked = time.monotonic()
                live = [log for log in self._logs.values() if not log.ended]
                if live:
                    ended = await run_in_threadpool(self._finished_of, [log.key for log in live])
                    for log in live:
                        if log.key in ended:
                            log.ended = True
                            log.wake()
                if self._jobs:
                    jobs = await run_in_threadpool(self._jobs_of, list(self._jobs))
                    for job_id, job in list(self._jobs.items()):
                        if jobs.get(job_id) != job.mark:
                            job.mark = jobs.get(job_id)
                            job.wake()
            await asyncio.sleep(self.poll_s)

    def _marks_of(self, keys: list[LogKey]) -> dict[LogKey, int]:
        with self.factory() as session:
            return logs.marks(session, keys)

    def _finished_of(self, keys: list[LogKey]) -> set[LogKey]:
        with self.factory() as session:
            return logs.finished(session, keys, self.clock.now())

    def _jobs_of(self, ids: list[int]) -> dict[int, tuple[str, str | None, int | None]]:
        """Each job's state, reason and newest attempt, in one query."""
        with self.factory() as session:
            rows = session.execute(select(Job.id, Job.state, Job.reason, func.max(Attempt.id))
                                   .outerjoin(Attempt, Attempt.job_id == Job.id).where(Job.id.in_(ids))
                                   .group_by(Job.id, Job.state, Job.reason))
            return {job_id: (state, reason, newest) for job_id, state, reason, newest in rows}


async def pages(factory: sessionmaker[Session], key: LogKey, offset: int, end: int,
                limiter: anyio.CapacityLimiter | None = None) -> AsyncIterator[bytes]:
    """The log from `offset` to `end`, one page (logs.PAGE_BYTES) at a time,
    each read in a short session of its own: a response holds one page, and
    the next is read only once the client has taken it."""
    def read(at: int) -> bytes:
        with factory() as session:
            return logs.read_from(session, *key, at, end - at)

    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # text, as the whole-body answer always was
    while offset < end:
        chunk = await anyio.to_thread.run_sync(read, offset, limiter=limiter)
        if not chunk:
            break
        offset += len(chunk)
        yield decoder.decode(chunk).encode()
    yield decoder.decode(b"", final=True).encode()


# How often a stream asks whether the token that opened it still stands.
RECHECK_S = 10.0
REVOKED_LINE = "the token this stream was opened with was revoked or rotated: the stream ends"


async def while_authorized(content: AsyncIterator[bytes], stands: Callable[[], bool],
                           every_s: float | None = None) -> AsyncIterator[bytes]:
    """`content` for as long as `stands()` (asked off the event loop, every
    `every_s` seconds, while it sends and while it waits) says the token that
    opened the stream still stands: a follow opened with a leaked token went
    on for the rest of the job after the token was rotated."""
    from spotbroker.broker.usecases.narration import line

    every_s = every_s or RECHECK_S
    it = aiter(content)
    pending: asyncio.Future | None = None
    checked = time.monotonic()
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if time.monotonic() - checked >= every_s:
                checked = time.monotonic()
                if not await run_in_threadpool(stands):
                    yield b"\n" + line(REVOKED_LINE)
                    return
            if not done:
                continue
            finished, pending = pending, None
            try:
                chunk = finished.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        if pending is not None:
            pending.cancel()
            try:
                await pending
            except BaseException:  # (its cancellation, or the end it had reached)
                pass
        await it.aclose()


class FollowResponse(StreamingResponse):
    """One of a team's log streams (followed, or a whole read's pages), which
    gives the team's place (taken by `admit`) back however it ends, even if
    the stream never started."""

    def __init__(self, followers: Followers, team_id: int, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/plain; charset=utf-8")
        self._release = lambda: followers.release(team_id)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            await self.body_iterator.aclose()


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
