"""The supervisor's side of the trainer process: its events, its death, its pids.

The trainer runs in its own session, so the agent has to arrange for it to die
with the agent (Linux), tell a signal from an exit code, and check that a pid
the library hands over is really one of the trainer's before signalling it.
Its checkpoint library talks back through ``events.jsonl`` in the control
directory, read here line by line as it grows.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotbroker.agent.logbound import BoundedWriter
from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    CHECKPOINTS_PRUNED,
    EVENTS_FILE,
    INTERVAL_ADOPTED,
    METRICS,
    NO_FLUSH,
    RESUMED,
)

log = logging.getLogger("spotbroker.agent")

# Events the trainer's library may report through events.jsonl; the others are the agent's own.
TRAINER_EVENT_TYPES = frozenset({CHECKPOINT_COMMITTED, RESUMED, NO_FLUSH, METRICS, INTERVAL_ADOPTED,
                                 CHECKPOINTS_PRUNED})


class EventTail:
    """Reads the complete new lines of the control directory's events.jsonl
    (nothing, without a control directory)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()

    def read_new(self) -> list[dict[str, Any]]:
        if self.path is None:
            return []
        with self._lock:
            try:
                with open(self.path, "rb") as events_file:
                    events_file.seek(self._offset)
                    data = events_file.read()
            except FileNotFoundError:
                return []
            self._offset += len(data)
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()  # an unfinished last line waits for its end
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("ignoring a line of %s that is not JSON (%d bytes)", EVENTS_FILE, len(line))
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


def event_data(event: dict[str, Any]) -> dict[str, Any]:
    """The library's event as `{"type", "data"}` or flat (`{"type", "step", ...}`): its data either way."""
    if isinstance(event.get("data"), dict):
        return dict(event["data"])
    return {k: v for k, v in event.items() if k not in ("type", "at", "seq")}


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def terminate_with(agent_pid: int) -> Callable[[], None] | None:
    """In the trainer, before exec: get SIGTERM if the agent dies (Linux).

    The trainer is in its own session, so a SIGKILLed or OOM-killed agent would
    otherwise leave it running unsupervised on the node.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # loaded before the fork: the child only calls it

    libc = ctypes.CDLL(None, use_errno=True)

    def arrange() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != agent_pid:  # the agent died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    return True


def pump_output(fd: int, log_path: Path, max_log_bytes: int = 0) -> None:
    """Copy the trainer's output to our stdout and to the log file the shipper
    reads, that one up to `max_log_bytes` (0: no bound; past it, a marker).

    The pipe is drained whatever fails downstream: a trainer blocked on a full
    pipe would stop training.
    """
    sinks: dict[str, Any] = {}
    try:
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed below, when the pipe ends
        sinks["log"] = BoundedWriter(log_file, max_log_bytes, stored=log_file.tell())
    except OSError as exc:
        log.error("trainer output: cannot open %s (%s): it is not shipped to the broker", log_path, exc)
    sinks["stdout"] = sys.stdout.buffer
    while chunk := os.read(fd, 65536):
        for name, sink in list(sinks.items()):
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError) as exc:
                log.warning("trainer output: %s no longer writable (%s)", name, exc)
                del sinks[name]
    if "log" in sinks:
        sinks["log"].close()
