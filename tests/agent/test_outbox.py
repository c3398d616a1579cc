"""The outbox keeps every unacknowledged event across restarts, and stays small."""
from __future__ import annotations

import json

from spotbroker.agent.outbox import ACKED_MARKER, OUTBOX_ACKED_FILE, OUTBOX_FILE, Outbox


def lines(directory):
    return [json.loads(x) for x in (directory / OUTBOX_FILE).read_text().splitlines()]


def events(directory):
    return [e for e in lines(directory) if e["type"] != ACKED_MARKER]


def test_acknowledged_events_are_compacted_away_once_the_file_is_large(tmp_path):
    box = Outbox(tmp_path, compact_bytes=2000)
    for i in range(40):
        box.add("heartbeat", {"i": i})
    box.ack(30)
    assert [e["seq"] for e in events(tmp_path)] == list(range(31, 41))  # only what is pending
    box.add("heartbeat", {"i": 40})
    box.close()
    again = Outbox(tmp_path, compact_bytes=2000)  # a restarted agent goes on where it stood
    assert [e["seq"] for e in again.batch()] == list(range(31, 42))
    assert again.add("heartbeat", {})["seq"] == 42
    again.close()


def test_a_small_file_is_left_alone(tmp_path):
    box = Outbox(tmp_path)
    for i in range(5):
        box.add("heartbeat", {"i": i})
    box.ack(5)
    box.close()
    assert len(events(tmp_path)) == 5
    again = Outbox(tmp_path)
    assert again.batch() == [] and again.add("heartbeat", {})["seq"] == 6
    again.close()


def test_everything_acknowledged_then_compacted_continues_the_numbering(tmp_path):
    box = Outbox(tmp_path, compact_bytes=100)
    for i in range(10):
        box.add("heartbeat", {"i": i})
    box.ack(10)
    box.close()
    assert lines(tmp_path) == [{"seq": 10, "type": ACKED_MARKER}]
    (tmp_path / OUTBOX_ACKED_FILE).unlink()  # even with the acknowledged seq's own file lost
    again = Outbox(tmp_path, compact_bytes=100)
    assert again.batch() == []
    assert again.add("heartbeat", {})["seq"] == 11  # never reuses a seq the broker has seen
    again.close()


def test_a_compaction_that_fails_leaves_the_outbox_working(tmp_path, monkeypatch):
    from spotbroker.agent import outbox

    box = Outbox(tmp_path, compact_bytes=100)
    for i in range(10):
        box.add("heartbeat", {"i": i})
    real = outbox._write_durably

    def full_disk(path, content):
        if path.name == OUTBOX_FILE:
            raise OSError(28, "No space left on device")
        return real(path, content)

    monkeypatch.setattr(outbox, "_write_durably", full_disk)
    box.ack(10)  # no error escapes: the delivery thread must live on
    assert box.add("heartbeat", {})["seq"] == 11 and [e["seq"] for e in box.batch()] == [11]
    box.close()
    box.ack(11)  # a late acknowledgement after close is harmless
    assert [e["seq"] for e in events(tmp_path)][-1] == 11


def test_a_backlog_is_not_rewritten_on_every_acknowledgement(tmp_path):
    box = Outbox(tmp_path, compact_bytes=1000)
    for i in range(200):
        box.add("heartbeat", {"i": i})
    box.ack(5)  # most of the file is still pending: nothing to shed
    assert len(events(tmp_path)) == 200
    box.ack(190)
    assert [e["seq"] for e in events(tmp_path)] == list(range(191, 201))
    box.close()
