"""Following SkyPilot requests and clusters without the reconciler waiting.

Every SkyPilot call is an HTTP round trip to its API server, and a launch
takes minutes: the reconciler must never wait on either. A `Follower` keeps
what SkyPilot last said of each cluster the launcher watches, and one
thread of its own asks again: every `poll_s` for the launch requests still
in flight (one `api_status` call for all of them, then `sky.get` for each
that finished, which returns at once), and every `cluster_poll_s` for the
clusters that are up (one `sky.status` for all, then each one's job).
`on_change` is called when anything changed, so the reconciler looks now.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from spotbroker.broker.launch.skypilot.errors import LaunchFailure, classify, server_unreachable
from spotbroker.broker.launch.skypilot.server import ServerWatch

log = logging.getLogger(__name__)

IN_FLIGHT = ("PENDING", "WAITING", "RUNNING")
GONE = "GONE"  # the cluster is not in SkyPilot's table any more
LOST = "LOST"  # the launch request is not in SkyPilot's table any more (its API server restarted)
# Looks in a row at which the server answered without the request before it
# counts as lost (a request is in its table before its id is returned).
LOST_AFTER = 2


@dataclass(frozen=True)
class Seen:
    """What SkyPilot last said of one cluster's launch and run."""

    request_id: str | None
    request: str = "PENDING"             # the launch request's status
    failure: LaunchFailure | None = None  # why it failed, when it did
    job_id: int | None = None             # SkyPilot's job on the cluster, once launched
    cluster: str | None = None            # INIT, UP, STOPPED or GONE
    job: str | None = None                # SkyPilot's JobStatus name
    missing: int = 0                      # looks in a row whose answer lacked the request


@dataclass
class Follower:
    sky: Any                              # the `sky` module
    poll_s: float = 1.0
    cluster_poll_s: float = 15.0
    on_change: Callable[[], None] | None = None
    server: ServerWatch | None = None     # told whether SkyPilot's API server answered
    _seen: dict[str, Seen] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _clusters_at: float = 0.0
    _asked: bool = False                  # whether the last look asked the server anything

    def watch(self, cluster: str, request_id: str | None) -> None:
        with self._lock:
            if cluster not in self._seen or self._seen[cluster].request_id != request_id:
                self._seen[cluster] = Seen(request_id)
        self._start()

    def forget(self, cluster: str) -> None:
        with self._lock:
            self._seen.pop(cluster, None)

    def seen(self, cluster: str) -> Seen | None:
        with self._lock:
            return self._seen.get(cluster)

    def close(self) -> None:
        self._stop.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="skypilot-follower", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:
                if not server_unreachable(exc):
                    log.warning("following SkyPilot failed", exc_info=True)
                elif self.server is not None:  # starting, restarting or gone: ask again next time
                    self.server.unavailable(exc)
                continue
            if self.server is not None and self._asked:
                self.server.answered()

    # --- one look ----------------------------------------------------------------------

    def poll_once(self) -> bool:
        """Ask SkyPilot once; returns whether anything changed."""
        self._asked = False
        changed = self._follow_requests()
        if time.monotonic() - self._clusters_at >= self.cluster_poll_s:
            self._clusters_at = time.monotonic()
            changed = self._follow_clusters() or changed
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    def _update(self, name: str, /, **values: Any) -> bool:
        with self._lock:
            old = self._seen.get(name)
            if old is None:
                return False
            new = replace(old, **values)
            self._seen[name] = new
            return new != old

    def _follow_requests(self) -> bool:
        with self._lock:
            flying = {s.request_id: c for c, s in self._seen.items() if s.request_id and s.request in IN_FLIGHT}
        if not flying:
            return False
        self._asked = True
        if self.server is not None:
            self.server.healthy_now()  # (SkyPilot's calls would wait up to 600 s on a 503)
        changed, answered = False, set()
        for payload in self.sky.api_status(request_ids=list(flying)):
            cluster = flying.get(payload.request_id)
            if cluster is None:
                continue
            answered.add(payload.request_id)
            if payload.status in IN_FLIGHT:
                changed = self._update(cluster, request=payload.status, missing=0) or changed
                continue
            changed = self._finished(cluster, payload.request_id) or changed
        for request_id in flying.keys() - answered:  # a restarted server forgets the requests it had
            changed = self._missed(flying[request_id], request_id) or changed
        return changed

    def _missed(self, cluster: str, request_id: str) -> bool:
        with self._lock:
            seen = self._seen.get(cluster)
            if seen is None or seen.request_id != request_id:  # forgotten, or launched again meanwhile
                return False
            missing = seen.missing + 1
            lost = missing >= LOST_AFTER
            self._seen[cluster] = replace(seen, missing=missing, request=LOST if lost else seen.request)
        if not lost:
            return False
        log.warning("cluster %s: SkyPilot's API server no longer knows launch request %s", cluster, request_id)
        return True

    def _finished(self, cluster: str, request_id: str) -> bool:
        try:
            job_id, _ = self.sky.get(request_id)
        except Exception as exc:
            if server_unreachable(exc):  # the server went between the two calls: not the launch's end
                raise
            failure = classify(exc)
            return self._update(cluster, request="FAILED", failure=failure)
        # Launched: the node's state is the next cluster look's, soon.
        self._clusters_at = 0.0
        return self._update(cluster, request="SUCCEEDED", job_id=job_id, cluster="UP")

    def _follow_clusters(self) -> bool:
        with self._lock:
            up = {c: s for c, s in self._seen.items() if s.request == "SUCCEEDED"}
        if not up:
            return False
        self._asked = True
        if self.server is not None:
            self.server.healthy_now()
        records = {r["name"]: r for r in self.sky.get(self.sky.status(cluster_names=list(up)))}
        changed = False
        for cluster, seen in up.items():
            record = records.get(cluster)
            state = GONE if record is None else str(getattr(record["status"], "value", record["status"]))
            job = seen.job
            if state == "UP" and seen.job_id is not None:
                job = self._job_state(cluster, seen.job_id) or job
            changed = self._update(cluster, cluster=state, job=job) or changed
        return changed

    def _job_state(self, cluster: str, job_id: int) -> str | None:
        try:
            states = self.sky.get(self.sky.job_status(cluster, [job_id]))
        except Exception as exc:  # not up after all: the next cluster look says so
            log.info("job status of %s: %s", cluster, exc)
            return None
        state = states.get(job_id)
        return None if state is None else str(getattr(state, "value", state))
