"""The checkpoint library's side of the agent's control directory.

The agent and the library share nothing but ``SPOTBROKER_CONTROL_DIR``: the
library announces itself in ``library.json`` (only then does the agent signal
it to flush), reads the agent's ``flush.json`` and appends its own events to
``events.jsonl`` (see :mod:`spotbroker.agent.protocol`). Each helper is a
no-op without a control directory, and a failure to write is logged, never
raised: training must go on whether or not an agent is listening.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from spotbroker.agent import protocol
from spotbroker.agent.ckpt_format import now_iso

log = logging.getLogger("spotbroker.checkpoint")


def write_library_file(control_dir: Path | None) -> None:
    if control_dir is None:
        return
    try:
        control_dir.mkdir(parents=True, exist_ok=True)
        path = control_dir / protocol.LIBRARY_FILE
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        temp.write_text(json.dumps({"pid": os.getpid(), "version": 1}))
        os.replace(temp, path)
    except OSError as exc:
        log.warning("cannot tell the agent we are here (%s): it will not ask for flushes", exc)


def withdraw_library_file(control_dir: Path | None) -> None:
    if control_dir is None:
        return
    path = control_dir / protocol.LIBRARY_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():  # another process's is not ours to remove
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def flush_file_mtime(control_dir: Path | None) -> int:
    """flush.json's mtime in ns (0 if none): a new value is a new flush request."""
    if control_dir is None:
        return 0
    try:
        return (control_dir / protocol.FLUSH_FILE).stat().st_mtime_ns
    except OSError:
        return 0


def read_flush_file(control_dir: Path | None) -> dict[str, Any]:
    if control_dir is None:
        return {}
    try:
        doc = json.loads((control_dir / protocol.FLUSH_FILE).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def emit_event(control_dir: Path | None, event_type: str, data: dict[str, Any]) -> None:
    if control_dir is None:
        return
    try:
        protocol.append_event(control_dir, {"type": event_type, "at": now_iso(), "data": data})
    except OSError as exc:
        log.warning("cannot append %s to %s: %s", event_type, protocol.EVENTS_FILE, exc)
