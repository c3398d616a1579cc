"""Durable, atomic writes of local objects, for :class:`~spotbroker.agent.checkpoint.storage.Storage`'s
``file://`` URIs: the bytes go to a staging file beside the target, are
fsynced, renamed over it, and the directory is fsynced. Large objects bypass
the page cache (``O_DIRECT``) through a page-aligned bounce buffer, and are
hashed there while the chunk is in cache.
"""
from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STAGING_RE = re.compile(r"#\d+$")
# Linux caps one write() near 2 GiB; stay well below it.
WRITE_CHUNK = 256 * 1024 * 1024
# Local objects at least this large bypass the page cache (O_DIRECT), written
# from a bounce buffer of DIRECT_CHUNK bytes whose address and length are
# multiples of DIRECT_ALIGN (enough for every common logical block size).
DIRECT_THRESHOLD = 4 * 1024 * 1024
DIRECT_CHUNK = 4 * 1024 * 1024
DIRECT_ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)
if O_DIRECT:
    import fcntl


def staging_path(target: Path) -> Path:
    """A unique temporary name beside ``target``: ``name#<digits>``, the
    staging-file form that obstore's local listing skips."""
    return target.with_name(f"{target.name}#{os.getpid()}{secrets.randbelow(10**9):09d}")


def remove_staging_leftovers(directory: Path) -> None:
    """Staging files of killed writers are invisible but take space: remove
    them, and the directories they kept from being cleaned up."""
    if not directory.is_dir():
        return
    for dirpath, _, filenames in os.walk(directory, topdown=False):
        for name in filenames:
            if STAGING_RE.search(name):
                Path(dirpath, name).unlink(missing_ok=True)
        try:
            os.rmdir(dirpath)  # only succeeds when empty
        except OSError:
            pass


_bounce = threading.local()


def bounce_buffer() -> memoryview:
    """This thread's page-aligned DIRECT_CHUNK-byte buffer (anonymous mmap)."""
    view = getattr(_bounce, "view", None)
    if view is None:
        view = _bounce.view = memoryview(mmap.mmap(-1, DIRECT_CHUNK))
    return view


def direct_off(fd: int) -> None:
    """Turn O_DIRECT off for the rest of this file's writes."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)


def write_direct(fd: int, segments: Sequence[memoryview], digest: Any) -> None:
    """Write ``segments`` to ``fd`` (opened O_DIRECT, or not if that failed)
    through the aligned bounce buffer; hash each chunk there while it is in cache.

    O_DIRECT writes whole aligned blocks: the unaligned tail goes out buffered
    (O_DIRECT switched off), as does everything should the kernel refuse a
    direct write (a file system with stricter alignment).
    """
    bounce = bounce_buffer()
    direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)
    filled = 0

    def drain(n: int) -> None:
        nonlocal direct
        chunk = bounce[:n]
        if digest is not None:
            digest.update(chunk)
        done = 0
        aligned = n - n % DIRECT_ALIGN if direct else 0
        if aligned:
            start = os.lseek(fd, 0, os.SEEK_CUR)
            try:
                write_all(fd, chunk[:aligned])
                done = aligned
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                done = os.lseek(fd, 0, os.SEEK_CUR) - start  # what did go out, if any
        if done < n:
            if direct:
                direct_off(fd)
                direct = False
            write_all(fd, chunk[done:n])

    for segment in segments:
        position, size = 0, segment.nbytes
        while position < size:
            n = min(size - position, DIRECT_CHUNK - filled)
            bounce[filled:filled + n] = segment[position:position + n]
            filled += n
            position += n
            if filled == DIRECT_CHUNK:
                drain(filled)
                filled = 0
    if filled:
        drain(filled)


def write_all(fd: int, view: memoryview) -> None:
    done = 0
    total = view.nbytes
    while done < total:
        done += os.write(fd, view[done:done + WRITE_CHUNK])


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
