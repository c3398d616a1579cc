"""Group commit for job submissions.

Submissions that arrive while a batch is being written wait, and the next
batch takes all of them: one transaction, one INSERT for the jobs and one
for their events, however many there are. Alone, a submission is written at
once (a batch of one), so this adds no latency; under load it divides the
database's work per submission (round trips, commits) by the batch size.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.api.schemas import JobOut
from spotbroker.broker.clock import Clock
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.sealing import Keyring
from spotbroker.broker.usecases import jobs

MAX_BATCH = 200


class SubmissionBatcher:
    def __init__(self, factory: sessionmaker[Session], clock: Clock, on_written: Callable[[], None],
                 keyring: Keyring) -> None:
        self.factory, self.clock, self.on_written, self.keyring = factory, clock, on_written, keyring
        self._waiting: list[tuple[jobs.Submission, str, asyncio.Future[JobOut]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, sub: jobs.Submission, team_name: str) -> JobOut:
        future: asyncio.Future[JobOut] = asyncio.get_running_loop().create_future()
        self._waiting.append((sub, team_name, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all())
        return await future

    async def _write_all(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                written = await run_in_threadpool(self._write, [(s, t) for s, t, _ in batch])
            except Exception as exc:  # the batch is lost as a whole: each request answers with the error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), out in zip(batch, written, strict=True):
                if not future.done():
                    future.set_result(out)
            self.on_written()

    def _write(self, batch: list[tuple[jobs.Submission, str]]) -> list[JobOut]:
        try:
            with transaction(self.factory) as session:
                made = jobs.submit_many(session, [s for s, _ in batch], self.clock, self.keyring)
                now = self.clock.now()
                return [JobOut.of(job, team, now) for job, (_, team) in zip(made, batch, strict=True)]
        except IntegrityError:
            # Another broker wrote one of these idempotency keys meanwhile:
            # write them one by one, so that only the loser is settled by key.
            return [self._write_one(s, team) for s, team in batch]

    def _write_one(self, sub: jobs.Submission, team: str) -> JobOut:
        try:
            with transaction(self.factory) as session:
                return JobOut.of(jobs.submit_many(session, [sub], self.clock, self.keyring)[0], team, self.clock.now())
        except IntegrityError:
            with self.factory() as session:
                return JobOut.of(jobs.by_key(session, sub.team_id, sub.idempotency_key), team, self.clock.now())
