"""What the broker knows of SkyPilot's API server: whether it answers.

Every SkyPilot call goes to that server, which may be starting (a local one
takes seconds after the first call starts it), restarting (`sky api stop`,
a crash, a reboot) or gone. None of that says anything about a job: a
launch that meets it is tried again later, never failed. `ServerWatch`
keeps the last word heard (by a launch, the follower or the janitor's
check) for the launch path, the reconciler's reason and `/readyz`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from spotbroker.broker.launch.base import LauncherUnavailable
from spotbroker.broker.launch.skypilot.errors import one_line, server_unreachable

log = logging.getLogger(__name__)
HEALTH_TIMEOUT = (3.05, 5.0)  # connect, read (seconds)


class ServerWatch:
    def __init__(self, sky: Any) -> None:
        self.sky = sky
        # A broker process starts or finds the server (janitor's thread)
        # before its first launch: until then a launch is put off, not sent.
        self.gate_until_seen = False
        self._seen = threading.Event()
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.detail: str | None = None
        self.wanted = threading.Event()  # a launch met no server: probe before the next interval
        self.started: set[int] = set()  # the local servers this process started (reaped once they end)

    @property
    def seen(self) -> bool:
        return self._seen.is_set()

    def check_open(self) -> None:
        """Raise LauncherUnavailable while the start-up wait is not over."""
        if self.gate_until_seen and not self._seen.is_set():
            raise LauncherUnavailable(self.detail or "waiting for SkyPilot's API server to start")

    def answered(self) -> None:
        with self._lock:
            if self.down_since is not None:
                log.info("SkyPilot's API server answers again")
            self.down_since, self.detail = None, None
        self._seen.set()

    def unavailable(self, exc: BaseException) -> LauncherUnavailable:
        """Note that the server did not answer; the error to raise for it."""
        with self._lock:
            if self.down_since is None:
                self.down_since = time.time()
                log.warning("SkyPilot's API server does not answer: %s: %s", type(exc).__name__, one_line(exc))
            self.detail = f"SkyPilot's API server does not answer ({type(exc).__name__}: {one_line(exc)[:300]})"
        return LauncherUnavailable(self.detail)

    def healthy_now(self) -> None:
        """One short `GET /api/health`, not retried; LauncherUnavailable
        unless it answers 200. Asked before any SDK call of the launch path:
        SkyPilot's own calls wait up to 600 s on a 503 (they retry it), and
        the reconciler must not wait on them."""
        if getattr(self.sky, "api_info", None) is None:  # an SDK stand-in without a server
            return
        from sky.server import common

        try:
            response = common.make_authenticated_request("GET", "/api/health", retry=False, timeout=HEALTH_TIMEOUT)
            response.raise_for_status()
        except Exception as exc:
            if server_unreachable(exc):
                self.wanted.set()  # the janitor's thread probes (and starts a local server) now
                raise self.unavailable(exc) from None
            raise

    def probe(self) -> None:
        """Ask the server whether it is up, starting a local one first if it
        is not (SkyPilot's own start: seconds, waited for); raises
        LauncherUnavailable if it does not answer."""
        self.reap()
        try:
            self.healthy_now()
        except LauncherUnavailable:
            if not local_server():
                raise
            try:
                _forget_last_health()
                self.start_local()
            except Exception as exc:
                raise self.unavailable(exc) from None
            self.healthy_now()
        finally:
            self.wanted.clear()  # (set by its own failed look too: the next probe is a launch's or an interval's)
        self.answered()

    def start_local(self) -> None:
        """SkyPilot's own start of a local server, which leaves the server a
        child of this process that nothing waits for: after `sky api stop` it
        stayed a zombie of the broker. Its pid is kept, for `reap`."""
        before = _children()
        try:
            self.sky.api_start()
        finally:  # (only its server: another thread's children are their own Popen's to wait for)
            self.started |= {pid for pid in _children() - before if _is_sky_server(pid)}

    def reap(self) -> None:
        """Collect the exit of each local server this process started that has ended."""
        for pid in list(self.started):
            try:
                ended = os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:  # collected already (subprocess does, at its next start)
                ended = True
            if ended:
                self.started.discard(pid)

    def wait_until_up(self, stop: threading.Event, longest_s: float = 30.0) -> bool:
        """Probe until the server answers or `stop`, backing off to `longest_s`; whether it answered."""
        delay = 1.0
        while not stop.is_set():
            try:
                self.probe()
                return True
            except LauncherUnavailable:
                stop.wait(delay)
                delay = min(longest_s, delay * 2)
        return False


def local_server() -> bool:
    """Whether SkyPilot's server is this host's own (no SKYPILOT_API_SERVER_ENDPOINT)."""
    from sky.server import common

    return common.is_api_server_local()


def _forget_last_health() -> None:
    """SkyPilot caches its last /api/health answer for 5 s: after a crash or
    `sky api stop` its start would take that answer for a running server
    and start nothing."""
    from sky.server import common

    common.get_api_server_status_response.cache_clear()


def _children() -> set[int]:
    """This process's children, by each process's parent in /proc (a thread's
    own `children` list is documented unreliable while they start and end)."""
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


def _is_sky_server(pid: int) -> bool:
    try:
        return b"sky.server.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
