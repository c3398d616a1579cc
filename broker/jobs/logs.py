"""Attempt logs on the broker's disk: `{data_dir}/logs/{job_id}/{attempt_id}.log`.

Node 0's agent ships the trainer's output here over HTTP (`append_at`); the
local launcher's other nodes write theirs directly. Each keeps at most
SPOTBROKER_MAX_LOG_BYTES, then a marker (agent/logbound.py). Reading is by
tail and by following.
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spotbroker.agent import logbound


def log_path(data_dir: Path, job_id: int, attempt_id: int, rank: int = 0) -> Path:
    suffix = "" if rank == 0 else f".node-{rank}"
    return data_dir / "logs" / str(job_id) / f"{attempt_id}{suffix}.log"


def tail(path: Path, lines: int | None) -> tuple[bytes, int]:
    """The last `lines` lines (all when None) and the file offset after them."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            if lines is None:
                f.seek(0)
                return f.read(), size
            block, data, pos = 64 * 1024, b"", size
            while pos > 0 and data.count(b"\n") <= lines:
                pos = max(0, pos - block)
                f.seek(pos)
                data = f.read(size - pos)
            kept = data.splitlines(keepends=True)[-lines:] if lines else []
            return b"".join(kept), size
    except FileNotFoundError:
        return b"", 0


def read_from(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def follow(path: Path, offset: int, still_running: Callable[[], bool], poll: float = 0.25) -> Iterator[bytes]:
    """Yield new bytes as they are written, until `still_running()` is false
    and nothing is left to read."""
    while True:
        chunk = read_from(path, offset)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        if not still_running():
            chunk = read_from(path, offset)
            if chunk:
                yield chunk
            return
        time.sleep(poll)


@dataclass(frozen=True)
class Appended:
    size: int   # the output's offset up to which the log has it (stored, or dropped past the bound)
    cut: bool   # this chunk reached the bound: the log now ends with the marker


def append_at(path: Path, offset: int, chunk: bytes, limit: int = 0) -> Appended:
    """Store `chunk` as the bytes at `offset` of the log, keeping at most
    `limit` bytes (0: no bound): past them the marker, once, and nothing more.

    Idempotent for re-sent chunks; a chunk past the end is not stored (the
    caller resends from the returned size), unless the log is cut already:
    then every chunk is taken and dropped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a re-sent chunk racing the first: one writes, one cut
        size = f.seek(0, os.SEEK_END)
        if limit and size > limit:  # cut already: what the node sends now is dropped
            return Appended(offset + len(chunk), cut=False)
        if not offset <= size < offset + len(chunk):
            return Appended(size, cut=False)
        kept, cut = logbound.cut(size, chunk[size - offset:], limit)
        f.write(kept)
    return Appended(offset + len(chunk), cut)
