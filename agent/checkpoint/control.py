"""The checkpoint library's side of the agent's control directory.

The agent and the library share nothing but ``SPOTBROKER_CONTROL_DIR`` (the
ranks of a node share it): each process of the library announces itself in
``library-{pid}.json`` (only then does the agent signal it to flush), reads
the agent's ``flush.json`` and appends its own events to ``events.jsonl``
(see :mod:`spotbroker.agent.protocol`). Each helper is a no-op without a
control directory, and a failure to write is logged, never raised: training
must go on whether or not an agent is listening. :class:`ControlChannel` is
the checkpointer's end of it.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from spotbroker.agent import protocol
from spotbroker.agent.protocol import now_iso

log = logging.getLogger("spotbroker.checkpoint")


def library_file_name(pid: int) -> str:
    return f"{protocol.LIBRARY_PREFIX}{pid}{protocol.LIBRARY_SUFFIX}"


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_text(json.dumps(doc))
    os.replace(temp, path)


def write_library_file(control_dir: Path | None, rank: int = 0, local_rank: int = 0) -> None:
    """Announce this process: its own file, and library.json for an older agent from the node's first rank."""
    if control_dir is None:
        return
    from spotbroker.agent.proctree import start_time

    pid = os.getpid()
    try:
        control_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(control_dir / library_file_name(pid), {
            "pid": pid, "start": start_time(pid), "rank": rank, "local_rank": local_rank, "version": 2})
        if local_rank == 0:
            _write_atomic(control_dir / protocol.LIBRARY_FILE, {"pid": pid, "version": 1})
    except OSError as exc:
        log.warning("cannot tell the agent we are here (%s): it will not ask for flushes", exc)


def withdraw_library_file(control_dir: Path | None) -> None:
    if control_dir is None:
        return
    try:
        (control_dir / library_file_name(os.getpid())).unlink()
    except OSError:
        pass
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


def control_dir_from(value: str | os.PathLike[str] | None) -> Path | None:
    """The control directory to use: ``value``, else the agent's variable."""
    control = value or os.environ.get(protocol.ENV_CONTROL_DIR)
    if not control:
        return None
    path = Path(control)
    if not path.is_absolute():
        # The agent always hands an absolute one: a relative path would
        # land in whatever directory the trainer runs in (the user's code).
        log.warning("ignoring a relative control directory %r: the agent cannot ask for flushes", str(control))
        return None
    return path


class ControlChannel:
    """The checkpointer's end of the control directory: flush requests in
    (``SIGUSR1`` and ``flush.json``), events out, the library's announcement."""

    def __init__(self, control_dir: Path | None, handle_signal: bool) -> None:
        self.dir = control_dir
        self._flag = False
        self._mtime = flush_file_mtime(control_dir)  # a request older than us is not ours
        self._previous_handler: Any = None
        self._installed = False
        if handle_signal:
            self._install()

    def announce(self, rank: int = 0, local_rank: int = 0) -> None:
        """Only once flush requests can be taken may the agent learn we are here."""
        write_library_file(self.dir, rank, local_rank)

    def emit(self, event_type: str, data: dict[str, Any]) -> None:
        emit_event(self.dir, event_type, data)

    def flush_requested(self) -> bool:
        # The file is read too, for a trainer whose handler could not be installed.
        mtime = flush_file_mtime(self.dir)
        if mtime != self._mtime:
            return True
        if self._flag and mtime:
            # The agent writes flush.json, then signals: a signal whose file was
            # already handled (at a boundary between the two) is that request's echo.
            self._flag = False
        return self._flag

    def take_flush_request(self) -> dict[str, Any]:
        """Mark the pending request handled; what the agent wrote in it."""
        self._flag = False
        self._mtime = flush_file_mtime(self.dir)
        return read_flush_file(self.dir)

    def close(self) -> None:
        """Tell the agent flushes are over and give the signal back."""
        withdraw_library_file(self.dir)
        if self._installed and threading.current_thread() is threading.main_thread():
            previous = self._previous_handler
            # A late signal from the agent must not kill the process: SIGUSR1's
            # default action is to terminate, so it is ignored instead.
            if previous in (None, signal.SIG_DFL):
                previous = signal.SIG_IGN
            signal.signal(getattr(signal, protocol.FLUSH_SIGNAL), previous)
            self._installed = False

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.info("not in the main thread: flush requests are read from %s at step boundaries",
                     protocol.FLUSH_FILE)
            return
        self._previous_handler = signal.signal(getattr(signal, protocol.FLUSH_SIGNAL), self.on_signal)
        self._installed = True

    def on_signal(self, signum: int, frame: Any) -> None:
        """The flush signal's handler."""
        # Runs between two bytecodes of the main thread: set the flag, nothing else.
        self._flag = True
