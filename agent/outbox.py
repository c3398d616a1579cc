"""The agent's outbox: its events on disk, in seq order, until the broker has them.

Every event the agent reports (its own and the ones the trainer's library
writes) is appended here and fsynced before anything counts on it, so that a
broker that is down, or an agent restarted on the same work dir, loses
nothing: the event sender (:mod:`spotbroker.agent.delivery`) posts what is
pending and acknowledges it here, and only then is it forgotten. Once the
file passes `COMPACT_BYTES`, an acknowledgement rewrites it with only what
is still pending (a heartbeat every 5 s would otherwise add ~2 MB a day).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("spotbroker.agent")

OUTBOX_FILE = "outbox.jsonl"
OUTBOX_ACKED_FILE = "outbox.acked"  # the highest seq the broker has acknowledged
BATCH_SIZE = 100
COMPACT_BYTES = 1 << 20


from spotbroker.agent.protocol import now_iso  # noqa: E402,F401  (re-exported)


class Outbox:
    """Events in seq order, appended to a file and kept until the broker acknowledges them."""

    def __init__(self, directory: Path, compact_bytes: int = COMPACT_BYTES) -> None:
        self.compact_bytes = compact_bytes
        self._path = directory / OUTBOX_FILE
        self._acked_path = directory / OUTBOX_ACKED_FILE
        self._changed = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self.acked = int(self._acked_path.read_text()) if self._acked_path.exists() else 0
        self.last_seq = self.acked
        for event in _read_jsonl(self._path):  # an agent restarted on the same work dir goes on
            self.last_seq = max(self.last_seq, event["seq"])
            if event["seq"] > self.acked:
                self._pending.append(event)
        self._file = open(self._path, "ab")
        if self._file.tell() and not self._path.read_bytes().endswith(b"\n"):
            self._file.write(b"\n")  # end a line cut short by a crash, so the next event stands alone

    def add(self, event_type: str, data: dict[str, Any], at: str | None = None) -> dict[str, Any]:
        with self._changed:
            self.last_seq += 1
            event = {"seq": self.last_seq, "type": event_type, "at": at or now_iso(), "data": data}
            self._file.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
            self._file.flush()
            os.fsync(self._file.fileno())  # on disk before anyone counts on it
            self._pending.append(event)
            self._changed.notify_all()
        log.debug("event %d %s", event["seq"], event_type)
        return event

    def batch(self, limit: int = BATCH_SIZE) -> list[dict[str, Any]]:
        with self._changed:
            return list(self._pending[:limit])

    def ack(self, seq: int) -> None:
        with self._changed:
            self._pending = [e for e in self._pending if e["seq"] > seq]
            self.acked = max(self.acked, seq)
            tmp = self._acked_path.with_suffix(".tmp")
            tmp.write_text(str(self.acked))
            os.replace(tmp, self._acked_path)
            if self._file.tell() > self.compact_bytes:
                self._compact()
            self._changed.notify_all()

    def _compact(self) -> None:
        """Rewrite the file with the pending events only. The acknowledged seq is
        on disk first, so a crash at any point leaves either file readable as
        a whole: the old one (its acknowledged events are skipped) or the new."""
        tmp = self._path.with_suffix(".compact")
        with open(tmp, "wb") as f:
            f.writelines(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in self._pending)
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself is durable
        finally:
            os.close(dir_fd)
        self._file = open(self._path, "ab")

    def wait_pending(self, timeout: float) -> bool:
        with self._changed:
            if not self._pending:
                self._changed.wait(timeout)
            return bool(self._pending)

    def has_pending(self, event_type: str | None = None) -> bool:
        with self._changed:
            return any(event_type is None or e["type"] == event_type for e in self._pending)

    def close(self) -> None:
        self._file.close()


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
