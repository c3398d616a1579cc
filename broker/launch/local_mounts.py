"""A local node's file mounts: placed before the job's `setup`, and what the
job wrote in a writable cloud bucket saved when it ends (a local node has
no mount to write through). The node runs as root and the job as its
team's uid: what is placed becomes the job's, and what is saved is read
without following the job's links (`agent/mounts.py`)."""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from spotbroker.agent import protocol
from spotbroker.agent.mounts import Mount
from spotbroker.agent.mounts import place as place_all
from spotbroker.agent.mounts import save as save_all
from spotbroker.agent.mounts import written_back as written_back_one

MAX_KEPT_BYTES = 64 << 10  # a credentials document is a few hundred bytes


def _credentials(env: dict[str, str], node: Path | None = None) -> None:
    """The node's storage credentials for this process: the agent's kept
    file when it renewed them (`node`), else the launch's document."""
    kept = sorted((node / "agent").glob(f"control-*/{protocol.CREDENTIALS_FILE}"), key=os.path.getmtime) \
        if node is not None else []
    document = _read_kept(kept[-1]) if kept else None
    if document is None:
        document = env.get(protocol.ENV_STORAGE_CREDENTIALS)
    if document:
        os.environ[protocol.ENV_STORAGE_CREDENTIALS] = document


def _read_kept(path: Path) -> str | None:
    """The agent's kept document, read as the job may have left it: the
    control directory is the job's uid's, and this process is root. A link
    is not followed, nor anything but a regular file read, nor more than
    MAX_KEPT_BYTES (a link to /dev/zero would have taken the host's memory,
    a FIFO held the node forever); None then, and the launch's document serves."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MAX_KEPT_BYTES + 1)
    return data.decode(errors="replace") if len(data) <= MAX_KEPT_BYTES else None


def _forget_credentials() -> None:
    os.environ.pop(protocol.ENV_STORAGE_CREDENTIALS_FILE, None)
    os.environ.pop(protocol.ENV_STORAGE_CREDENTIALS, None)


def place(mounts: list[dict], env: dict[str, str], node: Path, owner: tuple[int, int] | None,
          give: Callable, give_tree: Callable) -> None:
    """The job's file mounts at their paths (`~/P` in the node's home, `/P`
    under its `fs/`), the job user's. A cloud bucket is read with the node's
    own credentials, never the broker's. CodeError: which one, and why."""
    if not mounts:
        return
    give(node / "fs", owner)
    _credentials(env)
    try:
        placed = place_all([Mount.parse(m) for m in mounts], node / "home", node / "fs")
    finally:
        _forget_credentials()
    if owner is None:
        return
    for dest in placed:
        base = node / "home" if dest.is_relative_to(node / "home") else node / "fs"
        for parent in reversed(dest.relative_to(base).parents[:-1]):  # what placing made on the way
            os.chown(base / parent, *owner, follow_symlinks=False)
        if dest.is_dir() and not dest.is_symlink():
            give_tree(dest, owner)
        else:  # a file, or the link to a file:// bucket (whose directory is the job's already)
            os.chown(dest, *owner, follow_symlinks=False)


def written_back(mounts: list[dict]) -> bool:
    return any(written_back_one(Mount.parse(m)) for m in mounts)


def save(mounts: list[dict], env: dict[str, str], node: Path, owner: list[int] | None, rank: int) -> None:
    """What the job wrote in its writable cloud buckets, saved before its
    exit is recorded (so the next job of the team finds it). A failure is
    said on the node's output and keeps the job's exit code."""
    _credentials(env, node)
    try:
        saved = save_all([Mount.parse(m) for m in mounts], node / "home", node / "fs", owner[0] if owner else None)
        print(f"spotbroker: node {rank}: saved {saved} files of its file mounts", file=sys.stderr, flush=True)
    except Exception as exc:  # obstore's errors have no common base; the job's end is recorded all the same
        print(f"spotbroker: node {rank}: could not save its file mounts: {exc}", file=sys.stderr, flush=True)
    finally:
        _forget_credentials()
