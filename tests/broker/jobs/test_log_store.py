"""The attempt log store (broker/jobs/logs.py) on SQLite and PostgreSQL:
appends by offset as an agent re-sends them, from replicas at once; pages
that never exceed their bound; the last lines found by walking back only
as far as they go; when a log is finished; logs an older broker kept on
disk moved in at start."""
from __future__ import annotations

import random
import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, select
from support.world import T0, World

from spotbroker.agent import logbound, protocol
from spotbroker.broker.jobs import logs
from spotbroker.broker.jobs.logimport import import_disk_logs
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, LogChunk


@pytest.fixture
def attempt(factory) -> int:
    world = World(factory)
    return world.attempt(world.job(world.team()), nodes=2)


def whole(factory, attempt_id: int, rank: int = 0) -> bytes:
    out, offset = b"", 0
    with factory() as session:
        while chunk := logs.read_from(session, attempt_id, rank, offset):
            assert len(chunk) <= logs.PAGE_BYTES
            out, offset = out + chunk, offset + len(chunk)
    return out


def test_appends_by_offset_are_idempotent_and_keep_each_node_apart(factory, attempt):
    assert logs.append_at(factory, attempt, 0, 0, b"one\n").size == 4
    assert logs.append_at(factory, attempt, 0, 0, b"one\n").size == 4            # re-sent: ignored
    assert logs.append_at(factory, attempt, 0, 2, b"e\ntwo\n").size == 8         # overlapping: the new bytes
    assert logs.append_at(factory, attempt, 0, 100, b"gap\n").size == 8         # past the end: resend from 8
    assert logs.append_at(factory, attempt, 1, 0, b"node one\n").size == 9
    assert whole(factory, attempt) == b"one\ntwo\n" and whole(factory, attempt, 1) == b"node one\n"
    big = bytes(random.Random(1).randrange(256) for _ in range(3 * logs.ROW_BYTES + 5))
    assert logs.append_at(factory, attempt, 0, 8, big).size == 8 + len(big)
    assert whole(factory, attempt) == b"one\ntwo\n" + big
    with factory() as session:
        sizes = session.scalars(select(LogChunk.size).where(LogChunk.rank == 0)).all()
    assert max(sizes) <= logs.ROW_BYTES


def test_the_bound_cuts_once_with_the_marker_and_drops_the_rest(factory, attempt):
    first = logs.append_at(factory, attempt, 0, 0, b"a" * 60, limit=100)
    cut = logs.append_at(factory, attempt, 0, 60, b"b" * 60, limit=100)
    again = logs.append_at(factory, attempt, 0, 60, b"b" * 60, limit=100)
    later = logs.append_at(factory, attempt, 0, 120, b"c" * 10, limit=100)
    assert (first.cut, cut.cut, again.cut, later.cut) == (False, True, False, False)
    assert (cut.size, again.size, later.size) == (120, 120, 130)
    assert whole(factory, attempt) == b"a" * 60 + b"b" * 40 + logbound.marker(100)


def test_replicas_appending_the_same_chunks_at_once_store_each_byte_once(factory, attempt):
    """Two replicas taking re-sent chunks at the same moment: the primary
    key lets one write at an offset; the other looks again."""
    data = b"".join(f"line {i}\n".encode() for i in range(2000))
    pieces = [(o, data[o:o + 1000]) for o in range(0, len(data), 1000)]

    def agent() -> None:
        for offset, piece in pieces:
            logs.append_at(factory, attempt, 0, offset, piece)

    threads = [threading.Thread(target=agent) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert whole(factory, attempt) == data


def test_a_log_is_finished_once_its_node_has_said_its_last_word_or_cannot(factory, attempt):
    """A preemption ends the attempt at the flush; its node prints on until the
    cloud takes it. Its logs are finished when each node's agent reports the
    trainer's exit (sent after the log), or LATE_S after the end."""
    keys, end = [(attempt, 0), (attempt, 1)], T0 + timedelta(minutes=5)

    def finished(at=end, **row) -> set:
        with transaction(factory) as s:
            a = s.get(Attempt, attempt)
            for field, value in row.items():
                setattr(a, field, value)
            return logs.finished(s, keys, at)

    assert finished() == set()                                   # it runs
    ended = {"state": "PREEMPTED", "end_reason": "preempted", "ended_at": end}
    assert finished(**ended, agent_seq=0) == set(keys)           # no agent ever spoke: nothing to wait for
    assert finished(agent_seq=7) == set()                        # its agent spoke: its last word is awaited
    assert finished(end + timedelta(seconds=logs.LATE_S)) == set(keys)  # ... for LATE_S at most
    with transaction(factory) as s:
        job_id = s.get(Attempt, attempt).job_id
        s.add(Event(job_id=job_id, attempt_id=attempt, type=protocol.TRAINER_EXITED, at=end, data={"exit_code": 143}))
    assert finished() == {(attempt, 0)}                          # node 0's agent said it; node 1's not yet
    with transaction(factory) as s:
        s.add(Event(job_id=job_id, attempt_id=attempt, type=protocol.TRAINER_EXITED, at=end,
                    data={"exit_code": 143, protocol.EVENT_NODE: 1}))
    assert finished() == set(keys)
    with transaction(factory) as s:
        s.query(Event).delete()
    assert finished(end_reason="vanished") == set(keys)          # the node is gone
    assert finished(end_reason="preempted", exit_code=0) == set(keys)  # the launcher saw its run end
    assert finished(exit_code=None, state="SUCCEEDED", end_reason="succeeded") == set(keys)


def test_a_log_whose_exit_came_before_its_last_bytes_is_finished_once_it_has_them(factory, attempt):
    """A broker back from an outage takes the agent's exit and the log's last
    bytes at once, and the exit came first: `logs -f` ended with the job, six
    lines of forty shown (seen once in the suite under load)."""
    keys, end = [(attempt, 0)], T0 + timedelta(minutes=5)
    with transaction(factory) as s:
        a = s.get(Attempt, attempt)
        a.state, a.end_reason, a.exit_code, a.ended_at, a.agent_seq = "SUCCEEDED", "succeeded", 0, end, 9
        s.add(Event(job_id=a.job_id, attempt_id=attempt, type=protocol.TRAINER_EXITED, at=end,
                    data={"exit_code": 0, protocol.EVENT_LOG_BYTES: 12}))
    logs.append_at(factory, attempt, 0, 0, b"line 1\n")

    def finished(at=end) -> set:
        with factory() as s:
            return logs.finished(s, keys, at)

    assert finished() == set()                                          # 7 of its 12 bytes
    assert finished(end + timedelta(seconds=logs.LATE_S)) == set(keys)  # ... waited for LATE_S at most
    logs.append_at(factory, attempt, 0, 7, b"line 2\n")
    assert finished() == set(keys)


@pytest.mark.parametrize("text", [
    b"", b"\n", b"a", b"a\n", b"a\nb", b"a\nb\n", b"\n\n\n", b"a\n\nb\n\n", b"x" * 70_000 + b"\n" + b"y" * 200_000,
])
def test_tail_is_the_last_lines_that_unix_tail_gives(factory, attempt, text):
    logs.append_at(factory, attempt, 0, 0, text)
    lines = text.split(b"\n")
    for n in range(0, 6):
        with factory() as session:
            start, end = logs.tail_start(session, attempt, 0, n)
        want = b"" if n == 0 else b"\n".join(lines[:-1][-n:] if text.endswith(b"\n") else lines[-n:]) + (
            b"\n" if text.endswith(b"\n") and n else b"")
        assert (text[start:], end) == (want if text else b"", len(text)), n


def test_tail_reads_back_only_as_far_as_the_lines_it_returns(factory, engine, attempt):
    """16 MiB of output: the last 3 lines read the last rows, not the log."""
    line = b"z" * 999 + b"\n"
    for offset in range(0, 16 << 20, 1 << 20):
        logs.append_at(factory, attempt, 0, offset, line * ((1 << 20) // len(line)) + b"\n" * ((1 << 20) % len(line)))
    fetched = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        if "log_chunks" in statement:
            fetched.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        with factory() as session:
            start, end = logs.tail_start(session, attempt, 0, 3)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert end == 16 << 20 and end - start < 3000
    assert len(fetched) <= 2  # the length, then one page of rows back


def test_logs_an_older_broker_kept_on_disk_are_moved_into_the_store(factory, attempt, tmp_path):
    folder = tmp_path / "logs" / "1"
    folder.mkdir(parents=True)
    node0 = b"".join(f"step {i}\n".encode() for i in range(30_000))  # several rows
    (folder / f"{attempt}.log").write_bytes(node0)
    (folder / f"{attempt}.node-1.log").write_bytes(b"from node 1\n")
    (folder / "999999.log").write_bytes(b"an attempt that is gone\n")
    assert import_disk_logs(factory, tmp_path) == 2
    assert whole(factory, attempt) == node0 and whole(factory, attempt, 1) == b"from node 1\n"
    assert sorted(p.name for p in folder.iterdir()) == []
    # Again (a replica that also held it, a crash before the removal): the store's rows stand.
    (folder / f"{attempt}.log").write_bytes(b"a different copy\n")
    assert import_disk_logs(factory, tmp_path) == 0
    assert whole(factory, attempt) == node0 and not (folder / f"{attempt}.log").exists()


def test_a_job_keeps_its_newest_ended_attempts_logs_within_its_bound(factory):
    """Past SPOTBROKER_MAX_JOB_LOG_BYTES the oldest ended attempts' logs go,
    each with a `log_removed` event; the running attempt's, a node that may
    still ship, and other jobs' logs stay."""
    world = World(factory)
    team = world.team()
    job, other = world.job(team), world.job(team, name="other")
    ids = [world.attempt(job, nodes=2) for _ in range(5)]
    foreign = world.attempt(other)
    for attempt_id in ids + [foreign]:
        logs.append_at(factory, attempt_id, 0, 0, b"x" * 100_000)
    logs.append_at(factory, ids[1], 1, 0, b"y" * 50_000)
    end = T0 + timedelta(minutes=5)
    for attempt_id in ids[:4] + [foreign]:
        world.end(attempt_id, end, "failed")
    with transaction(factory) as s:  # the second's node may still ship: its agent spoke, no exit seen yet
        a = s.get(Attempt, ids[2])
        a.state, a.end_reason, a.agent_seq = "PREEMPTED", "preempted", 3
    now = end + timedelta(seconds=1)

    with transaction(factory) as s:
        assert logs.keep_within(s, job, 0, now) == 0                   # no bound
        assert logs.keep_within(s, job, 450_000, now) == 0             # ended: 450,000 bytes, within
        assert logs.keep_within(s, job, 200_000, now) == 250_000       # 1st and 2nd go; the 3rd still ships
    with factory() as s:
        removed = s.execute(select(Event.attempt_id, Event.data).where(Event.type == logs.REMOVED_EVENT)
                            .order_by(Event.id)).all()
        left = {(a, r) for a, r in s.execute(select(LogChunk.attempt_id, LogChunk.rank).distinct())}
    assert [(a, d["bytes"]) for a, d in removed] == [(ids[0], 100_000), (ids[1], 150_000)]
    assert left == {(ids[2], 0), (ids[3], 0), (ids[4], 0), (foreign, 0)}
    assert whole(factory, ids[3]) == b"x" * 100_000
    # a follower of the job says so where the output was (`logs -f` printed nothing for them)
    from spotbroker.broker.usecases import narration

    with factory() as s:
        seen = narration.view(s, team, job)
    assert [a.log_removed for a in seen.attempts] == [100_000, 150_000, None, None, None]
    assert narration.removed(seen.attempts[0]) == (f"attempt {ids[0]}'s output (100000 bytes) was removed to keep "
                                                   "the job's logs within SPOTBROKER_MAX_JOB_LOG_BYTES")

    with transaction(factory) as s:  # the 3rd's node said its last word: now it goes, the 4th stays
        s.add(Event(job_id=job, attempt_id=ids[2], type=protocol.TRAINER_EXITED, at=end, data={"exit_code": 143}))
    with transaction(factory) as s:
        assert logs.keep_within(s, job, 150_000, now) == 100_000
    with factory() as s:
        assert {a for (a,) in s.execute(select(LogChunk.attempt_id).distinct())} == {ids[3], ids[4], foreign}
