"""A job's output is bounded: past a size, the rest is dropped and a marker says so.

One rule for every place that stores a job's output: the agent's
`trainer.log`, each local node's output file, and the log the broker keeps
per attempt (SPOTBROKER_MAX_LOG_BYTES). A job that prints without end keeps
running; what it prints past the bound is read and dropped, never stored.
"""
from __future__ import annotations

TRUNCATED_EVENT = "log_truncated"  # the broker's event when it cuts an attempt's log


def marker(limit: int) -> bytes:
    return (f"\n[spotbroker: output truncated here: a log keeps at most {limit} bytes "
            "(SPOTBROKER_MAX_LOG_BYTES); the rest was not stored]\n").encode()


def cut(stored: int, data: bytes, limit: int) -> tuple[bytes, bool]:
    """What to write of `data` after the `stored` bytes a log holds, and
    whether that write cuts the log: then it ends with the marker, and
    nothing is written after it. `limit` 0: no bound. A log that was cut
    holds more than `limit` bytes (the marker), so `stored > limit` says so."""
    if not limit or stored + len(data) <= limit:
        return data, False
    if stored > limit:  # cut already
        return b"", False
    return data[:limit - stored] + marker(limit), True


class BoundedWriter:
    """Writes a stream to a binary file object up to `limit` bytes, then the marker once."""

    def __init__(self, sink, limit: int, stored: int = 0) -> None:
        self.sink = sink
        self.limit = limit
        self.stored = stored
        self.cut = limit > 0 and stored > limit

    def write(self, data: bytes) -> None:
        if self.cut:
            return
        kept, self.cut = cut(self.stored, data, self.limit)
        if kept:
            self.sink.write(kept)
            self.stored += len(kept)

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        self.sink.close()
