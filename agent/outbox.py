"""The agent's outbox: its events on disk, in seq order, until the broker has them.

Every event the agent reports (its own and the ones the trainer's library
writes) is appended here and fsynced before anything counts on it, so that a
broker that is down, or an agent restarted on the same work dir, loses
nothing: the event sender (:mod:`spotbroker.agent.delivery`) posts what is
pending and acknowledges it here, and only then is it forgotten. Once the
file passes `COMPACT_BYTES` (and is mostly acknowledged events), an
acknowledgement rewrites it with a marker of the acknowledged seq and what
is still pending (a heartbeat every 5 s would otherwise add ~2 MB a day).
The marker keeps the numbering going even if `outbox.acked` is lost: a seq
the broker has seen is never used again (it would ignore the event).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from spotbroker.agent.protocol import now_iso

log = logging.getLogger("spotbroker.agent")

OUTBOX_FILE = "outbox.jsonl"
OUTBOX_ACKED_FILE = "outbox.acked"  # the highest seq the broker has acknowledged
BATCH_SIZE = 100
COMPACT_BYTES = 1 << 20
ACKED_MARKER = "_acked"  # a line of the compacted file: {"seq": acked, "type": "_acked"}


class Outbox:
    """Events in seq order, appended to a file and kept until the broker acknowledges them."""

    def __init__(self, directory: Path, compact_bytes: int = COMPACT_BYTES) -> None:
        self.compact_bytes = compact_bytes
        self._path = directory / OUTBOX_FILE
        self._acked_path = directory / OUTBOX_ACKED_FILE
        self._changed = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self._closed = False
        self.acked = _read_int(self._acked_path)
        self.last_seq = self.acked
        for event in _read_jsonl(self._path):  # an agent restarted on the same work dir goes on
            self.last_seq = max(self.last_seq, event["seq"])
            if event["type"] == ACKED_MARKER:
                self.acked = max(self.acked, event["seq"])
            elif event["seq"] > self.acked:
                self._pending.append(event)
        self._pending = [e for e in self._pending if e["seq"] > self.acked]
        self._pending_bytes = sum(len(_line(e)) for e in self._pending)  # what compaction would keep
        self._file = open(self._path, "ab")
        if self._file.tell() and not self._path.read_bytes().endswith(b"\n"):
            self._file.write(b"\n")  # end a line cut short by a crash, so the next event stands alone

    def add(self, event_type: str, data: dict[str, Any], at: str | None = None) -> dict[str, Any]:
        with self._changed:
            self.last_seq += 1
            event = {"seq": self.last_seq, "type": event_type, "at": at or now_iso(), "data": data}
            line = _line(event)
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())  # on disk before anyone counts on it
            self._pending.append(event)
            self._pending_bytes += len(line)
            self._changed.notify_all()
        log.debug("event %d %s", event["seq"], event_type)
        return event

    def batch(self, limit: int = BATCH_SIZE) -> list[dict[str, Any]]:
        with self._changed:
            return list(self._pending[:limit])

    def ack(self, seq: int) -> None:
        with self._changed:
            done = [e for e in self._pending if e["seq"] <= seq]
            self._pending = self._pending[len(done):]  # in seq order
            self._pending_bytes -= sum(len(_line(e)) for e in done)
            self.acked = max(self.acked, seq)
            # Not fsynced: a stale or lost value only re-sends events the broker
            # ignores by seq; the compacted file's marker is what keeps seqs unique.
            tmp = self._acked_path.with_name(self._acked_path.name + ".tmp")
            tmp.write_text(str(self.acked))
            os.replace(tmp, self._acked_path)
            if not self._closed and self._file.tell() > self.compact_bytes:
                self._compact()
            self._changed.notify_all()

    def _compact(self) -> None:
        """Rewrite the file as the acknowledged-seq marker plus the pending events,
        when that sheds at least half of it (a long outage's backlog is not
        rewritten on every acknowledgement). Best effort: on any OS error the
        old file stays in use, and it is still correct."""
        if 2 * self._pending_bytes > self._file.tell():
            return
        lines = [_line({"seq": self.acked, "type": ACKED_MARKER})] + [_line(e) for e in self._pending]
        try:
            _write_durably(self._path, b"".join(lines))
            new = open(self._path, "ab")
        except OSError as exc:
            log.warning("could not compact the outbox (it keeps growing): %s", exc)
            return
        self._file.close()
        self._file = new

    def wait_pending(self, timeout: float) -> bool:
        with self._changed:
            if not self._pending:
                self._changed.wait(timeout)
            return bool(self._pending)

    def has_pending(self, event_type: str | None = None) -> bool:
        with self._changed:
            return any(event_type is None or e["type"] == event_type for e in self._pending)

    def close(self) -> None:
        with self._changed:  # a late acknowledgement may still come in; it no longer compacts
            self._closed = True
            self._file.close()


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _write_durably(path: Path, content: bytes) -> None:
    """Replace `path` with `content`: written and fsynced aside, renamed over it,
    and the rename made durable, so a crash leaves the old file or the new."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0  # missing, or cut short by a crash: the file's own marker says more


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_bytes().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    return events
