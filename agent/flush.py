"""Asking the trainer's checkpoint library to flush, and which processes to ask.

Every process that uses the library announces itself in the control
directory (``library-{pid}.json``; an older library writes only
``library.json``). On a notice the agent writes ``flush.json`` once and
sends the flush signal to each announced process that is alive, is the very
process that announced itself (its kernel start time matches: a pid reused
since is not it) and lies within the trainer's process tree, whatever its
session or group (``torchrun`` starts each worker in a session of its own).
A pid outside that tree (stale, or forged by another job) is never
signalled. The ranks then agree among themselves on the step to save.
"""
from __future__ import annotations

import json
import logging
import os
import signal
from datetime import datetime
from pathlib import Path

from spotbroker.agent import proctree
from spotbroker.agent.protocol import (
    FLUSH_FILE,
    FLUSH_SIGNAL,
    INTERVAL_FILE,
    LIBRARY_FILE,
    LIBRARY_PREFIX,
    LIBRARY_SUFFIX,
)

log = logging.getLogger("spotbroker.agent")


def _announcements(control_dir: Path) -> list[dict]:
    found = []
    try:
        names = [n for n in os.listdir(control_dir)
                 if n == LIBRARY_FILE or (n.startswith(LIBRARY_PREFIX) and n.endswith(LIBRARY_SUFFIX))]
    except OSError:
        return []
    for name in sorted(names):
        try:
            info = json.loads((control_dir / name).read_text())
            found.append({"pid": int(info["pid"]), "start": info.get("start")})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def library_pids(control_dir: Path | None, trainer_pid: int | None) -> list[int]:
    """The live processes below ``trainer_pid`` (or it) that announced the library."""
    if control_dir is None or trainer_pid is None:
        return []
    pids: list[int] = []
    for info in _announcements(control_dir):
        pid, start = info["pid"], info["start"]
        if pid <= 1 or pid in pids:
            continue
        alive = proctree.start_time(pid)
        if alive is None or (start is not None and str(start) != alive):
            continue  # gone, or the pid now belongs to another process
        if pid != trainer_pid and not proctree.is_descendant(pid, trainer_pid):
            log.warning("the control directory names pid %d, which is not one of the trainer's processes", pid)
            continue
        pids.append(pid)
    return pids


def request_flush(control_dir: Path, pids: list[int], deadline: datetime, reason: str) -> list[int]:
    """Write flush.json, then signal each pid; the pids that were signalled."""
    tmp = control_dir / (FLUSH_FILE + ".tmp")
    tmp.write_text(json.dumps({"deadline": deadline.isoformat(), "reason": reason}))
    os.replace(tmp, control_dir / FLUSH_FILE)  # the library never reads half a file
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, getattr(signal, FLUSH_SIGNAL))
            signalled.append(pid)
        except ProcessLookupError:
            continue
    return signalled


def write_interval_file(control_dir: Path, seconds: float | None) -> None:
    """The broker's checkpoint interval for the library (agent/checkpoint/interval.py), written whole."""
    tmp = control_dir / (INTERVAL_FILE + ".tmp")
    tmp.write_text(json.dumps({"seconds": seconds}))
    os.replace(tmp, control_dir / INTERVAL_FILE)
