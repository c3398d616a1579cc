"""Following a job across its attempts (`GET /v1/jobs/{id}/logs?follow=true`
without `attempt`): each attempt's output in order, a line of the job's
story (broker/usecases/narration.py) at each change, and the stream ends when
the job does, with its final state. An attempt's output is whole before the
change is said: its log is followed until finished (broker/jobs/logs.py),
so what a preempted node prints until the cloud takes it comes first.

It waits as attempt followers do (api/following.py): on the event loop, on
the one ticker that asks the database, for all followers at once, which
jobs changed; it reads the job only when woken, in a short session of its
own, so that any replica can serve it and none holds a connection.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio.to_thread

from spotbroker.api.following import Followers
from spotbroker.broker.usecases import narration
from spotbroker.broker.usecases.narration import JobView, line

# After an attempt ends, how long to wait for the next one before saying
# why the job waits: a preemption and where the run resumes make one line.
GRACE_S = 5.0


async def follow_job(followers: Followers, team_id: int, job_id: int, rank: int,
                     first: tuple[int, int] | None) -> AsyncIterator[bytes]:
    """The job's output from `first` (attempt id, offset; None: the first
    attempt's start) to its end. Another team's job reads as gone (the
    route checked it before the stream began)."""
    def read() -> JobView:
        with followers.factory() as session:
            return narration.view(session, team_id, job_id)

    watch = followers.watch_job(job_id)
    try:
        streamed: int | None = None   # the attempt whose output was sent last
        unsaid: int | None = None     # an attempt that ended, not yet said why
        said: tuple[str, str | None] | None = None
        grace = False
        open_line = False             # the output sent last ended without a newline
        while not followers.closing:
            changed = watch.changed  # before the read: a change after it wakes us
            job = await anyio.to_thread.run_sync(read, limiter=followers.reads)
            ended = job.attempt(unsaid) if unsaid is not None else None
            nxt = job.attempt(first[0]) if first and streamed is None else job.after(streamed)
            if nxt is None and not job.ended and ended is not None and not grace:
                grace = True  # the next attempt may be a moment away: one line says both
                await _wait(changed, GRACE_S)
                continue
            if nxt is not None:
                text: str | None = narration.next_on(ended, nxt)
            elif job.ended:
                text = narration.final(job)
            elif (job.state, job.reason) != said or ended is not None:
                prefix = f"attempt {ended.id} {narration.ended(ended)}; " if ended is not None else ""
                text, unsaid, said = prefix + narration.waiting(job), None, (job.state, job.reason)
            else:
                text = None
            if text is not None:
                # a story line starts a line of its own, after output that left one open (a progress bar)
                yield (b"\n" if open_line else b"") + line(text)
                open_line = False
            if nxt is not None and nxt.log_removed is not None:
                yield line(narration.removed(nxt))  # (its output was streamed as nothing, unsaid)
                unsaid, said, grace = None, None, False
                streamed = unsaid = nxt.id
                continue
            if nxt is not None:
                unsaid, said, grace = None, None, False
                at = first[1] if first and streamed is None else 0
                async with aclosing(followers.stream((nxt.id, rank), at)) as chunks:  # closed when we are
                    async for chunk in chunks:
                        if chunk:
                            open_line = not chunk.endswith(b"\n")
                        yield chunk
                streamed = unsaid = nxt.id
                continue
            if job.ended:
                return
            await changed.wait()
    finally:
        followers.unwatch_job(job_id)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
