"""Attempt logs in the database (`log_chunks`), where every broker replica
reads them.

Each node's agent ships the trainer's output over HTTP (`append_at`), to
whichever replica the load balancer picks; each log keeps at most
SPOTBROKER_MAX_LOG_BYTES, then a marker (agent/logbound.py). A log is rows
of at most ROW_BYTES, contiguous from offset 0, keyed (attempt, rank, start).

Nothing here holds a whole log: reads are pages of at most PAGE_BYTES
(`read_from`), `tail_start` walks rows backwards from the end only as far as
the lines it is asked for, and a caller streams the rest page by page.

A job's ended attempts keep at most SPOTBROKER_MAX_JOB_LOG_BYTES of logs
together: each new attempt removes the oldest ones' logs past it
(`keep_within`), with a `log_removed` event for each, as Kubernetes keeps a
container's previous log but not every one before it. Without it a job that
printed its bound and failed, a thousand restarts over, kept a terabyte.

A log is finished (`finished`) when nothing more will come: its attempt has
ended and its node's agent has said its last word or cannot any more. An
attempt ends at a preemption's flush, or at a cancel, before its node does:
the trainer runs on until the cloud (or the release) stops it, and what it
prints meanwhile reaches the log after the attempt's end.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.agent import logbound, protocol
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, EndReason
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, LogChunk

ROW_BYTES = 64 * 1024               # the most bytes in one row
PAGE_BYTES = 256 * 1024             # the most one read returns (and a response sends at once)
_APPEND_TRIES = 3
# How long after its attempt's end a node that may still run is waited for
# when its agent never says its last word (the cloud took the VM at once).
LATE_S = 30.0
# Ends after which the node may still run and ship (see the module's docstring).
_NODE_OUTLIVES = frozenset({EndReason.PREEMPTED, EndReason.MOVED, EndReason.CANCELLED})
REMOVED_EVENT = "log_removed"  # an ended attempt's logs went to keep its job's within its bound


def _of(attempt_id: int, rank: int):
    return (LogChunk.attempt_id == attempt_id) & (LogChunk.rank == rank)


def size(session: Session, attempt_id: int, rank: int = 0) -> int:
    """The log's length in bytes (0 when nothing was stored)."""
    last = session.execute(select(LogChunk.start, LogChunk.size).where(_of(attempt_id, rank))
                           .order_by(LogChunk.start.desc()).limit(1)).first()
    return last.start + last.size if last else 0


def marks(session: Session, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """For each (attempt, rank) log that has rows: the start of its newest row,
    which changes with every append (a follower's cue to read)."""
    ids = {attempt_id for attempt_id, _ in keys}
    if not ids:
        return {}
    rows = session.execute(select(LogChunk.attempt_id, LogChunk.rank, func.max(LogChunk.start))
                           .where(LogChunk.attempt_id.in_(ids)).group_by(LogChunk.attempt_id, LogChunk.rank))
    return {(a, r): m for a, r, m in rows}


def finished(session: Session, keys: Iterable[tuple[int, int]], now: datetime) -> set[tuple[int, int]]:
    """The (attempt, rank) logs among `keys` that will not grow any more.

    A node that outlives its attempt's end is waited for until its agent
    reports the trainer's exit, which it sends once the log is shipped
    (agent/runner.py), or for LATE_S. One whose agent never spoke has
    nothing to ship; one the launcher saw end (an exit code) has ended. The
    exit says how long the log is: a broker back from an outage takes the
    exit and the log's last bytes at once, and the exit may come first; the
    log is then finished once it has them, or LATE_S after the end."""
    keys = set(keys)
    rows = session.execute(select(Attempt.id, Attempt.job_id, Attempt.state, Attempt.end_reason,
                                  Attempt.exit_code, Attempt.ended_at, Attempt.agent_seq)
                           .where(Attempt.id.in_({a for a, _ in keys}))).all()
    ended, waiting, late = set(), set(), set()
    for row in rows:
        if row.state in LIVE_ATTEMPT_STATES:
            continue
        if row.ended_at is None or now - row.ended_at >= timedelta(seconds=LATE_S):
            late.add(row.id)
        if row.end_reason in _NODE_OUTLIVES and row.exit_code is None and row.agent_seq > 0 and row.id not in late:
            waiting.add(row.id)
        else:
            ended.add(row.id)
    done = {key for key in keys if key[0] in ended}
    over = {row.job_id for row in rows if row.id in ended | waiting}
    if not over:
        return done
    exits = session.execute(select(Event.attempt_id, Event.data).where(  # job_id: the events' index
        Event.job_id.in_(over), Event.attempt_id.in_(ended | waiting), Event.type == protocol.TRAINER_EXITED)).all()
    said = {(attempt_id, _rank(data)): data for attempt_id, data in exits}
    stored = _sizes(session, [key for key in said if key in keys and key[0] not in late])
    for key, data in said.items():
        if key not in keys:
            continue
        expected = data.get(protocol.EVENT_LOG_BYTES) if isinstance(data, dict) else None
        whole = key[0] in late or not isinstance(expected, int) or stored.get(key, 0) >= expected
        if whole:
            done.add(key)
        else:
            done.discard(key)
    return done


def _sizes(session: Session, keys: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Each log's length, from its rows (contiguous from 0), in one query."""
    if not keys:
        return {}
    rows = session.execute(select(LogChunk.attempt_id, LogChunk.rank, func.max(LogChunk.start + LogChunk.size))
                           .where(LogChunk.attempt_id.in_({a for a, _ in keys}))
                           .group_by(LogChunk.attempt_id, LogChunk.rank))
    return {(a, r): n for a, r, n in rows}


def _rank(data: object) -> int:
    node = data.get(protocol.EVENT_NODE) if isinstance(data, dict) else None
    return node if isinstance(node, int) else 0


def read_from(session: Session, attempt_id: int, rank: int, offset: int, limit: int = PAGE_BYTES) -> bytes:
    """At most `limit` bytes of the log from `offset` (fewer at its end).
    Rows are contiguous, so those that start within [offset - ROW_BYTES,
    offset + limit) hold all of it and at most limit + 2 rows' bytes."""
    limit = min(limit, PAGE_BYTES)
    rows = session.execute(select(LogChunk.start, LogChunk.data).where(
        _of(attempt_id, rank), LogChunk.start > offset - ROW_BYTES, LogChunk.start < offset + limit)
        .order_by(LogChunk.start))
    out = bytearray()
    for start, data in rows:
        if start + len(data) <= offset:
            continue
        if start > offset + len(out):  # a gap cannot happen (rows are contiguous); stop at it all the same
            break
        out += data[offset + len(out) - start:]
        if len(out) >= limit:
            break
    return bytes(out[:limit])


def tail_start(session: Session, attempt_id: int, rank: int, lines: int | None) -> tuple[int, int]:
    """(where the last `lines` lines begin, the log's length): all of it when
    `lines` is None. Walks rows back from the end, as far as those lines go,
    one page at a time: time and memory follow what is asked, not the log.
    A line ends with b"\\n"; an unfinished last line counts as one."""
    end = size(session, attempt_id, rank)
    if lines is None:
        return 0, end
    if lines == 0:
        return end, end
    left, before, newest = lines, end, True
    while before > 0:
        rows = session.execute(select(LogChunk.start, LogChunk.data).where(
            _of(attempt_id, rank), LogChunk.start < before, LogChunk.start >= before - PAGE_BYTES)
            .order_by(LogChunk.start.desc())).all()
        if not rows:
            break
        for start, data in rows:
            if newest and data.endswith(b"\n"):  # the log's final newline ends its last line, starts none
                data = data[:-1]
            newest = False
            found = data.count(b"\n")
            if found >= left:
                at = len(data)
                for _ in range(left):
                    at = data.rindex(b"\n", 0, at)
                return start + at + 1, end
            left -= found
            before = start
    return 0, end


@dataclass(frozen=True)
class Appended:
    size: int   # the output's offset up to which the log has it (stored, or dropped past the bound)
    cut: bool   # this chunk reached the bound: the log now ends with the marker


def append_at(factory: sessionmaker[Session], attempt_id: int, rank: int, offset: int, chunk: bytes,
              limit: int = 0) -> Appended:
    """Store `chunk` as the bytes at `offset` of the log, keeping at most
    `limit` bytes (0: no bound): past them the marker, once, and nothing more.

    Idempotent for re-sent chunks; a chunk past the end is not stored (the
    caller resends from the returned size), unless the log is cut already:
    then every chunk is taken and dropped. Two replicas storing at the same
    offset at once: the primary key lets one in, the other looks again."""
    for tries_left in range(_APPEND_TRIES - 1, -1, -1):
        try:
            with transaction(factory) as session:
                stored = size(session, attempt_id, rank)
                if limit and stored > limit:  # cut already: what the node sends now is dropped
                    return Appended(offset + len(chunk), cut=False)
                if not offset <= stored < offset + len(chunk):
                    return Appended(stored, cut=False)
                kept, cut = logbound.cut(stored, chunk[stored - offset:], limit)
                session.add_all(LogChunk(attempt_id=attempt_id, rank=rank, start=stored + i, size=len(piece),
                                         data=piece)
                                for i in range(0, len(kept), ROW_BYTES) for piece in [kept[i:i + ROW_BYTES]])
            return Appended(offset + len(chunk), cut)
        except IntegrityError:
            if not tries_left:
                raise
    raise AssertionError("unreachable")


def removed(session: Session, job_id: int, attempt_id: int) -> int | None:
    """The bytes of the attempt's logs that `keep_within` removed; None if it removed none."""
    data = session.scalar(select(Event.data).where(Event.job_id == job_id, Event.attempt_id == attempt_id,
                                                   Event.type == REMOVED_EVENT).limit(1))
    return data.get("bytes") if isinstance(data, dict) else None


def keep_within(session: Session, job_id: int, limit: int, now: datetime) -> int:
    """Remove the logs of the job's oldest ended attempts until those of its
    ended attempts together are at most `limit` bytes (0: no bound); how many
    bytes went. An attempt whose node may still ship is left for a later
    call: what it sends would start its log again."""
    if not limit:
        return 0
    ended = select(Attempt.id).where(Attempt.job_id == job_id,
                                     Attempt.state.not_in([str(s) for s in LIVE_ATTEMPT_STATES]))
    # Each log's length from its last row, found on the index: the bytes stay on disk.
    last = (select(LogChunk.attempt_id, LogChunk.rank, func.max(LogChunk.start).label("start"))
            .where(LogChunk.attempt_id.in_(ended)).group_by(LogChunk.attempt_id, LogChunk.rank).subquery())
    lasts = session.execute(select(LogChunk.attempt_id, LogChunk.rank, LogChunk.start + LogChunk.size).join(
        last, (LogChunk.attempt_id == last.c.attempt_id) & (LogChunk.rank == last.c.rank)
        & (LogChunk.start == last.c.start))).all()
    held: dict[int, int] = {}
    for attempt_id, _, length in lasts:
        held[attempt_id] = held.get(attempt_id, 0) + length
    over = sum(held.values()) - limit
    if over <= 0:
        return 0
    done = finished(session, [(a, r) for a, r, _ in lasts], now)
    shipping = {a for a, r, _ in lasts if (a, r) not in done}
    removed = 0
    for attempt_id in sorted(held):
        if removed >= over:
            break
        if attempt_id in shipping:
            continue
        session.execute(delete(LogChunk).where(LogChunk.attempt_id == attempt_id))
        session.add(Event(job_id=job_id, attempt_id=attempt_id, type=REMOVED_EVENT, at=now,
                          data={"bytes": held[attempt_id], "setting": "SPOTBROKER_MAX_JOB_LOG_BYTES"}))
        removed += held[attempt_id]
    return removed
