"""The outbox keeps every unacknowledged event across restarts, and stays small."""
from __future__ import annotations

import json

from spotbroker.agent.outbox import OUTBOX_FILE, Outbox


def lines(directory):
    return [json.loads(x) for x in (directory / OUTBOX_FILE).read_text().splitlines()]


def test_acknowledged_events_are_compacted_away_once_the_file_is_large(tmp_path):
    box = Outbox(tmp_path, compact_bytes=2000)
    for i in range(40):
        box.add("heartbeat", {"i": i})
    box.ack(30)
    assert [e["seq"] for e in lines(tmp_path)] == list(range(31, 41))  # only what is pending
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
    assert len(lines(tmp_path)) == 5
    again = Outbox(tmp_path)
    assert again.batch() == [] and again.add("heartbeat", {})["seq"] == 6
    again.close()


def test_everything_acknowledged_then_compacted_continues_the_numbering(tmp_path):
    box = Outbox(tmp_path, compact_bytes=100)
    for i in range(10):
        box.add("heartbeat", {"i": i})
    box.ack(10)
    box.close()
    assert (tmp_path / OUTBOX_FILE).read_bytes() == b""
    again = Outbox(tmp_path, compact_bytes=100)
    assert again.add("heartbeat", {})["seq"] == 11  # never reuses a seq the broker has seen
    again.close()
