"""Attempt logs on the broker's disk: `{data_dir}/logs/{job_id}/{attempt_id}.log`.

The local launcher writes them directly; on cloud nodes the agent ships the
trainer's output here over HTTP. Reading is by tail and by following.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


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


def append_at(path: Path, offset: int, chunk: bytes) -> int:
    """Store `chunk` as the bytes at `offset` of the log; returns the size.

    Idempotent for re-sent chunks; a chunk past the end is not stored (the
    caller resends from the returned size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        size = f.seek(0, os.SEEK_END)
        if offset <= size < offset + len(chunk):
            f.write(chunk[size - offset:])
            size = offset + len(chunk)
    return size
